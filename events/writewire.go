package events

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
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
// the subject written; ok is false for any other subject.
func ParseWriteSubject(s string) (kind, name, subject string, ok bool) {
	toks := strings.SplitN(s, ".", 4)
	if len(toks) != 4 || toks[0] != WriteServicePrefix || toks[1] != WriteTeam && toks[1] != WriteClient || toks[2] == "" || toks[3] == "" {
		return "", "", "", false
	}
	return toks[1], toks[2], toks[3], true
}

// WriteQuotaErrCode is the err_code of the write service's refusal of a tenant over its
// bytes per second (code 429), and WriteRefusedErrCode of a write it does not admit
// (code 400: a form it does not take, a roll-up, a size over its bound). A client's
// publish returns them as a *jetstream.APIError.
const (
	WriteQuotaErrCode   = 10801
	WriteRefusedErrCode = 10800
)

// ErrTenantQuota is wrapped by the error of a publish the core's write service refused
// because its tenant is over its bytes per second (TOOLBUS_TENANT_BYTES_PER_SECOND):
// retry later; and ErrWriteRefused by one it refused for its form or size.
var (
	ErrTenantQuota  = errors.New("events: quota_exceeded: the tenant is over its bytes per second")
	ErrWriteRefused = errors.New("events: the core's write service refused the write")
)

// writeRefusal wraps the error of a publish the write service refused in ErrTenantQuota
// or ErrWriteRefused, so that callers can tell it from a failure of the bus.
func writeRefusal(err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return err
	}
	switch apiErr.ErrorCode {
	case WriteQuotaErrCode:
		return fmt.Errorf("%w: %w", ErrTenantQuota, err)
	case WriteRefusedErrCode:
		return fmt.Errorf("%w: %w", ErrWriteRefused, err)
	}
	return err
}
