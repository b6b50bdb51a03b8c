package intake

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// What a tenant stores cannot fill what the others need: the buckets every team writes
// (secrets, instances, claims, outputs) are shared, and the bucket's own bound is the
// same for all of them, so one team at it would refuse another's OAuth token renewal.
// A team's write of a key is bounded here per bucket, in the bucket's own terms:
//
//   - its value's bytes (BucketBound.ValueBytes), refused for good (400) when over;
//   - the keys under its prefix (BucketBound.Keys; the first token of the key: the team
//     for secrets and instances, the tool for claims and outputs). A write of a key the
//     prefix holds already always passes (a renewal, a delete); a new key beyond the
//     bound is refused with code 507 and events.WriteStoreFullErrCode (store_full)
//     until some of the prefix's keys expire or an admin purges them.
//
// So a team holds at most Keys x ValueBytes of a bucket. The count is the bucket's own
// (the stream's subjects under the prefix, a deleted key's marker included), read from
// the server, so that every instance of the service (one per injector) counts the same
// keys and a restart forgets nothing; between two counts (at most countFresh apart while
// a prefix writes) an instance adds the keys it admitted itself, so with several
// instances a prefix may pass its bound by the keys the others admitted in that time.

// BucketBound bounds one tenant's keys of a shared bucket. A zero field bounds nothing.
type BucketBound struct {
	// Keys is the most keys under one prefix (the key's first token).
	Keys int
	// ValueBytes is the largest value of a key.
	ValueBytes int
}

// DefaultBucketBounds are the bounds toolbus's injector applies unless configured
// otherwise (TOOLBUS_TENANT_BUCKET_KEYS, TOOLBUS_TENANT_VALUE_BYTES): a team holds at
// most 1 MiB of the 64 MiB secrets bucket (64 teams fit), 256 instance records of up
// to 256 KiB, claims of up to 64 KiB (a claim carries its failed attempts), and per
// tool 2,048 output chunks of up to store.OutputChunk (256 MiB, a quarter of the
// default outputs bucket). Claims have no key bound: there is one per call, as many as
// the retention keeps; their bytes are (Limits.ClaimsShare, share.go).
var DefaultBucketBounds = map[string]BucketBound{
	store.BucketSecrets:   {Keys: 16, ValueBytes: 64 << 10},
	store.BucketInstances: {Keys: 256, ValueBytes: 256 << 10},
	store.BucketClaims:    {ValueBytes: 64 << 10},
	store.BucketOutputs:   {Keys: 2048, ValueBytes: store.OutputChunk},
}

// countFresh is how long a count of a prefix's keys is used (with the keys admitted
// since added) before it is read again.
const countFresh = time.Second

// keyCount is what an instance knows of a prefix's keys.
type keyCount struct {
	n          int             // keys at the last count, plus those admitted since
	at         time.Time       // of the last count
	refreshing bool            // a count is being read in the background
	held       map[string]bool // subjects found held at the bound (renewals pass without a read)
	// all: held is every subject of the prefix, listed at the bound (listKeys), so that
	// a key not in it is new and refused with no read. The service admits every
	// tenant's writes one at a time: a read per refused write was one request of the
	// core's JetStream (a stream info, on the server's one info queue) that every other
	// tenant's writes waited behind, for each new key a team at its bound sent.
	all bool
}

// refuseFull is the refusal of a new key of a prefix at its bound.
func refuseFull(format string, args ...any) *refusal {
	return &refusal{code: 507, errCode: events.WriteStoreFullErrCode, desc: "toolbus intake: store_full: " + fmt.Sprintf(format, args...)}
}

// kvOperation is the header of a KV delete or purge marker.
const kvOperation = "KV-Operation"

// hold checks a team's write of a key of a shared bucket against the bucket's bound;
// any other write passes.
func (s *Service) hold(kind, name, subject string, m *nats.Msg) *refusal {
	if kind != events.WriteTeam || !strings.HasPrefix(subject, "$KV.") {
		return nil
	}
	toks := strings.SplitN(subject, ".", 4)
	if len(toks) < 3 {
		return nil
	}
	bucket, prefix := toks[1], toks[2]
	b, ok := s.lim.Buckets[bucket]
	if !ok {
		return nil
	}
	if b.ValueBytes > 0 && len(m.Data) > b.ValueBytes {
		return refuse("%s: a value of %d bytes is over the bound of %d bytes of a key of %s (TOOLBUS_TENANT_VALUE_BYTES)", subject, len(m.Data), b.ValueBytes, bucket)
	}
	if b.Keys <= 0 || m.Header.Get(kvOperation) != "" {
		return nil // a delete or purge frees room
	}
	filter := store.KeySubject(bucket, prefix+".>")
	if len(toks) == 3 {
		filter = subject // a key of one token (the catalog's): the prefix is the key
	}
	s.mu.Lock()
	if s.counts == nil {
		s.counts = map[string]*keyCount{}
	}
	c := s.counts[filter]
	if c != nil && c.n < b.Keys {
		c.n++
		if time.Since(c.at) >= countFresh && !c.refreshing {
			c.refreshing = true
			go s.recount(bucket, filter)
		}
		s.mu.Unlock()
		return nil
	}
	if c != nil && time.Since(c.at) < countFresh {
		// At the bound by a fresh count: only a key the prefix holds passes.
		s.mu.Unlock()
		return s.held(filter, bucket, prefix, subject, b)
	}
	s.mu.Unlock()
	// Unknown, or at the bound by this instance's count: the bucket decides.
	n, err := s.countKeys(bucket, filter)
	if err != nil {
		s.log.Warn("intake: count keys", "filter", filter, "err", err)
		return &refusal{code: 503, errCode: events.WriteRefusedErrCode, desc: "toolbus intake: could not count the tenant's keys of " + bucket + ": retry"}
	}
	s.mu.Lock()
	nc := &keyCount{n: n, at: time.Now()}
	s.counts[filter] = nc
	if n < b.Keys {
		nc.n++
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	return s.held(filter, bucket, prefix, subject, b)
}

// held admits a write of a key the prefix holds already (a renewal) and refuses a new
// one: the prefix is at its bound. A key found held is remembered until the next count
// (at most the bound's number of them): its renewals meanwhile need no read.
func (s *Service) held(filter, bucket, prefix, subject string, b BucketBound) *refusal {
	s.mu.Lock()
	c := s.counts[filter]
	known, all := c != nil && c.held[subject], c != nil && c.all
	s.mu.Unlock()
	if known {
		return nil
	}
	if !all {
		// Once per count: the prefix's keys at its bound, a page of them.
		keys, complete, err := s.listKeys(bucket, filter)
		if err != nil {
			s.log.Warn("intake: list keys", "filter", filter, "err", err)
			return &refusal{code: 503, errCode: events.WriteRefusedErrCode, desc: "toolbus intake: could not read the tenant's keys of " + bucket + ": retry"}
		}
		s.mu.Lock()
		if c := s.counts[filter]; c != nil {
			c.held, c.all = keys, complete
		}
		s.mu.Unlock()
		known, all = keys[subject], complete
	}
	if known {
		return nil
	}
	if all {
		return refuseFull("%s would be a new key of %s, which holds its bound of %d keys in %s (TOOLBUS_TENANT_BUCKET_KEYS): write a key it holds, or have an admin purge some",
			subject, prefix, b.Keys, bucket)
	}
	// More keys than one listing holds (a bound over a page): the key is asked alone.
	if n, err := s.countKeys(bucket, subject); err == nil && n > 0 {
		s.mu.Lock()
		if c := s.counts[filter]; c != nil && !c.all && len(c.held) < b.Keys {
			if c.held == nil {
				c.held = map[string]bool{}
			}
			c.held[subject] = true
		}
		s.mu.Unlock()
		return nil
	}
	return refuseFull("%s would be a new key of %s, which holds its bound of %d keys in %s (TOOLBUS_TENANT_BUCKET_KEYS): write a key it holds, or have an admin purge some",
		subject, prefix, b.Keys, bucket)
}

// recount reads a prefix's keys again in the background.
func (s *Service) recount(bucket, filter string) {
	n, err := s.countKeys(bucket, filter)
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.counts[filter]
	if c == nil {
		return
	}
	c.refreshing = false
	if err != nil {
		s.log.Warn("intake: count keys", "filter", filter, "err", err)
		return
	}
	c.n, c.at, c.held, c.all = n, time.Now(), nil, false
}

// listKeys returns the subjects of bucket's stream that filter matches (a deleted key's
// marker too, as countKeys counts it), and whether they are all of them (one page of
// the server's answer, 100,000 subjects, holds every bound toolbus sets).
func (s *Service) listKeys(bucket, filter string) (map[string]bool, bool, error) {
	var info struct {
		Total int `json:"total"`
		State struct {
			Subjects map[string]uint64 `json:"subjects"`
		} `json:"state"`
	}
	if err := s.streamInfo(bucket, map[string]any{"subjects_filter": filter}, &info); err != nil {
		return nil, false, err
	}
	keys := make(map[string]bool, len(info.State.Subjects))
	for k := range info.State.Subjects {
		keys[k] = true
	}
	return keys, len(keys) >= info.Total, nil
}

// countKeys returns how many subjects of bucket's stream filter matches, as the server
// counts them: a stream info asked for the subjects past any there are returns their
// total and none of them.
func (s *Service) countKeys(bucket, filter string) (int, error) {
	var info struct {
		Total int `json:"total"`
	}
	err := s.streamInfo(bucket, map[string]any{"subjects_filter": filter, "offset": 1 << 30}, &info)
	return info.Total, err
}

// streamInfo asks the info of bucket's stream with req and decodes the answer into out.
func (s *Service) streamInfo(bucket string, req map[string]any, out any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := s.nc.RequestWithContext(ctx, "$JS.API.STREAM.INFO.KV_"+bucket, body)
	if err != nil {
		return fmt.Errorf("intake: stream info of %s: %w", bucket, err)
	}
	var apiErr struct {
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.Data, &apiErr); err != nil {
		return fmt.Errorf("intake: stream info of %s: %w", bucket, err)
	}
	if apiErr.Error != nil {
		return fmt.Errorf("intake: stream info of %s: %s", bucket, apiErr.Error.Description)
	}
	if err := json.Unmarshal(r.Data, out); err != nil {
		return fmt.Errorf("intake: stream info of %s: %w", bucket, err)
	}
	return nil
}

// BucketBounds returns DefaultBucketBounds with the given overrides, by the bucket's
// name without "toolbus_" (secrets, instances, claims, outputs): keys are the most keys
// of a prefix, values the largest value in bytes; 0 lifts that bound.
func BucketBounds(keys, values map[string]int) (map[string]BucketBound, error) {
	out := make(map[string]BucketBound, len(DefaultBucketBounds))
	for b, v := range DefaultBucketBounds {
		out[b] = v
	}
	set := func(what string, m map[string]int, f func(*BucketBound, int)) error {
		for name, v := range m {
			b, ok := out["toolbus_"+name]
			if !ok || v < 0 {
				return fmt.Errorf("intake: %s %s:%d: want one of secrets, instances, claims, outputs, with 0 (no bound) or more", what, name, v)
			}
			f(&b, v)
			out["toolbus_"+name] = b
		}
		return nil
	}
	if err := set("bucket keys", keys, func(b *BucketBound, v int) { b.Keys = v }); err != nil {
		return nil, err
	}
	if err := set("value bytes", values, func(b *BucketBound, v int) { b.ValueBytes = v }); err != nil {
		return nil, err
	}
	return out, nil
}
