// Package batch is the wire format of a batch of messages sent to the app in
// one request (COURIER_BATCH_MAX > 1): the request body courier writes, and
// the two answer shapes it reads, Dapr's bulk subscribe
// (https://docs.dapr.io/developing-applications/building-blocks/pubsub/pubsub-bulk/)
// and AWS Lambda's partial batch response
// (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-errorhandling.html).
// It knows nothing of JetStream or of how an entry is settled.
package batch

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// HeaderBatch carries the number of entries of a batch request.
const HeaderBatch = "Courier-Batch"

// ContentType is the batch request's content type.
const ContentType = "application/json"

// Entry is one message of a batch, as the app sees it.
type Entry struct {
	// ID names the entry in the app's answer: the message's stream
	// sequence, unique within a batch.
	ID          string
	Key         string // the idempotency key
	Attempt     int    // JetStream's delivery count, 1-based
	Subject     string
	Stream      string
	Sequence    uint64
	Published   time.Time
	ContentType string
	// Replay is the id of the rewind that delivers the message again
	// (Courier-Replay when sent alone); "" for none, and then not written.
	Replay string
	// Header is the message's application headers as they would be sent
	// one by one (courier's own Courier-* and Idempotency-Key excluded).
	Header http.Header
	Data   []byte
}

// Encode appends the request body of entries to dst: {"entries":[...]},
// each entry's body as JSON ("data") when its content type is JSON and it
// is valid JSON, else as base64 ("dataBase64").
func Encode(dst []byte, entries []Entry) []byte {
	dst = append(dst, `{"entries":[`...)
	for i := range entries {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = entries[i].appendJSON(dst)
	}
	return append(dst, "]}"...)
}

func (e *Entry) appendJSON(dst []byte) []byte {
	dst = append(dst, `{"entryId":`...)
	dst = appendString(dst, e.ID)
	dst = appendField(dst, "idempotencyKey", e.Key)
	dst = append(dst, `,"attempt":`...)
	dst = strconv.AppendInt(dst, int64(e.Attempt), 10)
	dst = appendField(dst, "subject", e.Subject)
	dst = appendField(dst, "stream", e.Stream)
	dst = append(dst, `,"sequence":`...)
	dst = strconv.AppendUint(dst, e.Sequence, 10)
	dst = append(dst, `,"published":"`...)
	dst = e.Published.UTC().AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, '"')
	dst = appendField(dst, "contentType", e.ContentType)
	if e.Replay != "" {
		dst = appendField(dst, "replay", e.Replay)
	}
	dst = append(dst, `,"headers":{`...)
	first := true
	for name, vs := range e.Header {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendString(dst, name)
		dst = append(dst, ':', '[')
		for i, v := range vs {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, v)
		}
		dst = append(dst, ']')
	}
	dst = append(dst, '}')
	if IsJSON(e.ContentType) && json.Valid(e.Data) {
		dst = append(dst, `,"data":`...)
		dst = appendCompact(dst, e.Data)
	} else {
		dst = append(dst, `,"dataBase64":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, e.Data)
		dst = append(dst, '"')
	}
	return append(dst, '}')
}

// appendField appends ,"name":"value" with value quoted as JSON.
func appendField(dst []byte, name, value string) []byte {
	dst = append(dst, ',', '"')
	dst = append(dst, name...)
	dst = append(dst, '"', ':')
	return appendString(dst, value)
}

// appendString appends s as a JSON string (RFC 8259 section 7): quotes,
// backslashes and control characters escaped, invalid UTF-8 replaced by
// U+FFFD, as encoding/json does (its HTML escaping aside, which a request
// body does not need).
func appendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendCompact appends valid JSON data without insignificant space.
func appendCompact(dst, data []byte) []byte {
	var b bytes.Buffer
	if err := json.Compact(&b, data); err != nil {
		return append(dst, data...)
	}
	return append(dst, b.Bytes()...)
}

// IsJSON reports whether a content type is JSON: application/json or a
// +json suffix (RFC 6839).
func IsJSON(contentType string) bool {
	// The common exact forms need no parse (ParseMediaType allocates).
	switch contentType {
	case "application/octet-stream", "text/plain", "":
		return false
	case "application/json":
		return true
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// Status is what the app's answer says of one entry.
type Status int

const (
	// Success: the entry was processed.
	Success Status = iota
	// Retry: the entry is to be sent again (a transient failure).
	Retry
	// Drop: the entry is to be dead-lettered as rejected.
	Drop
)

func (s Status) String() string {
	return [...]string{"SUCCESS", "RETRY", "DROP"}[s]
}

// Answer is what a 2xx answer to a batch says of each entry.
type Answer struct {
	// Statuses has one status per entry, in the order of the ids given
	// to ReadAnswer.
	Statuses []Status
	// Problem says what could not be read or placed ("" if nothing):
	// what it concerns was set to Retry.
	Problem string
	// Whole: the answer placed no entry (it could not be read, or named
	// none of the batch's entries), so it says nothing of which entry
	// failed: every entry is Retry, as after a non-2xx answer.
	Whole bool
}

// ReadAnswer reads the body of a 2xx answer to a batch of the entries ids,
// of the content type given.
// Dapr's shape, {"statuses":[{"entryId","status"}]}: an entry missing, or
// with a status missing or unknown, is Retry. Lambda's shape,
// {"batchItemFailures":[{"itemIdentifier"}]}: those listed are Retry, the
// rest Success. An empty body, one that is no JSON object (not of a JSON
// content type, nor starting with "{": "OK", say), or an object with
// neither shape, means every entry succeeded. A JSON answer that cannot be
// read (malformed, a shape of the wrong type) retries every entry; so does a Lambda answer naming an entry not in
// the batch, as the entries it meant to fail cannot be told apart from
// those that succeeded. A Dapr status naming an unknown entry is ignored
// (its own entries are placed), and an entry given two different statuses
// is Retry; Problem says so. An answer that places no entry at all is
// Whole.
func ReadAnswer(body []byte, contentType string, ids []string) Answer {
	a := Answer{Statuses: make([]Status, len(ids))}
	body = bytes.TrimSpace(body)
	if len(body) == 0 || !IsJSON(contentType) && body[0] != '{' {
		return a
	}
	var raw struct {
		Statuses *[]struct {
			EntryID *string `json:"entryId"`
			Status  *string `json:"status"`
		} `json:"statuses"`
		Failures *[]struct {
			ItemIdentifier *string `json:"itemIdentifier"`
		} `json:"batchItemFailures"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return a.retryAll(fmt.Sprintf("the answer is not a batch answer (%v): every entry retried", err))
	}
	index := make(map[string]int, len(ids))
	for i, id := range ids {
		index[id] = i
	}
	switch {
	case raw.Statuses != nil:
		return a.dapr(*raw.Statuses, index)
	case raw.Failures != nil:
		for _, f := range *raw.Failures {
			if f.ItemIdentifier == nil {
				return a.retryAll("a batchItemFailures item without itemIdentifier: every entry retried")
			}
			i, ok := index[*f.ItemIdentifier]
			if !ok {
				return a.retryAll(fmt.Sprintf("batchItemFailures names %q, not an entry of the batch: every entry retried", *f.ItemIdentifier))
			}
			a.Statuses[i] = Retry
		}
	}
	return a
}

// dapr places Dapr's statuses.
func (a Answer) dapr(statuses []struct {
	EntryID *string `json:"entryId"`
	Status  *string `json:"status"`
}, index map[string]int) Answer {
	placed := make([]bool, len(a.Statuses))
	conflict := make([]bool, len(a.Statuses))
	var problems []string
	for _, st := range statuses {
		if st.EntryID == nil {
			problems = append(problems, "a status without entryId")
			continue
		}
		i, ok := index[*st.EntryID]
		if !ok {
			problems = append(problems, fmt.Sprintf("a status for %q, not an entry of the batch", *st.EntryID))
			continue
		}
		var got Status
		switch {
		case st.Status == nil:
			got = Retry
			problems = append(problems, fmt.Sprintf("entry %q without a status: retried", *st.EntryID))
		case strings.EqualFold(*st.Status, "SUCCESS"):
			got = Success
		case strings.EqualFold(*st.Status, "RETRY"):
			got = Retry
		case strings.EqualFold(*st.Status, "DROP"):
			got = Drop
		default:
			got = Retry
			problems = append(problems, fmt.Sprintf("entry %q has unknown status %q: retried", *st.EntryID, *st.Status))
		}
		switch {
		case conflict[i]:
		case placed[i] && a.Statuses[i] != got:
			// Which one the app meant cannot be told: the entry goes
			// again, as one whose status is unknown.
			conflict[i] = true
			problems = append(problems, fmt.Sprintf("entry %q given two statuses (%s, then %s): retried", *st.EntryID, a.Statuses[i], got))
			a.Statuses[i] = Retry
		default:
			a.Statuses[i] = got
		}
		placed[i] = true
	}
	// An entry Dapr's answer leaves out is retried, as Dapr does; that is
	// the shape's rule, not a problem.
	any := false
	for i, ok := range placed {
		any = any || ok
		if !ok {
			a.Statuses[i] = Retry
		}
	}
	a.Problem = strings.Join(problems, "; ")
	a.Whole = !any && len(placed) > 0
	return a
}

func (a Answer) retryAll(problem string) Answer {
	for i := range a.Statuses {
		a.Statuses[i] = Retry
	}
	a.Problem = problem
	a.Whole = true
	return a
}
