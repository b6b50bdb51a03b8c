package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events/store"
)

// WithdrawnDir keeps, in a deployment's directory, the catalog entries of the tools an
// edit with -push took away from a team (revoke, remove-team): a grant of the tool to
// that team with -push puts the entry back.
const WithdrawnDir = "withdrawn"

// catalogMoves are the tools a team lost and gained between two grants.
func catalogMoves(before, after natsjwt.Grants) (lost, gained map[string]string) {
	lost, gained = map[string]string{}, map[string]string{}
	for team, tools := range before.Teams {
		for _, tool := range tools {
			if !slices.Contains(after.Teams[team], tool) {
				lost[tool] = team
			}
		}
	}
	for team, tools := range after.Teams {
		for _, tool := range tools {
			if !slices.Contains(before.Teams[team], tool) {
				gained[tool] = team
			}
		}
	}
	return lost, gained
}

// syncCatalog brings the core's tool catalog in line with a pushed edit, as the core
// decides, not as the team's executors say: a tool taken from a team (revoke,
// remove-team) leaves the catalog at once, so that `toolbus tools` no longer lists it
// and no model is offered it, while that team's running executors, whose instance
// records still name it, can no longer write its entry (their account lost the import);
// its entry is kept in WithdrawnDir. A tool granted again to the team its kept entry
// names goes back. It writes with the deployment's admin.creds (the core's
// administrator) and only for teams whose account the servers took (p); a failure is
// reported, never fatal: the grants are applied.
func (d *deployment) syncCatalog(ctx context.Context, url string, before natsjwt.Grants, p pushed, stdout io.Writer) {
	lost, gained := catalogMoves(before, d.grants)
	took := func(team string) bool { return p.took["account team-"+team] }
	maps.DeleteFunc(lost, func(_, team string) bool { return !took(team) })
	maps.DeleteFunc(gained, func(_, team string) bool { return !took(team) })
	if len(lost)+len(gained) == 0 {
		return
	}
	warn := func(err error) {
		fmt.Fprintf(stdout, "warning: the tool catalog was not updated (%v): `toolbus tools` lists what the team's executors last published until they stop\n", err)
	}
	nc, err := nats.Connect(url, nats.UserCredentials(filepath.Join(d.dir, "admin.creds")), nats.Name("toolbus admin"))
	if err != nil {
		warn(err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		warn(err)
		return
	}
	kv, err := js.KeyValue(ctx, store.BucketTools)
	if err != nil {
		warn(err)
		return
	}
	for _, tool := range slices.Sorted(maps.Keys(lost)) {
		if err := d.withdraw(ctx, kv, tool); err != nil {
			warn(err)
			continue
		}
		fmt.Fprintf(stdout, "catalog: %s taken out (team %s): no longer listed or offered to models; a grant to %s with -push puts it back\n", tool, lost[tool], lost[tool])
	}
	for _, tool := range slices.Sorted(maps.Keys(gained)) {
		back, err := d.restore(ctx, kv, tool, gained[tool])
		if err != nil {
			warn(err)
		} else if back {
			fmt.Fprintf(stdout, "catalog: %s put back (team %s)\n", tool, gained[tool])
		}
	}
}

// withdraw moves tool's catalog entry, if any, into WithdrawnDir.
func (d *deployment) withdraw(ctx context.Context, kv jetstream.KeyValue, tool string) error {
	e, err := kv.Get(ctx, tool)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", tool, err)
	}
	if err := os.MkdirAll(filepath.Join(d.dir, WithdrawnDir), 0o700); err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	if err := os.WriteFile(filepath.Join(d.dir, WithdrawnDir, tool+".json"), e.Value(), 0o600); err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	if err := kv.Delete(ctx, tool, jetstream.LastRevision(e.Revision())); err != nil {
		return fmt.Errorf("take %s out: %w", tool, err)
	}
	return nil
}

// restore puts back the kept entry of tool when it names team as the owner and the
// catalog holds none (an executor of the team may have published it since).
func (d *deployment) restore(ctx context.Context, kv jetstream.KeyValue, tool, team string) (bool, error) {
	file := filepath.Join(d.dir, WithdrawnDir, tool+".json")
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("admin: %w", err)
	}
	var c toolbus.ToolContract
	if json.Unmarshal(b, &c) != nil || c.Owner != team {
		return false, nil
	}
	if _, err := kv.Create(ctx, tool, b); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return false, fmt.Errorf("put %s back: %w", tool, err)
	}
	return true, os.Remove(file)
}
