package batch

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The request body is the documented shape, read back by encoding/json:
// a JSON body as "data", anything else (or invalid JSON) as "dataBase64".
func TestEncode(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC)
	entries := []Entry{
		{ID: "7", Key: "k-\"7\"", Attempt: 1, Subject: "orders.new", Stream: "ORDERS", Sequence: 7, Published: at,
			ContentType: "application/json", Header: http.Header{"X-Trace": {"a", "b"}}, Data: []byte(`{ "id" : 7 }`)},
		{ID: "8", Key: "k8", Attempt: 3, Subject: "orders.new", Stream: "ORDERS", Sequence: 8, Published: at,
			ContentType: "application/octet-stream", Data: []byte{0, 1, 2, 0xff}},
		{ID: "9", Key: "k9", Attempt: 1, Subject: "orders.new", Stream: "ORDERS", Sequence: 9, Published: at,
			ContentType: "application/cloudevents+json; charset=utf-8", Data: []byte(`{"broken"`)},
	}
	body := Encode(nil, entries)
	var got struct {
		Entries []struct {
			EntryID        string              `json:"entryId"`
			IdempotencyKey string              `json:"idempotencyKey"`
			Attempt        int                 `json:"attempt"`
			Subject        string              `json:"subject"`
			Stream         string              `json:"stream"`
			Sequence       uint64              `json:"sequence"`
			Published      string              `json:"published"`
			ContentType    string              `json:"contentType"`
			Headers        map[string][]string `json:"headers"`
			Data           json.RawMessage     `json:"data"`
			DataBase64     *string             `json:"dataBase64"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("body is not JSON: %v\n%s", err, body)
	}
	if len(got.Entries) != 3 {
		t.Fatalf("%d entries, want 3", len(got.Entries))
	}
	e := got.Entries[0]
	if e.EntryID != "7" || e.IdempotencyKey != `k-"7"` || e.Attempt != 1 || e.Subject != "orders.new" || e.Stream != "ORDERS" ||
		e.Sequence != 7 || e.Published != "2026-12-01T10:00:00.123456789Z" || e.ContentType != "application/json" {
		t.Errorf("entry 7 = %+v", e)
	}
	if !reflect.DeepEqual(e.Headers, map[string][]string{"X-Trace": {"a", "b"}}) {
		t.Errorf("headers = %v", e.Headers)
	}
	if string(e.Data) != `{"id":7}` || e.DataBase64 != nil {
		t.Errorf("a JSON body: data %s, dataBase64 %v", e.Data, e.DataBase64)
	}
	for i, want := range [][]byte{{0, 1, 2, 0xff}, []byte(`{"broken"`)} {
		e := got.Entries[i+1]
		if e.Data != nil || e.DataBase64 == nil {
			t.Fatalf("entry %s: data %s, want dataBase64", e.EntryID, e.Data)
		}
		if b, err := base64.StdEncoding.DecodeString(*e.DataBase64); err != nil || string(b) != string(want) {
			t.Errorf("entry %s: dataBase64 decodes to %q (%v), want %q", e.EntryID, b, err, want)
		}
	}
	if got.Entries[1].Headers == nil {
		t.Error("an entry without headers has no headers object")
	}
}

func TestReadAnswer(t *testing.T) {
	ids := []string{"1", "2", "3"}
	S, R, D := Success, Retry, Drop
	for _, c := range []struct {
		name    string
		body    string
		want    []Status
		problem string // a word the problem must hold; "" = no problem
		whole   bool   // the answer places no entry
	}{
		{"empty body: all succeeded", "", []Status{S, S, S}, "", false},
		{"neither shape: all succeeded", `{"ok":true}`, []Status{S, S, S}, "", false},
		{"dapr", `{"statuses":[{"entryId":"1","status":"SUCCESS"},{"entryId":"2","status":"RETRY"},{"entryId":"3","status":"DROP"}]}`,
			[]Status{S, R, D}, "", false},
		{"dapr, lower case", `{"statuses":[{"entryId":"1","status":"success"},{"entryId":"2","status":"drop"},{"entryId":"3","status":"Retry"}]}`,
			[]Status{S, D, R}, "", false},
		{"dapr, an entry missing is retried", `{"statuses":[{"entryId":"1","status":"SUCCESS"},{"entryId":"3","status":"SUCCESS"}]}`,
			[]Status{S, R, S}, "", false},
		{"dapr, empty list: all retried", `{"statuses":[]}`, []Status{R, R, R}, "", true},
		{"dapr, only unknown entries: all retried", `{"statuses":[{"entryId":"9","status":"SUCCESS"}]}`, []Status{R, R, R}, "not an entry", true},
		{"dapr, two statuses for one entry: retried", `{"statuses":[{"entryId":"1","status":"RETRY"},{"entryId":"1","status":"SUCCESS"},{"entryId":"2","status":"SUCCESS"},{"entryId":"3","status":"SUCCESS"}]}`,
			[]Status{R, S, S}, `entry "1" given two statuses (RETRY, then SUCCESS)`, false},
		{"dapr, two statuses, a third too: retried, said once", `{"statuses":[{"entryId":"2","status":"SUCCESS"},{"entryId":"2","status":"DROP"},{"entryId":"2","status":"SUCCESS"},{"entryId":"1","status":"SUCCESS"},{"entryId":"3","status":"SUCCESS"}]}`,
			[]Status{S, R, S}, "(SUCCESS, then DROP)", false},
		{"dapr, the same status twice", `{"statuses":[{"entryId":"1","status":"SUCCESS"},{"entryId":"1","status":"success"},{"entryId":"2","status":"SUCCESS"},{"entryId":"3","status":"DROP"}]}`,
			[]Status{S, S, D}, "", false},
		{"dapr, unknown status", `{"statuses":[{"entryId":"1","status":"MAYBE"},{"entryId":"2","status":"SUCCESS"},{"entryId":"3","status":"SUCCESS"}]}`,
			[]Status{R, S, S}, "unknown status", false},
		{"dapr, status missing", `{"statuses":[{"entryId":"1"},{"entryId":"2","status":"SUCCESS"},{"entryId":"3","status":"SUCCESS"}]}`,
			[]Status{R, S, S}, "without a status", false},
		{"dapr, unknown entry", `{"statuses":[{"entryId":"9","status":"DROP"},{"entryId":"1","status":"SUCCESS"},{"entryId":"2","status":"SUCCESS"},{"entryId":"3","status":"SUCCESS"}]}`,
			[]Status{S, S, S}, "not an entry", false},
		{"lambda", `{"batchItemFailures":[{"itemIdentifier":"2"}]}`, []Status{S, R, S}, "", false},
		{"lambda, none failed", `{"batchItemFailures":[]}`, []Status{S, S, S}, "", false},
		{"lambda, unknown entry: all retried", `{"batchItemFailures":[{"itemIdentifier":"9"}]}`, []Status{R, R, R}, "not an entry", true},
		{"lambda, no identifier: all retried", `{"batchItemFailures":[{}]}`, []Status{R, R, R}, "without itemIdentifier", true},
		{"bad JSON: all retried", `{"statuses":[`, []Status{R, R, R}, "not a batch answer", true},
		{"wrong type: all retried", `{"statuses":"SUCCESS"}`, []Status{R, R, R}, "not a batch answer", true},
		{"plain text: all succeeded", "OK", []Status{S, S, S}, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ct := ""
			if strings.HasPrefix(c.body, "{") {
				ct = "application/json"
			}
			a := ReadAnswer([]byte(c.body), ct, ids)
			if !reflect.DeepEqual(a.Statuses, c.want) {
				t.Errorf("statuses %v, want %v", a.Statuses, c.want)
			}
			if c.problem == "" && a.Problem != "" {
				t.Errorf("problem %q, want none", a.Problem)
			}
			if c.problem != "" && !strings.Contains(a.Problem, c.problem) {
				t.Errorf("problem %q, want it to say %q", a.Problem, c.problem)
			}
			if c.problem != "" && strings.Count(a.Problem, "statuses (") > 1 {
				t.Errorf("problem %q says an entry's conflict more than once", a.Problem)
			}
			if a.Whole != c.whole {
				t.Errorf("whole %v, want %v", a.Whole, c.whole)
			}
		})
	}
}

// Of a JSON content type, anything that is not a batch answer is
// unreadable, whatever its first byte.
func TestReadAnswerOfJSONType(t *testing.T) {
	for _, body := range []string{`"OK"`, `[`, `[]`, `true`} {
		a := ReadAnswer([]byte(body), "application/json; charset=utf-8", []string{"1", "2"})
		if !reflect.DeepEqual(a.Statuses, []Status{Retry, Retry}) || !strings.Contains(a.Problem, "not a batch answer") {
			t.Errorf("%s: %v %q, want every entry retried as not a batch answer", body, a.Statuses, a.Problem)
		}
	}
}

// appendString reads back as encoding/json's own encoding of the same
// string does: escapes, control characters, invalid UTF-8.
func TestAppendString(t *testing.T) {
	for _, s := range []string{"", "plain", `quo"te`, `back\slash`, "line\nfeed\r\t", "\x00\x01\x1f\x7f",
		"héllo wörld ✓", "bad \xff\xfe utf-8", "truncated \xe2\x82", "<html>&", "\u2028\u2029"} {
		var got, want string
		if err := json.Unmarshal(appendString(nil, s), &got); err != nil {
			t.Errorf("%q: not a JSON string: %v (%s)", s, err, appendString(nil, s))
			continue
		}
		b, _ := json.Marshal(s)
		_ = json.Unmarshal(b, &want)
		if got != want {
			t.Errorf("%q reads back as %q, encoding/json's as %q", s, got, want)
		}
	}
}

func TestIsJSON(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json": true, "application/json; charset=utf-8": true, "application/cloudevents+json": true,
		"text/plain": false, "application/octet-stream": false, "": false, "application/jsonx": false,
	} {
		if got := IsJSON(ct); got != want {
			t.Errorf("IsJSON(%q) = %v, want %v", ct, got, want)
		}
	}
}
