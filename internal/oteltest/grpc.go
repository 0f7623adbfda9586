package oteltest

import (
	"context"
	"net"
	"net/http"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// GRPCReceiver is an OTLP/gRPC collector without TLS: it hands what it is
// sent over on the returned channel (buffered: 64), the request's metadata
// as the Header. It returns its host:port.
func GRPCReceiver(tb testing.TB) (string, <-chan Export) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	got := make(chan Export, 64)
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, &traceService{got: got})
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(srv.Stop)
	return ln.Addr().String(), got
}

type traceService struct {
	collectortrace.UnimplementedTraceServiceServer
	got chan<- Export
}

func (s *traceService) Export(ctx context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	h := http.Header{}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		for k, vs := range md {
			h[http.CanonicalHeaderKey(k)] = vs
		}
	}
	s.got <- Export{Header: h, Req: req}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}
