package main

import (
	"context"
	"log/slog"
	"strconv"
	"strings"

	"github.com/courierhq/courier/config"
)

// features are the start-up log's line of what this courier does beyond
// delivering one message per request: a reader of the log learns from one
// line which of courier's features are in force, without `courier config`.
// Dedup and the in-flight limit are always named; the others only when on.
func features(cfg config.Config) []slog.Attr {
	var fs []slog.Attr
	add := func(key, value string) { fs = append(fs, slog.String(key, value)) }
	if len(cfg.SubscriptionNames) > 0 {
		// Each subscription's own line follows (logFeatures).
		add("subscriptions", strings.Join(cfg.SubscriptionNames, ","))
	} else if cfg.ConsumesStream() {
		fs = append(fs, pathFeatures(cfg)...)
	}
	return append(fs, processFeatures(cfg)...)
}

// pathFeatures are the features of one subscription's delivery path.
func pathFeatures(cfg config.Config) []slog.Attr {
	var fs []slog.Attr
	add := func(key, value string) { fs = append(fs, slog.String(key, value)) }
	switch {
	case !cfg.DedupEnabled():
		add("dedup", "off")
	case cfg.DedupStore == config.DedupShared:
		add("dedup", "shared (bucket "+cfg.DedupBucket+", "+cfg.DedupTTL.String()+")")
	default:
		add("dedup", "badger ("+cfg.DedupTTL.String()+")")
	}
	add("max_inflight", inflightText(cfg))
	if cfg.OrderKey != "" {
		add("order_key", cfg.OrderKey)
		if partitioned(cfg) {
			add("partitions", strconv.Itoa(cfg.OrderPartitions))
		}
	}
	if cfg.BatchMax > 1 {
		add("batches", "up to "+strconv.Itoa(cfg.BatchMax)+" messages, "+cfg.BatchWait.String()+" wait")
	}
	if cfg.CloudEvents != "" {
		add("cloudevents", cfg.CloudEvents)
	}
	if cfg.SuccessSubject != "" {
		add("success_records", cfg.SuccessSubject)
	}
	if cfg.MaxRate > 0 {
		add("max_rate", strconv.FormatFloat(cfg.MaxRate, 'g', -1, 64)+"/s")
	}
	if len(cfg.Routes) > 0 {
		add("routes", cfg.Routes.String())
	}
	return fs
}

// processFeatures are the features the process has once, whatever its
// subscriptions.
func processFeatures(cfg config.Config) []slog.Attr {
	var fs []slog.Attr
	add := func(key, value string) { fs = append(fs, slog.String(key, value)) }
	if cfg.SigningSecretsFile != "" {
		add("signing", "Standard Webhooks ("+cfg.SigningSecretsFile+")")
	}
	if cfg.AppTokenFile != "" {
		add("token", "bearer ("+cfg.AppTokenFile+")")
	}
	if cfg.ServesPublishes() {
		add("publish_api", cfg.PublishListenAddr()+" ("+strings.Join(cfg.PublishSubjects, ",")+")")
	}
	if cfg.ServesReplies() {
		add("reply", strings.Join(cfg.ReplySubjects, ","))
	}
	if cfg.TracingEnabled() {
		add("tracing", cfg.TracesProtocol())
	}
	return fs
}

// logFeatures logs features as one line, and with several subscriptions
// one line more for each.
func logFeatures(log *slog.Logger, cfg config.Config) {
	log.LogAttrs(context.Background(), slog.LevelInfo, "features in force", features(cfg)...)
	if len(cfg.SubscriptionNames) == 0 {
		return
	}
	for _, sub := range cfg.Subscriptions() {
		attrs := append([]slog.Attr{slog.String("subscription", sub.Name), slog.String("stream", sub.Config.Stream),
			slog.String("consumer", sub.Config.Consumer)}, pathFeatures(sub.Config)...)
		log.LogAttrs(context.Background(), slog.LevelInfo, "features in force", attrs...)
	}
}
