// Package cloudevents makes courier's request to the app a CloudEvent in
// the binary mode of the CloudEvents 1.0 HTTP binding
// (github.com/cloudevents/spec, cloudevents/bindings/http-protocol-binding.md):
// the body untouched, the attributes as ce-* headers, which is what Knative
// and Dapr apps read (COURIER_CLOUDEVENTS=binary; docs/behaviour.md#cloudevents).
//
// The attributes come from the headers courier already gives a delivery
// (proxy.BuildHeaders), so that one call maps them:
//
//	ce-specversion  1.0
//	ce-id           Idempotency-Key, the dedup key: the same for every
//	                redelivery of the message, as the spec wants of an id
//	ce-source       /courier/<stream>, a URI-reference naming the stream
//	                (the stream name path-escaped); source and id together
//	                are unique per message, as the spec asks
//	ce-type         Courier-Subject, unless the message has its own ce-type
//	ce-subject      Courier-Subject
//	ce-time         Courier-Published, the stream timestamp (RFC 3339)
//
// A message published as a binary CloudEvent (its own ce-specversion) keeps
// its attributes as its publisher wrote them and gets none of courier's; a
// message with only some ce-* headers keeps those and gets the rest; a
// structured one (Content-Type application/cloudevents+json, or any
// application/cloudevents… type, batches included) is delivered as it is,
// the event being its body. Dead letters keep the original's headers as
// they were, its own ce-* ones included; the attributes courier adds are
// not stored in them, since a replay republishes the original's headers as
// its publisher sent them, and courier derives the attributes again from
// what the dead letter records.
package cloudevents

import (
	"mime"
	"net/http"
	"net/url"
	"strings"
)

// SpecVersion is the CloudEvents version of the attributes.
const SpecVersion = "1.0"

// SourcePrefix starts ce-source; the stream's name follows.
const SourcePrefix = "/courier/"

// The headers of the attributes, canonical as http.Header keeps them.
const (
	HeaderSpecVersion = "Ce-Specversion"
	HeaderID          = "Ce-Id"
	HeaderSource      = "Ce-Source"
	HeaderType        = "Ce-Type"
	HeaderSubject     = "Ce-Subject"
	HeaderTime        = "Ce-Time"
)

// courier's headers of a delivery the attributes are made of (proxy's
// names; this package imports nothing of courier's).
const (
	headerKey       = "Idempotency-Key"
	headerSubject   = "Courier-Subject"
	headerStream    = "Courier-Stream"
	headerPublished = "Courier-Published"
	// headerBatch marks a request carrying several messages, each with its
	// own headers in the body: no one event.
	headerBatch = "Courier-Batch"
)

// Source is ce-source for stream.
func Source(stream string) string { return SourcePrefix + url.PathEscape(stream) }

// Binary adds the CloudEvents attributes to h, the headers of one delivery
// built by proxy.BuildHeaders, as the package comment says. A request that
// is not one message's delivery (no Courier-Stream: a health probe, a
// request/reply call; or a batch) is left as it is, as is a structured
// CloudEvent or a message that is a binary one already. Calling it again
// on the same headers changes nothing.
func Binary(h http.Header) {
	stream, subject := first(h, headerStream), first(h, headerSubject)
	if stream == "" || subject == "" || len(h[headerBatch]) > 0 {
		return
	}
	if len(h[HeaderSpecVersion]) > 0 || structured(first(h, "Content-Type")) {
		return
	}
	fill := func(name, v string) {
		if len(h[name]) == 0 && v != "" {
			h[name] = []string{v}
		}
	}
	h[HeaderSpecVersion] = []string{SpecVersion}
	fill(HeaderID, first(h, headerKey))
	fill(HeaderSource, Source(stream))
	fill(HeaderType, subject)
	fill(HeaderSubject, subject)
	fill(HeaderTime, first(h, headerPublished))
}

// structured reports whether a content type is one of CloudEvents' own
// (application/cloudevents+json, application/cloudevents-batch+json, ...):
// the body is then the event, attributes and all.
func structured(ct string) bool {
	if ct == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		mt = strings.ToLower(strings.TrimSpace(ct))
	}
	return strings.HasPrefix(mt, "application/cloudevents")
}

// first is h's first value of the canonical name, or "".
func first(h http.Header, name string) string {
	if vs := h[name]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}
