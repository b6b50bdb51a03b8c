package intake

import (
	"regexp"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/toolbus/toolbus/events"
)

// A tenant's headers are instructions to the stream (Nats-Msg-Id, Nats-Expected-*,
// Nats-Rollup, Nats-TTL, batches, schedules...), and the stream's answer to a failed one
// named another's message id or sequence. The service forwards only the headers
// toolbus's own writes send (the Go and TypeScript executors and clients), each with a
// value it checks, in a header of its own making; any other header is refused (400),
// not dropped, so that a writer learns at once that its write does not mean what it
// asked for (a dropped condition would store a write whose condition was never checked).
const (
	hdrMsgID       = events.HeaderMsgID
	hdrLastSubjSeq = "Nats-Expected-Last-Subject-Sequence"
	hdrLastSubj    = "Nats-Expected-Last-Subject-Sequence-Subject"
	hdrKVOperation = "KV-Operation"
)

// requestInfo is the header the server sets on a request that crosses accounts through a
// service import (the requester's account and user): the server's word to this service,
// never stored (it would put the tenant's connection in the stream).
const requestInfo = "Nats-Request-Info"

// ceAttrs are the CloudEvents attributes toolbus's events carry as ce-* headers
// (events.Encode, and the TypeScript SDK's eventHeaders): data for the consumers, who
// check them against the subject and the body.
var ceAttrs = map[string]bool{
	"specversion": true, "id": true, "source": true, "type": true, "subject": true, "time": true,
	"dataschema": true, "runid": true, "step": true, "callid": true, "callindex": true, "callcount": true,
	"traceparent": true, "tracestate": true,
	// The signature and the chain (events/seal): data too, which a verifier checks.
	"dssematerial": true, "signedextattrs": true, "prevdigest": true,
}

// traceHeaders are the W3C trace context and baggage headers the publishers' propagator
// writes (events.InjectTrace): data too.
var traceHeaders = map[string]bool{"traceparent": true, "tracestate": true, "baggage": true}

// contentTypes are the Content-Type values of toolbus's events (binary and structured).
var contentTypes = map[string]bool{events.ContentTypeJSON: true, "application/cloudevents+json": true}

// guardedSuffix is the suffix of a message id in its guarded form (<id>/guarded/<suffix>):
// the team's HMAC, a NUID or a UUID, which nobody else can know.
var guardedSuffix = regexp.MustCompile(`^[A-Za-z0-9_-]{16,64}$`)

// maxMsgID bounds a message id: a run id, a call id and the rest of an event's id.
const maxMsgID = 1024

// tenantIDSeparator joins a tenant's plain message id to the tenant it is stored for:
// <id>/tenant/<kind>.<name>. No event id of the core ends so (each ends in its type or a
// number), and no tenant can send one that does (the service appends its own).
const tenantIDSeparator = "/tenant/"

// headers returns the header to forward a write of tenant kind.name on subject with, or
// why it is refused. kv tells a key of a bucket from an event.
func headers(kind, name, subject string, kv bool, in nats.Header) (nats.Header, *refusal) {
	out := make(nats.Header, len(in))
	for k, vs := range in {
		if k == requestInfo {
			continue
		}
		if len(vs) != 1 {
			return nil, refuse("%s: the header %s is given %d times: toolbus's writes send it once", subject, k, len(vs))
		}
		v := vs[0]
		switch {
		case k == hdrLastSubjSeq:
			// On the written subject itself, which is the tenant's own: the guard of a
			// squatted event, a key's create (0) and compare-and-set (its revision).
			if _, err := strconv.ParseUint(v, 10, 64); err != nil {
				return nil, refuse("%s: %s %q is no sequence", subject, k, v)
			}
		case k == hdrLastSubj:
			// Only as StartRun sends it: no message of the run exists (0 over
			// toolbus.<run>.>), which says whether the run id is taken and nothing else.
			if kind != events.WriteClient || !strings.Contains(subject, ".run.started.") || v != runOf(subject) || in.Get(hdrLastSubjSeq) != "0" {
				return nil, refuse("%s: %s is taken only on a client's run.started, as %s with %s 0", subject, k, runOf(subject), hdrLastSubjSeq)
			}
		case k == hdrKVOperation && kv:
			if v != "DEL" {
				return nil, refuse("%s: %s %q: a team deletes its keys (DEL); a purge is a roll-up", subject, k, v)
			}
		case k == hdrMsgID && !kv:
			id, r := msgID(kind, name, subject, v, in.Get("ce-id"))
			if r != nil {
				return nil, r
			}
			v = id
		case k == events.HeaderContentType && !kv:
			if !contentTypes[v] {
				return nil, refuse("%s: %s %q is none of toolbus's events", subject, k, v)
			}
		case !kv && (traceHeaders[k] || strings.HasPrefix(k, "ce-") && ceAttrs[k[3:]]):
		default:
			return nil, refuse("%s: the header %s is not one toolbus's writes send: a tenant's write is data, not an instruction to the stream", subject, k)
		}
		out[k] = []string{v}
	}
	return out, nil
}

// runOf is toolbus.<run>.> of an event subject's run ("" for another subject).
func runOf(subject string) string {
	run, ok := events.RunIDFromSubject(subject)
	if !ok {
		return ""
	}
	return events.SubjectRun(run)
}

// msgID checks the message id v of an event on subject (its ce-id ceID) and returns the
// id to store it under. It must be the event's id (ce-id), of the subject's run, plain
// or in its guarded form (<id>/guarded/<suffix>: keyed by a team's credentials, or
// random). A plain id is stored as <id>/tenant/<kind>.<name>: the stream's duplicate
// window, keyed by message id across every subject, then matches only the tenant's own
// writes, so a duplicate acknowledgement tells nothing of another's events (a client's
// ids name no identity: <run>/run.cancel is every canceller's) and no tenant can take
// the id of another's event (a squat). A guarded id already is nobody else's.
func msgID(kind, name, subject, v, ceID string) (string, *refusal) {
	run, _ := events.RunIDFromSubject(subject)
	id, suffix, guarded := v, "", false
	if i := strings.LastIndex(v, events.GuardedIDSeparator); i >= 0 {
		id, suffix, guarded = v[:i], v[i+len(events.GuardedIDSeparator):], true
	}
	switch {
	case len(v) > maxMsgID:
		return "", refuse("%s: a message id of %d bytes is over %d", subject, len(v), maxMsgID)
	case !strings.HasPrefix(id, run+"/"):
		return "", refuse("%s: the message id is no id of an event of run %s", subject, run)
	case ceID != "" && id != ceID:
		return "", refuse("%s: the message id is not the event's id (ce-id) or its guarded form", subject)
	case guarded && !guardedSuffix.MatchString(suffix):
		return "", refuse("%s: a guarded message id ends in 16 to 64 of [A-Za-z0-9_-]", subject)
	case guarded:
		return v, nil
	}
	return v + tenantIDSeparator + kind + "." + name, nil
}
