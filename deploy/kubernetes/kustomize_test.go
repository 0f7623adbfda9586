package kubernetes_test

import (
	"os"
	"os/exec"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestKustomizeComponent renders deploy/kustomize/example, an overlay adding
// courier to a plain Deployment with the deploy/kustomize/courier component,
// and deploy/kustomize/shipping, that overlay with two subscriptions, with
// kubectl's kustomize, and puts the result through the checks the manifests
// of this directory pass.
func TestKustomizeComponent(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skipf("kubectl is not on PATH (%v): deploy/kustomize is not rendered; install kubectl 1.27 or later to check it", err)
	}
	render := func(t *testing.T, dir string) (checked, []object) {
		t.Helper()
		out, err := exec.CommandContext(t.Context(), kubectl, "kustomize", dir).Output()
		if err != nil {
			msg := ""
			if ee, ok := err.(*exec.ExitError); ok {
				msg = string(ee.Stderr)
			}
			t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, msg)
		}
		objs := renderedObjects(t, "kubectl kustomize", string(out))
		got := checkManifests(t, withSecrets(objs, "courier-nats"))
		if len(got.configs) != 1 {
			t.Fatalf("%d Deployments with courier, want the example's one", len(got.configs))
		}
		return got, objs
	}

	t.Run("example", func(t *testing.T) {
		got, objs := render(t, "../kustomize/example")
		// The overlay's images: pins the component's own tag, which is the
		// chart's release.
		checkImage(t, objs, "ghcr.io/courierhq/courier:"+chartAppVersion(t))
		checkComponentImage(t)
		cfg := got.configs["orders"]
		if cfg.Stream != "ORDERS" || cfg.AppURL != "http://127.0.0.1:8080/messages" {
			t.Errorf("courier reads COURIER_STREAM %q, COURIER_APP_URL %q: the overlay's ConfigMap did not reach it", cfg.Stream, cfg.AppURL)
		}
	})

	t.Run("two subscriptions", func(t *testing.T) {
		got, _ := render(t, "../kustomize/shipping")
		subs := got.configs["orders"].Subscriptions()
		checkShipping(t, subs)
	})
}

// checkComponentImage: the component's own image (used by an overlay
// without images:) is the chart's release too.
func checkComponentImage(t *testing.T) {
	t.Helper()
	var patch map[string]any
	b, err := os.ReadFile("../kustomize/courier/sidecar.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &patch); err != nil {
		t.Fatalf("sidecar.yaml: %v", err)
	}
	c, native := findCourier(t, asMap(t, dig(patch, "spec", "template", "spec"), "sidecar.yaml's pod spec"))
	if c == nil || !native {
		t.Fatal("sidecar.yaml: no courier among initContainers with restartPolicy: Always")
	}
	if want := "ghcr.io/courierhq/courier:" + chartAppVersion(t); str(c["image"]) != want {
		t.Errorf("sidecar.yaml: image %q, want %q (deploy/helm/courier's appVersion)", str(c["image"]), want)
	}
}
