package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/courierhq/courier/internal/poll"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// courier answers requests as a NATS micro service, alone (no stream) or
// beside the delivery loop: request → POST → reply, a non-2xx with micro's
// error headers, the app down a 503 error reply.
func TestReplyService(t *testing.T) {
	h := newHarness(t)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if string(b) == "bad" {
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = w.Write([]byte("no"))
			return
		}
		w.Header().Set("X-Answer", "yes")
		_, _ = w.Write([]byte("hello " + string(b)))
	}))
	t.Cleanup(app.Close)
	for _, mode := range []struct {
		name string
		env  []string
	}{
		{"requests only", h.env("", "COURIER_STREAM=", "COURIER_REPLY_SUBJECTS=svc.hello", "COURIER_REPLY_URL="+app.URL)},
		{"beside the delivery loop", h.env(app.URL, "COURIER_REPLY_SUBJECTS=svc.hello")},
	} {
		t.Run(mode.name, func(t *testing.T) {
			c := start(t, mode.env)
			admin := adminAddr(t, c)
			poll.Until(t, 10*time.Second, "ready", func() bool { code, _ := get(t, "http://"+admin+"/readyz"); return code == 200 })
			resp, err := h.nc.Request("svc.hello", []byte("world"), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if string(resp.Data) != "hello world" || resp.Header.Get("Courier-Status") != "200" || resp.Header.Get("X-Answer") != "yes" {
				t.Errorf("reply %q %v", resp.Data, resp.Header)
			}
			resp, err = h.nc.Request("svc.hello", []byte("bad"), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Header.Get(micro.ErrorCodeHeader) != "422" || string(resp.Data) != "no" {
				t.Errorf("error reply %q %v", resp.Data, resp.Header)
			}
			// $SRV.PING sees the service.
			ping, err := h.nc.Request("$SRV.PING.courier", nil, 2*time.Second)
			if err != nil || !strings.Contains(string(ping.Data), `"name":"courier"`) {
				t.Errorf("$SRV.PING: %v %s", err, pingData(ping))
			}
			if err := c.stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func pingData(m *nats.Msg) string {
	if m == nil {
		return ""
	}
	return string(m.Data)
}
