package dedup

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// lastRecord is the last message stored on a key's subject.
type lastRecord struct {
	rev    uint64
	header nats.Header
	data   []byte
	time   time.Time
}

// deleted reports whether the record is a delete or purge marker (a release)
// or the marker a key leaves when its TTL runs out (a lapse).
func (r *lastRecord) deleted() bool {
	return r.header.Get(kvOperation) != "" || r.header.Get(jetstream.MarkerReasonHeader) != ""
}

// claim reports whether the record is a claim.
func (r *lastRecord) claim() bool { return !r.deleted() && string(r.data) == string(claimValue) }

// readLast reads the last record of bk from the bucket's stream leader.
// Not with a direct get, which a bucket allows and nats.go's KV uses: any
// replica answers it, and a follower behind its leader would show a claim
// already recorded, or nothing where a claim exists. Here a read follows a
// write the leader refused, so it must see at least what the leader saw.
// It returns jetstream.ErrMsgNotFound when the key holds nothing.
func (s *Shared) readLast(ctx context.Context, bk string) (*lastRecord, error) {
	req, err := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{bk})
	if err != nil {
		return nil, err
	}
	resp, err := s.js.Conn().RequestWithContext(ctx, s.msgGet, req)
	if err != nil {
		return nil, err
	}
	var r struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs"`
			Data     []byte    `json:"data"`
			Time     time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, err
	}
	switch {
	case r.Error != nil && r.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case r.Error != nil:
		return nil, r.Error
	case r.Message == nil:
		return nil, jetstream.ErrInvalidJetStreamResponse
	}
	rec := &lastRecord{rev: r.Message.Sequence, data: r.Message.Data, time: r.Message.Time}
	if len(r.Message.Header) > 0 {
		if rec.header, err = nats.DecodeHeadersMsg(r.Message.Header); err != nil {
			return nil, err
		}
	}
	return rec, nil
}
