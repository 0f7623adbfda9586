package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// Start-up retries what time fixes and gives up on what it cannot: a
// placement refused for a peer offline (a node restarting) is retried, one
// refused for want of peers or storage is final, as the server words them
// (nats-server's selectPeerError).
func TestTransientSetupErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}, true},
		{fmt.Errorf("create a stream: %w", &jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline, insufficient storage"}), true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement"}, false},
		{&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, insufficient storage"}, false},
		{&jetstream.APIError{Code: 400, ErrorCode: 10058, Description: "stream name already in use with a different configuration"}, false},
	} {
		if got := transientSetupError(c.err); got != c.want {
			t.Errorf("transientSetupError(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
