package promcheck

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"testing"
)

// selectorsFile is read by courier's module (cmd/courier/monitoring_test.go).
const selectorsFile = "selectors.json"

var update = flag.Bool("update", false, "rewrite "+selectorsFile+" from the dashboard and the rules")

// TestSelectorsFile: selectors.json holds every vector selector of the
// dashboard and the rules, each with where it is, so that courier's module
// can check them against what a running courier serves without
// Prometheus's parser. Run `go test -run SelectorsFile -update` in this
// directory after changing either file.
func TestSelectorsFile(t *testing.T) {
	var qs []Query
	_, dq, err := CheckDashboard(read(t, dashboardFile))
	if err != nil {
		t.Fatalf("%s:\n%v", dashboardFile, err)
	}
	_, rq, err := CheckRules(read(t, rulesFile))
	if err != nil {
		t.Fatalf("%s:\n%v", rulesFile, err)
	}
	for _, f := range []struct {
		path string
		qs   []Query
	}{{"deploy/grafana/courier.json", dq}, {"deploy/prometheus/courier-rules.yaml", rq}} {
		for _, q := range f.qs {
			q.Where = f.path + ": " + q.Where
			qs = append(qs, q)
		}
	}
	// One selector a line: readable, and a change shows as a diff of lines.
	var b bytes.Buffer
	b.WriteString("[\n")
	n := 0
	for _, q := range qs {
		for _, s := range q.Selectors() {
			if n > 0 {
				b.WriteString(",\n")
			}
			line, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(line)
			n++
		}
	}
	b.WriteString("\n]\n")
	if n < 20 {
		t.Fatalf("only %d selectors in the dashboard and rules", n)
	}
	if *update {
		if err := os.WriteFile(selectorsFile, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if have, _ := os.ReadFile(selectorsFile); !bytes.Equal(have, b.Bytes()) {
		t.Errorf("%s is not what the dashboard and rules select: run `go test -run SelectorsFile -update` in deploy/promcheck", selectorsFile)
	}
}
