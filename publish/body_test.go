package publish

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// readAll returns the body whole whatever length was declared (exact,
// none, or past firstRead), sets aside no more than firstRead before the
// bytes come, and passes a reading error on.
func TestReadAll(t *testing.T) {
	small := []byte(`{"entries":[{"entryId":"a"}]}`)
	large := bytes.Repeat([]byte("x"), firstRead+12345)
	for _, c := range []struct {
		name string
		body []byte
		n    int64
	}{
		{"declared", small, int64(len(small))},
		{"undeclared", small, -1},
		{"empty", nil, 0},
		{"large, declared", large, int64(len(large))},
		{"large, undeclared", large, -1},
	} {
		got, err := readAll(bytes.NewReader(c.body), c.n)
		if err != nil || !bytes.Equal(got, c.body) {
			t.Errorf("%s: read %d bytes (%v), want %d", c.name, len(got), err, len(c.body))
		}
	}
	// A body declared at 8 MiB that sends 3 bytes.
	got, err := readAll(strings.NewReader("abc"), 8<<20)
	if err != nil || string(got) != "abc" || cap(got) > firstRead+1 {
		t.Errorf("read %q (%v) into %d bytes, want abc in at most %d", got, err, cap(got), firstRead+1)
	}
	boom := errors.New("connection reset")
	if _, err := readAll(io.MultiReader(strings.NewReader("ab"), failingReader{boom}), -1); !errors.Is(err, boom) {
		t.Errorf("a failing read gave %v, want %v", err, boom)
	}
}

// failingReader is a reader that fails with err.
type failingReader struct{ err error }

func (r failingReader) Read([]byte) (int, error) { return 0, r.err }

// readBody sets aside no more than firstRead before a single publish's
// body arrives, whatever length it declares: the first read of a body
// declared at 8 MiB is given at most firstRead+1 bytes. A body declared
// past max_payload is refused before it is read, one that declares none
// once it grows past it.
func TestReadBody(t *testing.T) {
	const maxPayload = 64 << 20
	body := &firstReadSize{r: strings.NewReader("abc")}
	req := httptest.NewRequest(http.MethodPost, PathPrefix+"orders.x", body)
	req.ContentLength = 8 << 20
	got, err := readBody(req, maxPayload)
	if body.n == 0 || body.n > firstRead+1 {
		t.Errorf("the first read was given %d bytes, want at most %d", body.n, firstRead+1)
	}
	if err != nil || string(got) != "abc" {
		t.Errorf("read %q (%v), want abc", got, err)
	}

	for _, c := range []struct {
		name string
		n    int64
		body string
		want string // the data, or in the refusal
	}{
		{"declared", 3, "abc", "abc"},
		{"undeclared", -1, "abc", "abc"},
		{"empty", 0, "", ""},
		{"declared past max_payload", maxPayload + 1, "abc", "larger than the server's max_payload"},
		{"undeclared past max_payload", -1, strings.Repeat("x", maxPayload+1), "larger than the server's max_payload"},
	} {
		req := httptest.NewRequest(http.MethodPost, PathPrefix+"orders.x", io.MultiReader(strings.NewReader(c.body)))
		req.ContentLength = c.n
		got, err := readBody(req, maxPayload)
		var ref *refusal
		switch {
		case err == nil && string(got) != c.want:
			t.Errorf("%s: read %d bytes, want %q", c.name, len(got), c.want)
		case err != nil && (!errors.As(err, &ref) || ref.status != http.StatusRequestEntityTooLarge || !strings.Contains(ref.msg, c.want)):
			t.Errorf("%s: %v, want 413 containing %q", c.name, err, c.want)
		}
	}
}

// firstReadSize records the size of the buffer its first Read is given.
type firstReadSize struct {
	r io.Reader
	n int
}

func (f *firstReadSize) Read(p []byte) (int, error) {
	if f.n == 0 {
		f.n = len(p)
	}
	return f.r.Read(p)
}
