package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/jsutil"
	"github.com/courierhq/courier/internal/poll"
	"github.com/courierhq/courier/partition"
)

// courier status names the courier the durable is pinned to (order per
// key, no partitions) by its host name, as it names the holders of
// partitions, not by the server's pin id; cleanup removes the bucket the
// couriers name themselves in once the consumer goes.
func TestStatusNamesThePinHolder(t *testing.T) {
	h := newHarness(t)
	a := newApp(t, nil)
	env := h.env(a.URL, "COURIER_ORDER_KEY=subject:2")
	h.publish("orders.k1.created", "x", nil)
	c := start(t, env)
	poll.Until(t, 20*time.Second, "the message delivered", func() bool { return a.count() == 1 })
	host, _ := os.Hostname()
	holder := regexp.MustCompile(`(?m)^pinned \(courier\)\s+(\S+) since `)
	var out string
	poll.Until(t, 20*time.Second, "courier status naming the pin's holder", func() bool {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), []string{"status"}, env, &stdout, &stderr); err != nil {
			t.Fatalf("courier status: %v\n%s", err, stderr.String())
		}
		out = stdout.String()
		m := holder.FindStringSubmatch(out)
		return m != nil && strings.HasPrefix(m[1], jsutil.NameToken(host)+"-")
	})
	if strings.Contains(out, "pin ") {
		t.Errorf("courier status shows a pin id:\n%s", out)
	}
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	bucket := partition.MembersBucket("ORDERS", "courier")
	if out, code := h.cleanupRun(t, "--yes"); code != 0 || !strings.Contains(out, `removed key-value bucket "`+bucket+`"`) {
		t.Errorf("cleanup: exit %d\n%s", code, out)
	}
	if _, err := h.js.KeyValue(context.Background(), bucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Errorf("the bucket after cleanup: %v, want it gone", err)
	}
}
