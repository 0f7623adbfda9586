package config

import (
	"strings"
	"testing"
)

// Every subject NATS keeps for itself is refused wherever courier would
// publish to it, reply on it or let the app publish to it: a first token
// beginning with '$', whichever system it names, or _INBOX.
func TestReservedSubjects(t *testing.T) {
	tests := []struct {
		name    string
		environ map[string]string
		want    string // a prefix
	}{
		{"dlq services", with(map[string]string{"COURIER_DLQ_SUBJECT": "$SRV.PING"}), `COURIER_DLQ_SUBJECT="$SRV.PING": subjects starting with $SRV. are reserved by NATS`},
		{"dlq inbox token", with(map[string]string{"COURIER_DLQ_SUBJECT": "_INBOX"}), `COURIER_DLQ_SUBJECT="_INBOX": subjects starting with _INBOX are reserved by NATS`},
		{"success raft", with(map[string]string{"COURIER_SUCCESS_SUBJECT": "$NRG.x"}), `COURIER_SUCCESS_SUBJECT="$NRG.x": subjects starting with $NRG. are reserved by NATS`},
		{"success jetstream cluster", with(map[string]string{"COURIER_SUCCESS_SUBJECT": "$JSC.x"}), `COURIER_SUCCESS_SUBJECT="$JSC.x": subjects starting with $JSC. are reserved by NATS`},
		{"reply services", with(map[string]string{"COURIER_REPLY_SUBJECTS": "$SRV.>"}), `COURIER_REPLY_SUBJECTS="$SRV.>": "$SRV.>": subjects starting with $SRV. are reserved by NATS`},
		{"publish services", with(map[string]string{"COURIER_PUBLISH_ADDR": ":7416", "COURIER_PUBLISH_SUBJECTS": "orders.>,$SRV.INFO"}), `COURIER_PUBLISH_SUBJECTS="orders.>,$SRV.INFO": "$SRV.INFO": subjects starting with $SRV. are reserved by NATS`},
		{"publish one token", with(map[string]string{"COURIER_PUBLISH_ADDR": ":7416", "COURIER_PUBLISH_SUBJECTS": "$G"}), `COURIER_PUBLISH_SUBJECTS="$G": "$G": subjects starting with $G are reserved by NATS`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := problems(t, tt.environ)
			if len(got) != 1 || !strings.HasPrefix(got[0], tt.want) {
				t.Errorf("problems:\n%s\nwant one starting\n %s", strings.Join(got, "\n"), tt.want)
			}
		})
	}
}
