package modeltest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// APIKey is the key the fake server accepts (as a bearer token or an x-api-key header).
const APIKey = "test-key"

// Reply is what the fake server answers to an accepted request.
type Reply struct {
	// Status is the HTTP status (0: 200).
	Status int
	// Header holds extra response headers (Retry-After...).
	Header map[string]string
	// Body is the response body.
	Body string
	// SSE sends the body as text/event-stream.
	SSE bool
}

// Always returns a reply function that answers every request with r.
func Always(r Reply) func(n int, body []byte) Reply {
	return func(int, []byte) Reply { return r }
}

// Sequence returns a reply function that answers the n-th request with rs[n], the last
// one repeating.
func Sequence(rs ...Reply) func(n int, body []byte) Reply {
	return func(n int, _ []byte) Reply { return rs[min(n, len(rs)-1)] }
}

// Server is a fake provider: it records every request body, refuses with a 400 in the
// provider's error format the requests that break the wire format (Provider.Decode) or
// the rules every provider enforces (Check), and answers the others from a script.
type Server struct {
	// URL is the server's address (no path).
	URL string

	t     *testing.T
	p     Provider
	reply func(n int, body []byte) Reply

	mu       sync.Mutex
	requests [][]byte
	accepted int
	rejected []string
	sent     []Entry // the assistant messages of the successful replies
	entries  []Entry // the last accepted request, decoded
}

// NewServer starts a fake server for p, closed when the test ends. reply answers the
// n-th accepted request (n from 0).
func NewServer(t *testing.T, p Provider, reply func(n int, body []byte) Reply) *Server {
	t.Helper()
	s := &Server{t: t, p: p, reply: reply}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// ServeHTTP serves one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, body)
	reject := func(status int, msg string) {
		s.rejected = append(s.rejected, msg)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, s.p.ErrorBody(msg))
	}
	if r.Method != http.MethodPost || r.URL.Path != s.p.Path {
		reject(http.StatusNotFound, "unknown endpoint "+r.Method+" "+r.URL.Path)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+APIKey && r.Header.Get("X-Api-Key") != APIKey {
		reject(http.StatusUnauthorized, "invalid x-api-key")
		return
	}
	entries, err := s.p.Decode(body)
	if err != nil {
		reject(http.StatusBadRequest, err.Error())
		return
	}
	if err := Check(entries, s.sent); err != nil {
		reject(http.StatusBadRequest, err.Error())
		return
	}
	s.entries = entries
	rep := s.reply(s.accepted, body)
	s.accepted++
	if rep.Status == 0 {
		rep.Status = http.StatusOK
	}
	for k, v := range rep.Header {
		w.Header().Set(k, v)
	}
	if rep.SSE {
		w.Header().Set("Content-Type", "text/event-stream")
	} else if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	if rep.Status == http.StatusOK && !rep.SSE {
		if e, ok := s.p.DecodeAnswer([]byte(rep.Body)); ok {
			s.sent = append(s.sent, e)
		}
	}
	w.WriteHeader(rep.Status)
	_, _ = io.WriteString(w, rep.Body)
}

// LastRequest returns the body of the last request.
func (s *Server) LastRequest() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.requests) == 0 {
		s.t.Fatal("the fake server received no request")
	}
	return s.requests[len(s.requests)-1]
}

// Entries returns the last accepted request, decoded.
func (s *Server) Entries() []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Entry(nil), s.entries...)
}

// Counts returns the number of requests, of accepted ones, and the messages of the
// rejected ones.
func (s *Server) Counts() (requests, accepted int, rejected []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.requests), s.accepted, append([]string(nil), s.rejected...)
}

// Forget drops the record of the assistant messages sent so far, for a test that
// rewrites them on purpose.
func (s *Server) Forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = nil
}

// Post sends a raw body to url with the accepted key, as a client that breaks the
// rules would, and returns the status and the response body.
func Post(t *testing.T, url string, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+APIKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// BytesTransport answers every request with a fixed body, with no network: the fuzz
// targets serve arbitrary bytes through it.
type BytesTransport struct {
	Status      int
	ContentType string
	Body        []byte
}

// RoundTrip answers r with the fixed body.
func (b BytesTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	h := http.Header{}
	h.Set("Content-Type", b.ContentType)
	return &http.Response{StatusCode: b.Status, Header: h, Body: io.NopCloser(bytes.NewReader(b.Body)),
		ContentLength: int64(len(b.Body)), Request: r, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}, nil
}

// Canon is the canonical JSON of a value (sorted keys), for comparisons.
func Canon(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// DecodeJSON decodes a JSON document keeping numbers as json.Number.
func DecodeJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return dec.Decode(v)
}

// Arr, Obj and Str read decoded JSON values (zero values when the type differs).
func Arr(v any) []any {
	a, _ := v.([]any)
	return a
}

// Obj reads a decoded JSON object.
func Obj(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// Str reads a decoded JSON string.
func Str(v any) string {
	s, _ := v.(string)
	return s
}
