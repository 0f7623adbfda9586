package subject_test

import (
	"testing"

	"github.com/courierhq/courier/internal/subject"
)

func TestReserved(t *testing.T) {
	for _, tt := range []struct{ s, want string }{
		{"orders.created", ""},
		{"$JS.API.STREAM.DELETE.ORDERS", "$JS."},
		{"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ORDERS.courier", "$JS."},
		{"$KV.bucket.key", "$KV."},
		{"$O.store.C.x", "$O."},
		{"$SYS.REQ.SERVER.PING", "$SYS."},
		{"$SRV.PING", "$SRV."},
		{"$MQTT.sess.x", "$MQTT."},
		{"$JS", "$JS"},
		{"_INBOX.abc.1", "_INBOX."},
		{"_INBOX", "_INBOX"},
		{"_inbox.abc", ""},
		{"_INBOXES.x", ""},
		{"orders.$JS.x", ""},
		{"", ""},
	} {
		if got := subject.Reserved(tt.s); got != tt.want {
			t.Errorf("Reserved(%q) = %q, want %q", tt.s, got, tt.want)
		}
	}
}
