package store

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolbus/toolbus"
)

// batchTimeout bounds one batched read; batchPause is how long batched reads are not
// tried again after one failed (a server without direct gets on the bucket, credentials
// that may not send the request, a server too old for multi_last).
const (
	batchTimeout = 2 * time.Second
	batchPause   = time.Minute
)

// batchMux routes the answers of batched reads from one wildcard subscription (made on
// first use) to the reads waiting for them: a subscription per read would cost the
// server a change of its subscription list each time.
type batchMux struct {
	mu      sync.Mutex
	prefix  string
	sub     *nats.Subscription
	next    uint64
	waiting map[string]*batchWaiter
}

type batchWaiter struct {
	ch   chan *nats.Msg
	quit chan struct{}
}

// open registers a read; done unregisters it.
func (b *batchMux) open(nc *nats.Conn) (reply string, ch <-chan *nats.Msg, done func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sub == nil || !b.sub.IsValid() {
		b.prefix = nc.NewInbox()
		b.waiting = map[string]*batchWaiter{}
		sub, err := nc.Subscribe(b.prefix+".*", func(m *nats.Msg) {
			b.mu.Lock()
			w := b.waiting[m.Subject]
			b.mu.Unlock()
			if w != nil {
				select {
				case w.ch <- m:
				case <-w.quit: // the read gave up
				}
			}
		})
		if err != nil {
			return "", nil, nil, err
		}
		_ = sub.SetPendingLimits(-1, -1) // each read's answer is bounded by its batch size
		b.sub = sub
	}
	b.next++
	reply = b.prefix + "." + strconv.FormatUint(b.next, 36)
	w := &batchWaiter{ch: make(chan *nats.Msg, 8), quit: make(chan struct{})}
	b.waiting[reply] = w
	return reply, w.ch, func() {
		b.mu.Lock()
		delete(b.waiting, reply)
		b.mu.Unlock()
		close(w.quit)
	}, nil
}

// batchMax is the most keys one batched read asks for (the server answers at most 1024).
const batchMax = 1000

// batchResults reads the stored results of a step with one direct-get batch request
// (multi_last on the step's result keys) instead of one request per result. It returns
// the results it got by call index; ok is false when the batch could not be read, and
// the caller then reads each result on its own, as it always may. A result missing from
// the answer (deleted, or cut by the server's size bound) is simply absent.
func (s *Store) batchResults(ctx context.Context, run string, step, n int) (map[int]toolbus.ToolResult, bool) {
	if n > batchMax {
		return nil, false
	}
	vals, ok := s.lastValues(ctx, []string{stepKey(run, step, "r") + ".*"}, n)
	if !ok {
		return nil, false
	}
	return decodeResults(vals, stepKey(run, step, "r")+".", n), true
}

// decodeResults picks the results of a step (keys prefix + index) out of vals; one that
// does not decode is left out (reading it on its own reports the error).
func decodeResults(vals map[string][]byte, prefix string, n int) map[int]toolbus.ToolResult {
	out := make(map[int]toolbus.ToolResult, n)
	for k, v := range vals {
		rest, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		idx, err := strconv.Atoi(rest)
		if err != nil || idx < 0 || idx >= n {
			continue
		}
		var r toolbus.ToolResult
		if json.Unmarshal(v, &r) != nil {
			continue
		}
		out[idx] = r
	}
	return out
}

// lastValues reads the value of every history key matching filters (keys, or key
// patterns with wildcards) with one direct-get batch request (multi_last): one round
// trip and one request for the server instead of one per key, read as one snapshot.
// It returns the values by key (deleted keys are absent); ok is false when the batch
// could not be read (the caller reads each key on its own, as it always may).
func (s *Store) lastValues(ctx context.Context, filters []string, max int) (map[string][]byte, bool) {
	if s.conn == nil || time.Now().UnixNano() < s.batchOffUntil.Load() {
		return nil, false
	}
	subjects := make([]string, len(filters))
	for i, f := range filters {
		subjects[i] = historySubjectPrefix + f
	}
	out, _, ok, fatal := s.readBatch(ctx, BucketHistory, subjects, max)
	if fatal {
		s.batchOffUntil.Store(time.Now().Add(batchPause).UnixNano())
	}
	return out, ok
}

const historySubjectPrefix = "$KV." + BucketHistory + "."

type batchReq struct {
	MultiLast []string `json:"multi_last"`
	Batch     int      `json:"batch"`
}

// readBatch sends one multi_last direct get and collects its answers; n counts the
// messages answered (deleted and expired keys included: n == max means the answer may
// be cut). fatal: batched reads do not work here (no direct gets on the bucket, a
// refused or unanswered request).
func (s *Store) readBatch(ctx context.Context, bucket string, subjects []string, max int) (_ map[string][]byte, n int, ok, fatal bool) {
	prefix := KeyPrefix(bucket)
	ctx, cancel := context.WithTimeout(ctx, batchTimeout)
	defer cancel()
	reply, ch, done, err := s.batch.open(s.conn)
	if err != nil {
		return nil, 0, false, true
	}
	defer done()
	req, _ := json.Marshal(batchReq{MultiLast: subjects, Batch: max})
	if err := s.conn.PublishRequest("$JS.API.DIRECT.GET.KV_"+bucket, reply, req); err != nil {
		return nil, 0, false, false
	}
	out := make(map[string][]byte, min(max, 64))
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-ctx.Done():
			// No answer in time (a request the credentials refuse is dropped silently).
			return nil, 0, false, ctx.Err() == context.DeadlineExceeded
		}
		// A stored message carries its sequence: only an answer without one is a status
		// (a message stored with a Status header must not end the batch: directRequest).
		if status := m.Header.Get("Status"); status != "" && m.Header.Get("Nats-Sequence") == "" {
			switch status {
			case "204", "404": // end of batch; nothing stored
				return out, n, true, false
			case "413": // more keys than a batch answers: read them one by one
				return nil, 0, false, false
			}
			return nil, 0, false, true // 503 no direct gets, 408 bad request...
		}
		n++
		if m.Header.Get("KV-Operation") != "" {
			continue // a deleted or purged key
		}
		if m.Header.Get("Nats-Marker-Reason") != "" {
			continue // an expired key
		}
		key, ok := strings.CutPrefix(m.Header.Get("Nats-Subject"), prefix)
		if !ok {
			continue
		}
		out[key] = m.Data
	}
}

// seqBatchReq asks for the messages of a stream from a sequence on whose subjects match
// a filter (a batched direct get).
type seqBatchReq struct {
	Seq     uint64 `json:"seq"`
	NextFor string `json:"next_by_subj"`
	Batch   int    `json:"batch"`
}

// errBatchUnavailable: batched direct gets do not work here (no direct gets on the
// bucket, credentials that may not send them, no answer); the caller reads key by key.
var errBatchUnavailable = errors.New("store: batched reads unavailable")

// readFrom reads the messages of a bucket's stream from sequence from on, in stream
// order, with batched direct gets of up to batchMax messages each, until none is left
// (the server counts what is left after each batch). fn gets each message's key, data
// and whether it is a delete or expiry marker. It returns the sequence of the last
// message read (0 when none was).
func (s *Store) readFrom(ctx context.Context, bucket string, from uint64, fn func(key string, val []byte, deleted bool)) (uint64, error) {
	prefix := KeyPrefix(bucket)
	var read uint64
	for {
		more, last, err := s.readSeqBatch(ctx, bucket, prefix+">", from, func(m *nats.Msg) {
			key, ok := strings.CutPrefix(m.Header.Get("Nats-Subject"), prefix)
			if !ok {
				return
			}
			deleted := m.Header.Get("KV-Operation") != "" || m.Header.Get("Nats-Marker-Reason") != ""
			fn(key, m.Data, deleted)
		})
		read = max(read, last)
		if err != nil || !more {
			return read, err
		}
		from = last + 1
	}
}

// readSeqBatch sends one batched direct get from sequence from and hands each message
// to fn. more reports that matching messages are left after last, the sequence of the
// last one answered.
func (s *Store) readSeqBatch(ctx context.Context, bucket, filter string, from uint64, fn func(*nats.Msg)) (more bool, last uint64, err error) {
	if s.conn == nil || time.Now().UnixNano() < s.batchOffUntil.Load() {
		return false, 0, errBatchUnavailable
	}
	fail := func(fatal bool) (bool, uint64, error) {
		if fatal {
			s.batchOffUntil.Store(time.Now().Add(batchPause).UnixNano())
		}
		return false, 0, errBatchUnavailable
	}
	ctx, cancel := context.WithTimeout(ctx, batchTimeout)
	defer cancel()
	reply, ch, done, err := s.batch.open(s.conn)
	if err != nil {
		return fail(true)
	}
	defer done()
	req, _ := json.Marshal(seqBatchReq{Seq: max(from, 1), NextFor: filter, Batch: batchMax})
	if err := s.conn.PublishRequest("$JS.API.DIRECT.GET.KV_"+bucket, reply, req); err != nil {
		return fail(false)
	}
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-ctx.Done():
			// No answer in time (a request the credentials refuse is dropped silently).
			return fail(ctx.Err() == context.DeadlineExceeded)
		}
		status := m.Header.Get("Status")
		if m.Header.Get("Nats-Sequence") != "" {
			status = "" // a stored message, whatever its headers say
		}
		switch status {
		case "":
		case "404": // nothing from there on
			return false, last, nil
		case "204": // end of batch: what is left after it
			pending, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
			return pending > 0 && last > 0, last, nil
		default:
			return fail(true) // 503 no direct gets, 408 bad request...
		}
		seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
		if err != nil || seq < last {
			return fail(true)
		}
		last = seq
		fn(m)
	}
}
