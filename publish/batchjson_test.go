package publish

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

// fastBodies are bodies decodeBatch must take itself: the shapes courier
// delivers batches in and apps send (the README's examples, the
// benchmark's, an entry received and published as it is).
var fastBodies = []string{
	`{"entries":[{"entryId":"a","subject":"orders.paid","idempotencyKey":"order-42-paid","contentType":"application/json","headers":{"X-Tenant":["7"]},"data":{"order":42}},{"entryId":"b","dataBase64":"aGk="}]}`,
	`{"entries":[{"idempotencyKey":"k1","contentType":"application/octet-stream","dataBase64":"AAEC"},{"idempotencyKey":"k2","contentType":"application/octet-stream","dataBase64":""}]}`,
	"{ \"entries\" : [ { \"entryId\" : \"x\" , \"data\" : [1, 2.5e3, -0, true, false, null, \"s\\\"q\\u00e9\", {\"n\":{}}, []] } ] }\n",
	`{"entries":[{"entryId":"r","attempt":2,"stream":"ORDERS","sequence":12,"published":"2026-12-03T10:00:00Z","subject":"orders.paid","headers":{"Traceparent":["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"],"Empty":[]},"data":"a string"}]}`,
	`{"entries":[{"entryId":"n","subject":null,"headers":null,"dataBase64":null,"data":null}]}`,
	`{"entries":[{},{"entryId":"é ünïcode ✓","data":"ü"}]}`,
	`{"entries":[]}`,
}

// slowBodies are bodies decodeBatch leaves to encoding/json: it reads some
// of them differently from how a plain reading would, or refuses them.
var slowBodies = []string{
	`{"entries":[{"entryId":"a\u0041"}]}`,             // an escape where a string is read
	`{"entries":[{"dataBase64":"aGk\/"}]}`,            // PHP's json_encode escapes '/'
	`{"entries":[{"EntryID":"a"}]}`,                   // encoding/json matches keys in any case
	`{"Entries":[]}`,                                  // the same at the top
	`{"entries":[{"entryId":"a","entryId":"b"}]}`,     // a key twice: the last wins
	`{"entries":[{"headers":{"A":["1"],"A":["2"]}}]}`, // a header twice
	`{"entries":[],"entries":[{"entryId":"b"}]}`,      // entries twice
	`{"entries":[{"subjet":"x"}]}`,                    // unknown: refused
	`{"entries":[{"data":{"a":1,}}]}`,                 // not JSON
	`{"entries":[{"data":01}]}`,                       // not JSON
	`{"entries":[{"data":tru}]}`,                      // not JSON
	`{"entries":[{"entryId":"a"}]} {"entries":[]}`,    // more after
	`{"entries":[{"entryId":"a"}]}x`,                  // more after
	`{"entries":[{"headers":{"A":null}}]}`,            // null in headers
	`{"entries":[{"headers":{"A":["1",null]}}]}`,      // null in headers
	`{"entries":null}`,                                // no entries
	`{}`,                                              // no entries
	`null`,                                            // no batch
	`{"entries":[{"entryId":"` + "\xff" + `"}]}`,      // not UTF-8: encoding/json replaces it
	`{"entries":[{"entryId":"a` + "\t" + `b"}]}`,      // a control character: not JSON
	`{"entries":[{"data":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + `}]}`, // deep
	`{"entries":[{"entryId":1}]}`,          // not a string
	`{"entries":[{"headers":{"A":"1"}}]}`,  // not an array
	`{"entries":[{"data"}]}`,               // not JSON
	`{"entries":[{"data":"unterminated}]}`, // not JSON
	`{"entries":[{"data":{"a" 1}}]}`,       // not JSON
	`{"entries":[{"data":{"a":1:2}}]}`,     // not JSON
	`{"entries":[{"data":{"a",1}}]}`,       // not JSON
}

func TestDecodeBatchTakesWhatAppsSend(t *testing.T) {
	for _, body := range fastBodies {
		got, ok := decodeBatch([]byte(body), testMost)
		if !ok {
			t.Errorf("decodeBatch left %s to encoding/json", body)
			continue
		}
		want, err := decodeWithJSON([]byte(body))
		if err != nil {
			t.Fatalf("encoding/json refuses %s: %v", body, err)
		}
		if !reflect.DeepEqual(asJSONReadsIt(got), want) {
			t.Errorf("%s\n read as %+v\n encoding/json reads %+v", body, asJSONReadsIt(got), want)
		}
	}
}

func TestDecodeBatchLeavesTheRest(t *testing.T) {
	for _, body := range slowBodies {
		if _, ok := decodeBatch([]byte(body), testMost); ok {
			t.Errorf("decodeBatch took %s", body)
		}
	}
}

// decodeBatchJSON reads, an entry at a time, what json.Decoder reads whole,
// and refuses what it refuses; but entries given twice, which it refuses
// where encoding/json reads the second list into the first.
func TestDecodeBatchJSONReadsAsEncodingJSON(t *testing.T) {
	const twice = `{"entries":[],"entries":[{"entryId":"b"}]}`
	bodies := append(append([]string{
		`{"entries":[{"entryId":"a"}],"extra":1}`,
		`{"ENTRIES":[{"entryId":"a"}]}`,
		`{"entri\u0065s":[{"entryId":"a"}]}`,
		`{"entries":{}}`,
		`{"entries":"x"}`,
		`{"entries":[1]}`,
		`[{"entries":[]}]`,
		`"batch"`,
		``,
		`  `,
		`{"entries":[{"entryId":"a"}]`,
		`{"entries":[{"entryId":"a"},]}`,
	}, fastBodies...), slowBodies...)
	for _, body := range bodies {
		got, err := decodeBatchJSON([]byte(body), testMost)
		if body == twice {
			if err == nil || !strings.Contains(err.Error(), "twice") {
				t.Errorf("%s: %+v, %v; want entries given twice refused", body, got, err)
			}
			continue
		}
		want, werr := decodeWhole([]byte(body))
		switch {
		case (err == nil) != (werr == nil):
			t.Errorf("%s: error %v, encoding/json's %v", body, err, werr)
		case err == nil && !reflect.DeepEqual(got, want):
			t.Errorf("%s\n read as %+v\n encoding/json reads %+v", body, got, want)
		}
	}
}

// Both readings stop at the entry past the most a request may carry: what
// they hold is most+1 entries, whatever follows, JSON or not.
func TestDecodeBatchStopsPastMost(t *testing.T) {
	const most = 3
	list := func(first string, n int, after string) string {
		return `{"entries":[` + first + strings.Repeat(`,{}`, n-1) + after
	}
	for _, tc := range []struct {
		body string
		want int
	}{
		{list(`{}`, 3, `]}`), 3},
		{list(`{}`, 4, `]}`), 4},
		{list(`{}`, 1000, `]}`), 4},
		{list(`{}`, 1000, `,{"unknown":1}]}`), 4},
		{list(`{}`, 1000, `,garbage`), 4},
		{list(`{"entryId":"\u0041"}`, 3, `]}`), 3},
		{list(`{"entryId":"\u0041"}`, 1000, `]}`), 4},
		{list(`{"entryId":"\u0041"}`, 1000, `,{"unknown":1}]}`), 4},
		{list(`{"entryId":"\u0041"}`, 1000, `,garbage`), 4},
	} {
		b, ok := decodeBatch([]byte(tc.body), most)
		if !ok {
			var err error
			b, err = decodeBatchJSON([]byte(tc.body), most)
			if err != nil {
				t.Errorf("%.60s...: %v, want %d entries", tc.body, err, tc.want)
				continue
			}
		}
		if len(b.Entries) != tc.want {
			t.Errorf("%.60s... (%d entries): read %d, want %d", tc.body, strings.Count(tc.body, "{")-1, len(b.Entries), tc.want)
		}
	}
}

// Whatever decodeBatch takes, encoding/json (as readBatch's fallback
// reads) takes too and reads alike. `go test` runs the seeds; `go test
// -fuzz FuzzDecodeBatch ./publish` searches further.
func FuzzDecodeBatch(f *testing.F) {
	for _, b := range append(fastBodies, slowBodies...) {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := decodeBatch(body, testMost)
		if !ok {
			return
		}
		want, err := decodeWithJSON(body)
		if err != nil {
			t.Fatalf("decodeBatch took %q, which encoding/json refuses: %v", body, err)
		}
		if !reflect.DeepEqual(asJSONReadsIt(got), want) {
			t.Fatalf("%q\n read as %+v\n encoding/json reads %+v", body, asJSONReadsIt(got), want)
		}
	})
}

// testMost is a bound on entries that no test body reaches.
const testMost = 1 << 20

// decodeWithJSON reads body as readBatch's fallback does.
func decodeWithJSON(body []byte) (batchBody, error) {
	return decodeBatchJSON(body, testMost)
}

// decodeWhole reads body as json.Decoder reads it whole into a batchBody,
// what decodeBatchJSON reads an entry at a time.
func decodeWhole(body []byte) (batchBody, error) {
	var b batchBody
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return b, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return b, errors.New("more after the batch")
	}
	return b, nil
}

// asJSONReadsIt is b with each dataB64 in DataBase64, as encoding/json
// leaves it.
func asJSONReadsIt(b batchBody) batchBody {
	for i := range b.Entries {
		e := &b.Entries[i]
		if e.dataB64 != nil {
			s := string(e.dataB64)
			e.DataBase64, e.dataB64 = &s, nil
		}
	}
	return b
}

// BenchmarkReadBatchBody reads the benchmark's batch of 32 entries of
// 256 bytes each way.
func BenchmarkReadBatchBody(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"entries":[`)
	for i := range 32 {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"idempotencyKey":"bench-1-` + strings.Repeat("7", 6) + `","contentType":"application/octet-stream","dataBase64":"` +
			strings.Repeat("QUJD", 86) + `"}`)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	b.Run("decodeBatch", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := decodeBatch(body, testMost); !ok {
				b.Fatal("left to encoding/json")
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeWithJSON(body); err != nil {
				b.Fatal(err)
			}
		}
	})
}
