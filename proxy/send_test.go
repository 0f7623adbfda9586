package proxy

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/courierhq/courier/apphttp"
	"github.com/courierhq/courier/batch"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy/limit"
)

// TestPostChecksAfterItsLastWait keeps the order of sender.post: every
// wait (the rate limit, a slot of the in-flight limit) comes before the
// request's checks (req.ready), and from the checks to the write
// (Endpoint.Post) only calls that cannot block. A wait put after the
// checks, or a call not known to be free of waits, fails it: what the
// checks decided (the gate, the breaker, the pin, the stop) must still hold
// when the request is written.
func TestPostChecksAfterItsLastWait(t *testing.T) {
	calls := callsOf(t, "send.go", "post")
	at := func(name string) int {
		t.Helper()
		i := slices.Index(calls, name)
		if i < 0 {
			t.Fatalf("post calls no %s: %v", name, calls)
		}
		return i
	}
	ready, write := at("ready"), at("Post")
	for _, wait := range []string{"Wait", "Acquire"} {
		if i := at(wait); i > ready {
			t.Errorf("post waits (%s) after its checks (ready)", wait)
		}
	}
	if write < ready {
		t.Fatalf("post writes the request before its checks")
	}
	// Calls known not to block: the timer, the metrics, the clock, the
	// signature (an HMAC), the slot given back, errors made.
	free := map[string]bool{
		"newRequestTimer": true, "close": true, "start": true, "stop": true, "Inc": true, "Dec": true,
		"Now": true, "Since": true, "stamp": true, "Release": true, "outcomeOf": true, "outcome": true,
	}
	for _, c := range calls[ready+1 : write] {
		if !free[c] {
			t.Errorf("post calls %s between its checks and the write: a call that may wait belongs before the checks", c)
		}
	}
}

// callsOf returns the names of the calls in function fn of file, in the
// order they appear, and fails if the body receives from a channel or
// selects (waits the list of calls cannot show) after a call named ready.
func callsOf(t *testing.T, file, fn string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, decl := range f.Decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok || fd.Name.Name != fn {
			continue
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				switch f := n.Fun.(type) {
				case *ast.Ident:
					names = append(names, f.Name)
				case *ast.SelectorExpr:
					names = append(names, f.Sel.Name)
				}
			case *ast.SelectStmt, *ast.GoStmt:
				if slices.Contains(names, "ready") {
					t.Errorf("%s selects or starts a goroutine after its checks", fn)
				}
			case *ast.UnaryExpr:
				if n.Op == token.ARROW && slices.Contains(names, "ready") {
					t.Errorf("%s receives from a channel after its checks", fn)
				}
			}
			return true
		})
		return names
	}
	t.Fatalf("%s has no function %s", file, fn)
	return nil
}

// testSender is a sender to app with a fixed limit of n.
func testSender(t *testing.T, app http.Handler, n int) *sender {
	t.Helper()
	srv := httptest.NewServer(app)
	t.Cleanup(srv.Close)
	o, err := Options{AppURL: srv.URL, Stream: "S", Consumer: "c", MaxInflight: n, Registerer: prometheus.NewRegistry()}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return newSender(o, newMetrics(o.Registerer, o.DeadLetterCounter))
}

// TestPostChecksOnceItHoldsItsSlot: a request waiting for a slot is checked
// only once it has the slot, so a check that changes meanwhile (the breaker
// opened, the pin moved, courier stopping) stops it; one refused reaches no
// app and gives its slot back.
func TestPostChecksOnceItHoldsItsSlot(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int32
	s := testSender(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			<-release
		}
	}), 1)
	ctx := context.Background()
	first := make(chan error, 1)
	go func() {
		_, _, err := s.post(ctx, request{body: []byte("1")})
		first <- err
	}()
	poll.Until(t, 5*time.Second, "the first request at the app", func() bool { return calls.Load() == 1 })

	var open atomic.Bool // the gate, as the check reads it
	open.Store(true)
	var checkedWith atomic.Int32 // requests in flight when the check ran
	second := make(chan error, 1)
	go func() {
		_, _, err := s.post(ctx, request{ready: func() (http.Header, []byte, error) {
			checkedWith.Store(int32(s.inflight.InFlight()))
			if !open.Load() {
				return nil, nil, errRefused
			}
			return nil, []byte("2"), nil
		}})
		second <- err
	}()
	poll.Until(t, 5*time.Second, "the second request waiting for a slot", func() bool { return s.inflight.Stats().Waiting == 1 })
	open.Store(false) // the gate closes while it waits
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first request: %v", err)
	}
	if err := <-second; !errors.Is(err, errRefused) {
		t.Fatalf("second request: got %v, want it refused by its check", err)
	}
	if got := checkedWith.Load(); got != 1 {
		t.Errorf("the check ran with %d requests in flight, want 1: its own, after the first gave its slot back", got)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the app saw %d requests, want 1: the refused one must not be sent", n)
	}
	if n := s.inflight.InFlight(); n != 0 {
		t.Errorf("%d slots held after the refusal, want 0", n)
	}
}

// TestPostGivesTheLimitWhatTheAnswerSays: a 2xx whose outcome says it
// failed (a batch whose entries the app all refused) is no sample of the
// app's answer time; a 2xx without one is.
func TestPostGivesTheLimitWhatTheAnswerSays(t *testing.T) {
	for _, tc := range []struct {
		name    string
		outcome func(*apphttp.Answer) limit.Outcome
		sampled bool
	}{
		{"a 2xx", nil, true},
		{"a 2xx whose outcome is a failure", func(*apphttp.Answer) limit.Outcome { return limit.Failed }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testSender(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), 1)
			s.inflight = limit.NewAuto(limit.AutoOptions{Max: 4, ProbeSamples: 3})
			for range 20 {
				if _, _, err := s.post(context.Background(), request{outcome: tc.outcome}); err != nil {
					t.Fatal(err)
				}
			}
			if sampled := s.inflight.MinRTT() > 0; sampled != tc.sampled {
				t.Errorf("answer times sampled: %v, want %v", sampled, tc.sampled)
			}
		})
	}
}

// TestBatchOutcome: a batch answered 2xx is a success to the limit only if
// one of its entries succeeded.
func TestBatchOutcome(t *testing.T) {
	for _, tc := range []struct {
		statuses []batch.Status
		want     limit.Outcome
	}{
		{[]batch.Status{batch.Success, batch.Retry}, limit.Success},
		{[]batch.Status{batch.Retry, batch.Retry}, limit.Failed},
		{[]batch.Status{batch.Drop, batch.Retry}, limit.Failed},
		{[]batch.Status{batch.Drop}, limit.Failed},
	} {
		if got := batchOutcome(batch.Answer{Statuses: tc.statuses}); got != tc.want {
			t.Errorf("%v: got %v, want %v", tc.statuses, got, tc.want)
		}
	}
}
