package proxy_test

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/proxy"
)

// socketApp serves the test app on a Unix socket, counting the messages
// POSTed to /messages and the health checks on /healthz, and remembering
// any request that came with another path or Host.
type socketApp struct {
	path     string
	messages atomic.Int32
	health   atomic.Int32
	mu       sync.Mutex
	odd      []string
	srv      *http.Server
}

func (a *socketApp) start(t *testing.T) {
	t.Helper()
	_ = os.Remove(a.path)
	ln, err := net.Listen("unix", a.path)
	if err != nil {
		t.Fatal(err)
	}
	a.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Host != "localhost":
			a.note(r)
		case r.Method == http.MethodPost && r.URL.Path == "/messages":
			a.messages.Add(1)
		case r.Method == http.MethodGet && r.URL.Path == "/healthz":
			a.health.Add(1)
		default:
			a.note(r)
		}
	})}
	go func() { _ = a.srv.Serve(ln) }()
}

func (a *socketApp) note(r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.odd = append(a.odd, r.Method+" "+r.Host+" "+r.URL.RequestURI())
}

// An app listening on a Unix socket (COURIER_APP_URL=unix://...) gets every
// message on the path named after the socket, is health-checked over the
// same socket, and when the socket goes away its messages are held, not
// spent, until it is back.
func TestAppOnUnixSocket(t *testing.T) {
	e := setup(t)
	app := &socketApp{path: filepath.Join(t.TempDir(), "app.sock")}
	app.start(t)
	t.Cleanup(func() { _ = app.srv.Close() })
	e.url = "unix://" + app.path + ":/messages"
	_, stop := e.runWith(t, nil, proxy.Options{
		MaxDeliver: 3, AckWait: 5 * time.Second,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		AppHealthURL: "unix://" + app.path + ":/healthz", HealthInterval: 50 * time.Millisecond,
	})
	defer stop()

	e.publish(t, 20, []byte("{}"))
	poll.Until(t, 10*time.Second, "20 messages delivered over the socket", func() bool { return app.messages.Load() == 20 && e.settled(t) })
	if app.health.Load() == 0 {
		t.Error("the health URL on the socket was never asked")
	}

	// The app goes away: its socket refuses connections.
	_ = app.srv.Close()
	_ = os.Remove(app.path)
	poll.Until(t, 10*time.Second, "deliveries held for the app", func() bool {
		return counter(t, e.reg, "courier_delivery_held", "app_unavailable") == 1
	})
	e.publish(t, 5, []byte("{}"))
	time.Sleep(300 * time.Millisecond)
	app.start(t)
	// All 25 reach the app: none was dead-lettered while it was away.
	poll.Until(t, 10*time.Second, "the held messages delivered once the socket is back", func() bool { return app.messages.Load() == 25 && e.settled(t) })
	if got := counter(t, e.reg, "courier_delivery_held", "app_unavailable"); got != 0 {
		t.Errorf("courier_delivery_held{cause=app_unavailable} = %v after the app came back", got)
	}
	app.mu.Lock()
	defer app.mu.Unlock()
	if len(app.odd) > 0 {
		t.Errorf("requests the app did not expect (method, Host, path): %q", app.odd)
	}
}
