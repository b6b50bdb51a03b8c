// Package trail verifies a run's audit trail: every event signed by a key its signer
// was issued (events/seal), signed by a signer allowed to publish it, chained to the
// event that caused it, and no call left without its result where the run went on.
// It reads a run from a live bus (Collect) into a Bundle, which is self-contained: the
// events as stored and the public keys, so that Verify needs no bus (toolbus audit
// export, toolbus audit verify, toolbus replay --verify).
package trail

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/audit/checkpoint"
	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/seal"
)

// BundleFormat names the bundle's format and version.
const BundleFormat = "toolbus-audit-bundle/v1"

// Record is one event as the stream stores it: its sequence, subject, headers and data
// (base64 in JSON), and when the server stored it (Stored; zero in bundles exported
// before it was recorded): a time no publisher chooses, unlike the event's ce-time.
type Record struct {
	Seq     uint64              `json:"seq"`
	Subject string              `json:"subject"`
	Header  map[string][]string `json:"header"`
	Data    []byte              `json:"data"`
	Stored  time.Time           `json:"stored,omitzero"`
}

// Bundle is a run's audit trail, self-contained.
type Bundle struct {
	Format   string       `json:"format"`
	Run      string       `json:"run"`
	Stream   string       `json:"stream"`
	Exported time.Time    `json:"exported"`
	Events   []Record     `json:"events"`
	Keys     seal.Keyring `json:"keys"`
	// Checkpoint is the latest signed checkpoint of the stream and each event's
	// inclusion proof in it (audit/checkpoint).
	Checkpoint *checkpoint.Proofs `json:"checkpoint,omitempty"`
}

// ErrNoRun: the stream holds no event of the run.
var ErrNoRun = errors.New("trail: the stream holds no event of the run")

// Collect reads every event of run from the bus's stream, in stream order, the public
// keys from the core's bucket (seal.BucketSigners) and the latest checkpoint with the
// events' inclusion proofs; a stream that does not hash to its checkpoint (even where
// the run was removed whole) is an error.
func Collect(ctx context.Context, b *events.Bus, run string) (Bundle, error) {
	out := Bundle{Format: BundleFormat, Run: run, Stream: b.Config().Stream, Exported: time.Now().UTC()}
	recs, err := readRun(ctx, b.Reader(), run)
	if err != nil {
		return out, err
	}
	out.Events = recs
	if err := prove(ctx, b, &out); err != nil {
		return out, err
	}
	if len(recs) == 0 {
		return out, fmt.Errorf("%w %s", ErrNoRun, run)
	}
	if out.Keys, err = seal.LoadKeyring(ctx, b.JetStream()); err != nil {
		return out, err
	}
	return out, nil
}

// readRun reads the messages of toolbus.<run>.> with an ordered consumer.
func readRun(ctx context.Context, s jetstream.Stream, run string) ([]Record, error) {
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.SubjectRun(run)}})
	if err != nil {
		return nil, fmt.Errorf("trail: read run %s: %w", run, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("trail: read run %s: %w", run, err)
	}
	pending := info.NumPending
	var out []Record
	for uint64(len(out)) < pending {
		batch, err := cons.Fetch(int(min(pending-uint64(len(out)), 256)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("trail: read run %s: %w", run, err)
		}
		n := 0
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				return nil, fmt.Errorf("trail: read run %s: %w", run, err)
			}
			out = append(out, Record{Seq: md.Sequence.Stream, Subject: m.Subject(), Header: m.Headers(), Data: m.Data(), Stored: md.Timestamp.UTC()})
			n++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("trail: read run %s: %w", run, err)
		}
		if n == 0 {
			return nil, fmt.Errorf("trail: read run %s: %d of %d events read", run, len(out), pending)
		}
	}
	return out, nil
}

// WriteFile writes the bundle as JSON.
func (b Bundle) WriteFile(file string) error {
	raw, err := json.MarshalIndent(b, "", " ")
	if err != nil {
		return fmt.Errorf("trail: %w", err)
	}
	if err := os.WriteFile(file, append(raw, '\n'), 0o644); err != nil {
		return fmt.Errorf("trail: %w", err)
	}
	return nil
}

// ReadFile reads a bundle.
func ReadFile(file string) (Bundle, error) {
	var b Bundle
	raw, err := os.ReadFile(file)
	if err != nil {
		return b, fmt.Errorf("trail: %w", err)
	}
	if err := json.Unmarshal(raw, &b); err != nil {
		return b, fmt.Errorf("trail: %s: %w", file, err)
	}
	if b.Format != BundleFormat {
		return b, fmt.Errorf("trail: %s: format %q, want %q", file, b.Format, BundleFormat)
	}
	return b, nil
}

// Export is `toolbus audit export RUN -o FILE`: the run's bundle written to file.
func Export(ctx context.Context, b *events.Bus, run, file string, w io.Writer) error {
	bundle, err := Collect(ctx, b, run)
	if err != nil {
		return err
	}
	if err := bundle.WriteFile(file); err != nil {
		return err
	}
	fmt.Fprintf(w, "wrote %s: %d events of run %s, %d public keys, %d inclusion proofs\n", file, len(bundle.Events), run, len(bundle.Keys.Keys), proofs(bundle))
	return nil
}

// proofs is the number of inclusion proofs of a bundle.
func proofs(b Bundle) int {
	if b.Checkpoint == nil {
		return 0
	}
	return len(b.Checkpoint.Leaves)
}

// VerifyLive is `toolbus replay --verify RUN`: the run's trail read from the bus and
// verified, explained on w; it returns the exit code (Explain), 0 at once unless verify.
// replay verifies before it checks the invariants: the trail names the event that fails,
// which an invariant may only hint at.
func VerifyLive(ctx context.Context, b *events.Bus, run string, w io.Writer, verify bool) int {
	if !verify {
		return 0
	}
	bundle, err := Collect(ctx, b, run)
	if err != nil {
		fmt.Fprintln(w, err)
		return 1
	}
	res, err := Verify(bundle)
	return Explain(w, run, res, err)
}
