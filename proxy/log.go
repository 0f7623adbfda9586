package proxy

import (
	"context"
	"log/slog"
)

// msgLog logs about one message. Its attributes are added only to lines that
// are written: a Logger.With per message costs CPU even when nothing is.
type msgLog struct {
	l       *slog.Logger
	subject string
	seq     uint64
	key     string
	attempt int
}

// enabled reports whether lines at level are written: a caller checks it
// first where building a line's values costs allocations per message.
func (ml *msgLog) enabled(level slog.Level) bool {
	return ml.l != nil && ml.l.Enabled(context.Background(), level)
}

func (ml *msgLog) log(level slog.Level, msg string, args ...any) {
	if !ml.enabled(level) {
		return
	}
	ctx := context.Background()
	ml.l.Log(ctx, level, msg, append([]any{"subject", ml.subject, "seq", ml.seq, "key", ml.key, "attempt", ml.attempt}, args...)...)
}

func (ml *msgLog) Debug(msg string, args ...any) { ml.log(slog.LevelDebug, msg, args...) }
func (ml *msgLog) Info(msg string, args ...any)  { ml.log(slog.LevelInfo, msg, args...) }
func (ml *msgLog) Warn(msg string, args ...any)  { ml.log(slog.LevelWarn, msg, args...) }
func (ml *msgLog) Error(msg string, args ...any) { ml.log(slog.LevelError, msg, args...) }
