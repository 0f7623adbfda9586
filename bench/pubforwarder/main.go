// Command pubforwarder is the baseline of courier's publish benchmark
// (bench/publish.go): the least an HTTP-to-JetStream publisher can do. It
// serves POST /v1/publish/<subject> with a plain net/http server, reads the
// body, publishes it with js.PublishMsg (Idempotency-Key as Nats-Msg-Id)
// and answers 200 with {"stream","seq","duplicate"} once the stream has
// acknowledged it, 503 on any error. Nothing else: no subject checks, no
// header passing, no retries, no bounds, no metrics, no logs per request.
// What courier's publish API costs beyond it is courier's; what it costs
// beyond nats.go's js.Publish is HTTP's.
//
// With BENCH_PUBLISH_NULL=1 it publishes nothing and answers every request
// at once as if the stream had stored it: HTTP's cost alone, the ceiling of
// any HTTP publisher on the machine.
//
// It reads NATS_URL and COURIER_PUBLISH_ADDR, logs the address it listens
// on as courier does (a JSON line {"msg":"publish API listening","addr":...}
// on stderr, which the benchmark reads), and stops on SIGTERM or SIGINT.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pubforwarder: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	url, addr := os.Getenv("NATS_URL"), os.Getenv("COURIER_PUBLISH_ADDR")
	if url == "" {
		url = nats.DefaultURL
	}
	if addr == "" {
		return errors.New("COURIER_PUBLISH_ADDR is required")
	}
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	null := os.Getenv("BENCH_PUBLISH_NULL") == "1"
	var seq atomic.Uint64
	mux.HandleFunc("POST /v1/publish/{subject...}", func(w http.ResponseWriter, r *http.Request) {
		if null {
			if _, err := io.Copy(io.Discard, r.Body); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			answer(w, &jetstream.PubAck{Stream: "NULL", Sequence: seq.Add(1)})
			return
		}
		publish(w, r, js)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	line, _ := json.Marshal(map[string]string{"msg": "publish API listening", "addr": ln.Addr().String()})
	fmt.Fprintf(os.Stderr, "%s\n", line)

	select {
	case err = <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	<-served
	return err
}

// publish publishes the request's body to its subject and answers with the
// acknowledgement.
func publish(w http.ResponseWriter, r *http.Request, js jetstream.JetStream) {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	m := &nats.Msg{Subject: r.PathValue("subject"), Data: data}
	if key := r.Header.Get("Idempotency-Key"); key != "" {
		m.Header = nats.Header{nats.MsgIdHdr: []string{key}}
	}
	ack, err := js.PublishMsg(r.Context(), m)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	answer(w, ack)
}

// answer writes ack as courier's publish API does.
func answer(w http.ResponseWriter, ack *jetstream.PubAck) {
	// The answer courier gives, without an encoder: stream names are
	// letters, digits, '-' and '_' (no JSON escaping needed).
	b := make([]byte, 0, 64)
	b = append(b, `{"stream":"`...)
	b = append(b, ack.Stream...)
	b = append(b, `","seq":`...)
	b = strconv.AppendUint(b, ack.Sequence, 10)
	b = append(b, `,"duplicate":`...)
	b = strconv.AppendBool(b, ack.Duplicate)
	b = append(b, "}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}
