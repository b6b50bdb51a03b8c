package store

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
)

// ErrContractChanged is returned by PublishTool when the catalog already holds a
// different contract for the tool and the offer neither bumps its version nor replaces
// it on purpose: a second deployment (or a stale one) must not silently change what the
// model is told about another's tool.
var ErrContractChanged = errors.New("store: tool contract differs from the registered one")

// ContractChangedError is the ErrContractChanged of one tool: what is registered and
// what was offered.
type ContractChangedError struct {
	Tool                string
	Registered, Offered toolbus.ToolContract
}

func (e *ContractChangedError) Error() string {
	if e.Registered.Owner != "" && e.Offered.Owner != "" && e.Registered.Owner != e.Offered.Owner {
		// Another team's tool: no version bump or replacement makes it this team's.
		return fmt.Sprintf("%s: %s is owned by team %q (version %d); team %q may not offer it: serve it under another name, or an administrator moves the tool to your team",
			ErrContractChanged, e.Tool, e.Registered.Owner, e.Registered.Version, e.Offered.Owner)
	}
	return fmt.Sprintf("%s: %s (registered: owner %q version %d; offered: owner %q version %d; bump the tool's Version or replace it on purpose with TOOLBUS_EXECUTOR_REPLACE_CONTRACTS=true)",
		ErrContractChanged, e.Tool, e.Registered.Owner, e.Registered.Version, e.Offered.Owner, e.Offered.Version)
}

func (e *ContractChangedError) Unwrap() error { return ErrContractChanged }

// MaxContractBytes bounds a tool contract's JSON in the catalog. Every contract offered
// to a run goes into each of its model requests, so on a shared tier one team's huge
// description would cost every other team's runs: PublishTool refuses a larger one, and
// every reader of the catalog ignores a larger entry (a team writing the bucket directly
// gains nothing).
const MaxContractBytes = 64 << 10

// ErrContractTooLarge is wrapped by PublishTool's refusal of a contract over
// MaxContractBytes.
var ErrContractTooLarge = errors.New("store: tool contract too large")

// errContractSize is the refusal of a catalog entry over MaxContractBytes, or nil.
func errContractSize(tool string, val []byte) error {
	if len(val) > MaxContractBytes {
		return fmt.Errorf("%w: %s is %d bytes, over %d", ErrContractTooLarge, tool, len(val), MaxContractBytes)
	}
	return nil
}

// ErrEntryNamesAnother is the error of a catalog entry whose value names another tool
// than its key. The key is the tool (only the tool's team may write it: the server's
// permissions, the write service's import); the value is the team's own words, so an
// entry of calc naming search would offer search twice, once as calc's team wrote it
// (its description and schema before models and hosts, its owner deciding which team's
// console users see search's calls). Such an entry is no tool's: every reader skips it.
var ErrEntryNamesAnother = errors.New("store: catalog entry names another tool")

// contractAt decodes the catalog entry of key: within MaxContractBytes, naming key.
func contractAt(key string, val []byte) (toolbus.ToolContract, error) {
	var tc toolbus.ToolContract
	if err := errContractSize(key, val); err != nil {
		return tc, err
	}
	if err := json.Unmarshal(val, &tc); err != nil {
		return tc, err
	}
	if tc.Name != key {
		return toolbus.ToolContract{}, fmt.Errorf("%w: the entry of %s names %q", ErrEntryNamesAnother, key, tc.Name)
	}
	return tc, nil
}

// PublishTool writes a tool contract to the catalog (key = tool name). Executors call it
// at start for every tool they serve. An entry that already holds the same contract is
// left alone. A different one is replaced only when c.Version is higher than the
// registered version or replace is true; otherwise PublishTool returns a
// *ContractChangedError (ErrContractChanged) and writes nothing. The write is a
// compare-and-set on the revision read, so two offers racing cannot both win.
func (s *Store) PublishTool(ctx context.Context, c toolbus.ToolContract, replace bool) error {
	if !toolbus.ValidToolName(c.Name) {
		return fmt.Errorf("store: invalid tool name %q", c.Name)
	}
	if n := len(mustJSON(c)); n > MaxContractBytes {
		return fmt.Errorf("%w: %s is %d bytes of JSON, over %d: shorten its description or input schema", ErrContractTooLarge, c.Name, n, MaxContractBytes)
	}
	for attempt := 0; ; attempt++ {
		e, err := s.tools.Get(ctx, c.Name)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			if _, err := s.tools.Create(ctx, c.Name, mustJSON(c)); err == nil {
				return nil
			} else if !errors.Is(err, jetstream.ErrKeyExists) || attempt > 3 {
				return fmt.Errorf("store: catalog put %s: %w", c.Name, err)
			}
			continue // someone registered it meanwhile: compare with theirs
		}
		if err != nil {
			return fmt.Errorf("store: catalog get %s: %w", c.Name, err)
		}
		if cur, err := contractAt(c.Name, e.Value()); err == nil {
			if bytes.Equal(mustJSON(cur), mustJSON(c)) {
				return nil
			}
			if !replace && c.Version <= cur.Version {
				return &ContractChangedError{Tool: c.Name, Registered: cur, Offered: c}
			}
		} // an undecodable entry, or one naming another tool, is replaced
		if _, err := s.tools.Update(ctx, c.Name, mustJSON(c), e.Revision()); err == nil {
			return nil
		} else if attempt > 3 || refused(err) {
			return fmt.Errorf("store: catalog put %s: %w", c.Name, err)
		}
	}
}

// Catalog is a live view of the tool catalog and of the executor instances serving each
// tool, kept current by re-reading both buckets every CatalogPoll. A tool is offered to
// models only while at least one live instance serves it.
type Catalog struct {
	store     *Store // for Resolve; nil in a catalog built without a store
	mu        sync.RWMutex
	tools     map[string]toolbus.ToolContract
	instances map[string]Instance // by instance key
	// offered caches the contracts of the live tools, sorted by name (nil: not
	// computed since tools or instances last changed): Tools runs at every step.
	offered []toolbus.ToolContract

	// Only the refreshing goroutine uses these. toolsSeq and instancesSeq are the last
	// message of each bucket read (0: read it whole next time); polls counts the
	// refreshes.
	toolsSeq, instancesSeq uint64
	polls                  int
	// whole is the tools bucket's stream as the last whole read left it (its message
	// count and last sequence): while nothing was read since and the stream still says
	// so, the next whole read is skipped.
	whole struct{ msgs, last uint64 }
	// toolsRaw and instancesRaw are the values each key was last decoded from, with what
	// they decoded to: a re-read decodes only what changed (at 1,000 tools, decoding
	// every entry at each poll was most of an idle planner's catalog cost).
	toolsRaw     map[string]decoded[toolbus.ToolContract]
	instancesRaw map[string]decoded[Instance]
}

// decoded is a value as read from a bucket and what it decoded to.
type decoded[T any] struct {
	raw string
	v   T
}

// catalogFullEvery (a variable for the tests) is how many polls go by between two whole
// reads of each bucket; in between only the changes since the last message read are
// (one request, usually answered with nothing, or with a heartbeat or two for the
// instances). Every change is a new message (the tools bucket has no TTL; an expired
// instance leaves a marker); the whole reads also cover what no message tells (an
// administrator who purges a key's messages from the bucket's stream). A whole read of
// the tools is skipped when no message came since the last one and the stream's message
// count and last sequence are still what that read left, since a purge lowers the
// count: one request for the stream's state instead of one message per tool (at 1,000
// tools, 33 messages a second less from the server to each idle catalog view). Atomic:
// a test sets it while an earlier view's poll may still read it.
var catalogFullEvery atomic.Int64

func init() { catalogFullEvery.Store(120) }

// CatalogPoll is how often a catalog view re-reads the catalog and the instances.
var CatalogPoll = 250 * time.Millisecond

// WatchCatalog reads the catalog and the instances, and re-reads them every CatalogPoll
// until ctx ends. The returned catalog holds every tool and live instance present at
// start.
//
// It reads with direct gets and creates no consumer (no KV watch): the planner and
// `toolbus mcp` must read the catalog even when readers filled the consumer limit of
// the bucket's stream.
func (s *Store) WatchCatalog(ctx context.Context, log *slog.Logger) (*Catalog, error) {
	c := &Catalog{store: s, tools: map[string]toolbus.ToolContract{}, instances: map[string]Instance{}}
	if err := s.refreshCatalog(ctx, c, log); err != nil {
		return nil, err
	}
	refreshEvery(ctx, CatalogPoll, func() error { return s.refreshCatalog(ctx, c, nil) }, log,
		"catalog not refreshed; using the last one read", "catalog refreshed again")
	return c, nil
}

// refreshEvery calls refresh every period until ctx ends, in a goroutine of its own: the
// polling of every catalog view. A view keeps what it read last when a refresh fails;
// the first failure is logged (warn), and the first success after it (recovered, when
// given).
func refreshEvery(ctx context.Context, period time.Duration, refresh func() error, log *slog.Logger, warn, recovered string) {
	go func() {
		t := time.NewTicker(period)
		defer t.Stop()
		failing := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			err := refresh()
			switch {
			case err != nil && !failing && ctx.Err() == nil && log != nil:
				log.Warn(warn, "error", err)
			case err == nil && failing && log != nil && recovered != "":
				log.Info(recovered)
			}
			failing = err != nil
		}
	}()
}

// refreshCatalog reads both buckets and replaces the view's content with what it read.
// Each bucket is read whole every catalogFullEvery polls and otherwise from the last
// message read on (refreshTools, refreshInstances).
func (s *Store) refreshCatalog(ctx context.Context, c *Catalog, log *slog.Logger) error {
	tools, toolsChanged, err := s.refreshTools(ctx, c, log)
	if err != nil {
		return fmt.Errorf("store: read the catalog: %w", err)
	}
	instances, instancesChanged, err := s.refreshInstances(ctx, c)
	if err != nil {
		return fmt.Errorf("store: read the instances: %w", err)
	}
	changed := toolsChanged || instancesChanged
	if !changed {
		return nil // the sorted list of live tools (offered) still holds
	}
	c.mu.Lock()
	c.tools, c.instances, c.offered = tools, instances, nil
	c.mu.Unlock()
	return nil
}

// refreshTools returns the catalog's tools as they are now: the changes since the last
// read applied to a copy of the current map (the same map when nothing changed), or a
// whole read; and whether they changed.
func (s *Store) refreshTools(ctx context.Context, c *Catalog, log *slog.Logger) (map[string]toolbus.ToolContract, bool, error) {
	changed := false
	// raw is the toolsRaw being built: the current one when changes are applied, a new
	// one for a whole read.
	if c.toolsRaw == nil {
		c.toolsRaw = map[string]decoded[toolbus.ToolContract]{}
	}
	raw := c.toolsRaw
	decode := func(tools map[string]toolbus.ToolContract, key string, val []byte) {
		if d, ok := c.toolsRaw[key]; ok && d.raw == string(val) {
			tools[key], raw[key] = d.v, d
			return
		}
		changed = true
		tc, err := contractAt(key, val)
		if err == nil {
			tools[key], raw[key] = tc, decoded[toolbus.ToolContract]{raw: string(val), v: tc}
		} else {
			delete(tools, key)
			delete(raw, key)
			if log != nil {
				log.Warn("catalog entry ignored", "tool", key, "error", err)
			}
		}
	}
	c.polls++
	if c.toolsSeq > 0 && c.polls%int(catalogFullEvery.Load()) != 0 {
		c.mu.RLock()
		cur := c.tools
		c.mu.RUnlock()
		next, last, removed, err := readChanges(ctx, s, s.tools.Bucket(), c.toolsSeq, cur, raw, decode)
		if err == nil {
			c.toolsSeq = max(c.toolsSeq, last)
			return next, changed || removed, nil
		}
		if !errors.Is(err, errBatchUnavailable) {
			return nil, false, err
		}
	}
	var state struct{ msgs, last uint64 }
	if st, err := s.tools.Status(ctx); err == nil {
		if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && bs.StreamInfo() != nil {
			state.msgs, state.last = bs.StreamInfo().State.Msgs, bs.StreamInfo().State.LastSeq
			if c.toolsSeq > 0 && c.toolsSeq == c.whole.last && state == c.whole {
				c.mu.RLock()
				defer c.mu.RUnlock()
				return c.tools, false, nil
			}
		}
	}
	// A whole read: batched from the start of the bucket's stream, else key by key.
	tools := map[string]toolbus.ToolContract{}
	before := len(c.toolsRaw)
	raw = make(map[string]decoded[toolbus.ToolContract], before)
	last, batched, err := readWhole(ctx, s, s.tools, tools, raw, decode)
	c.toolsSeq = 0
	if err != nil {
		return nil, false, err
	}
	c.toolsRaw = raw
	if !batched {
		return tools, true, nil
	}
	// The state read before this read: anything since makes the two differ, and the
	// next whole read happens.
	c.toolsSeq, c.whole = last, state
	return tools, changed || len(raw) != before, nil
}

// readWhole reads a bucket whole into vals and raw (fresh maps; decode fills both):
// batched from the start of its stream, else key by key (walk) where batched reads are
// not served. It returns the last sequence a batched read read and whether it was one.
func readWhole[T any](ctx context.Context, s *Store, kv jetstream.KeyValue, vals map[string]T, raw map[string]decoded[T], decode func(map[string]T, string, []byte)) (uint64, bool, error) {
	last, err := s.readFrom(ctx, kv.Bucket(), 1, func(key string, val []byte, deleted bool) {
		if deleted {
			delete(vals, key)
			delete(raw, key)
		} else {
			decode(vals, key, val)
		}
	})
	if err == nil {
		return last, true, nil
	}
	if !errors.Is(err, errBatchUnavailable) {
		return 0, false, err
	}
	clear(vals)
	clear(raw)
	return 0, false, s.walk(ctx, kv, func(key string, val []byte) { decode(vals, key, val) })
}

// Lookup returns the contract of a tool, whether or not an instance serves it now.
func (c *Catalog) Lookup(name string) (toolbus.ToolContract, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	t, ok := c.tools[name]
	return t, ok
}

// Resolve is Lookup that, for a tool this view does not hold yet, reads the tool's
// catalog entry from the bucket before answering. The view lags the bucket by up to one
// CatalogPoll, and a call routed as "no executor serves it" is rejected, never run: a
// tool published a moment before its first call must not be refused for that lag.
func (c *Catalog) Resolve(ctx context.Context, name string) (toolbus.ToolContract, bool) {
	if t, ok := c.Lookup(name); ok || c.store == nil || !toolbus.ValidToolName(name) {
		return t, ok
	}
	e, err := c.store.tools.Get(ctx, name)
	if err != nil {
		return toolbus.ToolContract{}, false
	}
	tc, err := contractAt(name, e.Value())
	if err != nil {
		return toolbus.ToolContract{}, false
	}
	c.mu.Lock()
	if _, ok := c.tools[name]; !ok {
		c.tools = maps.Clone(c.tools) // refreshTools may share the map it returned
		c.tools[name] = tc
		c.offered = nil
	}
	c.mu.Unlock()
	return tc, true
}

// Instances returns the live instances this view holds, sorted by team and name (each
// one's Team is its key's).
func (c *Catalog) Instances() []Instance {
	c.mu.RLock()
	out := slices.Collect(maps.Values(c.instances))
	c.mu.RUnlock()
	slices.SortFunc(out, func(a, b Instance) int { return cmp.Or(cmp.Compare(a.Team, b.Team), cmp.Compare(a.Name, b.Name)) })
	return out
}

// Serving returns the names of the live instances that serve tool, sorted. An instance
// serves only the tools its team owns (servesFor).
func (c *Catalog) Serving(tool string) []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.servingLocked(tool)
}

// servesFor is Instance.Serves with the contract of tool this view holds.
func (c *Catalog) servesFor(in Instance, tool string) bool {
	return in.Serves(c.tools[tool].Owner, tool)
}

func (c *Catalog) servingLocked(tool string) []string {
	var out []string
	for _, in := range c.instances {
		if c.servesFor(in, tool) {
			out = append(out, in.Name)
		}
	}
	sort.Strings(out)
	// A restarted process (same name, new boot id) is listed once while its
	// predecessor's record expires.
	return slices.Compact(out)
}

// Tools returns the contracts allowed by rs (all when rs is nil) that at least one live
// instance serves, sorted by name: a tool whose last executor is gone is not offered.
// The slice may be shared with other callers: do not modify it.
func (c *Catalog) Tools(rs *toolbus.RunStarted) []toolbus.ToolContract {
	offered := c.liveTools()
	if rs == nil || len(rs.AllowedTools) == 0 {
		return slices.Clip(offered)
	}
	out := make([]toolbus.ToolContract, 0, min(len(offered), len(rs.AllowedTools)))
	for _, t := range offered {
		if rs.Allows(t.Name) {
			out = append(out, t)
		}
	}
	return out
}

// liveTools returns the contracts of the tools a live instance serves, sorted by name,
// computed once per change of the catalog or the instances.
func (c *Catalog) liveTools() []toolbus.ToolContract {
	c.mu.RLock()
	offered := c.offered
	c.mu.RUnlock()
	if offered != nil {
		return offered
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.offered != nil {
		return c.offered
	}
	live := make(map[string]bool, len(c.tools))
	for _, in := range c.instances {
		for _, t := range in.Tools {
			if c.servesFor(in, t) {
				live[t] = true
			}
		}
	}
	out := make([]toolbus.ToolContract, 0, len(c.tools))
	for _, t := range c.tools {
		if live[t.Name] {
			out = append(out, t)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	c.offered = out
	return out
}

// Contracts lists every tool contract in the catalog, sorted by name, whether or not an
// instance serves it now.
func (s *Store) Contracts(ctx context.Context) ([]toolbus.ToolContract, error) {
	var out []toolbus.ToolContract
	err := s.walk(ctx, s.tools, func(key string, val []byte) {
		if tc, err := contractAt(key, val); err == nil {
			out = append(out, tc)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("store: list catalog: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Contract returns the catalog entry of the tool name; ErrNotFound when none is
// registered.
func (s *Store) Contract(ctx context.Context, name string) (toolbus.ToolContract, error) {
	var tc toolbus.ToolContract
	if !toolbus.ValidToolName(name) {
		return tc, fmt.Errorf("%w: invalid tool name %q", ErrNotFound, name)
	}
	if err := s.getJSON(ctx, s.tools, name, &tc); err != nil {
		return tc, err
	}
	if tc.Name != name {
		return toolbus.ToolContract{}, fmt.Errorf("%w: %s (its entry names the tool %q)", ErrNotFound, name, tc.Name)
	}
	return tc, nil
}

// refreshInstances returns the live instances as they are now and whether they
// changed, as refreshTools does for the tools: the messages since the last one read
// (heartbeats, deletes at stop, and the marker the bucket leaves when an instance
// expires: its LimitMarkerTTL) applied to a copy of the current map, one request
// usually answered with a heartbeat or two; or a whole read every catalogFullEvery
// polls, after a failed read (a marker lives only as long as an instance would: one
// missed for good would keep a dead instance), while the bucket leaves no markers (set
// up before it did), or key by key where batched reads are not served. At 1,000 tools
// (20 instances of 100 tools each), reading the bucket whole at every poll was most of
// an idle catalog view's cost.
func (s *Store) refreshInstances(ctx context.Context, c *Catalog) (map[string]Instance, bool, error) {
	changed := false
	if c.instancesRaw == nil {
		c.instancesRaw = map[string]decoded[Instance]{}
	}
	raw := c.instancesRaw
	decode := func(ins map[string]Instance, key string, val []byte) {
		if d, ok := c.instancesRaw[key]; ok && d.raw == string(val) {
			ins[key], raw[key] = d.v, d
			return
		}
		changed = true
		var in Instance
		if json.Unmarshal(val, &in) != nil {
			delete(ins, key)
			delete(raw, key)
			return
		}
		in.Team = InstanceTeam(key) // the key's team is what the server checked
		ins[key], raw[key] = in, decoded[Instance]{raw: string(val), v: in}
	}
	if c.instancesSeq > 0 && c.polls%int(catalogFullEvery.Load()) != 0 {
		c.mu.RLock()
		cur := c.instances
		c.mu.RUnlock()
		next, last, removed, err := readChanges(ctx, s, s.instances.Bucket(), c.instancesSeq, cur, raw, decode)
		if err == nil {
			c.instancesSeq = max(c.instancesSeq, last)
			return next, changed || removed, nil
		}
		c.instancesSeq = 0
		if !errors.Is(err, errBatchUnavailable) {
			return nil, false, err
		}
	}
	// A whole read: batched from the start of the bucket's stream, else key by key.
	marked := false
	if st, err := s.instances.Status(ctx); err == nil {
		if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && bs.StreamInfo() != nil {
			marked = bs.StreamInfo().Config.SubjectDeleteMarkerTTL > 0
		}
	}
	ins := map[string]Instance{}
	before := len(c.instancesRaw)
	raw = make(map[string]decoded[Instance], before)
	last, batched, err := readWhole(ctx, s, s.instances, ins, raw, decode)
	c.instancesSeq = 0
	if err != nil {
		return nil, false, err
	}
	c.instancesRaw = raw
	if batched && marked {
		c.instancesSeq = last
	}
	return ins, changed || len(raw) != before, nil
}

// readChanges applies the messages of bucket after seq to a copy of cur, made at the
// first message (cur itself when none came): decode for a value, a removal for a
// delete, purge or expiry marker. It returns the map, the last sequence read and
// whether a key held was removed.
func readChanges[T any](ctx context.Context, s *Store, bucket string, seq uint64, cur map[string]T, raw map[string]decoded[T], decode func(map[string]T, string, []byte)) (map[string]T, uint64, bool, error) {
	next, copied, removed := cur, false, false
	last, err := s.readFrom(ctx, bucket, seq+1, func(key string, val []byte, deleted bool) {
		if !copied {
			next, copied = maps.Clone(cur), true
		}
		if !deleted {
			decode(next, key, val)
			return
		}
		if _, had := next[key]; had {
			removed = true
		}
		delete(next, key)
		delete(raw, key)
	})
	return next, last, removed, err
}

// WatchOffered is a catalog view of the tools another party offers: read(ctx) returns
// the contracts a live instance serves (a client account's read service answers them,
// events.Bus.Catalog), read at once and again every poll until ctx ends. The view has
// no instances; every tool it holds is offered, and Resolve reads nothing more.
func WatchOffered(ctx context.Context, poll time.Duration, read func(context.Context) ([]toolbus.ToolContract, error), log *slog.Logger) (*Catalog, error) {
	c := &Catalog{tools: map[string]toolbus.ToolContract{}, instances: map[string]Instance{}, offered: []toolbus.ToolContract{}}
	set := func() error {
		tools, err := read(ctx)
		if err != nil {
			return err
		}
		m := make(map[string]toolbus.ToolContract, len(tools))
		for _, tc := range tools {
			m[tc.Name] = tc
		}
		out := slices.SortedFunc(maps.Values(m), func(a, b toolbus.ToolContract) int { return cmp.Compare(a.Name, b.Name) })
		c.mu.Lock()
		c.tools, c.offered = m, out
		c.mu.Unlock()
		return nil
	}
	if err := set(); err != nil {
		return nil, err
	}
	refreshEvery(ctx, poll, set, log, "offered tools not refreshed; using the last ones read", "")
	return c, nil
}
