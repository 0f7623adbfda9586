// Package oteltest is an OTLP/HTTP trace receiver for courier's tests: a
// real collector endpoint, decoding what the exporter sends.
package oteltest

import (
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Export is one request the receiver got.
type Export struct {
	Header http.Header
	Req    *collectortrace.ExportTraceServiceRequest
}

// Receiver is an OTLP/HTTP collector: it decodes what is POSTed to
// /v1/traces and hands it over on the returned channel (buffered: 64).
func Receiver(tb testing.TB) (*httptest.Server, <-chan Export) {
	tb.Helper()
	got := make(chan Export, 64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
			tb.Errorf("receiver: %s %s", r.Method, r.URL.Path)
			http.NotFound(w, r)
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				tb.Errorf("receiver: gzip: %v", err)
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req := &collectortrace.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(b, req); err != nil {
			tb.Errorf("receiver: not an OTLP protobuf request (Content-Type %q): %v", r.Header.Get("Content-Type"), err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		got <- Export{Header: r.Header.Clone(), Req: req}
		resp, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(resp)
	}))
	tb.Cleanup(srv.Close)
	return srv, got
}

// Span is a received span with its resource's attributes and its scope.
type Span struct {
	Resource map[string]string
	Scope    string
	Span     *tracepb.Span
}

// Spans flattens an export's spans.
func Spans(e Export) []Span {
	var out []Span
	for _, rs := range e.Req.GetResourceSpans() {
		res := map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			res[kv.GetKey()] = kv.GetValue().GetStringValue()
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				out = append(out, Span{Resource: res, Scope: ss.GetScope().GetName(), Span: s})
			}
		}
	}
	return out
}
