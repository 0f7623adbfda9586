package publish

// A batch's body read without reflection. encoding/json reading a batch of
// 32 entries was about a third of courier's CPU per publish in the batch
// benchmark (README, "Publishing through courier"), and with its garbage
// it held courier under the rate of a Go program publishing with nats.go.
// decodeBatch takes the bodies apps send, in the shape courier delivers
// batches in; anything else (an escape in a string the batch is read by, a
// key spelt in another case, a key given twice, a field courier does not
// know, JSON that is not valid) it leaves to encoding/json, an entry at a
// time (decodeBatchJSON), whose result, or refusal, stands (readBatch). So
// it need not refuse anything well: it must only never accept what
// encoding/json would read differently, which FuzzDecodeBatch checks.
//
// Both stop at the entry past the most a request may carry, so that what
// a refused batch holds is bounded by its body, not by its count of
// entries: 8 MiB of empty entries ({}) are 2.8 million of them.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// maxFastDepth bounds the nesting of an entry's data the fast path skips;
// deeper data goes to encoding/json (its own bound is 10,000).
const maxFastDepth = 256

// decodeBatch reads body as encoding/json reads it into a batchBody (no
// unknown field, nothing but white space after), for the bodies it takes:
// ok is false for any other, which the caller reads with decodeBatchJSON.
// It stops at the entry past most: b then holds most+1 entries, the rest
// of body unread, and the caller refuses the batch. The entries' data, raw
// fields and dataB64 share body's memory.
func decodeBatch(body []byte, most int) (b batchBody, ok bool) {
	d := batchScanner{b: body}
	if !d.byte('{') || !d.key("entries") || !d.byte('[') {
		return batchBody{}, false
	}
	b.Entries = make([]batchEntry, 0, min(countObjects(body), most+1))
	over := false
	entries := d.list(']', func() bool {
		var e batchEntry
		seen := 0
		if !d.byte('{') || !d.list('}', func() bool { return d.field(&e, &seen) }) {
			return false
		}
		b.Entries = append(b.Entries, e)
		over = len(b.Entries) > most
		return !over
	})
	if over {
		return b, true
	}
	if !entries || !d.byte('}') {
		return batchBody{}, false
	}
	d.space()
	return b, d.i == len(d.b)
}

// errTrailing is decodeBatchJSON's error for a batch followed by more
// than white space.
var errTrailing = errors.New("the batch is followed by more than white space")

// decodeBatchJSON reads body with encoding/json, as json.Decoder with
// DisallowUnknownFields reads it into a batchBody (keys matched in any
// case, null as nothing) and then finds nothing but white space after it
// (errTrailing), but an entry at a time: it stops at the entry past most,
// as decodeBatch does. One difference, for a body no app sends: it refuses
// entries given twice, which encoding/json would read into one another.
func decodeBatchJSON(body []byte, most int) (batchBody, error) {
	var b batchBody
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	tok, err := dec.Token()
	switch {
	case err != nil:
		return batchBody{}, err
	case tok == nil: // null: nothing, as encoding/json reads it
	case tok != json.Delim('{'):
		return batchBody{}, fmt.Errorf("the batch is %s, not an object", jsonKind(tok))
	default:
		seen := false
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return batchBody{}, err
			}
			key, _ := tok.(string)
			switch {
			case !strings.EqualFold(key, "entries"):
				return batchBody{}, fmt.Errorf("json: unknown field %q", key)
			case seen:
				return batchBody{}, errors.New(`"entries" is given twice`)
			}
			seen = true
			if b.Entries, err = decodeEntries(dec, most); err != nil || len(b.Entries) > most {
				return b, err
			}
		}
		if _, err := dec.Token(); err != nil { // the closing brace
			return batchBody{}, err
		}
	}
	switch _, err := dec.Token(); {
	case err == nil:
		return batchBody{}, errTrailing
	case !errors.Is(err, io.EOF):
		return batchBody{}, err
	}
	return b, nil
}

// decodeEntries reads the value of a batch's entries from dec: null (no
// entries), or a list of entries, read up to the one past most.
func decodeEntries(dec *json.Decoder, most int) ([]batchEntry, error) {
	tok, err := dec.Token()
	switch {
	case err != nil:
		return nil, err
	case tok == nil:
		return nil, nil
	case tok != json.Delim('['):
		return nil, fmt.Errorf("the batch's entries are %s, not a list", jsonKind(tok))
	}
	entries := []batchEntry{} // an empty list is not null, to encoding/json
	for dec.More() {
		if len(entries) > most {
			return entries, nil
		}
		entries = append(entries, batchEntry{})
		if err := dec.Decode(&entries[len(entries)-1]); err != nil {
			return nil, err
		}
	}
	_, err = dec.Token() // the closing bracket
	return entries, err
}

// jsonKind names the kind of JSON value tok (a json.Decoder token) begins.
func jsonKind(tok json.Token) string {
	switch tok := tok.(type) {
	case json.Delim:
		if tok == '[' {
			return "a list"
		}
		return "an object"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	}
	return "a number"
}

// countObjects is a guess at the entries in body (its '{' but the first),
// so that they are held in one allocation.
func countObjects(body []byte) int {
	n := -1
	for _, c := range body {
		if c == '{' {
			n++
		}
	}
	return max(n, 0)
}

// batchScanner reads a batch's body from b[i:].
type batchScanner struct {
	b []byte
	i int
}

// list reads the items of an array or object whose opening bracket was
// read, each with item, up to its closing bracket end.
func (d *batchScanner) list(end byte, item func() bool) bool {
	if d.peek(end) {
		d.i++
		return true
	}
	for {
		if !item() {
			return false
		}
		if !d.peek(',') {
			return d.byte(end)
		}
		d.i++
	}
}

// The fields of an entry, each allowed once on the fast path.
const (
	fieldEntryID = 1 << iota
	fieldSubject
	fieldIdempotencyKey
	fieldContentType
	fieldHeaders
	fieldData
	fieldDataBase64
	fieldAttempt
	fieldStream
	fieldSequence
	fieldPublished
)

// field reads one field of an entry's object into e: a field courier
// knows, not among those seen already (a bit each), which it joins.
func (d *batchScanner) field(e *batchEntry, seen *int) bool {
	name, ok := d.str()
	if !ok || !d.byte(':') {
		return false
	}
	d.space()
	var field int
	var ok2 bool
	switch string(name) {
	case "entryId":
		field, ok2 = fieldEntryID, d.text(&e.EntryID)
	case "subject":
		field, ok2 = fieldSubject, d.text(&e.Subject)
	case "idempotencyKey":
		field, ok2 = fieldIdempotencyKey, d.text(&e.IdempotencyKey)
	case "contentType":
		field, ok2 = fieldContentType, d.text(&e.ContentType)
	case "headers":
		field, ok2 = fieldHeaders, d.headers(&e.Headers)
	case "data":
		field, ok2 = fieldData, d.raw(&e.Data)
	case "dataBase64":
		field, ok2 = fieldDataBase64, d.base64(&e.dataB64)
	case "attempt":
		field, ok2 = fieldAttempt, d.raw(&e.Attempt)
	case "stream":
		field, ok2 = fieldStream, d.raw(&e.Stream)
	case "sequence":
		field, ok2 = fieldSequence, d.raw(&e.Sequence)
	case "published":
		field, ok2 = fieldPublished, d.raw(&e.Published)
	}
	if !ok2 || *seen&field != 0 {
		return false
	}
	*seen |= field
	return true
}

// space skips JSON's white space.
func (d *batchScanner) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// peek skips white space and reports whether c comes next.
func (d *batchScanner) peek(c byte) bool {
	d.space()
	return d.i < len(d.b) && d.b[d.i] == c
}

// byte skips white space and c, reporting whether c came.
func (d *batchScanner) byte(c byte) bool {
	if !d.peek(c) {
		return false
	}
	d.i++
	return true
}

// key reads the object key name and its colon.
func (d *batchScanner) key(name string) bool {
	k, ok := d.str()
	return ok && string(k) == name && d.byte(':')
}

// null reads the literal null, if it comes next.
func (d *batchScanner) null() bool {
	if d.peek('n') && len(d.b)-d.i >= 4 && string(d.b[d.i:d.i+4]) == "null" {
		d.i += 4
		return true
	}
	return false
}

// str reads a string without escapes, of valid UTF-8 (encoding/json
// replaces what is not): its bytes, between the quotes.
func (d *batchScanner) str() ([]byte, bool) {
	if !d.byte('"') {
		return nil, false
	}
	start, ascii := d.i, true
	for ; d.i < len(d.b); d.i++ {
		switch c := d.b[d.i]; {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			return s, ascii || utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, false
}

// text reads a string, or null (which leaves *s as it is).
func (d *batchScanner) text(s *string) bool {
	if d.null() {
		return true
	}
	v, ok := d.str()
	*s = string(v)
	return ok
}

// base64 reads dataBase64's string as it is (entryMsg decodes it), or
// null (which leaves *v nil).
func (d *batchScanner) base64(v *[]byte) bool {
	if d.null() {
		return true
	}
	s, ok := d.str()
	*v = s[:len(s):len(s)]
	return ok && s != nil
}

// headers reads an object of arrays of strings, or null (which leaves *h
// nil).
func (d *batchScanner) headers(h *map[string][]string) bool {
	if d.null() {
		return true
	}
	if !d.byte('{') {
		return false
	}
	m := map[string][]string{}
	*h = m
	return d.list('}', func() bool {
		k, ok := d.str()
		if !ok || !d.byte(':') || !d.byte('[') {
			return false
		}
		if _, dup := m[string(k)]; dup {
			return false
		}
		vs := []string{}
		values := d.list(']', func() bool {
			v, ok := d.str()
			vs = append(vs, string(v))
			return ok
		})
		m[string(k)] = vs
		return values
	})
}

// raw reads any JSON value, as json.RawMessage keeps it (null too).
func (d *batchScanner) raw(v *json.RawMessage) bool {
	d.space()
	start := d.i
	if !d.skip(0) {
		return false
	}
	*v = json.RawMessage(d.b[start:d.i:d.i])
	return json.Valid(*v)
}

// skip passes over one JSON value, finding where it ends; raw checks that
// it is valid.
func (d *batchScanner) skip(depth int) bool {
	if depth > maxFastDepth || d.i >= len(d.b) {
		return false
	}
	switch d.b[d.i] {
	case '"':
		for d.i++; d.i < len(d.b); d.i++ {
			switch d.b[d.i] {
			case '\\':
				d.i++
			case '"':
				d.i++
				return true
			}
		}
		return false
	case '{', '[':
		end := byte('}')
		if d.b[d.i] == '[' {
			end = ']'
		}
		d.i++
		if d.peek(end) {
			d.i++
			return true
		}
		for {
			d.space()
			if !d.skip(depth + 1) {
				return false
			}
			d.space()
			if d.i >= len(d.b) {
				return false
			}
			switch d.b[d.i] {
			case ',', ':':
				d.i++
			case end:
				d.i++
				return true
			default:
				return false
			}
		}
	default: // a number, true, false or null
		start := d.i
		for d.i < len(d.b) {
			switch d.b[d.i] {
			case ',', '}', ']', ':', ' ', '\t', '\n', '\r', '"', '{', '[':
				return d.i > start
			}
			d.i++
		}
		return d.i > start
	}
}
