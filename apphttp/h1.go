package apphttp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/courierhq/courier/internal/appurl"
)

// h1Transport is the HTTP/1.1 transport of NewClient's clients for plain
// http:// and unix:// apps: each request is written and its answer read on
// the calling goroutine, over a keep-alive connection taken from an idle
// pool. net/http's Transport hands every request to two goroutines of its
// connection (one writes, one reads) and back; for a sidecar that sends one
// request at a time per worker to an app on the same host, those handoffs
// cost more CPU than the request itself. The answer is read by net/http's
// ReadResponse; the request is written as Request.Write writes it
// (appendHead, write), without its general machinery.
//
// It behaves as NewClient's http.Transport did for what courier sends: no
// proxy, no compression, no resends of its own, keep-alive connections kept
// idle up to a limit and closed after IdleTimeout, the context ending a
// request at any point, and the httptrace hooks that classify a failure
// (GetConn, GotConn, WroteRequest). Other schemes (https) go to next.
type h1Transport struct {
	dial     appurl.DialFunc
	maxIdle  int
	idleTime time.Duration
	next     http.RoundTripper // every request that is not plain HTTP

	mu    sync.Mutex
	idle  []*h1Conn // most recently used last
	sweep *time.Timer
}

// h1Conn is one connection to the app and its buffers.
type h1Conn struct {
	t         *h1Transport
	addr      string
	c         net.Conn
	br        *bufio.Reader // reads c through Read
	bw        *bufio.Writer
	idleSince time.Time
	// limit is what br may still read from c: maxHeaderBytes while an
	// answer's header is read, no limit for its body.
	limit int64
}

// maxHeaderBytes bounds an answer's header, its interim answers (1xx)
// included, as net/http's Transport bounds them by default. It does not
// count interim answers: an app may send 102 Processing while it works.
const maxHeaderBytes = 10 << 20

// aLongTimeAgo is a deadline in the past: setting it makes a blocked read or
// write return at once.
var aLongTimeAgo = time.Unix(1, 0)

// h1Request is what send writes: a request's parts, its body in memory
// (body) or to be read (bodyR, for RoundTrip's callers).
type h1Request struct {
	method, uri, host, addr string
	header                  http.Header
	close                   bool
	length                  int64
	body                    []byte
	bodyR                   io.ReadCloser
	// req is the request as ReadResponse sees it (it reads the method)
	// and the answer names it: the caller's, or the endpoint's template.
	req *http.Request
}

// RoundTrip is Client.Do's way to the transport: a plain-HTTP request is
// sent here, on the calling goroutine; any other goes to next.
func (t *h1Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || req.URL.User != nil {
		return t.next.RoundTrip(req)
	}
	r := h1RequestOf(req)
	if req.ContentLength < 0 || (req.ContentLength == 0 && r.bodyR != nil) {
		// A body of unknown length, sent chunked: not something courier
		// sends; net/http's transport has the machinery.
		return t.next.RoundTrip(req)
	}
	var st connTrace
	return t.send(req.Context(), &r, httptrace.ContextClientTrace(req.Context()), &st)
}

// h1RequestOf is req's parts, as send writes them.
func h1RequestOf(req *http.Request) h1Request {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	r := h1Request{method: req.Method, uri: req.URL.RequestURI(), host: host, addr: canonicalAddr(req.URL),
		header: req.Header, close: req.Close, length: req.ContentLength, req: req}
	if req.Body != nil && req.Body != http.NoBody {
		r.bodyR = req.Body
	}
	if r.method == "" {
		r.method = http.MethodGet
	}
	return r
}

// exchange is Send's request to an http:// or unix:// app: POST body with
// header h to e, without an http.Request of its own nor httptrace hooks
// (what they would learn, send records in a connTrace). It answers as
// exchangeNetHTTP does.
func (t *h1Transport) exchange(ctx context.Context, e *Endpoint, h http.Header, body []byte) (*http.Response, error, bool) {
	r := h1Request{method: http.MethodPost, uri: e.uri, host: e.tmpl.Host, addr: e.addr,
		header: h, length: int64(len(body)), body: body, req: e.tmpl}
	var st connTrace
	resp, err := t.send(ctx, &r, nil, &st)
	if err != nil {
		// As Client.Do reports it.
		err, resend := exchangeError(ctx, &url.Error{Op: "Post", URL: e.url.String(), Err: err}, &st)
		return nil, err, resend
	}
	if err := badLocation(e.url, r.length, resp); err != nil {
		resp.Body.Close()
		err, resend := exchangeError(ctx, err, &st)
		return nil, err, resend
	}
	return resp, nil, false
}

// send writes r on an idle connection or a new one, and reads its answer.
// It records in st what it learned of the connection, and calls trace's
// hooks (if any) as net/http's Transport would.
func (t *h1Transport) send(ctx context.Context, r *h1Request, trace *httptrace.ClientTrace, st *connTrace) (*http.Response, error) {
	pc, err := t.connect(ctx, r, trace, st)
	if err != nil {
		if r.bodyR != nil {
			_ = r.bodyR.Close()
		}
		return nil, err
	}
	// The context ends the request at any point, its answer's body
	// included: a blocked read or write returns at once.
	stop := context.AfterFunc(ctx, func() { _ = pc.c.SetDeadline(aLongTimeAgo) })
	resp, wrote, err := pc.roundTrip(ctx, r, trace, st)
	if err != nil {
		stop()
		pc.close()
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, err
	}
	reuse := wrote == nil && !resp.Close && !r.close && resp.StatusCode != http.StatusSwitchingProtocols
	if resp.Body == http.NoBody || resp.Body == nil {
		pc.done(stop, reuse)
		resp.Body = http.NoBody
		return resp, nil
	}
	resp.Body = &h1Body{ctx: ctx, rc: resp.Body, pc: pc, stop: stop, reuse: reuse}
	return resp, nil
}

// connect returns a connection for r: an idle one, or a new one. It refuses
// first, before a connection is sought, what net/http's Transport refuses
// then: a header it would not send, a context already ended (which says
// nothing of the app).
func (t *h1Transport) connect(ctx context.Context, r *h1Request, trace *httptrace.ClientTrace, st *connTrace) (*h1Conn, error) {
	if err := checkHeader(r.header); err != nil {
		return nil, err
	}
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	st.askedConn = true
	if trace != nil && trace.GetConn != nil {
		trace.GetConn(r.addr)
	}
	pc, reused, idle := t.take(r.addr)
	if pc == nil {
		c, err := t.dial(ctx, "tcp", r.addr)
		if err != nil {
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			return nil, err
		}
		pc = &h1Conn{t: t, addr: r.addr, c: c, bw: bufio.NewWriterSize(c, 4<<10)}
		pc.br = bufio.NewReaderSize(pc, 4<<10)
	}
	st.gotConn, st.reused = true, reused
	if trace != nil && trace.GotConn != nil {
		trace.GotConn(httptrace.GotConnInfo{Conn: pc.c, Reused: reused, WasIdle: reused, IdleTime: idle})
	}
	return pc, nil
}

// roundTrip writes r on pc and reads its answer's header. wrote is the
// error of writing it: the app may have answered before reading the whole
// request (a 413) and closed its end, and its answer is then the outcome,
// as with net/http's Transport, which waits as long for it. err is the
// error to report when there is no answer; pc is then unfit for reuse.
func (pc *h1Conn) roundTrip(ctx context.Context, r *h1Request, trace *httptrace.ClientTrace, st *connTrace) (resp *http.Response, wrote, err error) {
	wrote = pc.write(r)
	st.wrote, st.wroteErr = true, wrote
	if trace != nil && trace.WroteRequest != nil {
		trace.WroteRequest(httptrace.WroteRequestInfo{Err: wrote})
	}
	if wrote != nil {
		if ctx.Err() != nil {
			return nil, wrote, wrote
		}
		// An answer sent before the app closed its end is on its way.
		_ = pc.c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	}
	resp, err = pc.readResponse(r.req)
	if err != nil && wrote != nil {
		err = wrote
	}
	return resp, wrote, err
}

// readResponse reads the final answer's header to req, after any interim
// answers (100 Continue, 103 Early Hints), within maxHeaderBytes.
func (pc *h1Conn) readResponse(req *http.Request) (*http.Response, error) {
	pc.limit = maxHeaderBytes
	for {
		resp, err := http.ReadResponse(pc.br, req)
		switch {
		case err != nil && pc.limit <= 0:
			return nil, fmt.Errorf("the app's answer headers exceeded %d bytes", maxHeaderBytes)
		case errors.Is(err, io.EOF):
			return nil, fmt.Errorf("the app closed the connection without an answer: %w", io.ErrUnexpectedEOF)
		case err != nil:
			return nil, err
		}
		// 101 Switching Protocols is final, on a connection no longer HTTP.
		if resp.StatusCode < 100 || resp.StatusCode > 199 || resp.StatusCode == http.StatusSwitchingProtocols {
			pc.limit = math.MaxInt64
			return resp, nil
		}
	}
}

// Read reads from the connection for br, no more than limit.
func (pc *h1Conn) Read(p []byte) (int, error) {
	if pc.limit <= 0 {
		return 0, errors.New("read limit exhausted")
	}
	if int64(len(p)) > pc.limit {
		p = p[:pc.limit]
	}
	n, err := pc.c.Read(p)
	pc.limit -= int64(n)
	return n, err
}

// h1Body is an answer's body: once read to its end, its connection goes
// back to the pool; closed before, the connection is closed.
type h1Body struct {
	ctx   context.Context
	rc    io.ReadCloser
	pc    *h1Conn
	stop  func() bool
	reuse bool
	ended bool
}

func (b *h1Body) Read(p []byte) (int, error) {
	if b.ended {
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.end(true)
	} else if err != nil {
		b.end(false)
		if b.ctx.Err() != nil {
			err = context.Cause(b.ctx) // the context ended the read
		}
	}
	return n, err
}

func (b *h1Body) Close() error {
	if !b.ended {
		b.end(false)
	}
	return nil
}

func (b *h1Body) end(whole bool) {
	b.ended = true
	b.pc.done(b.stop, b.reuse && whole)
}

// write sends r on pc. The head is built in the buffer's free space
// (AvailableBuffer), so a request that fits is copied once. A body in
// memory that does not fit beside the head goes with it in one writev: a
// batch's request then leaves in one write, which wakes the app's reader
// once, where the buffer would send its first 4 KiB and then the rest.
func (pc *h1Conn) write(r *h1Request) error {
	head := appendHead(pc.bw.AvailableBuffer(), r)
	if r.bodyR == nil && pc.bw.Buffered() == 0 && len(head)+len(r.body) > pc.bw.Available() {
		bufs := net.Buffers{head, r.body}
		_, err := bufs.WriteTo(pc.c)
		return err
	}
	if err := writeRest(pc.bw, head, r); err != nil {
		return err
	}
	return pc.bw.Flush()
}

// writeRest writes head and then r's body to w.
func writeRest(w *bufio.Writer, head []byte, r *h1Request) error {
	w.Write(head)
	if r.bodyR == nil {
		_, err := w.Write(r.body)
		return err
	}
	n, err := io.Copy(w, r.bodyR)
	_ = r.bodyR.Close()
	if err == nil && n != r.length {
		err = fmt.Errorf("net/http: ContentLength=%d with Body length %d", r.length, n)
	}
	return err
}

// appendHead appends r's head to b as (*http.Request).Write writes a
// request with a known length: the request line, Host, User-Agent (Go's
// unless the header has one), Connection: close if r.close, Content-Length,
// the header (except the fields Request.Write writes from a request's own
// fields), and the blank line. The header has passed checkHeader.
func appendHead(b []byte, r *h1Request) []byte {
	b = append(b, r.method...)
	b = append(b, ' ')
	b = append(b, r.uri...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, r.host...)
	b = append(b, "\r\n"...)
	ua := "Go-http-client/1.1"
	if vs, ok := r.header["User-Agent"]; ok {
		ua = ""
		if len(vs) > 0 {
			ua = vs[0]
		}
	}
	if ua != "" {
		b = append(b, "User-Agent: "...)
		b = append(b, ua...)
		b = append(b, "\r\n"...)
	}
	if r.close {
		b = append(b, "Connection: close\r\n"...)
	}
	if r.length > 0 || r.method == http.MethodPost || r.method == http.MethodPut || r.method == http.MethodPatch {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, r.length, 10)
		b = append(b, "\r\n"...)
	}
	for k, vs := range r.header {
		switch k {
		case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		for _, v := range vs {
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	b = append(b, "\r\n"...)
	return b
}
