package publish

// A request's body, read as it arrives: what is set aside before it comes
// is bounded whatever length the request declares, so that a client does
// not make courier hold memory for bytes it never sends.

import (
	"errors"
	"io"
	"net/http"
)

// firstRead bounds what readAll sets aside for a body before it arrives.
const firstRead = 1 << 20

// readBody reads a single publish's message data, refusing (413) a body
// larger than the server's max_payload: before reading it when its length
// is declared, else once it grows past it.
func readBody(r *http.Request, maxPayload int64) ([]byte, error) {
	tooLarge := func() error {
		return refuse(http.StatusRequestEntityTooLarge, outcomeTooLarge, "the body is larger than the server's max_payload (%d bytes)", maxPayload)
	}
	if r.ContentLength > maxPayload {
		return nil, tooLarge()
	}
	// net/http's body ends at a declared length: a limit only for the
	// body that declares none.
	var body io.Reader = r.Body
	if r.ContentLength < 0 {
		body = http.MaxBytesReader(nil, r.Body, maxPayload)
	}
	data, err := readAll(body, r.ContentLength)
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return nil, tooLarge()
		}
		return nil, refuse(http.StatusBadRequest, outcomeInvalid, "reading the body: %v", err)
	}
	// Read to its end, so closed: net/http then has nothing left to
	// discard before the answer (chunkWriter.writeHeader).
	_ = r.Body.Close()
	return data, nil
}

// readAll reads all of r, in one allocation when the request says its
// length (n, or -1 when it does not) and it is at most firstRead: a
// length declared larger is grown into as the bytes come, so that a
// client does not make courier hold what it never sends.
func readAll(r io.Reader, n int64) ([]byte, error) {
	size := int64(512) // a first guess at a body of no declared length
	if n >= 0 {
		size = n // exactly, so that a small message holds no more
	}
	b := make([]byte, 0, min(size, firstRead)+1) // +1: room to read the end
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		m, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+m]
		if errors.Is(err, io.EOF) {
			return b, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
