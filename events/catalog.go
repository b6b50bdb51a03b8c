package events

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// PublishTool writes a tool contract to the catalog (key = tool name). Executors call it
// at start for every tool they serve.
func (b *Bus) PublishTool(ctx context.Context, c ToolContract) error {
	if !ValidToolName(c.Name) {
		return fmt.Errorf("events: invalid tool name %q", c.Name)
	}
	if _, err := b.tools.Put(ctx, c.Name, mustJSON(c)); err != nil {
		return fmt.Errorf("events: catalog put %s: %w", c.Name, err)
	}
	return nil
}

// Catalog is a live view of the tool catalog, kept current by a KV watcher.
type Catalog struct {
	mu    sync.RWMutex
	tools map[string]ToolContract
	ready chan struct{}
}

// WatchCatalog starts watching the catalog until ctx ends. The returned catalog is ready
// (holds every tool present at start) when WatchCatalog returns.
func (b *Bus) WatchCatalog(ctx context.Context, log *slog.Logger) (*Catalog, error) {
	w, err := b.tools.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("events: watch catalog: %w", err)
	}
	c := &Catalog{tools: map[string]ToolContract{}, ready: make(chan struct{})}
	go func() {
		defer w.Stop() //nolint:errcheck // nothing to do on stop failure
		initial := true
		for e := range w.Updates() {
			if e == nil { // end of the initial values
				if initial {
					initial = false
					close(c.ready)
				}
				continue
			}
			c.mu.Lock()
			switch e.Operation() {
			case jetstream.KeyValuePut:
				var tc ToolContract
				if err := json.Unmarshal(e.Value(), &tc); err != nil {
					if log != nil {
						log.Warn("catalog entry ignored", "tool", e.Key(), "error", err)
					}
				} else {
					c.tools[e.Key()] = tc
				}
			default:
				delete(c.tools, e.Key())
			}
			c.mu.Unlock()
		}
	}()
	select {
	case <-c.ready:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Lookup returns the contract of a tool.
func (c *Catalog) Lookup(name string) (ToolContract, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	t, ok := c.tools[name]
	return t, ok
}

// Tools returns the contracts allowed by rs (all when rs is nil), sorted by name.
func (c *Catalog) Tools(rs *RunStarted) []ToolContract {
	c.mu.RLock()
	out := make([]ToolContract, 0, len(c.tools))
	for _, t := range c.tools {
		if rs == nil || rs.Allows(t.Name) {
			out = append(out, t)
		}
	}
	c.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Decision is a recorded approval decision for one call.
type Decision struct {
	Approval
	Granted bool `json:"granted"`
}

// kvSafe maps a call id (which comes from a model provider) to a valid KV key token,
// injectively: other bytes than [A-Za-z0-9_-] become =XX.
func kvSafe(s string) string {
	const hex = "0123456789ABCDEF"
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			out = append(out, c)
		} else {
			out = append(out, '=', hex[c>>4], hex[c&15])
		}
	}
	if len(out) == 0 {
		return "="
	}
	return string(out)
}

// PutOutput keeps a whole tool output in the object store and returns its reference
// ("objectstore://toolbus_outputs/<name>").
func (b *Bus) PutOutput(ctx context.Context, name string, data []byte) (string, error) {
	if _, err := b.outputs.PutBytes(ctx, name, data); err != nil {
		return "", fmt.Errorf("events: put output %s: %w", name, err)
	}
	return OutputRefPrefix + name, nil
}

// OutputRefPrefix starts the reference of an output kept in the object store.
const OutputRefPrefix = "objectstore://" + BucketOutputs + "/"

// Output reads a whole output kept by PutOutput.
func (b *Bus) Output(ctx context.Context, ref string) ([]byte, error) {
	name := ref
	if len(ref) > len(OutputRefPrefix) && ref[:len(OutputRefPrefix)] == OutputRefPrefix {
		name = ref[len(OutputRefPrefix):]
	}
	data, err := b.outputs.GetBytes(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("events: get output %s: %w", name, err)
	}
	return data, nil
}
