package appauth

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"sync/atomic"
)

// maxFile bounds what is read of a watched file: a secrets or token file is
// a few lines; anything larger is the wrong file.
const maxFile = 64 << 10

// watched is one file and the last good value parsed from it. The file is
// read whole on every poll rather than when its modification time changes:
// a Kubernetes Secret volume swaps a symlink, an editor may keep the size
// and the second, and only reading tells that a file became unreadable.
// value is read by any goroutine; the rest belongs to the one that polls.
type watched[T any] struct {
	name, path, what string // the variable, its file, what it holds (for logs)
	parse            func([]byte) (T, error)
	summary          func(T) []any // log attributes that say what was read, never the value
	log              *slog.Logger

	value   atomic.Pointer[T]
	raw     []byte // the content value was parsed from
	failing bool   // the last poll could not use the file: it was said once
}

// watch reads and parses the file at path once; an error is Open's.
func watch[T any](name, path, what string, parse func([]byte) (T, error), summary func(T) []any, log *slog.Logger) (*watched[T], error) {
	w := &watched[T]{name: name, path: path, what: what, parse: parse, summary: summary, log: log}
	b, err := readFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s=%s: %w", name, path, err)
	}
	v, err := parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s=%s: %w", name, path, err)
	}
	w.value.Store(&v)
	w.raw = b
	return w, nil
}

// poll reads the file again: a changed, valid content replaces the value;
// a file that cannot be read or parsed keeps the last good value, and is
// logged once per failure episode (not once per poll), as is its return.
func (w *watched[T]) poll() {
	b, err := readFile(w.path)
	if err == nil && bytes.Equal(b, w.raw) {
		if w.failing {
			w.failing = false
			w.log.Info(w.name+" usable again, unchanged", "file", w.path)
		}
		return
	}
	var v T
	if err == nil {
		v, err = w.parse(b)
	}
	if err != nil {
		if !w.failing {
			w.failing = true
			w.log.Warn(w.name+" cannot be used; keeping the last good "+w.what+" until it can",
				"file", w.path, "error", err.Error())
		}
		return
	}
	w.value.Store(&v)
	w.raw = b
	w.failing = false
	attrs := []any{"file", w.path}
	if w.summary != nil {
		attrs = append(attrs, w.summary(v)...)
	}
	w.log.Info(w.name+" changed: "+w.what+" re-read", attrs...)
}

// readFile reads a watched file whole, refusing a directory or one larger
// than maxFile. Its errors name the problem, not the path (the caller
// names the variable and the path).
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read the file: %w", pathless(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("cannot read the file: %w", pathless(err))
	}
	if fi.IsDir() {
		return nil, errors.New("is a directory, not a file")
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read the file: %w", pathless(err))
	}
	if len(b) > maxFile {
		return nil, fmt.Errorf("larger than %d KiB: not a file of secrets or a token", maxFile>>10)
	}
	return b, nil
}

// pathless is err without the path a *fs.PathError repeats.
func pathless(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
