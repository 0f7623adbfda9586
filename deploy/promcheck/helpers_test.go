package promcheck

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The files checked, from this directory.
const (
	rulesFile      = "../prometheus/courier-rules.yaml"
	ruleCRFile     = "../kubernetes/prometheusrule.yaml"
	dashboardFile  = "../grafana/courier.json"
	operationsFile = "../../docs/operations.md"
	adaptiveFile   = "../../docs/adaptive-concurrency.md"
	runbookPrefix  = "https://github.com/courierhq/courier/blob/main/docs/operations.md#"
)

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// seriesSuffix is what a histogram's or summary's series add to its name.
var seriesSuffix = regexp.MustCompile(`_(bucket|sum|count)$`)

// checkDocumented: every courier_* metric the queries select is in the
// operations guide's metric tables (where cmd/courier/metrics_doc_test.go
// keeps every served metric), or in the guide to the automatic in-flight
// limit, whose metrics it explains.
func checkDocumented(t *testing.T, qs []Query) {
	t.Helper()
	doc := string(read(t, operationsFile)) + string(read(t, adaptiveFile))
	documented := func(name string) bool {
		return strings.Contains(doc, "`"+name+"`") || strings.Contains(doc, "`"+name+"{")
	}
	for _, q := range qs {
		for _, s := range q.Selectors() {
			if !strings.HasPrefix(s.Metric, "courier_") {
				continue
			}
			if !documented(s.Metric) && !documented(seriesSuffix.ReplaceAllString(s.Metric, "")) {
				t.Errorf("%s: %s is not in docs/operations.md", q.Where, s.Metric)
			}
		}
	}
}

// docAnchors returns the GitHub anchors of the operations guide's headings.
func docAnchors(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	for line := range strings.Lines(string(read(t, operationsFile))) {
		h := strings.TrimLeft(line, "#")
		if len(h) == len(line) || !strings.HasPrefix(h, " ") {
			continue
		}
		a := drop.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), "")
		out[strings.ReplaceAll(a, " ", "-")] = true
	}
	return out
}
