package schedule

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/natstest"
)

// store publishes the schedule of a message to orders.<name> at at.
func store(t *testing.T, js jetstream.JetStream, name string, at time.Time, key string) ID {
	t.Helper()
	sm, id, err := Message(&nats.Msg{Subject: "orders." + name, Header: nats.Header{}, Data: []byte(name)}, "ORDERS", "_sched", at, key)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Try(t, "publish "+name, func(ctx context.Context) error {
		_, err := js.PublishMsg(ctx, sm)
		return err
	})
	return id
}

// TestTools: List returns the waiting schedules soonest first, Streams the
// streams that hold them; Cancel removes one (then ErrNotFound), leaves one
// whose time has come (ErrDue), and removes the schedule it read, not one
// stored on its subject since.
func TestTools(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := natstest.Connect(t, srv)
	natstest.Try(t, "streams", func(ctx context.Context) error {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>", "_sched.ORDERS.>"}, AllowMsgSchedules: true}); err != nil {
			return err
		}
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}})
		return err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	now := time.Now()
	late := store(t, js, "late", now.Add(time.Hour), "k-late")
	soon := store(t, js, "soon", now.Add(time.Minute), "")
	due := store(t, js, "due", now.Add(500*time.Millisecond), "k-due")

	names, err := Streams(ctx, js, "_sched")
	if err != nil || len(names) != 1 || names[0] != "ORDERS" {
		t.Errorf("Streams = %v, %v", names, err)
	}
	list, err := List(ctx, js, "_sched", "ORDERS")
	if err != nil || len(list) != 3 || list[0].ID != due || list[1].ID != soon || list[2].ID != late {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if list[2].Key != "k-late" || list[2].Target != "orders.late" || list[1].Key != "" {
		t.Errorf("List read %+v", list)
	}

	if _, err := Cancel(ctx, js, "_sched", due, time.Now()); !errors.Is(err, ErrDue) {
		t.Errorf("Cancel of one due: %v, want ErrDue", err)
	}
	info, err := Cancel(ctx, js, "_sched", late, time.Now())
	if err != nil || info.ID != late {
		t.Fatalf("Cancel = %+v, %v", info, err)
	}
	if _, err := Cancel(ctx, js, "_sched", late, time.Now()); !errors.Is(err, ErrNotFound) {
		t.Errorf("Cancel again: %v, want ErrNotFound", err)
	}
	if _, err := Lookup(ctx, js, "_sched", ID{"NOPE", "x"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("Lookup in no stream: %v, want ErrNotFound", err)
	}
	// The schedule read is the one purged: one stored since on its
	// subject stays.
	n, err := purge(ctx, js, "ORDERS", soon.Subject("_sched"), 1)
	if err != nil || n != 0 {
		t.Errorf("purge below the schedule's sequence: %d, %v", n, err)
	}
	if _, err := Lookup(ctx, js, "_sched", soon); err != nil {
		t.Errorf("the schedule is gone: %v", err)
	}
	time.Sleep(time.Until(now.Add(time.Second)))
	list, err = List(ctx, js, "_sched", "ORDERS")
	if err != nil || len(list) != 1 || list[0].ID != soon {
		t.Errorf("after the cancel and the delivery: %+v, %v", list, err)
	}
}
