//go:build nodemo

package main

import (
	"context"
	"io"
)

// runDemo: this build leaves the demo (and the embedded nats-server it needs)
// out.
func runDemo(context.Context, []string, []string, io.Writer, io.Writer) error {
	return usageError("this build of courier has no demo (built with -tags nodemo); run `go run ./cmd/courier demo` from the source")
}
