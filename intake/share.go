package intake

import (
	"strings"
	"time"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
)

// A tenant's share of the event stream. The stream is bounded (TOOLBUS_STREAM_MAX_BYTES,
// refusing what is beyond it) and the injector refuses every new run once it holds
// events.StreamAdmitPercent of the bound, so a tenant writing at its bytes per second
// for as long as the retention would, alone, push every other tenant's runs to that
// line. Each tenant (a team, a client identity) may hold at most StreamShare.Bytes of
// the stream's bytes written within its retention (StreamShare.Window, the stream's
// MaxAge: older writes have left the stream); a write beyond it is refused with code
// 507 store_full naming the share, until older writes leave the window. With the
// default share (DefaultStreamSharePercent of the bound) one tenant at its share leaves
// the others the stream up to the admission line less its share.
//
// The count is this instance's own, in memory: with several instances of the service a
// tenant holds up to its share per instance (as with its bytes per second), and a
// restart forgets what it counted.

// DefaultStreamSharePercent is a tenant's share of the event stream's bound unless
// configured otherwise (TOOLBUS_TENANT_STREAM_SHARE).
const DefaultStreamSharePercent = 10

// StreamShare bounds the bytes one tenant stores in the event stream. Zero bounds
// nothing.
type StreamShare struct {
	// Bytes is the most bytes (charged as the bytes per second are) a tenant's writes
	// on the event stream may hold within Window.
	Bytes int64
	// Window is how long a write counts: the stream's retention (MaxAge).
	Window time.Duration
}

// StreamShareOf is percent of a stream bounded to maxBytes with retention maxAge (no
// bound when either is 0).
func StreamShareOf(maxBytes int64, percent int, maxAge time.Duration) StreamShare {
	if maxBytes <= 0 || percent <= 0 {
		return StreamShare{}
	}
	if maxAge <= 0 {
		maxAge = 100 * 365 * 24 * time.Hour // kept for good: the share is of everything
	}
	return StreamShare{Bytes: maxBytes * int64(min(percent, 100)) / 100, Window: maxAge}
}

// shareSlots is how many parts a tenant's window is counted in: a write leaves the count
// at most Window/shareSlots after it left the stream.
const shareSlots = 64

// shareCount is one tenant's bytes on the event stream within the window, by slot.
type shareCount struct {
	slots [shareSlots]int64
	head  int64 // index (time / slot length) of the newest slot
	sum   int64
}

// advance drops the slots that left the window by now.
func (c *shareCount) advance(idx int64) {
	if idx <= c.head {
		return
	}
	for i := c.head + 1; i <= idx && i <= c.head+shareSlots; i++ {
		s := &c.slots[i%shareSlots]
		c.sum -= *s
		*s = 0
	}
	c.head = idx
}

// onStream reports whether subject is stored in the event stream (the buckets have
// bounds of their own: buckets.go).
func onStream(subject string) bool { return strings.HasPrefix(subject, events.SubjectPrefix+".") }

// claimsPrefix is the subjects of the claims bucket's keys.
const claimsPrefix = "$KV." + store.BucketClaims + "."

// A team's claims. A claim is kept as long as the events (the bucket's TTL is the
// stream's retention) and there is one per call, as many as the retention keeps, so a
// bound on its keys would refuse a busy tool its claims: a team's claims are bounded by
// their bytes written within that retention (Limits.ClaimsShare, counted as the stream
// share is and apart from it), so one team writing claims at its bytes per second cannot
// fill the store the core and every other team's claims live in.

// DefaultClaimsBytes is Limits.ClaimsShare's bytes unless configured otherwise
// (TOOLBUS_TENANT_CLAIMS_BYTES): 1 GiB of claims a team within the retention, some
// two million calls' claims at their usual size.
const DefaultClaimsBytes = 1 << 30

// share charges n bytes of tenant's write on subject to its share of the event stream,
// or of the claims bucket, or refuses it. Called with the bytes already counted for the
// rate.
func (s *Service) share(tenant, subject string, n int) *refusal {
	sh, key, what, setting := s.lim.StreamShare, tenant, "the event stream", "TOOLBUS_TENANT_STREAM_SHARE, % of TOOLBUS_STREAM_MAX_BYTES"
	if strings.HasPrefix(subject, claimsPrefix) {
		sh, key, what, setting = s.lim.ClaimsShare, tenant+" claims", "the claims bucket", "TOOLBUS_TENANT_CLAIMS_BYTES"
	} else if !onStream(subject) {
		return nil
	}
	if sh.Bytes <= 0 || sh.Window <= 0 {
		return nil
	}
	slot := sh.Window / shareSlots
	idx := time.Now().UnixNano() / int64(max(slot, 1))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shares == nil {
		s.shares = map[string]*shareCount{}
	}
	c := s.shares[key]
	if c == nil {
		c = &shareCount{head: idx}
		s.shares[key] = c
	}
	c.advance(idx)
	if c.sum+int64(n) > sh.Bytes {
		return refuseFull("%s holds %d bytes of %s written within its retention of %s, and its share is %d bytes (%s): this write of %d bytes waits until older writes leave it",
			tenant, c.sum, what, sh.Window, sh.Bytes, setting, n)
	}
	c.slots[idx%shareSlots] += int64(n)
	c.sum += int64(n)
	return nil
}
