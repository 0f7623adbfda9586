package proxy_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
)

// Workers hand their deliveries to the batch and go on: one worker
// (MaxInflight 1) fills every batch to BatchMax, and the places keep it to
// one batch's worth while that batch is at the app, so none overlaps.
func TestBatchOneWorkerFillsBatches(t *testing.T) {
	e := setup(t)
	var atApp, overlapped atomic.Int32
	a := newBatchApp(t, e, func([]wireEntry, int) (int, http.Header, string) {
		if atApp.Add(1) > 1 {
			overlapped.Add(1)
		}
		defer atApp.Add(-1)
		return 200, nil, ""
	})
	publishKeys(t, e, numbered("w", 40)...)
	o := batchOptions()
	o.MaxInflight, o.BatchMax, o.BatchWait = 1, 8, time.Hour // only a full batch goes
	e.runWith(t, nil, o)
	poll.Until(t, 20*time.Second, "every message settled", func() bool { return e.settled(t) })
	a.wantFull(t, 8, 40, "BatchMax, from one worker")
	if n := overlapped.Load(); n > 0 {
		t.Errorf("%d batches reached the app while another was there, want none at MaxInflight 1", n)
	}
}
