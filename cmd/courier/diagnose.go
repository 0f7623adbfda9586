package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/courierhq/courier/internal/editdist"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/partition"
)

// The commands that run beside a sidecar (status, pause, resume, dlq,
// cleanup) are often run from another shell than the sidecar's, with a
// variable missing or misspelt. When the durable is not where their
// environment says, they say what there is and what to set, rather than
// the server's "consumer not found".

// missingConsumer explains why cfg's durable was not found: the stream is
// missing (the streams there are, closest first), the durable is split
// into partitions the environment does not name, or is not split though
// the environment says so, or another consumer is there. It returns nil
// when it finds nothing to say (the caller keeps its own error).
func missingConsumer(ctx context.Context, js jetstream.JetStream, cfg config.Config) error {
	if err := missingStream(ctx, js, cfg.Stream); err != nil {
		return err
	}
	workName, err := partition.WorkStreamName(ctx, js, cfg.Stream, cfg.Consumer)
	if err != nil {
		return err // both names this durable's work stream may have are other durables'
	}
	work, werr := js.Stream(ctx, workName)
	if werr != nil && !errors.Is(werr, jetstream.ErrStreamNotFound) {
		return nil
	}
	_, cerr := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	switch {
	case !partitioned(cfg) && work != nil:
		info := work.CachedInfo().Config
		n, token, ok := partition.Partitioning(info)
		if !ok {
			return fmt.Errorf("consumer %q of stream %q is split into partitions (work stream %s), which COURIER_ORDER_PARTITIONS does not say: set COURIER_ORDER_KEY and COURIER_ORDER_PARTITIONS as the sidecar has them", cfg.Consumer, cfg.Stream, info.Name)
		}
		return fmt.Errorf("consumer %q of stream %q is split into %d partitions by subject token %d (work stream %s): set COURIER_ORDER_KEY=subject:%d COURIER_ORDER_PARTITIONS=%d, as the sidecar has them",
			cfg.Consumer, cfg.Stream, n, token, info.Name, token, n)
	case partitioned(cfg) && work == nil && cerr == nil:
		return fmt.Errorf("consumer %q of stream %q is not split into partitions (no work stream %s; the durable is on the stream itself): unset COURIER_ORDER_PARTITIONS, as the sidecar has it",
			cfg.Consumer, cfg.Stream, workName)
	case partitioned(cfg) && work == nil:
		return fmt.Errorf("consumer %q of stream %q: its partitions' work stream %s does not exist yet (a courier with COURIER_ORDER_PARTITIONS creates it when it starts)%s",
			cfg.Consumer, cfg.Stream, workName, otherConsumers(ctx, js, cfg))
	case !partitioned(cfg) && errors.Is(cerr, jetstream.ErrConsumerNotFound):
		return fmt.Errorf("consumer %q not found on stream %q%s", cfg.Consumer, cfg.Stream, otherConsumers(ctx, js, cfg))
	}
	return nil
}

// missingStream says, when stream does not exist, which streams there are,
// closest to its name first; nil when it exists (or cannot be told).
func missingStream(ctx context.Context, js jetstream.JetStream, stream string) error {
	_, err := js.Stream(ctx, stream)
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	var names []string
	lister := js.StreamNames(ctx)
	for name := range lister.Name() {
		// Not the streams courier and key-value buckets make beside it.
		if !strings.HasPrefix(name, "KV_") && !strings.HasPrefix(name, "OBJ_") && !strings.HasPrefix(name, "COURIER_") {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("stream %q not found, and there is no stream on this server (for this account): create it, or point NATS_URL at the sidecar's server", stream)
	}
	return fmt.Errorf("stream %q not found (COURIER_STREAM); the streams there are: %s", stream, strings.Join(closest(stream, names, 8), ", "))
}

// otherConsumers names, for an error, the consumers of cfg's stream other
// than courier's own, closest to COURIER_CONSUMER first.
func otherConsumers(ctx context.Context, js jetstream.JetStream, cfg config.Config) string {
	s, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return ""
	}
	var names []string
	lister := s.ConsumerNames(ctx)
	for name := range lister.Name() {
		names = append(names, name)
	}
	if len(names) == 0 {
		return ": the stream has no consumer (no courier has started with this COURIER_STREAM yet)"
	}
	return "; its consumers are: " + strings.Join(closest(cfg.Consumer, names, 8), ", ") + " (COURIER_CONSUMER)"
}

// closest returns at most n of names, the closest to name first: the same
// but for case, then one holding the other, then by edit distance, then in
// name order.
func closest(name string, names []string, n int) []string {
	lower := strings.ToLower(name)
	dist := func(s string) int {
		ls := strings.ToLower(s)
		switch {
		case ls == lower:
			return -2
		case strings.Contains(ls, lower) || strings.Contains(lower, ls):
			return -1
		}
		return editdist.Distance(lower, ls)
	}
	out := slices.Clone(names)
	slices.SortFunc(out, func(a, b string) int {
		return cmp.Or(cmp.Compare(dist(a), dist(b)), strings.Compare(a, b))
	})
	if len(out) > n {
		out = append(out[:n], fmt.Sprintf("… %d more", len(names)-n))
	}
	return out
}
