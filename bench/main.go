// Command bench measures courier as it is deployed, as its own process, and
// prints the figures: its drain rate for N preloaded messages against an
// instant local app at several in-flight limits, its resident memory idle and
// while draining, and the latency it adds at a paced rate well below
// capacity (latency while draining a backlog is queueing, not overhead).
// Every figure is set beside a minimal forwarder (./bench/forwarder:
// consume, POST, ack, nothing else) run the same way, and courier is run
// with dedup off and on (at 16 in flight also with the shared store, to the
// app's Unix socket, logging a line per message at debug, in batches of 32
// to the app as it is and to one decoding each batch with encoding/json,
// and with order per key on 1,000 keys or one, see order.go). Courier runs with every setting at
// its default but those naming what the benchmark sets up (NATS, stream,
// consumer, app, in-flight limit, admin address, dedup directory) and the one
// a variant is about. Last, replicas: one and three couriers with the shared
// store on one durable, draining to an app that takes 20 ms a request, and
// the same with 1,000 keys kept in order by partitions ("replicas ordered";
// see replicas.go). Then subscriptions: two streams drained at once by one
// courier serving both (COURIER_SUBSCRIPTIONS) and by two couriers, one a
// stream (see subscriptions.go). Then the adaptive in-flight limit ("adaptive: ...", see
// adaptive.go): courier with COURIER_MAX_INFLIGHT=auto against fixed numbers
// (8, today's default, and 16 or 64), each draining a backlog to an app of
// 8 workers taking 10 ms a request (the rest wait inside it), to an instant
// app, and to an app taking 20 ms a request with any number at once: the
// drain rate, the requests inside the app (mean and 90th percentile over
// time), and the limit and unloaded answer time auto ends at, from
// courier's /metrics. Then publishing: courier's HTTP publish API at 16
// callers against nats.go's synchronous js.Publish at 16 and a minimal HTTP
// forwarder (./bench/pubforwarder) at 16 (see publish.go). Only when -only
// names them (-only rollout), rollouts and crashes: a rolling update and a
// SIGKILL of three ordered couriers on a 3-node cluster, in both modes of
// order, and the waits they cause (see rollout.go).
//
// Run it from the module root:
//
//	go run ./bench [-n 30000] [-inflight 1,16,64] [-size 256] [-rate 200] [-latency-n 2000] [-repeat 3] [-only regexp] [-replicas-n 3000] [-subs-n 3000] [-adaptive-n 4000] [-publish-n 20000] [-rollout-rate 100]
//
// It builds courier and the forwarder into a temporary directory, starts an
// embedded nats-server and the app inside its own process, and starts and
// stops the process under test once per measurement. It prints figures and
// asserts nothing: how fast is fast enough is for the reader to judge.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if ctx.Err() != nil {
		err = errors.New("interrupted; every process it started is stopped")
	}
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	n        int            // messages preloaded per drain
	inflight []int          // in-flight limits to drain at
	size     int            // message body size
	rate     float64        // paced publish rate of the latency phase, msgs/s
	latencyN int            // messages of the latency phase
	repeat   int            // drains per variant and limit; the median is shown
	timeout  time.Duration  // bound on one drain or latency phase
	courier  string         // a prebuilt courier binary; empty builds ./cmd/courier
	only     *regexp.Regexp // variants measured, by name; nil: all
	// replicasN messages per drain of the replicas scenario; 0 skips it.
	replicasN int
	// publishN messages per phase of the publish scenario; 0 skips it.
	publishN int
	// subsN messages per stream per drain of the subscriptions scenario;
	// 0 skips it.
	subsN int
	// adaptiveN messages per drain of the adaptive scenario (the instant
	// app's drains take more, adaptive.go); 0 skips it.
	adaptiveN int
	// rolloutRate is the publish rate of the rollout scenario, msgs/s; 0
	// skips it. The scenario runs only when -only names it.
	rolloutRate float64
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var inflight, only string
	fs.IntVar(&o.n, "n", 30000, "messages preloaded per drain")
	fs.StringVar(&inflight, "inflight", "1,16,64", "comma-separated in-flight limits to drain at")
	fs.IntVar(&o.size, "size", 256, fmt.Sprintf("message body size in bytes (at least %d)", bodyFixed))
	fs.Float64Var(&o.rate, "rate", 200, "paced publish rate of the latency phase, msgs/s")
	fs.IntVar(&o.latencyN, "latency-n", 2000, "messages published in the latency phase")
	fs.IntVar(&o.repeat, "repeat", 3, "drains per variant and in-flight limit (the median is shown)")
	fs.IntVar(&o.replicasN, "replicas-n", 3000, "messages per drain of the replicas scenario (0 skips it)")
	fs.IntVar(&o.subsN, "subs-n", 3000, "messages per stream per drain of the subscriptions scenario (0 skips it; -only subscriptions runs it alone)")
	fs.IntVar(&o.publishN, "publish-n", 20000, "messages per phase of the publish scenario (0 skips it; -only publish runs it alone)")
	fs.IntVar(&o.adaptiveN, "adaptive-n", 4000, "messages per drain of the adaptive scenario, 5× to the instant app and 2× to the 20 ms one (0 skips it; -only adaptive runs it alone)")
	fs.Float64Var(&o.rolloutRate, "rollout-rate", 100, "msgs/s published throughout the rollout scenario, which runs only when -only names it (-only rollout runs it alone)")
	fs.StringVar(&o.courier, "courier", "", "benchmark this courier binary instead of building ./cmd/courier")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "bound on one drain (and on the latency phase beyond its publishing time)")
	fs.StringVar(&only, "only", "", `measure only the variants whose name matches this regexp (e.g. "baseline|dedup on$")`)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if only != "" {
		re, err := regexp.Compile(only)
		if err != nil {
			return o, fmt.Errorf("-only: %w", err)
		}
		o.only = re
	}
	for _, f := range strings.Split(inflight, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return o, fmt.Errorf("-inflight: %q is not a positive integer", f)
		}
		o.inflight = append(o.inflight, v)
	}
	switch {
	case o.n < 1 || o.latencyN < 1 || o.repeat < 1:
		return o, errors.New("-n, -latency-n and -repeat must be positive")
	case o.replicasN < 0 || o.publishN < 0 || o.adaptiveN < 0 || o.subsN < 0 || o.rolloutRate < 0:
		return o, errors.New("-replicas-n, -publish-n, -adaptive-n, -subs-n and -rollout-rate must not be negative")
	case o.size < bodyFixed:
		return o, fmt.Errorf("-size must be at least %d (the benchmark's own header)", bodyFixed)
	case o.rate <= 0:
		return o, errors.New("-rate must be positive")
	}
	return o, nil
}

// focusInflight is the in-flight limit of the dedup target, the info-logs
// run and the latency phase.
const focusInflight = 16

// consumerName is the durable every process under test consumes.
const consumerName = "bench"

// variant is one process under test.
type variant int

const (
	baseline       variant = iota // the minimal forwarder
	dedupOff                      // courier with COURIER_DEDUP_TTL=0
	dedupOn                       // courier with its dedup store (default TTL)
	dedupOnInfo                   // dedupOn logging at debug (a line per message) to /dev/null
	dedupShared                   // courier with the shared store (COURIER_DEDUP_STORE=shared)
	dedupSocket                   // dedupOn sending to the app's Unix socket (COURIER_APP_URL=unix://...)
	dedupBatch                    // dedupOn with batches of benchBatch (COURIER_BATCH_MAX)
	dedupBatchJSON                // dedupBatch to an app decoding each batch with encoding/json
	// Order per key (bench/order.go): messages on orderKeys keys, or one.
	orderUnordered // dedupOn on orderKeys keys
	orderKeyed     // dedupOn on orderKeys keys with COURIER_ORDER_KEY
	orderOneKey    // dedupOn on one key with COURIER_ORDER_KEY
	orderForwarder // the forwarder on one key with MaxAckPending 1
)

// benchBatch is the batch size of the batches variant.
const benchBatch = 32

func (v variant) String() string {
	return [...]string{"baseline forwarder", "courier, dedup off", "courier, dedup on", "courier, dedup on, debug logs",
		"courier, dedup shared", "courier, dedup on, unix socket", "courier, dedup on, batches of 32",
		"courier, dedup on, batches of 32, app decodes JSON",
		"order: courier, 1000 keys, unordered", "order: courier, 1000 keys, ordered", "order: courier, one key",
		"order: forwarder, one key, MaxAckPending 1"}[v]
}

func (v variant) courier() bool { return v != baseline && v != orderForwarder }
func (v variant) dedup() bool {
	return v == dedupOn || v == dedupOnInfo || v == dedupShared || v == dedupSocket || v == dedupBatch ||
		v == dedupBatchJSON || v == orderUnordered || v == orderKeyed || v == orderOneKey
}
func (v variant) info() bool { return v == dedupOnInfo }

// skip reports whether -only leaves v out.
func (o options) skip(v variant) bool { return o.only != nil && !o.only.MatchString(v.String()) }

// bench holds what every measurement shares. It is used by one goroutine.
type bench struct {
	o         options
	dir       string // temporary root: binaries, JetStream store, dedup stores, logs
	courier   string // binary
	forwarder string // binary
	// pubforwarder is the publish scenario's baseline binary.
	pubforwarder string
	broker       *broker
	app          *app
	baseEnv      []string // the environment without NATS_* and COURIER_*
	runs         uint64   // measurements started; names streams and tags bodies
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "courier-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	b := &bench{o: o, dir: dir, baseEnv: cleanEnv(os.Environ())}
	fmt.Fprintln(stderr, "bench: building courier and the forwarder")
	if err := b.build(ctx); err != nil {
		return err
	}
	if b.broker, err = startBroker(filepath.Join(dir, "jetstream")); err != nil {
		return err
	}
	defer b.broker.close()
	if b.app, err = startApp(b.dir); err != nil {
		return err
	}
	defer b.app.close()

	rep := &report{o: o}
	rep.machine = machine(ctx, b.courier)
	if set := goEnv(b.baseEnv); len(set) > 0 {
		rep.machine = append(rep.machine, "go env:   "+strings.Join(set, " ")+
			" (for both processes; GOGC replaces courier's default of 50)")
	}
	rep.loadStart = loadAvg()

	for _, phase := range []func(context.Context, *report, io.Writer) error{
		b.idlePhase, b.drainPhase, b.replicasPhase, b.subscriptionsPhase, b.adaptivePhase, b.publishPhase, b.rolloutPhase, b.latencyPhase,
	} {
		if err := phase(ctx, rep, stderr); err != nil {
			return err
		}
	}
	rep.print(stdout)
	return nil
}

func noteIf(err error) string {
	if err == nil {
		return ""
	}
	return " (" + err.Error() + ")"
}

// cleanEnv drops the variables courier and the forwarder read, so that the
// caller's environment cannot change what is measured: OTEL_* among them, as
// an OTLP endpoint in the caller's environment would turn tracing on in
// courier alone. Go's runtime variables (GOGC, GOMEMLIMIT, ...) are kept,
// for both alike, and named in the report (goEnv).
func cleanEnv(environ []string) []string {
	return slices.DeleteFunc(slices.Clone(environ), func(kv string) bool {
		return strings.HasPrefix(kv, "NATS_") || strings.HasPrefix(kv, "COURIER_") || strings.HasPrefix(kv, "OTEL_")
	})
}

// goRuntimeVars are the variables of Go's runtime that change what is
// measured. They reach both processes; GOGC also replaces courier's own
// default (50), so a report made with one set is not of courier at its
// defaults.
var goRuntimeVars = []string{"GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GODEBUG"}

// goEnv lists the Go runtime variables set in environ, as NAME=value.
func goEnv(environ []string) []string {
	var set []string
	for _, kv := range environ {
		if name, _, ok := strings.Cut(kv, "="); ok && slices.Contains(goRuntimeVars, name) {
			set = append(set, kv)
		}
	}
	slices.Sort(set)
	return set
}

// build compiles courier and the forwarder into b.dir.
func (b *bench) build(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	gomodPath := strings.TrimSpace(string(gomod))
	if gomodPath == "" || gomodPath == os.DevNull {
		return errors.New("run the benchmark inside courier's module (go run ./bench from its root)")
	}
	root := filepath.Dir(gomodPath)
	b.forwarder = filepath.Join(b.dir, "forwarder")
	b.pubforwarder = filepath.Join(b.dir, "pubforwarder")
	builds := map[string]string{"./bench/forwarder": b.forwarder, "./bench/pubforwarder": b.pubforwarder}
	if b.o.courier != "" {
		if b.courier, err = filepath.Abs(b.o.courier); err != nil {
			return err
		}
	} else {
		b.courier = filepath.Join(b.dir, "courier")
		builds["./cmd/courier"] = b.courier
	}
	for pkg, out := range builds {
		// As the image builds courier (Dockerfile): static (no libc
		// mapped), without symbol tables, -tags nodemo (no embedded
		// server for the demo); the forwarder has no such tag. Both are
		// built alike, so what they map from their binaries compares.
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-tags", "nodemo", "-ldflags", "-s -w", "-o", out, pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %w\n%s", pkg, err, msg)
		}
	}
	return nil
}

// next names a fresh stream and subject for one measurement, and the tag its
// message bodies carry.
func (b *bench) next() (run uint64, stream, subject string) {
	b.runs++
	return b.runs, fmt.Sprintf("BENCH%d", b.runs), fmt.Sprintf("bench.%d", b.runs)
}

// launch starts v consuming stream with the given in-flight limit. Courier's
// logs (at the default level, info) go to a log file, returned so the
// caller can read it; at debug level they go to /dev/null, as the cost of
// writing a line per message is what that variant measures.
func (b *bench) launch(v variant, run uint64, stream string, inflight int) (*child, string, error) {
	return b.launchReplica(v, run, stream, inflight, 0)
}

// launchReplica is launch for one of several processes on the same durable:
// each has a dedup directory and a log of its own.
func (b *bench) launchReplica(v variant, run uint64, stream string, inflight, replica int, extra ...string) (*child, string, error) {
	env := append(slices.Clone(b.baseEnv),
		"NATS_URL="+b.broker.URL(),
		"COURIER_STREAM="+stream,
		"COURIER_CONSUMER="+consumerName,
		"COURIER_APP_URL="+b.app.URL(),
		"COURIER_MAX_INFLIGHT="+strconv.Itoa(inflight),
	)
	bin := b.forwarder
	if v.courier() {
		bin = b.courier
		// Everything else at its default: dedup on, logs at info, a
		// MaxAckPending of 1000 (the forwarder's too, up to 250 in flight).
		env = append(env,
			"COURIER_ADMIN_ADDR=127.0.0.1:0",
			"COURIER_DEDUP_DIR="+filepath.Join(b.dedupDir(run), strconv.Itoa(replica)),
		)
		if v.info() {
			env = append(env, "COURIER_LOG_LEVEL=debug")
		}
		if !v.dedup() {
			env = append(env, "COURIER_DEDUP_TTL=0")
		}
		if v == dedupShared {
			env = append(env, "COURIER_DEDUP_STORE=shared") // the bucket is deleted with the streams
		}
		if v == dedupSocket {
			env = append(env, "COURIER_APP_URL="+b.app.SocketURL()) // the later value wins
		}
		if v == dedupBatch || v == dedupBatchJSON {
			env = append(env, "COURIER_BATCH_MAX="+strconv.Itoa(benchBatch))
		}
		env = append(env, extra...)
		if slices.ContainsFunc(extra, func(kv string) bool { return strings.HasPrefix(kv, "COURIER_SUBSCRIPTIONS=") }) {
			// Each subscription names its own stream: courier warns of a
			// plain COURIER_STREAM that none uses.
			env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "COURIER_STREAM=") })
		}
	}
	env = append(env, v.orderEnv()...)
	var logPath string
	var logFile *os.File
	if !v.info() {
		logPath = filepath.Join(b.dir, fmt.Sprintf("run%d-%d.log", run, replica))
		f, err := os.Create(logPath)
		if err != nil {
			return nil, "", err
		}
		defer f.Close() // the child has its own copy
		logFile = f
	}
	c, err := startChild(bin, env, logFile)
	return c, logPath, err
}

func (b *bench) dedupDir(run uint64) string {
	return filepath.Join(b.dir, fmt.Sprintf("dedup%d", run))
}

// selfCPU is the CPU time this process (the embedded server and the app)
// has used so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadAvg is the machine's load average over 1, 5 and 15 minutes, as
// /proc/loadavg says it: on a machine shared with other work, what the
// figures were measured beside.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// machine describes where the figures come from.
func machine(ctx context.Context, courierBin string) []string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 && f[0] == "MemTotal:" {
			if kib, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				mem = fmt.Sprintf(", %.1f GiB RAM", float64(kib)/(1<<20))
			}
		}
	}
	goVersion := runtime.Version()
	if out, err := exec.CommandContext(ctx, "go", "version").Output(); err == nil {
		goVersion = strings.TrimSpace(string(out))
	}
	courierVersion := "?"
	if out, err := exec.CommandContext(ctx, courierBin, "version").Output(); err == nil {
		courierVersion = strings.TrimSpace(string(out))
	}
	return []string{
		fmt.Sprintf("machine:  nproc %d (GOMAXPROCS %d), %s%s, %s/%s",
			runtime.NumCPU(), runtime.GOMAXPROCS(0), model, mem, runtime.GOOS, runtime.GOARCH),
		"go:       " + goVersion,
		"courier:  " + courierVersion,
	}
}
