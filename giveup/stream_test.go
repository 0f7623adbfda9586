package giveup_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/giveup"
	"github.com/courierhq/courier/internal/natstest"
	"github.com/courierhq/courier/internal/poll"
)

func TestGiveUpNames(t *testing.T) {
	t.Parallel()
	if got, want := giveup.AdvisorySubject("ORDERS", "courier"), "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ORDERS.courier"; got != want {
		t.Errorf("AdvisorySubject = %q, want %q", got, want)
	}
	if got, want := giveup.StreamName("orders-v2", "my_courier"), "COURIER_ADVISORIES_ORDERS-V2_MY_COURIER"; got != want {
		t.Errorf("StreamName = %q, want %q", got, want)
	}
	if got, want := giveup.ConsumerName("courier"), "courier-giveup-courier"; got != want {
		t.Errorf("ConsumerName = %q, want %q", got, want)
	}
	long := strings.Repeat("s", 60)
	a, b := giveup.StreamName(long, "a"), giveup.StreamName(long, "b")
	if len(a) > 64 || len(b) > 64 || a == b {
		t.Errorf("StreamName of long names = %q, %q: want distinct names of at most 64 characters", a, b)
	}
}

func TestGiveUpCheckStream(t *testing.T) {
	t.Parallel()
	good := giveup.StreamConfig("ORDERS", "courier", 1, 0)
	tests := []struct {
		name    string
		change  func(*jetstream.StreamConfig)
		refused string
		warning string
	}{
		{name: "created config"},
		{name: "interest", change: func(c *jetstream.StreamConfig) { c.Retention = jetstream.InterestPolicy }},
		{name: "work queue", change: func(c *jetstream.StreamConfig) { c.Retention = jetstream.WorkQueuePolicy }},
		{name: "memory", change: func(c *jetstream.StreamConfig) { c.Storage = jetstream.MemoryStorage }, refused: "memory storage"},
		{name: "sealed", change: func(c *jetstream.StreamConfig) { c.Sealed = true }, refused: "sealed"},
		{name: "short max age", change: func(c *jetstream.StreamConfig) { c.MaxAge = time.Hour }, warning: "max_age 1h0m0s"},
		{name: "max msgs", change: func(c *jetstream.StreamConfig) { c.MaxMsgs = 10 }, warning: "max_msgs 10"},
		{name: "max bytes", change: func(c *jetstream.StreamConfig) { c.MaxBytes = 1024 }, warning: "max_bytes 1024"},
		{name: "per subject", change: func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject = 1 }, warning: "max_msgs_per_subject 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			if tt.change != nil {
				tt.change(&cfg)
			}
			warnings, err := giveup.CheckStream(cfg)
			switch {
			case tt.refused == "" && err != nil:
				t.Errorf("CheckStream: %v", err)
			case tt.refused != "" && (!errors.Is(err, giveup.ErrUnsuitableStream) || !strings.Contains(err.Error(), tt.refused)):
				t.Errorf("CheckStream error = %v, want ErrUnsuitableStream naming %q", err, tt.refused)
			}
			if tt.warning == "" && len(warnings) > 0 {
				t.Errorf("warnings = %q, want none", warnings)
			}
			if tt.warning != "" && (len(warnings) != 1 || !strings.Contains(warnings[0], tt.warning)) {
				t.Errorf("warnings = %q, want one naming %q", warnings, tt.warning)
			}
		})
	}
}

func TestGiveUpEnsureStreamCreates(t *testing.T) {
	t.Parallel()
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	info, created, err := giveup.EnsureStream(ctx(t, 5*time.Second), js, "ORDERS", "courier", 1, 0)
	if err != nil || !created {
		t.Fatalf("EnsureStream = created %v, %v; want created", created, err)
	}
	c := info.Config
	if c.Name != "COURIER_ADVISORIES_ORDERS_COURIER" || !slices.Equal(c.Subjects, []string{giveup.AdvisorySubject("ORDERS", "courier")}) ||
		c.Storage != jetstream.FileStorage || c.Retention != jetstream.WorkQueuePolicy || c.Replicas != 1 ||
		c.MaxAge != giveup.DefaultMaxAge || c.Duplicates != giveup.DuplicateWindow || c.MaxMsgs != -1 || c.MaxBytes != -1 {
		t.Errorf("created stream config = %+v", c)
	}
	if warnings, err := giveup.CheckStream(c); err != nil || len(warnings) > 0 {
		t.Errorf("CheckStream(created) = %q, %v; want neither", warnings, err)
	}
	again, created, err := giveup.EnsureStream(ctx(t, 5*time.Second), js, "ORDERS", "courier", 1, 0)
	if err != nil || created || again.Config.Name != c.Name {
		t.Errorf("EnsureStream again = created %v, %v; want %s reused", created, err, c.Name)
	}
}

// Stream names are upper-cased: the advisories of consumer courier on
// streams orders and ORDERS would go to one stream name. Each gets a
// stream of its own, capturing only its own advisories.
func TestGiveUpEnsureStreamBesideNamesake(t *testing.T) {
	t.Parallel()
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	upper, _, err := giveup.EnsureStream(ctx(t, 5*time.Second), js, "ORDERS", "courier", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	lower, created, err := giveup.EnsureStream(ctx(t, 5*time.Second), js, "orders", "courier", 1, 0)
	if err != nil || !created {
		t.Fatalf("EnsureStream beside its namesake = created %v, %v; want a stream of its own", created, err)
	}
	if lower.Config.Name == upper.Config.Name ||
		!slices.Equal(lower.Config.Subjects, []string{giveup.AdvisorySubject("orders", "courier")}) {
		t.Errorf("streams %s and %s %q: want two, each capturing its own advisories", upper.Config.Name, lower.Config.Name, lower.Config.Subjects)
	}
	again, created, err := giveup.EnsureStream(ctx(t, 5*time.Second), js, "orders", "courier", 1, 0)
	if err != nil || created || again.Config.Name != lower.Config.Name {
		t.Errorf("EnsureStream again = created %v, %v; want %s found", created, err, lower.Config.Name)
	}
}

func TestGiveUpEnsureStreamUsesExisting(t *testing.T) {
	t.Parallel()
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	if _, err := js.CreateStream(ctx(t, 5*time.Second), jetstream.StreamConfig{
		Name: "AUDIT", Subjects: []string{"$JS.EVENT.ADVISORY.>"}, MaxAge: time.Hour,
	}); err != nil {
		t.Fatal(err)
	}
	info, created, err := giveup.EnsureStream(ctx(t, 5*time.Second), js, "ORDERS", "courier", 1, 0)
	if err != nil || created || info.Config.Name != "AUDIT" {
		t.Fatalf("EnsureStream = created %v, %v; want AUDIT reused", created, err)
	}

	s = natstest.Start(t, natstest.Options{})
	_, js = natstest.Connect(t, s)
	if _, err := js.CreateStream(ctx(t, 5*time.Second), jetstream.StreamConfig{
		Name: "MEM", Subjects: []string{giveup.AdvisorySubjectPrefix + ".OTHER.>"}, Storage: jetstream.MemoryStorage,
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := giveup.EnsureStream(ctx(t, 5*time.Second), js, "OTHER", "courier", 1, 0); !errors.Is(err, giveup.ErrUnsuitableStream) || !strings.Contains(err.Error(), `"MEM"`) {
		t.Errorf("EnsureStream over a memory stream = %v; want ErrUnsuitableStream naming MEM", err)
	}
}

func TestGiveUpCatcherSetupCaptureInExistingStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t, jetstream.LimitsPolicy)
	auditStream(t, e)
	reg := prometheus.NewRegistry()
	c, err := giveup.New(e.js, e.src, consumer, e.pub, giveup.Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Setup(ctx(t, 5*time.Second)); err != nil {
		t.Fatalf("Setup: %v", err)
	}
	(&catcher{Catcher: c, reg: reg}).run(t)
	seq := e.publish("orders.created", "audit", nil)
	e.exhaust()
	poll.Until(t, 15*time.Second, "the dead letter", func() bool { return len(e.deadLetters()) == 1 })
	checkLetter(t, e, e.deadLetters()[0], seq, "audit", nil)
}

func TestGiveUpSetupCannotCreate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		allow    []string
		replicas int
		want     []string
	}{
		{
			name:     "stream",
			allow:    []string{"$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.INFO.>"},
			replicas: 3,
			want: []string{"no permission", "nats stream add COURIER_ADVISORIES_ORDERS_COURIER",
				"--subjects='$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ORDERS.courier'", "--storage=file", "--retention=workqueue",
				"--max-age=168h0m0s", "--replicas=3", `"max_age":604800000000000`},
		},
		{
			name:     "consumer",
			allow:    []string{"$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.INFO.>", "$JS.API.STREAM.CREATE.>"},
			replicas: 1,
			want: []string{"no permission", "nats consumer add COURIER_ADVISORIES_ORDERS_COURIER courier-giveup-courier",
				"--filter='$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ORDERS.courier'", "--ack=explicit", "--max-deliver=-1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) {
				o.Users = []*server.User{
					{Username: "admin", Password: "pw"},
					{Username: "app", Password: "pw", Permissions: &server.Permissions{
						Publish: &server.SubjectPermission{Allow: tt.allow},
					}},
				}
			}})
			admin, err := nats.Connect(s.ClientURL(), nats.UserInfo("admin", "pw"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(admin.Close)
			ajs, _ := jetstream.New(admin)
			src, err := ajs.CreateStream(ctx(t, 5*time.Second), jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
			if err != nil {
				t.Fatal(err)
			}

			nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("app", "pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			js, _ := jetstream.New(nc)
			c, err := giveup.New(js, src, consumer, dlq.NewPublisher(js, dlqSubject), giveup.Options{Replicas: tt.replicas, Registerer: prometheus.NewRegistry()})
			if err != nil {
				t.Fatal(err)
			}
			// The server drops a denied request: it ends at the deadline.
			err = c.Setup(ctx(t, time.Second))
			if !errors.Is(err, giveup.ErrCannotCreate) {
				t.Fatalf("Setup = %v; want ErrCannotCreate", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
