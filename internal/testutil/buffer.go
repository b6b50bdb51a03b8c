// Package testutil holds small helpers shared by the tests of several packages.
package testutil

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for writers and a reader in different goroutines: a
// log sink for slog handlers under test.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
