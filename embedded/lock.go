package embedded

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// LockFile is the name of the file in a store directory that the process whose embedded
// server uses the directory holds locked, and that names the process and its server.
const LockFile = "toolbus.lock"

// ErrStoreInUse is wrapped by the error of Start when another process's server uses the
// store directory: two JetStream servers on one file store lose each other's writes.
var ErrStoreInUse = errors.New("embedded: data directory in use")

// Holder is what the lock file of a store directory says about the process that holds it.
type Holder struct {
	// PID of the process, and URL of its server (empty while it starts).
	PID int    `json:"pid"`
	URL string `json:"url,omitempty"`
	// Command is the holder's command line, for the refusal message.
	Command string `json:"command,omitempty"`
}

// InUseError is the refusal of a store directory that another process holds.
type InUseError struct {
	Dir    string
	Holder Holder
}

func (e *InUseError) Error() string {
	who := "another process"
	if e.Holder.PID > 0 {
		who = fmt.Sprintf("process %d", e.Holder.PID)
		if e.Holder.Command != "" {
			who += fmt.Sprintf(" (%s)", e.Holder.Command)
		}
	}
	msg := fmt.Sprintf("%v: %s is used by the embedded server of %s", ErrStoreInUse, e.Dir, who)
	if e.Holder.URL != "" {
		return msg + fmt.Sprintf("; use that server instead: TOOLBUS_NATS_URL=%s (or stop it first)", e.Holder.URL)
	}
	return msg + "; stop it first, or give this process its own TOOLBUS_DATA_DIR"
}

func (e *InUseError) Unwrap() error { return ErrStoreInUse }

// storeLock is a store directory held by this process: an advisory lock (flock) on its
// lock file, released by the kernel when the process ends however it ends.
type storeLock struct {
	f *os.File
}

// lockStore takes the lock of dir, or returns an *InUseError naming its holder.
func lockStore(dir string) (*storeLock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("embedded: store dir: %w", err)
	}
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("embedded: lock file: %w", err)
	}
	if err := flock(f); err != nil {
		f.Close() //nolint:errcheck // refused: read-only use follows
		h, _ := ReadHolder(dir)
		return nil, &InUseError{Dir: dir, Holder: h}
	}
	l := &storeLock{f: f}
	if err := l.write(Holder{PID: os.Getpid(), Command: strings.Join(os.Args, " ")}); err != nil {
		l.release()
		return nil, err
	}
	return l, nil
}

// write records h in the lock file.
func (l *storeLock) write(h Holder) error {
	b, _ := json.Marshal(h)
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("embedded: lock file: %w", err)
	}
	if _, err := l.f.WriteAt(append(b, '\n'), 0); err != nil {
		return fmt.Errorf("embedded: lock file: %w", err)
	}
	return nil
}

// release empties the lock file and lets the directory go.
func (l *storeLock) release() {
	if l == nil || l.f == nil {
		return
	}
	_ = l.f.Truncate(0)
	funlock(l.f)
	l.f.Close() //nolint:errcheck // nothing to do at release
	l.f = nil
}

// ReadHolder returns what the lock file of dir says about the process holding it, and
// whether a process holds it now (a lock file left by an ended process is not held).
func ReadHolder(dir string) (Holder, bool) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return Holder{}, false
	}
	defer f.Close() //nolint:errcheck // read only
	var h Holder
	b, _ := io.ReadAll(f)
	_ = json.Unmarshal(b, &h)
	if flock(f) == nil {
		funlock(f)
		return h, false
	}
	return h, true
}
