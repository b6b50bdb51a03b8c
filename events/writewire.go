package events

import (
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/internal/refusal"
)

// The write service (package intake, docs/tenancy-design.md "Writes of tenants"): a team
// or a client in an account of its own publishes nothing into the core's streams
// directly. Each subject it may write (its tools' results, waits, progress, logs and
// questions, its keys in the claims, outputs, catalog, instances and secrets buckets; a
// client's starts, decisions, cancels and answers) is imported from the core under
// WriteServicePrefix, with the tenant's kind and name before the subject itself, and
// the core's intake checks each message before it forwards it to the stream: its form,
// no roll-up header, its size and the tenant's bytes per second. The tenant publishes
// on the subject as before (the import maps it); the stream's acknowledgement, or the
// intake's refusal, comes back as the answer.

// WriteServicePrefix is the first token of the write service's subjects.
const WriteServicePrefix = "toolbus_write"

// WriteQueue is the queue group the write service's instances share.
const WriteQueue = "toolbus_write"

// The kinds of tenant the write service admits writes of (the second token).
const (
	WriteTeam   = "team"
	WriteClient = "client"
)

// TeamWriteSubject is toolbus_write.team.<team>.<subject>: where a team's write of
// subject reaches the core (the import of the team's account maps subject to it).
func TeamWriteSubject(team, subject string) string {
	return WriteServicePrefix + "." + WriteTeam + "." + team + "." + subject
}

// ClientWriteSubject is toolbus_write.client.<id>.<subject>: where a write of a client
// bound to identity id reaches the core.
func ClientWriteSubject(id, subject string) string {
	return WriteServicePrefix + "." + WriteClient + "." + IdentityToken(id) + "." + subject
}

// ParseWriteSubject splits a write service subject into the tenant's kind and name and
// the subject written; ok is false for any other subject, and for one with an empty or a
// wildcard token ("*", ">"). The server delivers a publish on "toolbus.*.tool.finished.x"
// to an import of that pattern, and a stream stores it under that subject: a message of
// no run (and a key "x.>" of no call), which the subject's checks downstream were never
// meant to see.
func ParseWriteSubject(s string) (kind, name, subject string, ok bool) {
	toks := strings.SplitN(s, ".", 4)
	if len(toks) != 4 || toks[0] != WriteServicePrefix || toks[1] != WriteTeam && toks[1] != WriteClient || !literalSubject(s) {
		return "", "", "", false
	}
	return toks[1], toks[2], toks[3], true
}

// literalSubject reports whether every token of s is non-empty and no wildcard.
func literalSubject(s string) bool {
	for _, t := range strings.Split(s, ".") {
		if t == "" || t == "*" || t == ">" {
			return false
		}
	}
	return true
}

// WriteQuotaErrCode is the err_code of the write service's refusal of a tenant over its
// bytes per second (code 429), and WriteRefusedErrCode of a write it does not admit
// (code 400: a form it does not take, a roll-up, a size over its bound) or could not
// forward (code 503). A tenant's publish returns them as a *jetstream.APIError, which
// every write of this package and its store wraps (WriteRefusal).
//
// WriteConflictErrCode (code 400) answers a write whose condition does not hold (a key's
// create on a key that exists, a compare-and-set on a stale revision, a run.started whose
// run id is taken): the stream's own "wrong last sequence" code, which every NATS client
// branches on (jetstream.ErrKeyExists, a lost compare-and-set), with the service's words
// instead of the stream's, which named the subject's last sequence or message id.
const (
	WriteQuotaErrCode    = refusal.QuotaErrCode
	WriteRefusedErrCode  = refusal.RefusedErrCode
	WriteConflictErrCode = int(jetstream.JSErrCodeStreamWrongLastSequence)
	// WriteStoreFullErrCode is the err_code of a new key refused because its tenant
	// holds its bound of keys in the bucket (code 507, ErrTenantStoreFull).
	WriteStoreFullErrCode = refusal.StoreFullErrCode
)

// ErrTenantStoreFull is wrapped by the error of a KV write that would add a key to a
// shared bucket (secrets, instances, claims, outputs) in which the tenant holds its
// bound of keys (TOOLBUS_TENANT_BUCKET_KEYS): the other tenants' room is not its to
// take. Writing a key it holds passes; a new one passes once some of its keys expire or
// an admin purges them.
var ErrTenantStoreFull = refusal.ErrTenantStoreFull

// ErrTenantQuota is wrapped by the error of a write (an event's publish, or a key of the
// claims, outputs, catalog, instances or secrets buckets) the core's write service
// refused because its tenant is over its bytes per second
// (TOOLBUS_TENANT_BYTES_PER_SECOND): retry later; and ErrWriteRefused by one it refused
// for its form, a roll-up or its size (400: sending it again is refused again), or could
// not forward (503: it may pass later; WritePassesLater tells).
var (
	ErrTenantQuota  = refusal.ErrTenantQuota
	ErrWriteRefused = refusal.ErrWriteRefused
)

// WriteRefusal wraps the error of a write the core's write service refused in
// ErrTenantQuota or ErrWriteRefused (the service's description kept), so that callers
// can tell it from a failure of the bus; any other error, or one already wrapped, is
// returned unchanged. Every publish of this package and every KV write of its store
// passes its error through it.
func WriteRefusal(err error) error { return refusal.Wrap(err) }

// WritePassesLater reports whether err is a refusal of the write service that the same
// write may pass when sent again: ErrTenantQuota (429), or a 503 (the service could not
// forward it). An executor retries those in place; a 400 never passes.
func WritePassesLater(err error) bool { return refusal.PassesLater(err) }

// WriteRefusedForGood reports whether err is a refusal of the write service that
// sending the write again cannot pass (400: its form, a roll-up, its size).
func WriteRefusedForGood(err error) bool { return refusal.ForGood(err) }

// writeRefusal is WriteRefusal.
func writeRefusal(err error) error { return refusal.Wrap(err) }
