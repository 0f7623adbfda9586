package publish

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/courierhq/courier/internal/natstest"
)

// api is a publish Server on a real listener, publishing through its own
// connection to an embedded server.
type api struct {
	t   testing.TB
	srv *Server
	reg *prometheus.Registry
	nc  *nats.Conn
	url string // http://addr
}

// startAPI starts a Server on 127.0.0.1:0 connected to url; opts.Subjects
// defaults to orders.>, shutdown when the test ends.
func startAPI(t testing.TB, url string, opts Options) *api {
	t.Helper()
	return startAPIAt(t, "127.0.0.1:0", url, opts)
}

// startAPIAt is startAPI listening on addr; a.url is the address bound.
func startAPIAt(t testing.TB, addr, url string, opts Options) *api {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Subjects == nil {
		opts.Subjects = []string{"orders.>"}
	}
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	s, err := Listen(addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	s.Connect(nc, js)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return &api{t: t, srv: s, reg: reg, nc: nc, url: "http://" + s.Addr()}
}

// answer is one response of the API.
type answer struct {
	status     int
	retryAfter string
	header     http.Header
	Stream     string `json:"stream"`
	Seq        uint64 `json:"seq"`
	Duplicate  bool   `json:"duplicate"`
	Error      string `json:"error"`
	// A delayed publish's (202).
	Schedule  string `json:"schedule"`
	DeliverAt string `json:"deliver_at"`
}

// post publishes body to subject with headers (name, value pairs).
func (a *api) post(subject, body string, headers ...string) answer {
	a.t.Helper()
	ans, err := a.tryPost(subject, body, headers...)
	if err != nil {
		a.t.Fatalf("POST %s: %v", subject, err)
	}
	return ans
}

// tryPost is post returning a transport error instead of failing.
func (a *api) tryPost(subject, body string, headers ...string) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, a.url+PathPrefix+subject, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	ans := answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), header: resp.Header}
	if ct := resp.Header.Get("Content-Type"); ct == "application/json" {
		if err := json.NewDecoder(bytes.NewReader(b)).Decode(&ans); err != nil {
			a.t.Errorf("answer %d %q: not JSON: %v", resp.StatusCode, b, err)
		}
	} else {
		ans.Error = string(b)
	}
	return ans, nil
}

// count is courier_publish_requests_total{outcome}.
func (a *api) count(outcome string) float64 {
	return value(a.srv.m.requests.WithLabelValues(outcome))
}

// value reads a counter or gauge.
func value(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// maxPayload is the server's max_payload in smallPayloadOrders.
const maxPayload = 8 << 10

// smallPayloadOrders starts a server whose max_payload is maxPayload, with
// stream ORDERS (orders.>), and connects to it.
func smallPayloadOrders(t *testing.T) (*server.Server, jetstream.JetStream) {
	t.Helper()
	srv := natstest.Start(t, natstest.Options{Configure: func(o *server.Options) { o.MaxPayload = maxPayload }})
	_, js := natstest.Connect(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	return srv, js
}

// createStream makes a stream through a connection of the test's own.
func createStream(t *testing.T, js jetstream.JetStream, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	var s jetstream.Stream
	natstest.Try(t, "create stream "+cfg.Name, func(ctx context.Context) error {
		var err error
		s, err = js.CreateStream(ctx, cfg)
		return err
	})
	return s
}

// stored returns the message at seq of stream.
func stored(t *testing.T, js jetstream.JetStream, stream string, seq uint64) *jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		t.Fatalf("message %d of %s: %v", seq, stream, err)
	}
	return m
}

// msgCount is how many messages stream holds.
func msgCount(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	var n uint64
	natstest.Try(t, "info of "+stream, func(ctx context.Context) error {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		n = info.State.Msgs
		return nil
	})
	return n
}

// storedOnce reads every message of stream and returns how many times
// each Nats-Msg-Id is stored, failing the test for any stored more than
// once.
func storedOnce(t *testing.T, js jetstream.JetStream, stream string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		seen[m.Header.Get(nats.MsgIdHdr)]++
	}
	for key, n := range seen {
		if n != 1 {
			t.Errorf("%s stored %d times", key, n)
		}
	}
	return seen
}
