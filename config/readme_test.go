package config

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestREADMEVariables: the README's tables of variables name no variable
// that `courier config` does not describe, and state the same defaults, so
// that the README cannot drift from the code. Every variable is in
// docs/configuration.md, generated from the code (TestConfigurationDoc);
// the README may show a few.
func TestREADMEVariables(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defaults := map[string]string{}
	for _, v := range Describe(Config{}) {
		defaults[v.Name] = v.Default
	}
	name := regexp.MustCompile("`([A-Z][A-Z0-9_]*)`")
	norm := func(s string) string { return strings.TrimSpace(strings.ReplaceAll(s, "`", "")) }

	seen := map[string]bool{}
	for line := range strings.Lines(string(readme)) {
		cells := strings.Split(strings.TrimSpace(line), "|")
		// | `VAR`[, `VAR2`...] | meaning | default |
		if len(cells) != 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		first := strings.TrimSpace(cells[1])
		if strings.Contains(first, "*") {
			continue // `OTEL_*`: a pointer to the Tracing table
		}
		var vars []string
		for _, m := range name.FindAllStringSubmatch(first, -1) {
			vars = append(vars, m[1])
		}
		if len(vars) == 0 || !strings.HasPrefix(vars[0], "COURIER_") && !strings.HasPrefix(vars[0], "NATS_") && !strings.HasPrefix(vars[0], "OTEL_") {
			continue
		}
		def := strings.TrimSpace(cells[3])
		// One default per variable, separated as the row separates
		// them, or one for all.
		parts := []string{def}
		for _, sep := range []string{"; ", ", "} {
			if p := strings.Split(def, sep); len(vars) > 1 && len(p) == len(vars) {
				parts = p
				break
			}
		}
		for i, v := range vars {
			want, ok := defaults[v]
			if !ok {
				t.Errorf("README names %s, which courier does not read (`courier config` does not list it)", v)
				continue
			}
			seen[v] = true
			got := norm(parts[min(i, len(parts)-1)])
			switch {
			case strings.HasPrefix(want, "required") && strings.HasPrefix(got, "required"):
			case slices.Contains(vars, want): // a default that names another variable of the row
			case got == norm(want) || strings.HasPrefix(got, norm(want)+" "):
			default:
				t.Errorf("README: %s defaults to %q; courier config says %q", v, got, want)
			}
		}
	}
	if len(seen) == 0 {
		t.Log("the README has no table of variables")
	}
}
