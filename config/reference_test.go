package config

import (
	"bytes"
	"flag"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "write docs/configuration.md from the package")

const referencePath = "../docs/configuration.md"

// TestConfigurationDoc: docs/configuration.md is what WriteReference
// writes, so that it lists every variable as the code reads it. Run `go
// generate ./config/` (or this test with -update) after changing a
// variable.
func TestConfigurationDoc(t *testing.T) {
	var want bytes.Buffer
	if err := WriteReference(&want); err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(referencePath, want.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(referencePath)
	if err != nil {
		t.Fatalf("%v: run `go generate ./config/`", err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Errorf("docs/configuration.md is out of date: run `go generate ./config/` (the first difference is at line %d)", firstDiffLine(string(got), want.String()))
	}
}

func firstDiffLine(a, b string) int {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}

// TestReferenceCoversVariables: every variable has its row, once, saying
// whether it is per subscription; a row per variable means what Variables
// says.
func TestReferenceCoversVariables(t *testing.T) {
	var doc bytes.Buffer
	if err := WriteReference(&doc); err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for line := range strings.Lines(doc.String()) {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.TrimSpace(line), " | ")
		name := strings.Trim(strings.TrimPrefix(cells[0], "| "), "`")
		if _, dup := rows[name]; dup {
			t.Errorf("%s has two rows", name)
		}
		rows[name] = strings.TrimSuffix(cells[len(cells)-1], " |")
	}
	vars := Variables()
	if len(rows) != len(vars) {
		t.Errorf("%d rows, %d variables", len(rows), len(vars))
	}
	perSub := 0
	for _, v := range vars {
		want := "no"
		if v.PerSubscription {
			want, perSub = "yes", perSub+1
		}
		if rows[v.Name] != want {
			t.Errorf("%s: per subscription %q, want %q", v.Name, rows[v.Name], want)
		}
	}
	// The variables of one message's path, as the contract lists them.
	if perSub != 32 {
		t.Errorf("%d variables per subscription, want 32", perSub)
	}
}

func TestMarkdownText(t *testing.T) {
	for in, want := range map[string]string{
		"a COURIER_APP_URL's origin":              "a `COURIER_APP_URL`'s origin",
		"set by COURIER_SUB_<NAME>_<VAR> (x)":     "set by `COURIER_SUB_<NAME>_<VAR>` (x)",
		"(COURIER_STREAM_REPLICAS replicas)":      "(`COURIER_STREAM_REPLICAS` replicas)",
		"as ce-* headers; <token> | a_b":          `as ce-\* headers; &lt;token&gt; \| a\_b`,
		"request → POST → reply, NATS_URL.":       "request → POST → reply, `NATS_URL`.",
		"orders.> and OTEL_EXPORTER_OTLP_HEADERS": "orders.&gt; and `OTEL_EXPORTER_OTLP_HEADERS`",
		"with COURIER_ORDER_KEY=subject:N: parts": "with `COURIER_ORDER_KEY=subject:N`: parts",
	} {
		if got := markdownText(in); got != want {
			t.Errorf("markdownText(%q) = %q, want %q", in, got, want)
		}
	}
}
