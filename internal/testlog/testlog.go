// Package testlog holds what courier's tests use to capture logs.
package testlog

import (
	"strings"
	"sync"
)

// Buffer collects what is written to it, safely from many goroutines (a
// slog handler's, the code under test's), for a test to read with String.
// The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
