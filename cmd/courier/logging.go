package main

import (
	"io"
	"log/slog"
	"os"

	"github.com/lmittmann/tint"

	"github.com/courierhq/courier/config"
)

// newLogger picks tint text on a terminal and JSON otherwise, unless
// COURIER_LOG_FORMAT says.
func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	level := cfg.SlogLevel()
	format := cfg.LogFormat
	if format == "" {
		format = "json"
		if isTerminal(w) {
			format = "text"
		}
	}
	if format == "text" {
		return slog.New(tint.NewTextHandler(w, &tint.Options{Level: level, TimeFormat: "15:04:05.000", NoColor: !isTerminal(w)}))
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

func isTerminal(f any) bool {
	file, ok := f.(*os.File)
	if !ok {
		return false
	}
	st, err := file.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
