package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/courierhq/courier/config"
)

// The start-up log names in one line the features in force: each feature
// when on, and only then; dedup and the in-flight limit always.
func TestFeaturesLine(t *testing.T) {
	dir := t.TempDir()
	secrets := filepath.Join(dir, "secrets")
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(secrets, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(token, []byte("t0ken\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"COURIER_STREAM=ORDERS", "COURIER_APP_URL=http://127.0.0.1:8080/"}
	for _, tc := range []struct {
		name string
		env  []string
		want string // the attributes, key=value, space separated
	}{
		{"defaults", nil, "dedup=badger (24h0m0s) max_inflight=8"},
		{"everything", []string{
			"COURIER_DEDUP_STORE=shared", "COURIER_MAX_INFLIGHT=4",
			"COURIER_ORDER_KEY=subject:2", "COURIER_ORDER_PARTITIONS=4",
			"COURIER_BATCH_MAX=10", "COURIER_BATCH_WAIT=5ms",
			"COURIER_CLOUDEVENTS=binary", "COURIER_SUCCESS_SUBJECT=done.orders", "COURIER_MAX_RATE=50",
			"COURIER_SIGNING_SECRETS_FILE=" + secrets, "COURIER_APP_TOKEN_FILE=" + token,
			"COURIER_PUBLISH_ADDR=:7416", "COURIER_PUBLISH_SUBJECTS=orders.>",
			"COURIER_REPLY_SUBJECTS=quotes.get",
			"OTEL_EXPORTER_OTLP_ENDPOINT=http://otel:4318",
		}, "dedup=shared (bucket COURIER_DEDUP, 24h0m0s) max_inflight=4 order_key=subject:2 partitions=4 " +
			"batches=up to 10 messages, 5ms wait cloudevents=binary success_records=done.orders max_rate=50/s " +
			"signing=Standard Webhooks (" + secrets + ") token=bearer (" + token + ") " +
			"publish_api=127.0.0.1:7416 (orders.>) reply=quotes.get tracing=http/protobuf"},
		{"dedup off, order by header", []string{"COURIER_DEDUP_TTL=0", "COURIER_ORDER_KEY=header:Order"},
			"dedup=off max_inflight=8 order_key=header:Order"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Load(config.Environ(append(append([]string{}, base...), tc.env...)))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, a := range features(cfg) {
				got = append(got, a.Key+"="+a.Value.String())
			}
			if s := strings.Join(got, " "); s != tc.want {
				t.Errorf("features:\n got  %s\n want %s", s, tc.want)
			}
		})
	}
}
