package checkpoint

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/events/store"
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
	last, more, err = store.DirectBatch(ctx, r.nc, r.subject, from, ">", batchMax, func(seq uint64, m *nats.Msg) { fn(seq, m.Header, m.Data) })
	if err != nil {
		return last, false, fmt.Errorf("checkpoint: read the stream: %w", err)
	}
	return last, more, nil
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
