package main

import (
	"context"
	"io"
)

func runCleanup(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	return usageError("cleanup: not yet")
}
