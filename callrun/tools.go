package callrun

import (
	"context"
	"errors"

	"github.com/toolbus/toolbus/events"
)

// ToolRow is one line of `toolbus tools`.
type ToolRow struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Owner is the team whose executors serve the tool ("" when the contract names
	// none); Version the contract's version (0 when unversioned).
	Owner     string   `json:"owner"`
	Version   int      `json:"version"`
	Instances []string `json:"instances"`
	// Pending counts calls waiting in the tool's queue; InFlight those being run.
	Pending  uint64 `json:"pending"`
	InFlight int    `json:"in_flight"`
	// Offered is false when no live instance serves the tool: models are not offered it.
	Offered bool `json:"offered"`
}

// ToolRows joins the catalog, the live instances and the queues; in a client account,
// which reads none of them, the tools the read service says are offered.
func ToolRows(ctx context.Context, bus *events.Bus) ([]ToolRow, error) {
	if bus.ClientAccount() {
		offered, err := bus.OfferedTools(ctx)
		rows := make([]ToolRow, len(offered))
		for i, tc := range offered {
			rows[i] = ToolRow{Name: tc.Name, Description: tc.Description, Owner: tc.Owner, Version: tc.Version, Instances: []string{}, Offered: true}
		}
		return rows, err
	}
	contracts, err := bus.Store().Contracts(ctx)
	if err != nil {
		return nil, err
	}
	instances, err := bus.Store().Instances(ctx)
	if err != nil {
		return nil, err
	}
	rows := make([]ToolRow, 0, len(contracts))
	for _, tc := range contracts {
		r := ToolRow{Name: tc.Name, Description: tc.Description, Owner: tc.Owner, Version: tc.Version, Instances: []string{}}
		for _, in := range instances {
			if in.Serves(tc.Owner, tc.Name) {
				r.Instances = append(r.Instances, in.Name)
			}
		}
		r.Offered = len(r.Instances) > 0
		q, err := bus.ToolQueueInfo(ctx, tc.Name)
		if err != nil && !errors.Is(err, events.ErrNotFound) {
			return nil, err
		}
		r.Pending, r.InFlight = q.Pending, q.InFlight
		rows = append(rows, r)
	}
	return rows, nil
}
