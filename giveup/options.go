package giveup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Options configures a Catcher. Zero values take the documented defaults;
// negative durations or counts are refused by New.
type Options struct {
	// Replicas is the replica count of the advisory stream, when courier
	// creates it (COURIER_STREAM_REPLICAS). Default 1.
	Replicas int
	// MaxAge bounds how long the advisory stream courier creates keeps
	// advisories. Default DefaultMaxAge (7 days).
	MaxAge time.Duration
	// AckWait is the ack wait of the durable consumer on the advisory
	// stream: how long an advisory whose handler vanished waits before
	// another replica gets it. Default 30s.
	AckWait time.Duration
	// RetryInitial and RetryMax bound the delay before an advisory whose
	// dead letter could not be stored is handled again; the delay doubles
	// with each try. Defaults 1s and 1m (RetryInitial when larger); a
	// RetryMax below RetryInitial is refused.
	RetryInitial, RetryMax time.Duration
	// StepTimeout bounds each request to JetStream while an advisory is
	// handled. Default 10s.
	StepTimeout time.Duration
	// Logger receives logs, narrowed with component=giveup; default
	// discards.
	Logger *slog.Logger
	// Registerer receives the metrics; default a private registry.
	Registerer prometheus.Registerer
	// Now is the clock; default time.Now.
	Now func() time.Time
	// OnDeadLetter, when set, is called once for each dead letter the
	// Catcher stores (not for one already stored), so it can be counted
	// with the others.
	OnDeadLetter func()
	// ReferenceStored, when set, reports whether the message at seq of the
	// stream is the original of a reference dead letter the delivery loop
	// stored and left in its stream (proxy.Runner.ReferenceStored). An
	// advisory for such a message is settled as a duplicate: no second
	// dead letter is stored (past the DLQ's duplicate window, the
	// Nats-Msg-Id would no longer stop one) and the original stays where
	// replay reads it. An error means it cannot tell: the advisory is
	// handled again later. Nil: only the DLQ's duplicate window guards. It
	// must be safe for concurrent use.
	ReferenceStored func(ctx context.Context, seq uint64) (bool, error)
	// Delivering, when set, reports whether the delivery loop is still
	// delivering the message at seq of the stream
	// (proxy.Runner.Delivering): it has it in progress, or awaits it as
	// its key's head. The server has not given up on such a message (not
	// yet, or the advisory is not the server's): its advisory is handled
	// again later, and checked anew then. Nil: not asked. It must be quick
	// and safe for concurrent use.
	Delivering func(seq uint64) bool
	// Dedup, when set, is the delivery loop's dedup store (COURIER_DEDUP),
	// read without claiming: a message whose idempotency key is recorded
	// there was processed, and gets no dead letter; one whose key another
	// delivery claims (the shared store) is handled again later. Nil
	// (dedup off): not asked.
	Dedup Dedup
	// IdempotencyHeader is the header the delivery loop takes a message's
	// idempotency key from (COURIER_IDEMPOTENCY_HEADER), as
	// proxy.ResolveKey does; Dedup is asked of that key.
	IdempotencyHeader string
	// Origin, when set, says that the stream is the partitions' work
	// stream (COURIER_ORDER_PARTITIONS), whose messages copy those of
	// another (package partition): New is then given AllConsumers, each
	// dead letter names the message copied (its Nats-Stream-Source
	// header), as the delivery loop's do, and ReferenceStored and Dedup
	// are asked of it (Delivering of the copy's sequence, which the
	// delivery loop reads). The copy is removed once its dead letter is stored,
	// even one that refers to the original for its body: the original is
	// in its own stream.
	Origin *Origin
}

// Origin is the stream a work stream copies, and the durable it stands
// for.
type Origin struct {
	// Stream is the copied stream's info: its name and creation time (part
	// of every dead letter's Nats-Msg-Id).
	Stream *jetstream.StreamInfo
	// Consumer is the durable's name (COURIER_CONSUMER), the dead letters'
	// consumer.
	Consumer string
}

// defaults fills the zero values of o with the defaults. A negative value,
// or a RetryMax set below RetryInitial, is an error naming the field: it is
// a mistake to report, not to replace silently.
func (o *Options) defaults() error {
	var problems []string
	for _, f := range []struct {
		name string
		neg  bool
	}{
		{"Replicas", o.Replicas < 0},
		{"MaxAge", o.MaxAge < 0},
		{"AckWait", o.AckWait < 0},
		{"RetryInitial", o.RetryInitial < 0},
		{"RetryMax", o.RetryMax < 0},
		{"StepTimeout", o.StepTimeout < 0},
	} {
		if f.neg {
			problems = append(problems, "Options."+f.name+" must not be negative (0 takes the default)")
		}
	}
	if o.RetryMax > 0 && o.RetryInitial > 0 && o.RetryMax < o.RetryInitial {
		problems = append(problems, fmt.Sprintf("Options.RetryMax (%s) must not be less than Options.RetryInitial (%s)", o.RetryMax, o.RetryInitial))
	}
	if len(problems) > 0 {
		return errors.New("giveup: " + strings.Join(problems, "; "))
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.MaxAge == 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.AckWait == 0 {
		o.AckWait = 30 * time.Second
	}
	if o.RetryInitial == 0 {
		o.RetryInitial = time.Second
	}
	if o.RetryMax == 0 {
		o.RetryMax = max(time.Minute, o.RetryInitial)
	}
	if o.StepTimeout == 0 {
		o.StepTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}
