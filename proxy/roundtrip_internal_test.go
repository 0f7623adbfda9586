package proxy

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestPostDirectAnswersAsClientDo: the runner's own client sends straight to
// its transport (postDirect); every outcome must read as it would through
// Client.Do, redirects and failures included.
func TestPostDirectAnswersAsClientDo(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if loc := r.URL.Query().Get("loc"); loc != "" {
			w.Header().Set("Location", loc)
		}
		switch r.URL.Query().Get("status") {
		case "302":
			w.WriteHeader(http.StatusFound)
		case "307":
			w.WriteHeader(http.StatusTemporaryRedirect)
		case "500":
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	t.Cleanup(app.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/"
	ln.Close()

	for _, tc := range []struct {
		name string
		url  string
		body []byte
	}{
		{"2xx", app.URL + "/", []byte("x")},
		{"500", app.URL + "/?status=500", []byte("x")},
		{"302 with Location", app.URL + "/?status=302&loc=/elsewhere", []byte("x")},
		{"302 with a Location that cannot be parsed", app.URL + "/?status=302&loc=%25zz%3A%2F%2F", []byte("x")},
		{"307 with a body, bad Location", app.URL + "/?status=307&loc=%25zz%3A%2F%2F", []byte("x")},
		{"307 without a body, bad Location", app.URL + "/?status=307&loc=%25zz%3A%2F%2F", nil},
		{"nothing listening", closed, []byte("x")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewClient(ClientOptions{MaxConns: 2})
			ep, err := parseEndpoint(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			h := func() http.Header { return http.Header{"Idempotency-Key": {"k"}} }
			viaDo, errDo := postAnswer(ctx, c, ep, h(), tc.body, 1<<10)
			direct, errDirect := postDirect(ctx, c, c.Transport, ep, h(), tc.body, 1<<10)
			t.Logf("Client.Do: %v, %v", viaDo != nil, errDo)
			if (viaDo == nil) != (direct == nil) || (viaDo != nil && viaDo.Status != direct.Status) {
				t.Errorf("answer: Client.Do %+v, direct %+v", viaDo, direct)
			}
			if es := func(err error) string {
				if err == nil {
					return ""
				}
				return err.Error() + " / " + Classify(err, func(int) bool { return true }).String()
			}; es(errDo) != es(errDirect) {
				t.Errorf("error: Client.Do %q, direct %q", es(errDo), es(errDirect))
			}
		})
	}
}
