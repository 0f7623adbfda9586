package natstest_test

import (
	"context"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/natstest"
	"github.com/nats-io/nats.go/jetstream"
)

// TestCluster starts three nodes, stores a message in an R3 stream, restarts
// its leader and reads the message back.
func TestCluster(t *testing.T) {
	c := natstest.StartCluster(t, 3, natstest.ClusterOptions{})
	_, js := natstest.ConnectURL(t, c.URL())
	natstest.Try(t, "creating an R3 stream", func(ctx context.Context) error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, Replicas: 3})
		return err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A new R3 stream answers publishes once it has a leader.
	// A new R3 stream answers publishes once it has a leader, and once the
	// node the client is connected to knows of it (until then: no
	// response from stream).
	c.StreamLeader("S")
	natstest.Try(t, "publishing to the new stream", func(ctx context.Context) error {
		_, err := js.Publish(ctx, "s", []byte("x"))
		return err
	})
	leader := c.StreamLeader("S")
	natstest.Try(t, "creating an R3 consumer", func(ctx context.Context) error {
		_, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "c", Replicas: 3})
		return err
	})
	if n := c.ConsumerLeader("S", "c"); n < 0 || n >= c.Len() {
		t.Fatalf("consumer leader %d", n)
	}
	c.Shutdown(leader)
	if next := c.StreamLeader("S"); next == leader {
		t.Fatalf("leader %d still leads after its shutdown", leader)
	}
	c.Restart(leader)
	for {
		st, err := js.Stream(ctx, "S")
		if err == nil {
			var m *jetstream.RawStreamMsg
			if m, err = st.GetMsg(ctx, 1); err == nil {
				if string(m.Data) != "x" {
					t.Fatalf("got %q", m.Data)
				}
				return
			}
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
