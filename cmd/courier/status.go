package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/admin"
	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/partition"
	"github.com/courierhq/courier/proxy"
)

const statusUsage = `Usage: courier status [--admin HOST:PORT]

Prints the durable consumer's state as the server has it (paused until,
pending, ack pending, redelivered, dead letters), and beside it the running
courier's own, read from its admin port (/v1/state): whether the app is
available, the breaker and when its next probe goes, the messages held, the
requests in flight and the limit in effect, a pause and when it ends. The
admin port is --admin, else COURIER_ADMIN_ADDR as this environment has it
(a host left out or 0.0.0.0 is this host): run it where courier runs
(kubectl exec -c courier POD -- courier status). A courier that cannot be
reached is said to be so, and the server's view is printed all the same.
Same environment as the sidecar; COURIER_APP_URL is not needed.
`

// runStatus runs `courier status`.
func runStatus(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("courier status", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	adminFlag := fs.String("admin", "", "")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, statusUsage)
		return nil
	} else if err != nil {
		return usageError("status: %v (see 'courier status --help')", err)
	}
	if fs.NArg() > 0 {
		return usageError("status takes no arguments but --admin (see 'courier status --help')")
	}
	cfg, err := loadConfigWithoutApp(environ)
	if err != nil {
		return err
	}
	if !cfg.ConsumesStream() {
		return usageError("status needs COURIER_STREAM (and COURIER_CONSUMER, default courier)")
	}
	// The courier's own view first, from the admin port: it answers
	// whether or not the server does.
	own := readOwnState(ctx, cfg, *adminFlag)
	js, closeConn, err := connectCLI(cfg, "status", stderr)
	if err != nil {
		own.print(stdout)
		return err
	}
	defer closeConn()
	err = printServerStatus(ctx, js, cfg, stdout)
	own.print(stdout)
	return err
}

// printServerStatus prints the durable as the server has it.
func printServerStatus(ctx context.Context, js jetstream.JetStream, cfg config.Config, stdout io.Writer) error {
	deadLetters := "unknown"
	if n, err := dlq.Depth(ctx, js, cfg.DLQSubject); err == nil {
		deadLetters = fmt.Sprint(n)
	}
	if partitioned(cfg) {
		d, err := partition.Find(ctx, js, cfg.Stream, cfg.Consumer)
		if err != nil {
			return err
		}
		if d == nil {
			return missingConsumer(ctx, js, cfg)
		}
		return printPartitionStatus(ctx, js, cfg, d, deadLetters, stdout)
	}
	cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err != nil {
		if why := missingConsumer(ctx, js, cfg); why != nil {
			return why
		}
		return fmt.Errorf("consumer %q on stream %q: %w", cfg.Consumer, cfg.Stream, err)
	}
	info := cons.CachedInfo()
	paused := "no"
	if info.Paused && info.Config.PauseUntil != nil {
		paused = "until " + info.Config.PauseUntil.UTC().Format(time.RFC3339)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "consumer\t%s/%s\n", cfg.Stream, cfg.Consumer)
	fmt.Fprintf(w, "paused\t%s\n", paused)
	fmt.Fprintf(w, "pending\t%d\n", info.NumPending)
	fmt.Fprintf(w, "ack pending\t%d\n", info.NumAckPending)
	fmt.Fprintf(w, "redelivered\t%d\n", info.NumRedelivered)
	fmt.Fprintf(w, "waiting pulls\t%d\n", info.NumWaiting)
	fmt.Fprintf(w, "dead letters\t%s (%s)\n", deadLetters, cfg.DLQSubject)
	fmt.Fprintf(w, "in-flight limit\t%s (COURIER_MAX_INFLIGHT, each courier's own)\n", inflightText(cfg))
	if r := lastRewind(ctx, js, cfg); r != nil {
		fmt.Fprintf(w, "rewind\t%s\n", rewindProgress(*r, info.AckFloor.Stream))
	}
	for _, g := range info.PriorityGroups {
		// Order per key pins the durable to one courier at a time, which
		// puts its name with its pin in the membership bucket.
		pinned := "nobody (the next courier to pull takes it)"
		if g.PinnedClientID != "" {
			pinned = pinHolder(ctx, js, cfg, g.PinnedClientID) + " since " + g.PinnedTS.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "pinned (%s)\t%s\n", g.Group, pinned)
	}
	return w.Flush()
}

// ownView is what status learnt from the courier's admin port: its state,
// or why it has none.
type ownView struct {
	addr    string
	state   *ownState
	path    *pathState // the durable's, within state
	problem string     // why there is no state: not reachable, no fixed port
	now     time.Time
}

// ownStateTimeout bounds the request to the admin port: a courier that
// is there answers at once.
const ownStateTimeout = 3 * time.Second

// readOwnState reads the state of the courier at the admin address (flag,
// else COURIER_ADMIN_ADDR) and picks cfg's durable from it.
func readOwnState(ctx context.Context, cfg config.Config, flagAddr string) ownView {
	v := ownView{now: time.Now()}
	addr, problem := adminTarget(cfg.AdminAddr, flagAddr)
	v.addr = addr
	if problem != "" {
		v.problem = problem
		return v
	}
	ctx, cancel := context.WithTimeout(ctx, ownStateTimeout)
	defer cancel()
	st, err := fetchOwnState(ctx, addr)
	if err != nil {
		v.problem = fmt.Sprintf("not reachable at %s (%v): is it running there? give --admin HOST:PORT, or COURIER_ADMIN_ADDR as courier has it", addr, err)
		return v
	}
	v.state = st
	for i, p := range st.Subscriptions {
		if p.Stream == cfg.Stream && p.Consumer == cfg.Consumer {
			v.path = &st.Subscriptions[i]
			break
		}
	}
	if v.path == nil {
		var serves []string
		for _, p := range st.Subscriptions {
			serves = append(serves, p.Stream+"/"+p.Consumer)
		}
		what := "none"
		if len(serves) > 0 {
			what = strings.Join(serves, ", ")
		}
		v.problem = fmt.Sprintf("the courier at %s does not consume %s/%s (it consumes: %s)", addr, cfg.Stream, cfg.Consumer, what)
	}
	return v
}

// adminTarget is where status asks for the courier's state: the flag, else
// the configured admin address, whose host, when it is every interface or
// none, is this host. problem says why there is none.
func adminTarget(configured, flagAddr string) (addr, problem string) {
	given := strings.TrimSpace(flagAddr)
	if given == "" {
		given = configured
	}
	given = strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(given, "http://"), "https://"), "/")
	host, port, err := net.SplitHostPort(given)
	if err != nil {
		return given, fmt.Sprintf("admin address %q is not HOST:PORT: give --admin HOST:PORT", given)
	}
	if port == "0" {
		return given, fmt.Sprintf("COURIER_ADMIN_ADDR %q has no fixed port (courier picked one at start; its start-up line names it): give --admin HOST:PORT", given)
	}
	switch host {
	case "", "0.0.0.0", "::":
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), ""
}

// fetchOwnState asks the courier at addr for its state.
func fetchOwnState(ctx context.Context, addr string) (*ownState, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+admin.StatePath, nil)
	if err != nil {
		return nil, err
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) {
			return nil, op.Err // "connection refused", without the URL again
		}
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s: not a courier, or one older than this command", admin.StatePath, resp.Status)
	}
	var st ownState
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil {
		return nil, fmt.Errorf("%s: %w", admin.StatePath, err)
	}
	return &st, nil
}

// print prints the courier's own view, after the server's.
func (v ownView) print(out io.Writer) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	defer w.Flush()
	if v.path == nil {
		fmt.Fprintf(w, "courier\t%s; above is the server's view only\n", v.problem)
		return
	}
	p := v.path
	fmt.Fprintf(w, "courier\tat %s (version %s), as it sees this durable:\n", v.addr, v.state.Version)
	if p.Starting != "" {
		fmt.Fprintf(w, "  starting\t%s\n", p.Starting)
		return
	}
	ready := "yes"
	if p.Ready != "" {
		ready = "no: " + p.Ready
	}
	fmt.Fprintf(w, "  ready\t%s\n", ready)
	holds := map[string]proxy.Hold{}
	for _, h := range p.Holds {
		holds[h.Cause] = h
	}
	app := "available"
	if h, ok := holds["app_unavailable"]; ok {
		app = fmt.Sprintf("unavailable for %s: %s; courier sends again as soon as it answers", v.since(h.Since), h.Reason)
	}
	fmt.Fprintf(w, "  app\t%s\n", app)
	fmt.Fprintf(w, "  breaker\t%s\n", v.breaker(p.Breaker, holds["breaker_open"]))
	if h, ok := holds["store_unavailable"]; ok {
		fmt.Fprintf(w, "  dedup store\tunavailable for %s: %s\n", v.since(h.Since), h.Reason)
	}
	paused := "no"
	if h, ok := holds["paused"]; ok {
		paused = "yes, " + h.Reason
		if h.Until != nil {
			paused = fmt.Sprintf("until %s (in %s)", h.Until.UTC().Format(time.RFC3339), v.until(*h.Until))
		}
	}
	fmt.Fprintf(w, "  paused\t%s\n", paused)
	fmt.Fprintf(w, "  held\t%s (in progress, no attempt spent, while deliveries are held)\n", plural(p.Held, "message"))
	limit := fmt.Sprintf("fixed (COURIER_MAX_INFLIGHT=%d)", p.Limit)
	if p.LimitAuto {
		limit = fmt.Sprintf("automatic, found from the app's answers, at most %d", p.LimitMax)
	}
	fmt.Fprintf(w, "  in flight\t%d of %d requests at the app; limit %s\n", p.InFlight, p.Limit, limit)
	bound := "yes"
	if !p.Bound {
		bound = "no (pulls do not reach it yet: starting, or NATS away)"
	}
	fmt.Fprintf(w, "  consumer bound\t%s\n", bound)
}

// breaker says what the breaker is doing and when that changes.
func (v ownView) breaker(b proxy.BreakerState, h proxy.Hold) string {
	if !b.Open {
		return "closed"
	}
	s := "open"
	if !h.Since.IsZero() {
		s += " for " + v.since(h.Since)
	}
	switch {
	case b.NextProbe != nil:
		s += fmt.Sprintf(": next probe at %s (in %s)", b.NextProbe.UTC().Format(time.RFC3339), v.until(*b.NextProbe))
	default:
		s += ": a probe is under way, or waits for a message to carry it"
	}
	switch {
	case b.ProbeWait != "" && b.ProbeMax != "" && b.ProbeWait != b.ProbeMax:
		s += ", then every " + b.ProbeWait + ", doubling up to " + b.ProbeMax + ", while probes fail"
	case b.ProbeWait != "":
		s += ", then every " + b.ProbeWait + " while probes fail"
	}
	return s + "; sending resumes when one succeeds"
}

// since and until say how long ago t was, and how long until it comes,
// by the clock of status (the courier's is the same host's, or close).
func (v ownView) since(t time.Time) string {
	return fmt.Sprintf("%s (since %s)", max(v.now.Sub(t), 0).Round(time.Second), t.UTC().Format(time.RFC3339))
}

func (v ownView) until(t time.Time) string {
	d := t.Sub(v.now)
	if d <= 0 {
		return "a moment"
	}
	if d < time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
