package events

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolbus/toolbus"
)

// PublishTool writes a tool contract to the catalog (key = tool name). Executors call it
// at start for every tool they serve.
func (b *Bus) PublishTool(ctx context.Context, c toolbus.ToolContract) error {
	if !toolbus.ValidToolName(c.Name) {
		return fmt.Errorf("events: invalid tool name %q", c.Name)
	}
	if _, err := b.tools.Put(ctx, c.Name, mustJSON(c)); err != nil {
		return fmt.Errorf("events: catalog put %s: %w", c.Name, err)
	}
	return nil
}

// Catalog is a live view of the tool catalog and of the executor instances serving each
// tool, kept current by two KV watchers. A tool is offered to models only while at
// least one live instance serves it.
type Catalog struct {
	mu        sync.RWMutex
	tools     map[string]toolbus.ToolContract
	instances map[string]Instance // by instance key
}

// WatchCatalog starts watching the catalog and the instances until ctx ends. The
// returned catalog holds every tool and live instance present at start.
func (b *Bus) WatchCatalog(ctx context.Context, log *slog.Logger) (*Catalog, error) {
	c := &Catalog{tools: map[string]toolbus.ToolContract{}, instances: map[string]Instance{}}
	if err := watchBucket(ctx, b.tools, log, func(key string, val []byte) {
		var tc toolbus.ToolContract
		if val == nil {
			delete(c.tools, key)
		} else if err := json.Unmarshal(val, &tc); err == nil {
			c.tools[key] = tc
		} else if log != nil {
			log.Warn("catalog entry ignored", "tool", key, "error", err)
		}
	}, &c.mu); err != nil {
		return nil, err
	}
	if err := watchBucket(ctx, b.instances, log, func(key string, val []byte) {
		var in Instance
		if val == nil {
			delete(c.instances, key)
		} else if err := json.Unmarshal(val, &in); err == nil {
			c.instances[key] = in
		}
	}, &c.mu); err != nil {
		return nil, err
	}
	return c, nil
}

// watchBucket applies every value of kv (nil for a deleted or expired key) under mu,
// and returns once the initial values are applied.
func watchBucket(ctx context.Context, kv jetstream.KeyValue, log *slog.Logger, apply func(key string, val []byte), mu *sync.RWMutex) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("events: watch %s: %w", kv.Bucket(), err)
	}
	ready := make(chan struct{})
	go func() {
		defer w.Stop() //nolint:errcheck // nothing to do on stop failure
		initial := true
		for e := range w.Updates() {
			if e == nil { // end of the initial values
				if initial {
					initial = false
					close(ready)
				}
				continue
			}
			mu.Lock()
			if e.Operation() == jetstream.KeyValuePut {
				apply(e.Key(), e.Value())
			} else {
				apply(e.Key(), nil)
			}
			mu.Unlock()
		}
	}()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Lookup returns the contract of a tool, whether or not an instance serves it now.
func (c *Catalog) Lookup(name string) (toolbus.ToolContract, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	t, ok := c.tools[name]
	return t, ok
}

// Serving returns the names of the live instances that serve tool, sorted.
func (c *Catalog) Serving(tool string) []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.servingLocked(tool)
}

func (c *Catalog) servingLocked(tool string) []string {
	var out []string
	for _, in := range c.instances {
		for _, t := range in.Tools {
			if t == tool {
				out = append(out, in.Name)
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

// Tools returns the contracts allowed by rs (all when rs is nil) that at least one live
// instance serves, sorted by name: a tool whose last executor is gone is not offered.
func (c *Catalog) Tools(rs *toolbus.RunStarted) []toolbus.ToolContract {
	c.mu.RLock()
	live := make(map[string]bool, len(c.tools))
	for _, in := range c.instances {
		for _, t := range in.Tools {
			live[t] = true
		}
	}
	out := make([]toolbus.ToolContract, 0, len(c.tools))
	for _, t := range c.tools {
		if live[t.Name] && (rs == nil || rs.Allows(t.Name)) {
			out = append(out, t)
		}
	}
	c.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Decision is a recorded approval decision for one call.
type Decision struct {
	toolbus.Approval
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
