// Package refusal tells the refusals of the core's write service (package intake) from
// other failures of a JetStream publish, for package events and its store alike: a
// tenant's event publishes and its KV writes (claims, outputs, catalog, instances,
// secrets) are answered by the same service. Package events re-exports what is here
// (events.ErrWriteRefused, events.ErrTenantQuota, events.WriteRefusal); the store, which
// may not import events, uses it directly.
package refusal

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// The err_codes of the write service's refusals: QuotaErrCode of a tenant over its bytes
// per second (code 429), RefusedErrCode of a write it does not admit (code 400) or could
// not forward (code 503), StoreFullErrCode of a new key of a tenant that holds its bound
// of keys in a shared bucket (code 507).
const (
	QuotaErrCode     = 10801
	RefusedErrCode   = 10800
	StoreFullErrCode = 10802
)

// ErrTenantQuota and ErrWriteRefused are events.ErrTenantQuota and events.ErrWriteRefused.
var (
	ErrTenantQuota  = errors.New("events: quota_exceeded: the tenant is over its bytes per second")
	ErrWriteRefused = errors.New("events: the core's write service refused the write")
)

// ErrTenantStoreFull is events.ErrTenantStoreFull: the write would add a key to a shared
// bucket in which the tenant holds its bound of keys (TOOLBUS_TENANT_BUCKET_KEYS). It
// passes once the tenant's keys expire or an admin purges some; writing a key the
// tenant holds already passes.
var ErrTenantStoreFull = errors.New("events: store_full: the tenant holds its bound of keys in this bucket")

// Wrap returns err wrapped in ErrTenantQuota or ErrWriteRefused when it is (or wraps) a
// refusal of the write service (a *jetstream.APIError of its err_codes), keeping the
// service's description; any other error, nil, or an error already wrapped, unchanged.
func Wrap(err error) error {
	if err == nil || errors.Is(err, ErrTenantQuota) || errors.Is(err, ErrWriteRefused) || errors.Is(err, ErrTenantStoreFull) {
		return err
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return err
	}
	switch apiErr.ErrorCode {
	case QuotaErrCode:
		return fmt.Errorf("%w: %w", ErrTenantQuota, err)
	case RefusedErrCode:
		return fmt.Errorf("%w: %w", ErrWriteRefused, err)
	case StoreFullErrCode:
		return fmt.Errorf("%w: %w", ErrTenantStoreFull, err)
	}
	return err
}

// PassesLater reports whether err is a refusal of the write service that the same write
// may pass when sent again: the tenant over its bytes per second (429), or the service
// could not forward it (503). A refusal of its form, a roll-up or its size (400) never
// passes.
func PassesLater(err error) bool {
	err = Wrap(err)
	if errors.Is(err, ErrTenantQuota) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.Is(err, ErrWriteRefused) && errors.As(err, &apiErr) && apiErr.Code == 503
}

// ForGood reports whether err is a refusal of the write service that sending the write
// again cannot pass (400: its form, a roll-up, its size).
func ForGood(err error) bool {
	return errors.Is(Wrap(err), ErrWriteRefused) && !PassesLater(err)
}
