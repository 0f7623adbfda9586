//go:build !nodemo

package main

import (
	"context"
	"errors"
	"io"

	"github.com/courierhq/courier/demo"
)

// runDemo runs the self-contained demo. It links an embedded nats-server
// into the binary; production builds leave it out with -tags nodemo (see the
// Dockerfile), which saves about 9 MB of binary (19 MB instead of 28 MB) and
// 3 MiB of resident memory.
func runDemo(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		return usageError("demo takes no arguments")
	}
	err := demo.Run(ctx, func(ctx context.Context, environ []string) error {
		return runSidecar(ctx, environ, stderr)
	}, demo.Options{Out: stdout, Environ: environ})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
