// Package deploy_test checks the deployment files under deploy/ that need
// no package of their own. The monitoring files (grafana/, prometheus/)
// are checked by deploy/promcheck, a module of its own, and against a
// running courier by cmd/courier/monitoring_test.go.
package deploy_test

import (
	"os"
	"testing"
)

// read returns the content of path, failing t if it cannot be read.
func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
