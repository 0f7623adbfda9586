package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/dlq"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// A dead-letter stream that refuses a dead letter (too large for it) holds
// that message and says so in readiness, but does not take the only worker:
// the messages behind it are delivered.
func TestRefusingDLQDoesNotTakeTheWorker(t *testing.T) {
	e := setup(t)
	if _, err := e.js.UpdateStream(context.Background(), jetstream.StreamConfig{
		Name: dlq.StreamName("dlq.s"), Subjects: []string{"dlq.s"}, MaxMsgSize: 512,
	}); err != nil {
		t.Fatal(err)
	}
	var ok atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > 100 {
			w.WriteHeader(http.StatusUnprocessableEntity) // rejected: dead-lettered
			return
		}
		ok.Add(1)
	}))
	t.Cleanup(app.Close)
	e.url = app.URL
	if _, err := e.js.Publish(context.Background(), "s.big", make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	r, _ := e.runWith(t, nil, proxy.Options{MaxInflight: 1})
	e.publish(t, 5, []byte("small"))
	poll.Until(t, 10*time.Second, "the messages behind the refused dead letter delivered", func() bool { return ok.Load() == 5 })
	poll.Until(t, 10*time.Second, "readiness to name the dead letters", func() bool {
		err := r.Ready()
		return err != nil && contains(err.Error(), "dead letters cannot be stored")
	})
}
