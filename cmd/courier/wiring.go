package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/config"
	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/verdict"
)

// deadLetters adapts the dlq publisher to the delivery loop's DeadLetterer.
type deadLetters struct{ p *dlq.Publisher }

func (d *deadLetters) DeadLetter(ctx context.Context, l dlq.Letter) error {
	_, err := d.p.Publish(ctx, l)
	return err
}

// seenChecker gives a store that answers only Seen the delivery loop's
// Check and Release (it holds no claims).
type seenChecker struct {
	s interface {
		Seen(ctx context.Context, key string) (bool, error)
		Record(ctx context.Context, keys ...string) error
	}
}

func (c seenChecker) Check(ctx context.Context, key string) (verdict.Verdict, error) {
	seen, err := c.s.Seen(ctx, key)
	if seen {
		return verdict.Processed, err
	}
	return verdict.New, err
}

func (c seenChecker) Record(ctx context.Context, keys ...string) error {
	return c.s.Record(ctx, keys...)
}
func (c seenChecker) Release(context.Context, string) error { return nil }

// ensureDLQ makes sure a stream keeps what is published to the DLQ subject,
// and that it is not the stream courier consumes (it would consume its own
// dead letters).
func ensureDLQ(ctx context.Context, js jetstream.JetStream, cfg config.Config, stream jetstream.Stream, log *slog.Logger) error {
	src := stream.CachedInfo().Config
	if len(cfg.Subjects) == 0 {
		for _, s := range src.Subjects {
			if config.SubjectMatches(s, cfg.DLQSubject) {
				return fmt.Errorf("dead-letter subject %q is captured by stream %q, which courier consumes: courier would consume its own dead letters; set COURIER_DLQ_SUBJECT to a subject outside the stream, or COURIER_SUBJECTS to filter it out", cfg.DLQSubject, cfg.Stream)
			}
		}
	}
	info, created, err := dlq.EnsureStream(ctx, js, cfg.DLQSubject, cfg.StreamReplicas)
	if err != nil {
		if transientSetupError(err) {
			return err
		}
		return fmt.Errorf("dead letters cannot be kept: %w", err)
	}
	if info.Config.Name == cfg.Stream && len(cfg.Subjects) == 0 {
		return fmt.Errorf("dead-letter subject %q is captured by stream %q, which courier consumes; set COURIER_DLQ_SUBJECT to a subject outside it", cfg.DLQSubject, cfg.Stream)
	}
	if created {
		log.Info("created dead-letter stream", "stream", info.Config.Name, "subject", cfg.DLQSubject,
			"replicas", info.Config.Replicas)
	} else {
		warnings, _ := dlq.CheckStream(info.Config)
		for _, w := range warnings {
			log.Warn("dead-letter stream may not keep every dead letter", "stream", info.Config.Name, "warning", w)
		}
	}
	return nil
}

// registerBuildInfo exposes courier_build_info{version,commit,goversion} 1.
func registerBuildInfo(reg prometheus.Registerer) {
	v, c, g := buildInfo()
	bi := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "courier_build_info",
		Help:        "courier's version, commit and Go version; always 1.",
		ConstLabels: prometheus.Labels{"version": v, "commit": c, "goversion": g},
	})
	bi.Set(1)
	reg.MustRegister(bi)
}
