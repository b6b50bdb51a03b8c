package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/internal/refusal"
)

// Outputs too large for an event live in the KV bucket toolbus_outputs, cut in chunks:
// <tool>.<run>.<step>.<call_id>.<i> for the chunks, then <tool>.<run>.<step>.<call_id>.meta
// (size, chunk count, SHA-256), written last. The tool comes first so that a subject
// permission ($KV.toolbus_outputs.<tool>.>) lets a team's executors write the outputs of
// its tools only: no team can overwrite another's output, and nobody but the admin may
// purge the bucket (writing never needs the stream purge an object store put does).

// OutputChunk is the size of the chunks of a stored output: well under the server's
// default max_payload (1 MiB).
const OutputChunk = 128 << 10

// OutputRefPrefix starts the reference of an output kept by PutOutput.
const OutputRefPrefix = "kv://" + BucketOutputs + "/"

// ErrOutputsFull wraps a PutOutput the bucket refused because it holds its
// TOOLBUS_OUTPUTS_MAX_BYTES.
var ErrOutputsFull = errors.New("store: the outputs bucket is full (TOOLBUS_OUTPUTS_MAX_BYTES)")

// outputsFull wraps err with ErrOutputsFull when the bucket refused a write for its
// byte bound.
func outputsFull(err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && strings.Contains(apiErr.Description, "maximum bytes exceeded") {
		return fmt.Errorf("%w: %w", ErrOutputsFull, err)
	}
	// A tenant at its bound of keys in the bucket is, for it, a full bucket: the result
	// goes out without its whole output rather than waiting for room.
	if errors.Is(refusal.Wrap(err), refusal.ErrTenantStoreFull) {
		return fmt.Errorf("%w: %w", ErrOutputsFull, refusal.Wrap(err))
	}
	return err
}

// outputMeta is the value of an output's .meta key.
type outputMeta struct {
	Size   int    `json:"size"`
	Chunks int    `json:"chunks"`
	SHA256 string `json:"sha256"`
}

// OutputKey is the key prefix of the output of a call: <tool>.<run>.<step>.<call_id>.
func OutputKey(tool, run string, step int, callID string) string {
	return tool + "." + run + "." + strconv.Itoa(step) + "." + kvSafe(callID)
}

// PutOutput keeps the whole output of a call (tool is the token of the queue the call
// came from) and returns its reference ("kv://toolbus_outputs/<key>"). Writing it again
// (a call that ran again) replaces it.
func (s *Store) PutOutput(ctx context.Context, tool, run string, step int, callID string, data []byte) (string, error) {
	return s.put(ctx, OutputKey(tool, run, step, callID), data)
}

// put keeps data in chunks under key, then its meta.
func (s *Store) put(ctx context.Context, key string, data []byte) (string, error) {
	n := 0
	for off := 0; off < len(data) || n == 0; off += OutputChunk {
		end := min(off+OutputChunk, len(data))
		if _, err := s.outputs.Put(ctx, key+"."+strconv.Itoa(n), data[off:end]); err != nil {
			return "", fmt.Errorf("store: put output %s: %w", key, outputsFull(err))
		}
		n++
	}
	sum := sha256.Sum256(data)
	if _, err := s.outputs.Put(ctx, key+".meta", mustJSON(outputMeta{Size: len(data), Chunks: n, SHA256: hex.EncodeToString(sum[:])})); err != nil {
		return "", fmt.Errorf("store: put output %s: %w", key, outputsFull(err))
	}
	return OutputRefPrefix + key, nil
}

// PutAttachment keeps attachment i of a call's result (toolbus.Attachment) as PutOutput
// keeps its output, under the output's key with .a<i> added, and returns its reference.
func (s *Store) PutAttachment(ctx context.Context, tool, run string, step int, callID string, i int, data []byte) (string, error) {
	return s.put(ctx, OutputKey(tool, run, step, callID)+".a"+strconv.Itoa(i), data)
}

// ErrOutputCorrupt: the chunks of a stored output do not match its checksum.
var ErrOutputCorrupt = errors.New("store: stored output does not match its checksum")

// Output reads a whole output kept by PutOutput, by its reference (or its key).
func (s *Store) Output(ctx context.Context, ref string) ([]byte, error) {
	key := strings.TrimPrefix(ref, OutputRefPrefix)
	var m outputMeta
	if err := s.getJSON(ctx, s.outputs, key+".meta", &m); err != nil {
		return nil, fmt.Errorf("store: get output %s: %w", key, err)
	}
	var buf bytes.Buffer
	buf.Grow(m.Size)
	for i := 0; i < m.Chunks; i++ {
		e, err := s.outputs.Get(ctx, key+"."+strconv.Itoa(i))
		if err != nil {
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				return nil, fmt.Errorf("%w: output %s chunk %d", ErrNotFound, key, i)
			}
			return nil, fmt.Errorf("store: get output %s: %w", key, err)
		}
		buf.Write(e.Value())
	}
	sum := sha256.Sum256(buf.Bytes())
	if hex.EncodeToString(sum[:]) != m.SHA256 || buf.Len() != m.Size {
		return nil, fmt.Errorf("%w: %s", ErrOutputCorrupt, key)
	}
	return buf.Bytes(), nil
}

// OutputOwner is a call as the core recorded it (the call of the assistant message the
// planner wrote, which the injector matched the result to): its tool, run, step and
// call id. A reference in a call's result is data its executor wrote, and the output
// keys are predictable, so the core reads only the outputs stored under the key of the
// result's own call (OwnsRef): the one rule every reader of a reference goes through
// (CallOutput), so that no tenant's result carries another's output.
type OutputOwner struct {
	Tool   string
	Run    string
	Step   int
	CallID string
}

// ErrForeignRef: a result's reference names no output of the result's own call.
var ErrForeignRef = errors.New("store: the reference names no output of this call")

// OwnsRef reports whether ref is the reference PutOutput (attachment < 0) or
// PutAttachment (attachment i) gives the call's output.
func (o OutputOwner) OwnsRef(ref string, attachment int) bool {
	if !toolbus.ValidToolName(o.Tool) || !toolbus.ValidRunID(o.Run) || o.Step < 0 || o.CallID == "" {
		return false
	}
	want := OutputRefPrefix + OutputKey(o.Tool, o.Run, o.Step, o.CallID)
	if attachment >= 0 {
		want += ".a" + strconv.Itoa(attachment)
	}
	return ref == want
}

// CallOutput reads the output (attachment < 0) or attachment i of the call o that ref
// names; a reference that is not the call's own (OwnsRef) is refused with
// ErrForeignRef and nothing is read.
func (s *Store) CallOutput(ctx context.Context, o OutputOwner, ref string, attachment int) ([]byte, error) {
	if !o.OwnsRef(ref, attachment) {
		return nil, fmt.Errorf("%w: %q is not where call %q of tool %s (run %s, step %d) keeps its output", ErrForeignRef, ref, o.CallID, o.Tool, o.Run, o.Step)
	}
	return s.Output(ctx, ref)
}

// WithheldRefMarker starts the line that WithholdForeignRefs adds to a result's
// content for each reference it withholds.
const WithheldRefMarker = "[toolbus: withheld "

// WithholdForeignRefs drops from r every reference that is not its call's own
// (OwnsRef): an attachment keeps its media type, name and size but loses its Ref (its
// bytes are never read), the whole output its Truncated.Ref; for each, a line saying so
// is added to r.Content, so the model and every reader see that something was
// withheld, never what. It returns how many references it dropped. The injector
// applies it to every result it joins.
func WithholdForeignRefs(o OutputOwner, r *toolbus.ToolResult) int {
	n, cloned := 0, false
	var lines []string
	if r.Truncated != nil && r.Truncated.Ref != "" && !o.OwnsRef(r.Truncated.Ref, -1) {
		t := *r.Truncated
		t.Ref = ""
		r.Truncated = &t
		lines = append(lines, WithheldRefMarker+"the whole output: its reference names another call's output]")
		n++
	}
	for i, a := range r.Attachments {
		if a.Ref == "" || o.OwnsRef(a.Ref, i) {
			continue
		}
		if !cloned { // the caller's slice may be shared
			r.Attachments, cloned = append([]toolbus.Attachment(nil), r.Attachments...), true
		}
		r.Attachments[i].Ref, r.Attachments[i].Data = "", nil
		lines = append(lines, fmt.Sprintf("%sattachment %d: its reference names another call's output]", WithheldRefMarker, i))
		n++
	}
	if len(lines) > 0 {
		if r.Content != "" {
			lines = append([]string{r.Content}, lines...)
		}
		r.Content = strings.Join(lines, "\n")
	}
	return n
}
