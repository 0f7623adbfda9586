package proxy

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Logs at the default level carry no line per successful message: instead,
// the runner logs a summary of counts every SummaryInterval in which there
// was traffic, and once more when it stops.

// counts are the outcomes the summary reports.
type counts struct {
	delivered, duplicate, retried, deadLettered, released float64
}

func (m *metrics) counts() counts {
	return counts{
		delivered: value(m.ended[endSucceeded]), duplicate: value(m.ended[endDuplicate]), retried: value(m.ended[endRetry]),
		deadLettered: value(m.ended[endDeadLetter]), released: value(m.ended[endGiveBack]),
	}
}

func value(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// summarize logs m's counts since the last summary, and the messages held
// (held), every interval in which something happened, until ctx ends, then
// once more if anything did.
func summarize(ctx context.Context, m *metrics, log *slog.Logger, every time.Duration, held func() float64) {
	last := m.counts()
	logSince := func(final bool) {
		now := m.counts()
		d := counts{
			delivered: now.delivered - last.delivered, duplicate: now.duplicate - last.duplicate,
			retried: now.retried - last.retried, deadLettered: now.deadLettered - last.deadLettered,
			released: now.released - last.released,
		}
		if d == (counts{}) && !final {
			return
		}
		last = now
		attrs := []any{"delivered", d.delivered, "duplicates", d.duplicate, "retried", d.retried,
			"dead_lettered", d.deadLettered, "given_back", d.released, "held", held()}
		if final {
			log.Info("summary at shutdown (since the last summary)", attrs...)
			return
		}
		log.Info("summary", append(attrs, "interval", every.String())...)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			logSince(true)
			return
		case <-t.C:
			logSince(false)
		}
	}
}
