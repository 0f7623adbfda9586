// Package kubernetes_test checks the example manifests in this directory
// against courier itself, so that the example cannot rot: the environment
// they give courier must be accepted by its configuration loader, and the
// probes, grace period, volumes and security settings must agree with it.
package kubernetes_test

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/config"
)

// object is one manifest document.
type object struct {
	file string
	doc  map[string]any
}

func (o object) kind() string { return str(o.doc["kind"]) }
func (o object) name() string { return str(dig(o.doc, "metadata", "name")) }

func TestManifests(t *testing.T) {
	checkManifests(t, loadManifests(t))
}

// checked is what checkManifests found: courier's configuration by
// Deployment name, and its scrape targets.
type checked struct {
	configs map[string]config.Config
	targets []scrapeTarget
}

// checkManifests runs the checks of this file on a set of objects: these
// manifests, or what the Helm chart and the kustomize component render
// (helm_test.go, kustomize_test.go).
func checkManifests(t *testing.T, objs []object) checked {
	t.Helper()
	byKind := map[string]map[string]object{}
	for _, o := range objs {
		if byKind[o.kind()] == nil {
			byKind[o.kind()] = map[string]object{}
		}
		if _, dup := byKind[o.kind()][o.name()]; dup {
			t.Errorf("%s: two %s objects named %q", o.file, o.kind(), o.name())
		}
		byKind[o.kind()][o.name()] = o
	}
	for _, cm := range byKind["ConfigMap"] {
		checkStringValues(t, cm, "data")
	}
	for _, s := range byKind["Secret"] {
		checkStringValues(t, s, "stringData")
		checkStringValues(t, s, "data")
	}

	sidecars := 0
	configs := map[string]config.Config{} // courier's, by Deployment name
	var targets []scrapeTarget            // courier's admin port, by pod template
	for _, o := range objs {
		switch o.kind() {
		case "Deployment", "StatefulSet", "DaemonSet":
		default:
			continue
		}
		t.Run(o.kind()+"/"+o.name(), func(t *testing.T) {
			checkSelector(t, o)
			pod := asMap(t, dig(o.doc, "spec", "template", "spec"), "spec.template.spec")
			c, native := findCourier(t, pod)
			if c == nil {
				t.Skip("no courier container")
			}
			sidecars++
			if !native {
				t.Errorf("courier is not a native sidecar: want it among initContainers with restartPolicy: Always, so it starts before the app and stops after it")
			}
			k := &podEnv{t: t, objs: byKind, pod: pod, c: c, root: t.TempDir()}
			environ := k.environ()
			cfg, err := config.Load(environ)
			if err != nil {
				t.Fatalf("courier refuses the manifests' environment:\n%v\nenvironment: %v", err, environ)
			}
			k.checkProbes(cfg)
			k.checkGrace(cfg)
			k.checkDedupDir(cfg)
			k.checkSecurity()
			k.checkResources()
			replicas := 1 // Kubernetes' default
			if v, ok := dig(o.doc, "spec", "replicas").(int); ok {
				replicas = v
			}
			checkReplicas(t, cfg, replicas)
			if o.kind() == "Deployment" {
				configs[o.name()] = cfg
			}
			targets = append(targets, k.scrapeTarget(o, cfg))
		})
	}
	if sidecars == 0 {
		t.Error("no workload with a courier container in the manifests")
	}
	for _, so := range byKind["ScaledObject"] {
		t.Run("ScaledObject/"+so.name(), func(t *testing.T) { checkScaledObject(t, so, configs) })
	}
	for _, pm := range byKind["PodMonitor"] {
		t.Run("PodMonitor/"+pm.name(), func(t *testing.T) { checkPodMonitor(t, pm, targets) })
	}
	return checked{configs: configs, targets: targets}
}

// scrapeTarget is what a scrape of courier's metrics must find in one pod
// template: its labels, the named ports of courier's container, and the
// admin port (COURIER_ADMIN_ADDR) that serves /metrics.
type scrapeTarget struct {
	workload  string
	labels    map[string]any
	ports     map[string]int // courier's container ports, by name
	adminPort int
}

func (k *podEnv) scrapeTarget(o object, cfg config.Config) scrapeTarget {
	st := scrapeTarget{workload: o.kind() + "/" + o.name(), ports: map[string]int{}}
	st.labels, _ = dig(o.doc, "spec", "template", "metadata", "labels").(map[string]any)
	for i, p := range asList(k.t, k.c["ports"], "ports") {
		p := asMap(k.t, p, fmt.Sprintf("ports[%d]", i))
		if name := str(p["name"]); name != "" {
			st.ports[name] = num(p["containerPort"])
		}
	}
	if _, port, err := net.SplitHostPort(cfg.AdminAddr); err == nil {
		st.adminPort, _ = strconv.Atoi(port)
	}
	// The prometheus.io annotations, for a Prometheus that scrapes by them.
	ann, _ := dig(o.doc, "spec", "template", "metadata", "annotations").(map[string]any)
	if v, ok := ann["prometheus.io/port"]; ok && str(v) != strconv.Itoa(st.adminPort) {
		k.t.Errorf("annotation prometheus.io/port %v is not COURIER_ADMIN_ADDR's port %d", v, st.adminPort)
	}
	if v, ok := ann["prometheus.io/path"]; ok && str(v) != "/metrics" {
		k.t.Errorf("annotation prometheus.io/path %v: courier serves /metrics", v)
	}
	return st
}

// checkPodMonitor: a PodMonitor selects the pods of a workload with courier
// and scrapes /metrics on the named port that is courier's admin port (a
// port name the container lacks yields no target, silently).
func checkPodMonitor(t *testing.T, pm object, targets []scrapeTarget) {
	sel, _ := dig(pm.doc, "spec", "selector", "matchLabels").(map[string]any)
	if len(sel) == 0 {
		t.Fatal("spec.selector.matchLabels is empty")
	}
	var selected []scrapeTarget
	for _, st := range targets {
		match := true
		for k, v := range sel {
			match = match && st.labels[k] == v
		}
		if match {
			selected = append(selected, st)
		}
	}
	if len(selected) == 0 {
		t.Fatalf("selector %v matches no pod template with courier", sel)
	}
	eps := asList(t, dig(pm.doc, "spec", "podMetricsEndpoints"), "spec.podMetricsEndpoints")
	if len(eps) == 0 {
		t.Fatal("no podMetricsEndpoints")
	}
	for i, ep := range eps {
		ep := asMap(t, ep, fmt.Sprintf("podMetricsEndpoints[%d]", i))
		if p := str(ep["path"]); p != "" && p != "/metrics" {
			t.Errorf("podMetricsEndpoints[%d].path %q: courier serves /metrics", i, p)
		}
		name := str(ep["port"])
		for _, st := range selected {
			if n, ok := st.ports[name]; !ok || n != st.adminPort {
				t.Errorf("podMetricsEndpoints[%d].port %q: %s's courier has no port of that name on COURIER_ADMIN_ADDR's %d", i, name, st.workload, st.adminPort)
			}
		}
	}
}

// checkReplicas: several couriers on one durable share their dedup keys
// (the embedded store would remember each pod's own keys only, and a
// duplicate landing on another pod would reach the app), in a bucket that
// outlives one server.
func checkReplicas(t *testing.T, cfg config.Config, replicas int) {
	t.Helper()
	// Dedup is each subscription's own (COURIER_DEDUP_TTL), the store the
	// process's.
	if replicas <= 1 || !slices.ContainsFunc(cfg.Subscriptions(), func(s config.Subscription) bool { return s.Config.DedupEnabled() }) {
		return
	}
	if cfg.DedupStore != config.DedupShared {
		t.Errorf("%d replicas with COURIER_DEDUP_STORE=%s: each pod would recognise only its own keys; use shared", replicas, cfg.DedupStore)
		return
	}
	if cfg.StreamReplicas < 3 {
		t.Errorf("COURIER_STREAM_REPLICAS=%d: the shared bucket (and the dead letters) would not survive one server down; use 3", cfg.StreamReplicas)
	}
}

// checkScaledObject: a KEDA ScaledObject scales a Deployment of the
// manifests on the very consumers its courier consumes (one trigger for
// each subscription), with a lag threshold above what one courier pulls
// ahead (which KEDA counts as lag: ack pending), and any count above one
// only with shared keys.
func checkScaledObject(t *testing.T, so object, configs map[string]config.Config) {
	ref := asMap(t, dig(so.doc, "spec", "scaleTargetRef"), "spec.scaleTargetRef")
	if kind := str(ref["kind"]); kind != "" && kind != "Deployment" {
		t.Fatalf("scaleTargetRef.kind %s: the example scales a Deployment", kind)
	}
	cfg, ok := configs[str(ref["name"])]
	if !ok {
		t.Fatalf("scaleTargetRef.name %q is no Deployment with courier among the manifests", str(ref["name"]))
	}
	minR, maxR := 0, 100 // KEDA's defaults
	if v, ok := dig(so.doc, "spec", "minReplicaCount").(int); ok {
		minR = v
	}
	if v, ok := dig(so.doc, "spec", "maxReplicaCount").(int); ok {
		maxR = v
	}
	if minR > maxR {
		t.Errorf("minReplicaCount %d > maxReplicaCount %d", minR, maxR)
	}
	checkReplicas(t, cfg, maxR)
	subs := map[string]config.Config{} // by stream/consumer
	for _, sub := range cfg.Subscriptions() {
		subs[sub.Config.Stream+"/"+sub.Config.Consumer] = sub.Config
	}
	triggered := map[string]bool{}
	found := false
	for i, tr := range asList(t, dig(so.doc, "spec", "triggers"), "spec.triggers") {
		tr := asMap(t, tr, fmt.Sprintf("triggers[%d]", i))
		if str(tr["type"]) != "nats-jetstream" {
			continue
		}
		found = true
		md := asMap(t, tr["metadata"], "nats-jetstream metadata")
		for k, v := range md {
			if _, ok := v.(string); !ok {
				t.Errorf("metadata.%s is %T, not a string: quote it", k, v)
			}
		}
		for _, k := range []string{"natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold"} {
			if str(md[k]) == "" {
				t.Errorf("nats-jetstream trigger without %s", k)
			}
		}
		if _, _, err := net.SplitHostPort(str(md["natsServerMonitoringEndpoint"])); err != nil {
			t.Errorf("natsServerMonitoringEndpoint %q is not host:port (KEDA adds the scheme and /jsz): %v", str(md["natsServerMonitoringEndpoint"]), err)
		}
		durable := str(md["stream"]) + "/" + str(md["consumer"])
		cfg, ok := subs[durable]
		if !ok {
			t.Errorf("trigger on %s, but courier consumes %v", durable, slices.Sorted(maps.Keys(subs)))
			continue
		}
		triggered[durable] = true
		lag, err := strconv.Atoi(str(md["lagThreshold"]))
		if err != nil || lag <= 0 {
			t.Errorf("lagThreshold %q is not a positive integer", str(md["lagThreshold"]))
		}
		// What one courier pulls ahead of its workers (proxy's fetch
		// queue), counted by KEDA as ack pending.
		readAhead := max(8*cfg.MaxInflight, 64) + cfg.MaxInflight
		if lag < 2*readAhead {
			t.Errorf("lagThreshold %d is not well above the %d messages one courier holds ahead of its workers (COURIER_MAX_INFLIGHT %d): a busy pod's read-ahead alone would look like backlog", lag, readAhead, cfg.MaxInflight)
		}
	}
	if !found {
		t.Error("no nats-jetstream trigger")
	}
	for durable := range subs {
		if found && !triggered[durable] {
			t.Errorf("no trigger on %s, which courier consumes: its backlog would not scale the Deployment", durable)
		}
	}
}

// loadManifests reads every YAML file beside this test.
func loadManifests(t *testing.T) []object {
	t.Helper()
	files, err := filepath.Glob("*.y*ml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no manifests")
	}
	var objs []object
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs, err := parseYAML(string(b))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for i, d := range docs {
			m, ok := d.(map[string]any)
			if !ok {
				t.Fatalf("%s: document %d is not a mapping", f, i+1)
			}
			o := object{file: f, doc: m}
			if str(m["apiVersion"]) == "" || o.kind() == "" || o.name() == "" {
				t.Fatalf("%s: document %d lacks apiVersion, kind or metadata.name", f, i+1)
			}
			objs = append(objs, o)
		}
	}
	return objs
}

// checkStringValues: a ConfigMap's or Secret's values must be strings; an
// unquoted 5 or true is refused by the API server.
func checkStringValues(t *testing.T, o object, field string) {
	t.Helper()
	m, _ := o.doc[field].(map[string]any)
	for k, v := range m {
		if _, ok := v.(string); !ok {
			t.Errorf("%s: %s %s: %s.%s is %T, not a string: quote it", o.file, o.kind(), o.name(), field, k, v)
		}
	}
}

func checkSelector(t *testing.T, o object) {
	t.Helper()
	sel, _ := dig(o.doc, "spec", "selector", "matchLabels").(map[string]any)
	labels, _ := dig(o.doc, "spec", "template", "metadata", "labels").(map[string]any)
	if len(sel) == 0 {
		t.Error("spec.selector.matchLabels is empty")
	}
	for k, v := range sel {
		if labels[k] != v {
			t.Errorf("selector %s=%v does not match the pod template's labels", k, v)
		}
	}
}

// findCourier returns courier's container, and whether it is a native
// sidecar (an init container that keeps running).
func findCourier(t *testing.T, pod map[string]any) (map[string]any, bool) {
	t.Helper()
	for _, field := range []string{"initContainers", "containers"} {
		for i, c := range asList(t, pod[field], field) {
			cm := asMap(t, c, fmt.Sprintf("%s[%d]", field, i))
			if str(cm["name"]) == "courier" || strings.Contains(str(cm["image"]), "/courier:") {
				return cm, field == "initContainers" && str(cm["restartPolicy"]) == "Always"
			}
		}
	}
	return nil, false
}

// podEnv is courier's container in one pod template, with the files its
// volumes would hold written under root.
type podEnv struct {
	t    *testing.T
	objs map[string]map[string]object
	pod  map[string]any
	c    map[string]any
	root string
}

// environ is courier's environment as Kubernetes would set it: the image's
// ENV, then envFrom, then env; files mounted from Secrets and ConfigMaps
// written under root, and every path into a volume moved there too.
func (k *podEnv) environ() map[string]string {
	t := k.t
	env := dockerfileEnv(t, "../../Dockerfile")
	for i, ef := range asList(t, k.c["envFrom"], "envFrom") {
		ef := asMap(t, ef, fmt.Sprintf("envFrom[%d]", i))
		prefix := str(ef["prefix"])
		for _, kind := range []string{"ConfigMap", "Secret"} {
			ref, ok := ef[strings.ToLower(kind[:1])+kind[1:]+"Ref"].(map[string]any)
			if !ok {
				continue
			}
			for key, v := range k.data(kind, str(ref["name"])) {
				env[prefix+key] = v
			}
		}
	}
	for i, e := range asList(t, k.c["env"], "env") {
		e := asMap(t, e, fmt.Sprintf("env[%d]", i))
		name := str(e["name"])
		if v, ok := e["value"]; ok {
			s, isStr := v.(string)
			if !isStr {
				t.Errorf("env %s: value is %T, not a string: quote it", name, v)
			}
			env[name] = s
			continue
		}
		from := asMap(t, e["valueFrom"], "env "+name+".valueFrom")
		if ref, ok := from["resourceFieldRef"].(map[string]any); ok {
			// limits.memory → the container's resources.limits.memory.
			kind, res, _ := strings.Cut(str(ref["resource"]), ".")
			res2 := asMap(t, k.c["resources"], "resources")
			if _, set := asMap(t, res2[kind], "resources."+kind)[res]; !set {
				t.Errorf("env %s: refers to %s, which the container does not set", name, str(ref["resource"]))
			}
			continue
		}
		for _, kind := range []string{"ConfigMap", "Secret"} {
			if ref, ok := from[strings.ToLower(kind[:1])+kind[1:]+"KeyRef"].(map[string]any); ok {
				v, found := k.data(kind, str(ref["name"]))[str(ref["key"])]
				if !found {
					t.Errorf("env %s: %s %s has no key %q", name, kind, str(ref["name"]), str(ref["key"]))
				}
				env[name] = v
			}
		}
	}

	// Paths: the root filesystem is read-only, so whatever courier reads
	// or writes must be on a volume.
	for _, name := range []string{"NATS_CREDS", "NATS_NKEY", "NATS_CA", "NATS_CERT", "NATS_KEY", "COURIER_DEDUP_DIR",
		"COURIER_SIGNING_SECRETS_FILE", "COURIER_APP_TOKEN_FILE"} {
		p, ok := env[name]
		if !ok || p == "" {
			continue
		}
		m := k.mountFor(p)
		if m == nil {
			t.Errorf("%s=%s is on no volume of the courier container", name, p)
			continue
		}
		env[name] = filepath.Join(k.root, p)
	}
	return env
}

// data returns a ConfigMap's or Secret's keys and values.
func (k *podEnv) data(kind, name string) map[string]string {
	o, ok := k.objs[kind][name]
	if !ok {
		k.t.Fatalf("%s %q is referenced but not among the manifests", kind, name)
	}
	out := map[string]string{}
	if m, ok := o.doc["data"].(map[string]any); ok {
		for key, v := range m {
			s := str(v)
			if kind == "Secret" {
				b, err := base64.StdEncoding.DecodeString(s)
				if err != nil {
					k.t.Errorf("Secret %s: data.%s is not base64", name, key)
				}
				s = string(b)
			}
			out[key] = s
		}
	}
	if m, ok := o.doc["stringData"].(map[string]any); ok {
		for key, v := range m {
			out[key] = str(v)
		}
	}
	return out
}

// mountFor returns the volume mount under which path lies (the deepest),
// after writing the volume's files under root.
func (k *podEnv) mountFor(path string) map[string]any {
	t := k.t
	var best map[string]any
	for i, vm := range asList(t, k.c["volumeMounts"], "volumeMounts") {
		vm := asMap(t, vm, fmt.Sprintf("volumeMounts[%d]", i))
		mp := filepath.Clean(str(vm["mountPath"]))
		if path != mp && !strings.HasPrefix(path, mp+"/") {
			continue
		}
		if best == nil || len(mp) > len(str(best["mountPath"])) {
			best = vm
		}
	}
	if best == nil {
		return nil
	}
	vol := k.volume(str(best["name"]))
	dir := filepath.Join(k.root, str(best["mountPath"]))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"Secret", "ConfigMap"} {
		src, ok := vol[strings.ToLower(kind[:1])+kind[1:]].(map[string]any)
		if !ok {
			continue
		}
		name := str(src["secretName"])
		if kind == "ConfigMap" {
			name = str(src["name"])
		}
		files := k.data(kind, name)
		if items, ok := src["items"].([]any); ok {
			selected := map[string]string{}
			for _, it := range items {
				it := asMap(t, it, "items")
				selected[str(it["path"])] = files[str(it["key"])]
			}
			files = selected
		}
		for f, content := range files {
			p := filepath.Join(dir, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return best
}

func (k *podEnv) volume(name string) map[string]any {
	for i, v := range asList(k.t, k.pod["volumes"], "volumes") {
		v := asMap(k.t, v, fmt.Sprintf("volumes[%d]", i))
		if str(v["name"]) == name {
			return v
		}
	}
	k.t.Fatalf("volume %q is mounted but not declared", name)
	return nil
}

// checkProbes: start-up and liveness on /healthz, on the admin port, which
// the kubelet can reach (not loopback); no readiness probe on /readyz: in a
// native sidecar courier's readiness decides the whole Pod's, so a NATS or
// app outage would take the app out of its Service
// (docs/behaviour.md#liveness-is-not-readiness).
func (k *podEnv) checkProbes(cfg config.Config) {
	t := k.t
	host, port, err := net.SplitHostPort(cfg.AdminAddr)
	if err != nil {
		t.Fatalf("COURIER_ADMIN_ADDR %q: %v", cfg.AdminAddr, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		t.Errorf("COURIER_ADMIN_ADDR %q listens on loopback: the kubelet's probes cannot reach it", cfg.AdminAddr)
	}
	adminPort, _ := strconv.Atoi(port)
	ports := map[string]int{}
	exposed := false
	for i, p := range asList(t, k.c["ports"], "ports") {
		p := asMap(t, p, fmt.Sprintf("ports[%d]", i))
		n := num(p["containerPort"])
		if name := str(p["name"]); name != "" {
			ports[name] = n
		}
		exposed = exposed || n == adminPort
	}
	if !exposed {
		t.Errorf("the admin port %d is not among the container's ports", adminPort)
	}
	for _, pr := range []struct {
		field, path string
		required    bool
	}{
		{"livenessProbe", "/healthz", true},
		// The app starts only once the startup probe passes, and
		// /readyz waits for the app's health URL: /healthz, or never.
		{"startupProbe", "/healthz", false},
	} {
		probe, ok := k.c[pr.field].(map[string]any)
		if !ok {
			if pr.required {
				t.Errorf("courier has no %s", pr.field)
			}
			continue
		}
		get, ok := probe["httpGet"].(map[string]any)
		if !ok {
			t.Errorf("%s: want an httpGet probe of %s", pr.field, pr.path)
			continue
		}
		if p := str(get["path"]); p != pr.path {
			t.Errorf("%s: path %q, want %q", pr.field, p, pr.path)
		}
		p := num(get["port"])
		if name, ok := get["port"].(string); ok {
			p = ports[name]
		}
		if p != adminPort {
			t.Errorf("%s: port %v is not COURIER_ADMIN_ADDR's %d", pr.field, get["port"], adminPort)
		}
	}
	if probe, ok := k.c["readinessProbe"].(map[string]any); ok {
		if get, ok := probe["httpGet"].(map[string]any); ok && str(get["path"]) == "/readyz" {
			t.Errorf("readinessProbe on /readyz: in a native sidecar it decides the Pod's readiness, so a NATS or app outage would take the app out of its Service")
		}
	}
}

// checkGrace: the kubelet kills courier terminationGracePeriodSeconds after
// asking the pod to stop; courier needs COURIER_SHUTDOWN_GRACE for in-flight
// requests and then a few seconds to NAK, close the store and drain.
func (k *podEnv) checkGrace(cfg config.Config) {
	grace := 30 * time.Second // Kubernetes' default
	if v, ok := k.pod["terminationGracePeriodSeconds"]; ok {
		grace = time.Duration(num(v)) * time.Second
	}
	const margin = 5 * time.Second
	if grace < cfg.ShutdownGrace+margin {
		k.t.Errorf("terminationGracePeriodSeconds %v leaves less than %v beyond COURIER_SHUTDOWN_GRACE %v", grace, margin, cfg.ShutdownGrace)
	}
}

// checkDedupDir: the store is on a writable volume.
func (k *podEnv) checkDedupDir(cfg config.Config) {
	if !cfg.DedupEnabled() {
		return
	}
	rel, err := filepath.Rel(k.root, cfg.DedupDir)
	if err != nil || strings.HasPrefix(rel, "..") {
		k.t.Errorf("COURIER_DEDUP_DIR %s is not on a volume", cfg.DedupDir)
		return
	}
	m := k.mountFor("/" + rel)
	if m == nil {
		return // reported by environ
	}
	if m["readOnly"] == true {
		k.t.Errorf("COURIER_DEDUP_DIR is on the read-only mount %s", str(m["mountPath"]))
	}
	vol := k.volume(str(m["name"]))
	if _, ok := vol["secret"]; ok {
		k.t.Errorf("COURIER_DEDUP_DIR is on a Secret volume")
	}
	if _, ok := vol["configMap"]; ok {
		k.t.Errorf("COURIER_DEDUP_DIR is on a ConfigMap volume")
	}
}

func (k *podEnv) checkSecurity() {
	t := k.t
	sc, _ := k.c["securityContext"].(map[string]any)
	psc, _ := k.pod["securityContext"].(map[string]any)
	if sc["runAsNonRoot"] != true && psc["runAsNonRoot"] != true {
		t.Error("runAsNonRoot is not set")
	}
	if sc["readOnlyRootFilesystem"] != true {
		t.Error("readOnlyRootFilesystem is not true")
	}
	if sc["allowPrivilegeEscalation"] != false {
		t.Error("allowPrivilegeEscalation is not false")
	}
	drop, _ := dig(sc, "capabilities", "drop").([]any)
	if !slices.Contains(drop, any("ALL")) {
		t.Error("capabilities.drop does not hold ALL")
	}
}

func (k *podEnv) checkResources() {
	for _, f := range []string{"requests", "limits"} {
		if dig(k.c, "resources", f, "memory") == nil {
			k.t.Errorf("resources.%s.memory is not set", f)
		}
	}
}

// dockerfileEnv returns the ENV of the Dockerfile's final stage.
func dockerfileEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) == 0:
		case fields[0] == "FROM":
			clear(env) // a new stage
		case fields[0] == "ENV":
			for _, kv := range fields[1:] {
				name, v, ok := strings.Cut(kv, "=")
				if !ok || strings.ContainsAny(v, `"'$`) {
					t.Fatalf("%s: write ENV as NAME=value (unquoted, no variables): %q", path, sc.Text())
				}
				env[name] = v
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return env
}

// dig follows keys through nested maps; nil if any is missing.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func num(v any) int {
	switch n := v.(type) {
	case int:
		return n
	case int64:
		return int(n)
	}
	return 0
}

func asMap(t *testing.T, v any, what string) map[string]any {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s: want a mapping, got %T", what, v)
	}
	return m
}

func asList(t *testing.T, v any, what string) []any {
	t.Helper()
	if v == nil {
		return nil
	}
	l, ok := v.([]any)
	if !ok {
		t.Fatalf("%s: want a list, got %T", what, v)
	}
	return l
}
