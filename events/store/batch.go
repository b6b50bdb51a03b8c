package store

import (
	"context"
	"encoding/json"
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
	waiting map[string]chan *nats.Msg
}

func (b *batchMux) open(nc *nats.Conn, n int) (reply string, ch chan *nats.Msg, done func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sub == nil || !b.sub.IsValid() {
		b.prefix = nc.NewInbox()
		b.waiting = map[string]chan *nats.Msg{}
		sub, err := nc.Subscribe(b.prefix+".*", func(m *nats.Msg) {
			b.mu.Lock()
			c := b.waiting[m.Subject]
			b.mu.Unlock()
			if c != nil {
				select {
				case c <- m:
				default: // more than the batch asked for: never sent
				}
			}
		})
		if err != nil {
			return "", nil, nil, err
		}
		_ = sub.SetPendingLimits(-1, -1) // answers are bounded by each read's batch size
		b.sub = sub
	}
	b.next++
	reply = b.prefix + "." + strconv.FormatUint(b.next, 36)
	ch = make(chan *nats.Msg, n+1) // at most n values and the end of the batch
	b.waiting[reply] = ch
	return reply, ch, func() {
		b.mu.Lock()
		delete(b.waiting, reply)
		b.mu.Unlock()
	}, nil
}

// batchResults reads the stored results of a step with one direct-get batch request
// (multi_last on the step's result keys) instead of one request per result. It returns
// the results it got by call index; ok is false when the batch could not be read, and
// the caller then reads each result on its own, as it always may. A result missing from
// the answer (deleted, or cut by the server's size bound) is simply absent.
func (s *Store) batchResults(ctx context.Context, run string, step, n int) (map[int]toolbus.ToolResult, bool) {
	if s.conn == nil || time.Now().UnixNano() < s.batchOffUntil.Load() {
		return nil, false
	}
	out, ok, fatal := s.readBatch(ctx, "$KV."+BucketHistory+"."+stepKey(run, step, "r")+".*", n)
	if fatal {
		s.batchOffUntil.Store(time.Now().Add(batchPause).UnixNano())
	}
	return out, ok
}

type batchReq struct {
	MultiLast []string `json:"multi_last"`
	Batch     int      `json:"batch"`
}

func (s *Store) readBatch(ctx context.Context, filter string, n int) (_ map[int]toolbus.ToolResult, ok, fatal bool) {
	ctx, cancel := context.WithTimeout(ctx, batchTimeout)
	defer cancel()
	reply, ch, done, err := s.batch.open(s.conn, n)
	if err != nil {
		return nil, false, true
	}
	defer done()
	req, _ := json.Marshal(batchReq{MultiLast: []string{filter}, Batch: n})
	if err := s.conn.PublishRequest("$JS.API.DIRECT.GET.KV_"+BucketHistory, reply, req); err != nil {
		return nil, false, false
	}
	out := make(map[int]toolbus.ToolResult, n)
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-ctx.Done():
			// No answer in time (a request the credentials refuse is dropped silently).
			return nil, false, ctx.Err() == context.DeadlineExceeded
		}
		if status := m.Header.Get("Status"); status != "" {
			switch status {
			case "204", "404": // end of batch; nothing stored
				return out, true, false
			}
			return nil, false, true // 503 no direct gets, 408 bad request...
		}
		if m.Header.Get("KV-Operation") != "" {
			continue // a deleted or purged key: no result
		}
		subj := m.Header.Get("Nats-Subject")
		idx, err := strconv.Atoi(subj[strings.LastIndexByte(subj, '.')+1:])
		if err != nil || idx < 0 || idx >= n {
			continue
		}
		var r toolbus.ToolResult
		if json.Unmarshal(m.Data, &r) != nil {
			continue // read on its own: the error is reported there
		}
		out[idx] = r
	}
}
