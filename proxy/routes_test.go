package proxy_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// Each message goes to the path of the first route its subject matches,
// the rest to the app URL; with batches, a batch holds one route's
// messages.
func TestRoutes(t *testing.T) {
	for _, batchMax := range []int{1, 8} {
		t.Run(map[int]string{1: "one by one", 8: "batches"}[batchMax], func(t *testing.T) {
			e := setup(t)
			var mu sync.Mutex
			got := map[string][]string{} // path → subjects
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				if r.Header.Get("Courier-Batch") == "" {
					got[r.URL.Path] = append(got[r.URL.Path], r.Header.Get(proxy.HeaderSubject))
					return
				}
				var body struct {
					Entries []struct {
						Subject string `json:"subject"`
					} `json:"entries"`
				}
				if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
					t.Errorf("batch: %v", err)
				}
				for _, en := range body.Entries {
					got[r.URL.Path] = append(got[r.URL.Path], en.Subject)
				}
			}))
			t.Cleanup(srv.Close)
			e.url = srv.URL + "/default?x=1"
			subjects := []string{"s.orders.created", "s.orders.paid", "s.orders.created", "s.payments", "s.other", "s.orders.x.y"}
			for _, s := range subjects {
				if _, err := e.js.Publish(context.Background(), s, []byte("{}")); err != nil {
					t.Fatal(err)
				}
			}
			o := proxy.Options{MaxDeliver: 3, AckWait: 5 * time.Second, BatchMax: batchMax, BatchWait: 20 * time.Millisecond,
				Routes: []proxy.Route{
					{Pattern: "s.orders.created", URL: srv.URL + "/created"},
					{Pattern: "s.orders.>", URL: srv.URL + "/orders"},
					{Pattern: "s.payments", URL: srv.URL + "/payments"},
				}}
			e.runWith(t, nil, o)
			poll.Until(t, 10*time.Second, "every message settled", func() bool { return e.settled(t) })
			mu.Lock()
			defer mu.Unlock()
			want := map[string][]string{
				"/created":  {"s.orders.created", "s.orders.created"},
				"/orders":   {"s.orders.paid", "s.orders.x.y"},
				"/payments": {"s.payments"},
				"/default":  {"s.other"},
			}
			for path, subs := range want {
				if len(got[path]) != len(subs) {
					t.Errorf("%s got %v, want %v", path, got[path], subs)
					continue
				}
				for _, s := range got[path] {
					ok := false
					for _, w := range subs {
						ok = ok || s == w
					}
					if !ok {
						t.Errorf("%s got %s, want only %v", path, s, subs)
					}
				}
			}
			if len(got) != len(want) {
				t.Errorf("paths %v, want those of %v", got, want)
			}
		})
	}
}
