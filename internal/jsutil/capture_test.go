package jsutil_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
	"github.com/courierhq/courier/internal/natstest"
)

func TestSafeStreamName(t *testing.T) {
	tests := []struct{ prefix, key, want string }{
		{"P_", "orders.created", "P_ORDERS_CREATED"},
		{"P_", "dlq.orders-v2.*.>", "P_DLQ_ORDERS-V2____"},
		{"P_", "café x", "P_CAF__X"},
	}
	for _, tt := range tests {
		if got := jsutil.SafeStreamName(tt.prefix, tt.key, tt.key); got != tt.want {
			t.Errorf("SafeStreamName(%q, %q) = %q, want %q", tt.prefix, tt.key, got, tt.want)
		}
	}
	long := strings.Repeat("segment.", 20)
	a, b := jsutil.SafeStreamName("P_", long+"a", long+"a"), jsutil.SafeStreamName("P_", long+"b", long+"b")
	if len(a) > 64 || len(b) > 64 || a == b || !strings.HasPrefix(a, "P_SEGMENT_") {
		t.Errorf("long names = %q, %q: want distinct names of at most 64 characters", a, b)
	}
}

func cfg(name, subject string) jetstream.StreamConfig {
	return jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.FileStorage, Duplicates: time.Minute, Replicas: 1}
}

var errRefused = errors.New("refused")

func refuseMemory(c jetstream.StreamConfig) ([]string, error) {
	if c.Storage == jetstream.MemoryStorage {
		return nil, errRefused
	}
	return nil, nil
}

func TestEnsureCapture(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	info, created, err := jsutil.EnsureCapture(ctx, js, cfg("A", "a.x"), refuseMemory)
	if err != nil || !created || info.Config.Name != "A" {
		t.Fatalf("first EnsureCapture = %v, %v, %v; want stream A created", info, created, err)
	}
	// Captured already, by a stream of another name: that one is used.
	info, created, err = jsutil.EnsureCapture(ctx, js, cfg("B", "a.x"), refuseMemory)
	if err != nil || created || info.Config.Name != "A" {
		t.Fatalf("second EnsureCapture = %v, %v, %v; want stream A found", info, created, err)
	}
	// Captured by a stream check refuses.
	mem := cfg("M", "m.>")
	mem.Storage = jetstream.MemoryStorage
	if _, err := js.CreateStream(ctx, mem); err != nil {
		t.Fatal(err)
	}
	if _, _, err := jsutil.EnsureCapture(ctx, js, cfg("C", "m.x"), refuseMemory); !errors.Is(err, errRefused) || !strings.Contains(err.Error(), `"m.x"`) {
		t.Errorf("EnsureCapture on a refused stream = %v, want errRefused naming the subject", err)
	}
	// The name is taken by a stream capturing something else: what to
	// create has a name that is free.
	_, _, err = jsutil.EnsureCapture(ctx, js, cfg("A", "other"), refuseMemory)
	var serr *jsutil.SetupError
	if !errors.As(err, &serr) || !strings.Contains(err.Error(), `a stream named "A" exists but does not capture it`) ||
		!strings.Contains(err.Error(), "nats stream add A_2 --subjects='other'") {
		t.Errorf("EnsureCapture with a taken name = %v, want a *SetupError saying to create A_2", err)
	}
	if _, err := js.CreateStream(ctx, cfg("A_2", "a2.x")); err != nil {
		t.Fatal(err)
	}
	_, _, err = jsutil.EnsureCapture(ctx, js, cfg("A", "other"), refuseMemory)
	if !errors.As(err, &serr) || !strings.Contains(err.Error(), "nats stream add A_3 --subjects='other'") {
		t.Errorf("EnsureCapture with A and A_2 taken = %v, want a *SetupError saying to create A_3", err)
	}
	// The stream it says to create is found by its subject.
	if _, err := js.CreateStream(ctx, cfg("A_3", "other")); err != nil {
		t.Fatal(err)
	}
	if info, created, err := jsutil.EnsureCapture(ctx, js, cfg("A", "other"), refuseMemory); err != nil || created || info.Config.Name != "A_3" {
		t.Errorf("EnsureCapture once A_3 captures the subject = %v, %v, %v; want A_3 found", info, created, err)
	}
	if _, _, err := jsutil.EnsureCapture(ctx, js, jetstream.StreamConfig{Name: "N"}, refuseMemory); err == nil {
		t.Error("EnsureCapture without subjects succeeded")
	}
}

// The streams courier names after a durable (dead letters, advisories) for
// durables whose names make one name (consumers x and X of ORDERS; stream
// A_B with consumer C, stream A with B_C) are one per durable, each
// capturing its own subject, and found again by it.
func TestEnsureCaptureOfCollidingDurables(t *testing.T) {
	s := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	durables := [][2]string{{"ORDERS", "x"}, {"ORDERS", "X"}, {"A_B", "C"}, {"A", "B_C"}}
	names := map[string]string{} // stream name → the subject it captures
	for round := range 2 {
		for _, d := range durables {
			subject := "dlq." + d[0] + "." + d[1]
			c := cfg(jsutil.SafeStreamName("COURIER_DLQ_", d[0]+"_"+d[1], subject), subject)
			c.Description = "courier: dead letters"
			info, _, err := jsutil.EnsureCapture(ctx, js, c, refuseMemory)
			if err != nil {
				t.Fatalf("round %d, %s/%s: %v", round, d[0], d[1], err)
			}
			if !slices.Equal(info.Config.Subjects, []string{subject}) {
				t.Errorf("round %d, %s/%s: stream %s captures %v, want only %s", round, d[0], d[1], info.Config.Name, info.Config.Subjects, subject)
			}
			if had, ok := names[info.Config.Name]; ok && had != subject {
				t.Errorf("stream %s for %s and %s", info.Config.Name, had, subject)
			}
			names[info.Config.Name] = subject
		}
	}
	if len(names) != len(durables) {
		t.Errorf("streams %v, want one per durable", names)
	}
}

func TestExplainSetupPermissionDenied(t *testing.T) {
	s := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) {
		o.Users = []*server.User{{Username: "app", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{"$JS.API.INFO", "$JS.API.STREAM.NAMES"}},
		}}}
	}})
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("app", "pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The refused request only times out (the server drops it and sends an
	// asynchronous -ERR), so this bounds the test; the lookups before it and
	// the -ERR must fit in it on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _, err = jsutil.EnsureCapture(ctx, js, cfg("A", "a.x"), refuseMemory)
	var serr *jsutil.SetupError
	if !errors.As(err, &serr) || !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "no permission") {
		t.Fatalf("EnsureCapture without permission = %v, want a *SetupError wrapping the permissions violation", err)
	}
	if got := jsutil.ExplainSetup(js, context.DeadlineExceeded, "NOT.THIS.ONE\"", "x", "y"); got != nil {
		t.Errorf("ExplainSetup of another request's time-out = %v, want nil", got)
	}
}

func TestNameToken(t *testing.T) {
	if got := jsutil.NameToken("orders.v1 Ä-x_Y*>"); got != "orders_v1__-x_Y__" {
		t.Errorf("NameToken = %q", got)
	}
}
