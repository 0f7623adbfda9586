package kubernetes_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/courierhq/courier/config"
)

const (
	// helmModule is the helm the chart is rendered with: a Go module,
	// built from the module proxy once per run of this package's tests
	// (minutes on a cold build cache, seconds after), never a dependency in
	// courier's go.mod.
	helmModule = "helm.sh/helm/v3/cmd/helm@v3.22.0"
	// kubeVersion is the cluster helm template renders for: its default
	// (1.20) predates native sidecars, which the charts require (1.29).
	kubeVersion = "1.29.0"
	chartsDir   = "../helm"
	libChart    = chartsDir + "/courier"
)

// helm runs a helm binary with its cache, configuration and data in a
// temporary directory, so that nothing of the user's is read or written.
type helm struct {
	bin  string
	home string
}

// buildHelm installs helmModule into a temporary directory.
func buildHelm(t *testing.T) helm {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: building %s takes minutes on a cold build cache", helmModule)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command on PATH to build %s with: %v", helmModule, err)
	}
	bin := t.TempDir()
	cmd := exec.CommandContext(t.Context(), goBin, "install", helmModule)
	// Outside courier's module: helm's own go.mod decides its dependencies.
	cmd.Dir = bin
	cmd.Env = append(os.Environ(), "GOBIN="+bin)
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install %s: %v\n%s", helmModule, err, out)
	}
	t.Logf("go install %s: %v", helmModule, time.Since(start).Round(time.Second))
	return helm{bin: filepath.Join(bin, "helm"), home: t.TempDir()}
}

// run runs helm and returns its standard output, or an error holding its
// standard error.
func (h helm) run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), h.bin, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(h.home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(h.home, "config"),
		"HELM_DATA_HOME="+filepath.Join(h.home, "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

func (h helm) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := h.run(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestHelmChart renders deploy/helm/example, the app chart using the courier
// library chart, with the real helm, and puts the result through the checks
// the manifests of this directory pass.
func TestHelmChart(t *testing.T) {
	h := buildHelm(t)
	// helm dependency update writes charts/ and Chart.lock beside
	// Chart.yaml: into a copy, not the source tree.
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(chartsDir)); err != nil {
		t.Fatal(err)
	}
	example := filepath.Join(dir, "example")
	h.must(t, "dependency", "update", "--skip-refresh", example)
	for _, args := range [][]string{{filepath.Join(dir, "courier")}, {example}, {example, "-f", filepath.Join(example, "shipping-values.yaml")}} {
		if out, err := h.run(t, append([]string{"lint", "--strict", "--kube-version", kubeVersion}, args...)...); err != nil {
			t.Errorf("%v\n%s", err, out)
		}
	}
	render := func(t *testing.T, args ...string) []object {
		t.Helper()
		out := h.must(t, append([]string{"template", "orders", example, "--kube-version", kubeVersion}, args...)...)
		return renderedObjects(t, "helm template", out)
	}
	appVersion := chartAppVersion(t)

	t.Run("defaults", func(t *testing.T) {
		objs := render(t)
		got := checkManifests(t, withSecrets(objs, "orders-courier-nats"))
		if len(got.configs) != 1 {
			t.Fatalf("%d Deployments with courier, want the example's one", len(got.configs))
		}
		checkImage(t, objs, "ghcr.io/courierhq/courier:"+appVersion)
		checkRules(t, find(t, objs, "PrometheusRule", "orders-courier"))
	})

	t.Run("everything", func(t *testing.T) {
		// Every Secret, every optional object, a port and a grace other
		// than the defaults: the probes, the PodMonitor, the NetworkPolicy
		// and terminationGracePeriodSeconds must follow.
		objs := render(t,
			"--set", "courier.adminPort=9415",
			"--set", "courier.shutdownGraceSeconds=50",
			"--set", "courier.secrets.natsTLS.secretName=orders-courier-tls",
			"--set", "courier.secrets.signingSecrets.secretName=orders-courier-signing",
			"--set", "courier.secrets.appToken.secretName=orders-courier-token",
			"--set", "courier.dashboard.enabled=true",
			"--set", "courier.keda.enabled=true",
			"--set", "courier.networkPolicy.enabled=true",
			"--set", `courier.env.NATS_URL=nats://nats-0.nats:4222\,tls://nats-1.nats:4443`,
		)
		got := checkManifests(t, withSecrets(objs, "orders-courier-nats", "orders-courier-tls", "orders-courier-signing", "orders-courier-token"))
		cfg := got.configs["orders"]
		if cfg.AdminAddr != ":9415" || cfg.ShutdownGrace != 50*time.Second {
			t.Errorf("COURIER_ADMIN_ADDR %q, COURIER_SHUTDOWN_GRACE %v: want the values' :9415 and 50s", cfg.AdminAddr, cfg.ShutdownGrace)
		}
		dep := find(t, objs, "Deployment", "orders")
		c, _ := findCourier(t, asMap(t, dig(dep.doc, "spec", "template", "spec"), "pod spec"))
		for _, name := range []string{"NATS_CA", "NATS_CERT", "NATS_KEY", "COURIER_SIGNING_SECRETS_FILE", "COURIER_APP_TOKEN_FILE"} {
			if !slices.ContainsFunc(asList(t, c["env"], "env"), func(e any) bool { return str(dig(e, "name")) == name }) {
				t.Errorf("no %s with its Secret set", name)
			}
		}
		for _, kind := range []string{"ScaledObject", "PodMonitor", "NetworkPolicy", "PrometheusRule"} {
			find(t, objs, kind, "orders-courier")
		}
		checkDashboard(t, find(t, objs, "ConfigMap", "orders-courier-dashboard"))
		checkNetworkPolicy(t, find(t, objs, "NetworkPolicy", "orders-courier"), got)
	})

	t.Run("values rendered as courier reads them", func(t *testing.T) {
		// From a values file, YAML numbers reach the templates as float64,
		// which print 1000000 as 1e+06.
		values := filepath.Join(t.TempDir(), "values.yaml")
		err := os.WriteFile(values, []byte("courier:\n  env:\n    COURIER_MAX_ACK_PENDING: 1000000\n    COURIER_BACKOFF_MULTIPLIER: 1.5\n    OTEL_SDK_DISABLED: true\n    COURIER_BACKOFF_MAX: 1h30m\n"), 0o600)
		if err != nil {
			t.Fatal(err)
		}
		got := checkManifests(t, withSecrets(render(t, "-f", values), "orders-courier-nats"))
		cfg := got.configs["orders"]
		if cfg.MaxAckPending != 1000000 || cfg.BackoffMultiplier != 1.5 || !cfg.OTELSDKDisabled || cfg.BackoffMax != 90*time.Minute {
			t.Errorf("courier read COURIER_MAX_ACK_PENDING %d, COURIER_BACKOFF_MULTIPLIER %v, OTEL_SDK_DISABLED %v, COURIER_BACKOFF_MAX %v", cfg.MaxAckPending, cfg.BackoffMultiplier, cfg.OTELSDKDisabled, cfg.BackoffMax)
		}
	})

	t.Run("two subscriptions", func(t *testing.T) {
		// shipping-values.yaml: one app consuming ORDERS (order per key,
		// routes) and PAYMENTS (batches, its own path), KEDA on both.
		objs := render(t, "-f", filepath.Join(example, "shipping-values.yaml"),
			"--set", "courier.keda.enabled=true")
		got := checkManifests(t, withSecrets(objs, "orders-courier-nats"))
		cfg, ok := got.configs["orders"]
		if !ok {
			t.Fatal("no Deployment orders with courier")
		}
		subs := cfg.Subscriptions()
		checkShipping(t, subs)
		if src := subs[0].Source["COURIER_STREAM"]; src != "COURIER_STREAM" {
			t.Errorf("orders' stream comes from %s, want the plain COURIER_STREAM of values.yaml", src)
		}
		so := find(t, objs, "ScaledObject", "orders-courier")
		if n := len(asList(t, dig(so.doc, "spec", "triggers"), "triggers")); n != 2 {
			t.Errorf("ScaledObject: %d triggers, want one per subscription", n)
		}
	})

	// Each of these is refused by helm before anything is rendered, let
	// alone applied: by values.schema.json, or by the templates for what a
	// schema cannot say.
	for _, tc := range []struct {
		set  string
		want string // in helm's error
	}{
		{"courier.podMonitor.enable=true", "additional properties 'enable' not allowed"},
		{"courier.adminPort=0", "at '/adminPort'"},
		{"courier.adminPort=admin", "at '/adminPort'"},
		{"courier.shutdownGraceSeconds=-1", "at '/shutdownGraceSeconds'"},
		{"courier.env.COURIER_ACK_WAIT=30", "at '/env/COURIER_ACK_WAIT'"},
		{"courier.env.COURIER_HTTP_TIMEOUT=10 seconds", "at '/env/COURIER_HTTP_TIMEOUT'"},
		{"courier.env.COURIER_MAX_DELIVER=five", "at '/env/COURIER_MAX_DELIVER'"},
		{"courier.env.COURIER_MAX_RATE=fast", "at '/env/COURIER_MAX_RATE'"},
		{"courier.env.COURIER_MAX_INFLIGHT=auto:0", "at '/env/COURIER_MAX_INFLIGHT'"},
		{"courier.env.COURIER_MAX_INFLIGHT=auto:x", "at '/env/COURIER_MAX_INFLIGHT'"},
		{"courier.env.COURIER_MAX_INFLIGHT=0", "at '/env/COURIER_MAX_INFLIGHT'"},
		{"courier.env.COURIER_MAX_INFLIGHT=automatic", "at '/env/COURIER_MAX_INFLIGHT'"},
		// Subscriptions: their names, their variables, and what the
		// templates refuse beside them.
		{"courier.subscriptions[0].name=or-ders", "at '/subscriptions/0/name'"},
		{"courier.subscriptions[0].env.COURIER_STREAM=ORDERS", "at '/subscriptions/0': missing property 'name'"},
		{"courier.subscriptions[0].name=orders,courier.subscriptions[0].env.COURIER_ADMIN_ADDR=:1", "additional properties 'COURIER_ADMIN_ADDR' not allowed"},
		{"courier.subscriptions[0].name=orders,courier.subscriptions[0].env.COURIER_SUB_ORDERS_STREAM=X", "additional properties 'COURIER_SUB_ORDERS_STREAM' not allowed"},
		{"courier.subscriptions[0].name=orders,courier.subscriptions[0].env.COURIER_BATCH_MAX=many", "at '/subscriptions/0/env/COURIER_BATCH_MAX'"},
		{"courier.subscriptions[0].name=orders,courier.subscriptions[0].env.COURIER_MAX_INFLIGHT=auto:0", "at '/subscriptions/0/env/COURIER_MAX_INFLIGHT'"},
		{"courier.subscriptions[0].name=orders,courier.subscriptions[1].name=Orders", "courier: subscriptions orders and Orders are one name to courier"},
		{"courier.subscriptions[0].name=orders,courier.env.COURIER_SUBSCRIPTIONS=orders", "env.COURIER_SUBSCRIPTIONS is refused beside subscriptions"},
		{"courier.subscriptions[0].name=orders,courier.env.COURIER_SUB_ORDERS_BATCH_MAX=5", "env.COURIER_SUB_ORDERS_BATCH_MAX is refused beside subscriptions"},
		{"courier.subscriptions[0].name=a,courier.subscriptions[0].env.COURIER_STREAM=A,courier.subscriptions[1].name=b,courier.subscriptions[1].env.COURIER_STREAM=B", "env.COURIER_STREAM is set but every subscription sets its own"},
		{"replicaCount=2,courier.env.COURIER_DEDUP_STORE=badger,courier.env.COURIER_DEDUP_TTL=0s,courier.subscriptions[0].name=a,courier.subscriptions[1].name=b,courier.subscriptions[1].env.COURIER_DEDUP_TTL=1h", "replicaCount 2 with COURIER_DEDUP_STORE=badger"},
		{"courier.env.OTEL_SDK_DISABLED=yes", "at '/env/OTEL_SDK_DISABLED'"},
		// Derived by the chart, or a secret: refused saying what to set.
		{"courier.env.COURIER_SHUTDOWN_GRACE=30s", "env.COURIER_SHUTDOWN_GRACE is refused. Not here: set shutdownGraceSeconds."},
		{"courier.env.NATS_CREDS=/creds", "env.NATS_CREDS is refused. Not here: set secrets.natsCreds."},
		{"courier.env.NATS_PASSWORD=hunter2", "env.NATS_PASSWORD is refused. Not here: a secret"},
		{"courier.env.not-a-name=1", "invalid propertyName 'not-a-name'"},
		// A misspelt variable, and values courier would refuse.
		{"courier.env.COURIER_MAX_INFLGHT=4", "additional properties 'COURIER_MAX_INFLGHT' not allowed"},
		{"courier.env.COURIER_CLOUDEVENTS=structured", "at '/env/COURIER_CLOUDEVENTS': value must be 'binary'"},
		{"courier.env.COURIER_ORDER_KEY=subject:0", "at '/env/COURIER_ORDER_KEY': 'subject:0' does not match"},
		{"courier.env.COURIER_ORDER_KEY=order", "at '/env/COURIER_ORDER_KEY': 'order' does not match"},
		{"courier.env.COURIER_DEDUP_STORE=memory", "at '/env/COURIER_DEDUP_STORE': value must be one of 'badger', 'shared'"},
		{"courier.env.COURIER_DELIVER_POLICY=last", "at '/env/COURIER_DELIVER_POLICY': value must be one of 'all', 'new'"},
		{"courier.env.COURIER_LOG_FORMAT=yaml", "at '/env/COURIER_LOG_FORMAT': value must be one of 'text', 'json'"},
		{"courier.env.COURIER_LOG_LEVEL=trace", "at '/env/COURIER_LOG_LEVEL': value must be one of"},
		{"courier.env.OTEL_TRACES_SAMPLER=sometimes", "at '/env/OTEL_TRACES_SAMPLER': value must be one of"},
		{"courier.env.OTEL_EXPORTER_OTLP_PROTOCOL=http/json", "at '/env/OTEL_EXPORTER_OTLP_PROTOCOL': value must be one of"},
		// Several replicas with the embedded store, however they come.
		{"replicaCount=2,courier.env.COURIER_DEDUP_STORE=badger", "replicaCount 2 with COURIER_DEDUP_STORE=badger"},
		{"replicaCount=1,autoscaling.enabled=true,autoscaling.maxReplicas=5,courier.env.COURIER_DEDUP_STORE=badger", "autoscaling.maxReplicas 5 with COURIER_DEDUP_STORE=badger"},
		{"replicaCount=1,courier.keda.enabled=true,courier.env.COURIER_DEDUP_STORE=badger", "courier.keda.maxReplicaCount 12 with COURIER_DEDUP_STORE=badger"},
		{"courier.image.digest=latest", "at '/image/digest'"},
		{"courier.image.pullPolicy=Sometimes", "at '/image/pullPolicy'"},
		{"courier.resources.limits.memory=lots", "at '/resources/limits/memory'"},
		{"courier.secrets.natsCreds.secretName=Not_A_Name", "at '/secrets/natsCreds/secretName'"},
		{"courier.keda.natsServerMonitoringEndpoint=http://nats:8222", "at '/keda/natsServerMonitoringEndpoint'"},
		{"courier.keda.enabled=true,courier.keda.minReplicaCount=20", "keda.minReplicaCount 20 is above keda.maxReplicaCount 12"},
		{"courier.keda.enabled=true,courier.env.COURIER_DEDUP_STORE=badger", "set courier.env.COURIER_DEDUP_STORE: shared"},
		{"courier.keda.enabled=true,courier.env.COURIER_STREAM=", "env.COURIER_STREAM is required with keda.enabled"},
		{"courier.keda.enabled=true,courier.env.COURIER_STREAM=,courier.subscriptions[0].name=a,courier.subscriptions[0].env.COURIER_STREAM=A,courier.subscriptions[1].name=b", "subscription b has no COURIER_STREAM, which keda.enabled needs"},
		{"courier.keda.enabled=true,courier.keda.natsServerMonitoringEndpoint=", "keda.natsServerMonitoringEndpoint (host:port of the NATS monitoring port) is required"},
	} {
		t.Run("refuses "+tc.set, func(t *testing.T) {
			out, err := h.run(t, "template", "orders", example, "--kube-version", kubeVersion, "--set", tc.set)
			if err == nil {
				t.Fatalf("helm accepted %s and rendered:\n%.500s", tc.set, out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("helm refused %s, but its error does not say %q:\n%v", tc.set, tc.want, err)
			}
		})
	}
}

// TestHelmChartGuards: what the chart accepts beside what it refuses
// (TestHelmChart): names that are not courier's, the variables of
// subscriptions, one replica or dedup off with the embedded store; every
// variable values.schema.json describes as "Not here" is refused by the
// templates with that description; the commands in the example chart's
// Chart.yaml render it; values.yaml names the admin port as it is
// rendered.
func TestHelmChartGuards(t *testing.T) {
	h := buildHelm(t)
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(chartsDir)); err != nil {
		t.Fatal(err)
	}
	example := filepath.Join(dir, "example")

	t.Run("Chart.yaml's commands", func(t *testing.T) {
		var cmds [][]string
		for line := range strings.Lines(string(readFile(t, chartsDir+"/example/Chart.yaml"))) {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "#   helm "); ok {
				cmds = append(cmds, strings.Fields(strings.ReplaceAll(rest, "deploy/helm/", dir+"/")))
			}
		}
		if len(cmds) != 2 || cmds[1][0] != "template" {
			t.Fatalf("Chart.yaml's comment gives %q, want helm dependency update and helm template", cmds)
		}
		for _, args := range cmds {
			h.must(t, args...)
		}
	})

	render := func(t *testing.T, sets ...string) (string, error) {
		t.Helper()
		args := []string{"template", "orders", example, "--kube-version", kubeVersion}
		for _, s := range sets {
			args = append(args, "--set-string", s)
		}
		return h.run(t, args...)
	}
	for _, set := range []string{
		"courier.env.GODEBUG=http2client=0",
		"courier.env.COURIE=1",
		"courier.env.COURIERX=1",
		"courier.env.COURIER_SUBSCRIPTIONS=orders",
		"courier.env.COURIER_SUB_ORDERS_STREAM=ORDERS",
		"courier.env.COURIER_ROUTES=orders.>=/orders",
		"courier.env.COURIER_ORDER_KEY=header:Order-Id",
		"replicaCount=1,courier.env.COURIER_DEDUP_STORE=badger",
		"replicaCount=3,courier.env.COURIER_DEDUP_STORE=badger,courier.env.COURIER_DEDUP_TTL=0",
		"courier.env.COURIER_MAX_INFLIGHT=auto",
		"courier.env.COURIER_MAX_INFLIGHT=auto:16",
		"courier.env.COURIER_MAX_INFLIGHT=AUTO: 8",
		"courier.env.COURIER_MAX_INFLIGHT=12",
		// A subscription that sets nothing of its own takes env's; so does
		// one that sets a variable to "" (unset to courier).
		"courier.subscriptions[0].name=orders",
		"courier.subscriptions[0].name=a,courier.subscriptions[0].env.COURIER_STREAM=",
		"courier.subscriptions[0].name=orders,courier.subscriptions[1].name=P2,courier.subscriptions[1].env.COURIER_STREAM=PAYMENTS,courier.subscriptions[1].env.COURIER_MAX_INFLIGHT=auto:4",
		// Dedup off in every subscription: one store per pod is no loss.
		"replicaCount=3,courier.env.COURIER_DEDUP_STORE=badger,courier.subscriptions[0].name=a,courier.subscriptions[0].env.COURIER_DEDUP_TTL=0,courier.subscriptions[1].name=b,courier.subscriptions[1].env.COURIER_DEDUP_TTL=0s",
	} {
		t.Run("accepts "+set, func(t *testing.T) {
			if out, err := render(t, set); err != nil {
				t.Errorf("%v\n%s", err, out)
			}
		})
	}

	t.Run("refuses what is derived, saying what to set", func(t *testing.T) {
		var schema struct {
			Properties struct {
				Env struct {
					Properties map[string]struct {
						Description string `json:"description"`
					} `json:"properties"`
				} `json:"env"`
			} `json:"properties"`
		}
		if err := json.Unmarshal(readFile(t, libChart+"/values.schema.json"), &schema); err != nil {
			t.Fatal(err)
		}
		n := 0
		for name, p := range schema.Properties.Env.Properties {
			if !strings.HasPrefix(p.Description, "Not here:") {
				continue
			}
			n++
			out, err := render(t, "courier.env."+name+"=x")
			if want := "courier: env." + name + " is refused. " + p.Description; err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("env.%s: want the error %q, got %v\n%.300s", name, want, err, out)
			}
		}
		if n == 0 {
			t.Error("values.schema.json describes no variable as Not here")
		}
	})

	t.Run("the admin port's name", func(t *testing.T) {
		m := regexp.MustCompile(`named (\S+) in the container`).FindSubmatch(readFile(t, libChart+"/values.yaml"))
		if m == nil {
			t.Fatal("values.yaml does not name the admin port")
		}
		out, err := render(t)
		if err != nil {
			t.Fatal(err)
		}
		dep := find(t, renderedObjects(t, "helm template", out), "Deployment", "orders")
		c, _ := findCourier(t, asMap(t, dig(dep.doc, "spec", "template", "spec"), "pod spec"))
		var names []string
		for _, p := range asList(t, c["ports"], "ports") {
			names = append(names, str(dig(p, "name")))
		}
		if len(names) != 1 || names[0] != string(m[1]) {
			t.Errorf("values.yaml names the admin port %s, the render %q", m[1], names)
		}
	})
}

// renderedObjects parses a tool's multi-document output.
func renderedObjects(t *testing.T, what, out string) []object {
	t.Helper()
	docs, err := parseYAML(out)
	if err != nil {
		t.Fatalf("%s: %v\n%s", what, err, out)
	}
	var objs []object
	for i, d := range docs {
		m, ok := d.(map[string]any)
		if !ok {
			t.Fatalf("%s: document %d is not a mapping", what, i+1)
		}
		o := object{file: what, doc: m}
		if str(m["apiVersion"]) == "" || o.kind() == "" || o.name() == "" {
			t.Fatalf("%s: document %d lacks apiVersion, kind or metadata.name", what, i+1)
		}
		objs = append(objs, o)
	}
	return objs
}

// withSecrets adds the Secrets the charts expect to exist beforehand (they
// never create one: credentials do not belong in values), with every key
// the templates mount.
func withSecrets(objs []object, names ...string) []object {
	for _, name := range names {
		objs = append(objs, object{file: "test", doc: map[string]any{
			"apiVersion": "v1",
			"kind":       "Secret",
			"metadata":   map[string]any{"name": name},
			"stringData": map[string]any{
				"user.creds":      "-----BEGIN NATS USER JWT-----\nplaceholder\n------END NATS USER JWT------\n",
				"ca.crt":          "placeholder CA\n",
				"tls.crt":         "placeholder certificate\n",
				"tls.key":         "placeholder key\n",
				"signing-secrets": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n",
				"app-token":       "placeholder token\n",
			},
		}})
	}
	return objs
}

func find(t *testing.T, objs []object, kind, name string) object {
	t.Helper()
	for _, o := range objs {
		if o.kind() == kind && o.name() == name {
			return o
		}
	}
	t.Fatalf("no %s %q rendered", kind, name)
	return object{}
}

// chartAppVersion is the library chart's appVersion, which must also be its
// version (the release workflow publishes both from one tag).
func chartAppVersion(t *testing.T) string {
	t.Helper()
	var chart struct {
		Version    string `yaml:"version"`
		AppVersion string `yaml:"appVersion"`
		Type       string `yaml:"type"`
	}
	b, err := os.ReadFile(libChart + "/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatalf("%s/Chart.yaml: %v", libChart, err)
	}
	if chart.Type != "library" {
		t.Errorf("%s/Chart.yaml: type %q, want library", libChart, chart.Type)
	}
	if chart.AppVersion == "" || chart.AppVersion != chart.Version {
		t.Errorf("%s/Chart.yaml: version %q and appVersion %q: the release workflow publishes both from one tag", libChart, chart.Version, chart.AppVersion)
	}
	return chart.AppVersion
}

// checkImage: courier's container runs want.
func checkImage(t *testing.T, objs []object, want string) {
	t.Helper()
	for _, o := range objs {
		if o.kind() != "Deployment" {
			continue
		}
		c, _ := findCourier(t, asMap(t, dig(o.doc, "spec", "template", "spec"), "pod spec"))
		if c != nil && str(c["image"]) != want {
			t.Errorf("%s %s: courier's image %q, want %q", o.kind(), o.name(), str(c["image"]), want)
		}
	}
}

// checkRules: the PrometheusRule carries deploy/prometheus's groups.
func checkRules(t *testing.T, o object) {
	t.Helper()
	docs, err := parseYAML(string(readFile(t, "../prometheus/courier-rules.yaml")))
	if err != nil || len(docs) != 1 {
		t.Fatalf("courier-rules.yaml: %v", err)
	}
	if !reflect.DeepEqual(o.doc["spec"], docs[0]) {
		t.Errorf("PrometheusRule %s: its spec is not deploy/prometheus/courier-rules.yaml", o.name())
	}
}

// checkDashboard: the ConfigMap holds deploy/grafana/courier.json.
func checkDashboard(t *testing.T, o object) {
	t.Helper()
	var got, want any
	if err := json.Unmarshal([]byte(str(dig(o.doc, "data", "courier.json"))), &got); err != nil {
		t.Fatalf("ConfigMap %s: data.courier.json: %v", o.name(), err)
	}
	if err := json.Unmarshal(readFile(t, "../grafana/courier.json"), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ConfigMap %s: data.courier.json is not deploy/grafana/courier.json", o.name())
	}
}

// checkNetworkPolicy: the policy selects the pods of a Deployment with
// courier and lets through what that courier needs: scrapes of its admin
// port, every server of its NATS_URL, and DNS.
func checkNetworkPolicy(t *testing.T, np object, got checked) {
	t.Helper()
	sel, _ := dig(np.doc, "spec", "podSelector", "matchLabels").(map[string]any)
	var target *scrapeTarget
	for i, st := range got.targets {
		match := len(sel) > 0
		for k, v := range sel {
			match = match && st.labels[k] == v
		}
		if match {
			target = &got.targets[i]
		}
	}
	if target == nil {
		t.Fatalf("NetworkPolicy %s: podSelector %v selects no pods with courier", np.name(), sel)
	}
	cfg := got.configs[strings.TrimPrefix(target.workload, "Deployment/")]
	allows := func(field string, port int, proto string) bool {
		for _, r := range asList(t, dig(np.doc, "spec", field), field) {
			for _, p := range asList(t, dig(r, "ports"), "ports") {
				if num(dig(p, "port")) == port && orDefault(str(dig(p, "protocol")), "TCP") == proto {
					return true
				}
			}
		}
		return false
	}
	if !allows("ingress", target.adminPort, "TCP") {
		t.Errorf("NetworkPolicy %s: no ingress to the admin port %d: no scrape of /metrics", np.name(), target.adminPort)
	}
	for u := range strings.SplitSeq(cfg.NATSURL, ",") {
		port := natsPort(t, strings.TrimSpace(u))
		if !allows("egress", port, "TCP") {
			t.Errorf("NetworkPolicy %s: no egress to port %d of NATS_URL's %s", np.name(), port, u)
		}
	}
	if !allows("egress", 53, "UDP") {
		t.Errorf("NetworkPolicy %s: no egress to DNS (53/UDP): courier could not resolve NATS_URL", np.name())
	}
}

// natsPort is the port a NATS URL connects to (nats.go's defaults).
func natsPort(t *testing.T, s string) int {
	t.Helper()
	if !strings.Contains(s, "://") {
		s = "nats://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		t.Fatalf("NATS_URL %q: %v", s, err)
	}
	if _, p, err := net.SplitHostPort(u.Host); err == nil {
		n, _ := strconv.Atoi(p)
		return n
	}
	switch u.Scheme {
	case "ws":
		return 80
	case "wss":
		return 443
	}
	return 4222
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHelmChartFiles: the library chart carries copies of the rule file and
// the dashboard (helm reads no file outside a chart), kept equal here.
func TestHelmChartFiles(t *testing.T) {
	for dup, orig := range map[string]string{
		libChart + "/files/courier-rules.yaml": "../prometheus/courier-rules.yaml",
		libChart + "/files/courier.json":       "../grafana/courier.json",
	} {
		if !bytes.Equal(readFile(t, dup), readFile(t, orig)) {
			t.Errorf("%s differs from %s: cp %s %s", dup, orig, orig, dup)
		}
	}
}

// TestHelmSchemaVariables: values.schema.json names under env exactly
// courier's variables, as config lists them for `courier config`
// (config.Describe), beside GOMEMLIMIT and the variables of subscriptions
// (COURIER_SUB_<NAME>_<VAR>): any other COURIER_ name is refused. It types
// each as config.Config parses it, and every value of its lists is one
// courier accepts. COURIER_MAX_INFLIGHT takes what courier takes (a
// number, auto, auto:N). Under subscriptions, a subscription's env names
// exactly the variables config marks per subscription, each typed as env
// types it, and a name is what COURIER_SUBSCRIPTIONS accepts.
func TestHelmSchemaVariables(t *testing.T) {
	var schema struct {
		Properties struct {
			Env struct {
				Properties        map[string]map[string]any `json:"properties"`
				PatternProperties map[string]map[string]any `json:"patternProperties"`
				Additional        *bool                     `json:"additionalProperties"`
			} `json:"env"`
			Subscriptions struct {
				Type  string `json:"type"`
				Items struct {
					Properties struct {
						Name map[string]any `json:"name"`
						Env  struct {
							Properties map[string]map[string]any `json:"properties"`
							Additional *bool                     `json:"additionalProperties"`
						} `json:"env"`
					} `json:"properties"`
					Additional *bool    `json:"additionalProperties"`
					Required   []string `json:"required"`
				} `json:"items"`
			} `json:"subscriptions"`
		} `json:"properties"`
		Defs map[string]map[string]any `json:"$defs"`
	}
	if err := json.Unmarshal(readFile(t, libChart+"/values.schema.json"), &schema); err != nil {
		t.Fatal(err)
	}
	env := schema.Properties.Env.Properties
	if len(env) == 0 {
		t.Fatal("values.schema.json names no variable under env")
	}

	// The names: config's, and those the schema may hold beyond them.
	known := map[string]bool{}
	for _, v := range config.Describe(config.Config{}) {
		known[v.Name] = true
	}
	beyond := []string{"GOMEMLIMIT"}
	for name := range known {
		if env[name] == nil {
			t.Errorf("values.schema.json does not name env.%s, a variable of courier's (courier config lists it): the chart would refuse it", name)
		}
	}
	for name := range env {
		if !known[name] && !slices.Contains(beyond, name) {
			t.Errorf("values.schema.json names env.%s, which courier does not read", name)
		}
	}
	if a := schema.Properties.Env.Additional; a == nil || *a {
		t.Error("values.schema.json's env takes names it does not list: a misspelt COURIER_ variable would pass")
	}
	// The patterns: COURIER_SUB_<NAME>_<VAR>, and every name that is not
	// COURIER_ (GODEBUG, TZ, ...).
	var patterns []*regexp.Regexp
	for p := range schema.Properties.Env.PatternProperties {
		patterns = append(patterns, regexp.MustCompile(p))
	}
	taken := func(name string) bool {
		return env[name] != nil || slices.ContainsFunc(patterns, func(re *regexp.Regexp) bool { return re.MatchString(name) })
	}
	for name, want := range map[string]bool{
		"COURIER_SUB_ORDERS_STREAM": true, "COURIER_SUB_P2_BATCH_MAX": true, "GODEBUG": true, "TZ": true,
		"COURIER": true, "COURIERX": true, "COURIER_SUB_": false, "COURIER_SUB_ORDERS": false,
		"COURIER_MAX_INFLGHT": false, "COURIER_": false,
	} {
		if got := taken(name); got != want {
			t.Errorf("values.schema.json takes env.%s: %v, want %v", name, got, want)
		}
	}

	// The types.
	kinds := map[string]reflect.Type{} // courier's variables, by name
	ct := reflect.TypeFor[config.Config]()
	for i := range ct.NumField() {
		if name := ct.Field(i).Tag.Get("env"); name != "" {
			kinds[name] = ct.Field(i).Type
		}
	}
	defs := map[reflect.Type]string{
		reflect.TypeFor[time.Duration](): "#/$defs/duration",
		reflect.TypeFor[int]():           "#/$defs/integerString",
		reflect.TypeFor[float64]():       "#/$defs/numberString",
		reflect.TypeFor[bool]():          "#/$defs/booleanString",
		reflect.TypeFor[*bool]():         "#/$defs/booleanString",
	}
	base := []string{"COURIER_STREAM=ORDERS", "COURIER_APP_URL=http://127.0.0.1:8080/"}
	for name, s := range env {
		desc, _ := s["description"].(string)
		if strings.HasPrefix(desc, "Not here:") {
			continue // refused by the templates (TestHelmChartGuards)
		}
		if want, typed := defs[kinds[name]]; typed && s["$ref"] != want {
			t.Errorf("values.schema.json: env.%s is %v, but courier parses a %v (want %s)", name, s["$ref"], kinds[name], want)
		}
		values, _ := s["enum"].([]any)
		for _, v := range values {
			_, err := config.Load(config.Environ(append(slices.Clone(base), fmt.Sprintf("%s=%v", name, v))))
			var cerr *config.Error
			if errors.As(err, &cerr) && slices.ContainsFunc(cerr.Problems, func(p string) bool { return strings.Contains(p, name) }) {
				t.Errorf("values.schema.json lets env.%s be %v, which courier refuses: %v", name, v, err)
			}
		}
	}
	// COURIER_MAX_INFLIGHT: what courier accepts, as a string or a YAML
	// number. (The empty string, unset to courier, is refused: leave the
	// variable out.)
	refuses := func(name string, value any, environ ...string) bool {
		_, err := config.Load(config.Environ(append(slices.Clone(base), append(environ, fmt.Sprintf("%s=%v", name, value))...)))
		var cerr *config.Error
		return errors.As(err, &cerr) && slices.ContainsFunc(cerr.Problems, func(p string) bool { return strings.Contains(p, name) })
	}
	for _, v := range []any{
		"8", 8, "+3", " 12 ", "auto", "AUTO", "auto:1", "auto:64", " auto:8 ", "auto: 8", "Auto:016",
		"0", 0, -1, "-1", "x", "1.5", 1.5, "auto:0", "auto:x", "auto:", "auto:-1", "auto:1.5", "auto8", "auto :8", "automatic", "8auto",
	} {
		want := !refuses("COURIER_MAX_INFLIGHT", v)
		if got := schemaTakes(t, schema.Defs, env["COURIER_MAX_INFLIGHT"], v); got != want {
			t.Errorf("values.schema.json takes env.COURIER_MAX_INFLIGHT %#v: %v; courier accepts it: %v", v, got, want)
		}
	}

	// subscriptions: a list of names, each with its own variables of one
	// message's path, by their plain names.
	subs := schema.Properties.Subscriptions
	if subs.Type != "array" || subs.Items.Additional == nil || *subs.Items.Additional || !slices.Contains(subs.Items.Required, "name") {
		t.Errorf("values.schema.json: subscriptions is %q, its items' additionalProperties %v, required %v: want an array of objects with a name and nothing unknown", subs.Type, subs.Items.Additional, subs.Items.Required)
	}
	subEnv := subs.Items.Properties.Env
	if a := subEnv.Additional; a == nil || *a {
		t.Error("values.schema.json: a subscription's env takes names it does not list: a variable of the process would pass")
	}
	perSub := map[string]bool{}
	for _, v := range config.Variables() {
		if v.PerSubscription {
			perSub[v.Name] = true
		}
	}
	if len(perSub) == 0 {
		t.Fatal("config marks no variable per subscription")
	}
	for name := range perSub {
		if subEnv.Properties[name] == nil {
			t.Errorf("values.schema.json: a subscription's env does not name %s, which config marks per subscription", name)
		}
	}
	for name, p := range subEnv.Properties {
		switch {
		case !perSub[name]:
			t.Errorf("values.schema.json: a subscription's env names %s, which config does not mark per subscription: courier would refuse COURIER_SUB_<NAME>_%s", name, strings.TrimPrefix(name, "COURIER_"))
		case !reflect.DeepEqual(p, env[name]):
			t.Errorf("values.schema.json: a subscription's %s is %v, env's %v: type them alike", name, p, env[name])
		}
	}
	for _, name := range []string{"orders", "P2", "0", "Orders2", "or-ders", "orders_x", "orders payments", "ördern", "orders.x"} {
		want := !refuses("COURIER_SUBSCRIPTIONS", name)
		if got := schemaTakes(t, schema.Defs, subs.Items.Properties.Name, name); got != want {
			t.Errorf("values.schema.json takes the subscription name %q: %v; courier accepts COURIER_SUBSCRIPTIONS=%s: %v", name, got, name, want)
		}
	}
	// Not one name to courier: none (unset), or two.
	for _, name := range []string{"", "orders,payments"} {
		if schemaTakes(t, schema.Defs, subs.Items.Properties.Name, name) {
			t.Errorf("values.schema.json takes the subscription name %q", name)
		}
	}

	// Every typed variable of courier is typed in the schema.
	for name, typ := range kinds {
		if _, ok := defs[typ]; ok && env[name] != nil && env[name]["$ref"] != defs[typ] {
			if desc, _ := env[name]["description"].(string); !strings.HasPrefix(desc, "Not here:") {
				t.Errorf("values.schema.json does not type env.%s (%v): a bad value would pass helm and fail only when courier starts", name, typ)
			}
		}
	}
}

// schemaTakes reports whether the schema s of values.schema.json (whose
// $defs are defs) takes the value v, a string or a YAML number: it knows
// the keywords the schema gives variables and names ($ref, type, pattern,
// minimum, enum) and fails t on any other, so that a keyword it would
// ignore cannot make it take a value helm refuses.
func schemaTakes(t *testing.T, defs map[string]map[string]any, s map[string]any, v any) bool {
	t.Helper()
	if s == nil {
		t.Fatal("no schema")
	}
	for k, kw := range s {
		switch k {
		case "description":
		case "$ref":
			ref, _ := kw.(string)
			def, ok := strings.CutPrefix(ref, "#/$defs/")
			if !ok || defs[def] == nil {
				t.Fatalf("$ref %q: not one of $defs", ref)
			}
			if !schemaTakes(t, defs, defs[def], v) {
				return false
			}
		case "type":
			types, ok := kw.([]any)
			if !ok {
				types = []any{kw}
			}
			typ := "string"
			switch n := v.(type) {
			case int:
				typ = "integer"
			case float64:
				typ = "number"
				if n == float64(int(n)) {
					typ = "integer"
				}
			}
			if !slices.Contains(types, any(typ)) && !(typ == "integer" && slices.Contains(types, any("number"))) {
				return false
			}
		case "pattern":
			if str, ok := v.(string); ok && !regexp.MustCompile(kw.(string)).MatchString(str) {
				return false
			}
		case "minimum":
			var n float64
			switch x := v.(type) {
			case int:
				n = float64(x)
			case float64:
				n = x
			default:
				continue
			}
			if n < kw.(float64) {
				return false
			}
		case "enum":
			if !slices.Contains(kw.([]any), v) {
				return false
			}
		default:
			t.Fatalf("schemaTakes does not know the keyword %s", k)
		}
	}
	return true
}

// checkShipping checks the subscriptions courier reads from the shipping
// example (Helm's shipping-values.yaml, kustomize's shipping overlay):
// orders in order per key with two routes, payments in batches of 50 on
// its own consumer and path, both with the shared auto:32.
func checkShipping(t *testing.T, subs []config.Subscription) {
	t.Helper()
	if len(subs) != 2 || subs[0].Name != "orders" || subs[1].Name != "payments" {
		t.Fatalf("courier reads subscriptions %+v, want orders and payments", subs)
	}
	o, p := subs[0].Config, subs[1].Config
	if o.Stream != "ORDERS" || o.OrderKey != "subject:2" || len(o.Routes) != 2 || o.BatchMax != 1 {
		t.Errorf("orders: stream %q, order key %q, routes %v, batch max %d: want ORDERS, subject:2, two routes, no batches", o.Stream, o.OrderKey, o.Routes, o.BatchMax)
	}
	if p.Stream != "PAYMENTS" || p.Consumer != "shipping-payments" || p.BatchMax != 50 || p.OrderKey != "" || p.AppURL != "http://127.0.0.1:8080/payments" {
		t.Errorf("payments: stream %q, consumer %q, batch max %d, order key %q, app URL %q: want PAYMENTS, shipping-payments, 50, none, its own path", p.Stream, p.Consumer, p.BatchMax, p.OrderKey, p.AppURL)
	}
	for _, sub := range subs {
		if !sub.Config.InflightAuto || sub.Config.MaxInflight != 32 {
			t.Errorf("%s: in-flight limit %d (automatic %v), want the shared auto:32", sub.Name, sub.Config.MaxInflight, sub.Config.InflightAuto)
		}
	}
}
