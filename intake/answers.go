package intake

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/events"
)

// The stream's answer to a forwarded write is relayed in the service's own words. The
// stream's text of a failed condition names what the subject holds ("wrong last
// sequence: 4711", "wrong last msg ID: <another run's event id>"), which on a subject
// that other tenants write (a run's subjects, by a run.started's condition) tells a
// tenant of others' runs, steps and calls. Its class is kept (the code and err_code),
// so that every caller, toolbus's and any NATS client's, branches as before; the words
// are the service's, with no id, sequence or subject in them.

// conflict is the description of a failed condition (err_code
// events.WriteConflictErrCode, the stream's "wrong last sequence").
const conflict = "toolbus intake: conflict: the write's condition does not hold (its subject or key holds another message: a key that exists, a stale revision, a run id that is taken)"

// storeLimits are the stream's own words for the bounds it refuses a write at: they name
// nothing of what it holds, and callers recognise them (events.ErrStreamFull,
// store.ErrOutputsFull read "maximum bytes exceeded").
var storeLimits = []string{"maximum messages per subject exceeded", "maximum bytes exceeded", "maximum messages exceeded", "message size exceeds maximum allowed"}

// pubAck is the stream's answer to a publish.
type pubAck struct {
	Stream    string              `json:"stream,omitempty"`
	Seq       uint64              `json:"seq,omitempty"`
	Duplicate bool                `json:"duplicate,omitempty"`
	Error     *jetstream.APIError `json:"error,omitempty"`
}

// answerOf is the answer to relay on reply for the stream's answer m.
func answerOf(reply string, m *nats.Msg) *nats.Msg {
	out := &nats.Msg{Subject: reply}
	if len(m.Data) == 0 {
		// A status (503 no responders: the stream is not there) has no text of anyone's.
		if st := m.Header.Get("Status"); st != "" {
			out.Header = nats.Header{"Status": {st}}
			return out
		}
	}
	var a pubAck
	if err := json.Unmarshal(m.Data, &a); err != nil || a.Error == nil && a.Stream == "" {
		out.Data = refusalData(&refusal{code: 503, errCode: events.WriteRefusedErrCode, desc: "toolbus intake: the stream's answer to the write was not understood"})
		return out
	}
	if a.Error == nil {
		out.Data, _ = json.Marshal(pubAck{Stream: a.Stream, Seq: a.Seq, Duplicate: a.Duplicate})
		return out
	}
	out.Data = refusalData(streamRefusal(a.Error))
	return out
}

// streamRefusal is the stream's refusal e in the service's words.
func streamRefusal(e *jetstream.APIError) *refusal {
	r := &refusal{code: e.Code, errCode: int(e.ErrorCode)}
	switch e.ErrorCode {
	case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
		r.code, r.errCode, r.desc = 400, events.WriteConflictErrCode, conflict
		return r
	}
	for _, l := range storeLimits {
		if strings.Contains(e.Description, l) {
			r.desc = "toolbus intake: the stream refused the write: " + l
			return r
		}
	}
	r.desc = fmt.Sprintf("toolbus intake: the stream refused the write (err_code %d)", e.ErrorCode)
	return r
}

// refusalData is r as the stream writes a refused publish's answer.
func refusalData(r *refusal) []byte {
	data, _ := json.Marshal(map[string]any{
		"type":  "io.nats.jetstream.api.v1.pub_ack_response",
		"error": map[string]any{"code": r.code, "err_code": r.errCode, "description": r.desc},
	})
	return data
}
