package checkpoint

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
)

// batchMax is the most messages one batched direct get answers.
const batchMax = 256

// reader reads the event stream with batched direct gets: no consumer (the core's
// roles may create none), one request per batchMax messages; a read mirror answers for
// the stream where it serves the direct gets (events.Bus).
type reader struct {
	nc      *nats.Conn
	subject string // $JS.API.DIRECT.GET.<stream>
}

func newReader(b *events.Bus) reader {
	stream := b.Config().Stream
	if r := b.Reader(); r != nil && r.CachedInfo() != nil && r.CachedInfo().Config.AllowDirect {
		stream = r.CachedInfo().Config.Name // the read mirror, where it serves the direct gets
	}
	return reader{nc: b.Conn(), subject: "$JS.API.DIRECT.GET." + stream}
}

// batch reads the messages from sequence from on, at most batchMax, handing each to fn;
// it returns the last sequence read (0: none) and whether messages are left after it.
func (r reader) batch(ctx context.Context, from uint64, fn func(seq uint64, h nats.Header, data []byte)) (last uint64, more bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	inbox := r.nc.NewRespInbox()
	sub, err := r.nc.SubscribeSync(inbox)
	if err != nil {
		return 0, false, fmt.Errorf("checkpoint: read the stream: %w", err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // a closed subscription
	req, _ := json.Marshal(struct {
		Seq     uint64 `json:"seq"`
		NextFor string `json:"next_by_subj"`
		Batch   int    `json:"batch"`
	}{max(from, 1), ">", batchMax})
	if err := r.nc.PublishRequest(r.subject, inbox, req); err != nil {
		return 0, false, fmt.Errorf("checkpoint: read the stream: %w", err)
	}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return last, false, fmt.Errorf("checkpoint: read the stream from %d: %w (no answer: direct gets refused?)", from, err)
		}
		if m.Header.Get("Nats-Sequence") == "" {
			switch m.Header.Get("Status") {
			case "404": // nothing from there on
				return last, false, nil
			case "204": // end of batch: what is left after it
				pending, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
				return last, pending > 0 && last > 0, nil
			}
			return last, false, fmt.Errorf("checkpoint: read the stream from %d: status %s %s", from, m.Header.Get("Status"), m.Header.Get("Description"))
		}
		seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
		if err != nil || seq <= last {
			return last, false, fmt.Errorf("checkpoint: read the stream: sequence %q after %d", m.Header.Get("Nats-Sequence"), last)
		}
		last = seq
		fn(seq, m.Header, m.Data)
	}
}

// from reads every message from sequence from on (until none is left, or until stop
// says so after a message), returning the last sequence read (from-1 when none was).
func (r reader) from(ctx context.Context, from uint64, fn func(seq uint64, h nats.Header, data []byte) (stop bool)) (uint64, error) {
	last, stopped := from-1, false
	for !stopped {
		l, more, err := r.batch(ctx, last+1, func(seq uint64, h nats.Header, data []byte) {
			if !stopped {
				stopped = fn(seq, h, data)
			}
		})
		if l > 0 {
			last = l
		}
		if err != nil || !more {
			return last, err
		}
	}
	return last, nil
}
