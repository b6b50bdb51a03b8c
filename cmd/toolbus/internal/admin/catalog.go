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

// syncCatalog brings the core's tool catalog in line with the grants the servers took,
// as the core decides, not as the team's executors say: an entry whose owner is a team
// of the deployment that the grants no longer give it (revoke, remove-team; with -push,
// or a push after edits made without it, or after a sync that failed) leaves the
// catalog at once, so that `toolbus tools` no longer lists it and no model is offered
// it, while that team's running executors, whose instance records still name it, can no
// longer write its entry (their account lost the import); its entry is kept in
// WithdrawnDir. A tool granted again to the team its kept entry names goes back. Only
// the teams whose account the servers took (p) are looked at (before names the teams
// an edit removed). It writes with the deployment's admin.creds (the core's
// administrator); a failure is reported, never fatal: the grants are applied.
func (d *deployment) syncCatalog(ctx context.Context, url string, before natsjwt.Grants, p pushed, stdout io.Writer) {
	teams := map[string]bool{}
	for _, g := range []natsjwt.Grants{before, d.grants} {
		for team := range g.Teams {
			if p.took["account team-"+team] {
				teams[team] = true
			}
		}
	}
	if len(teams) == 0 {
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
	lost, err := d.ungranted(ctx, kv, teams)
	if err != nil {
		warn(err)
	}
	for _, tool := range slices.Sorted(maps.Keys(lost)) {
		if err := d.withdraw(ctx, kv, tool); err != nil {
			warn(err)
			continue
		}
		fmt.Fprintf(stdout, "catalog: %s taken out (team %s): no longer listed or offered to models; a grant to %s with -push puts it back\n", tool, lost[tool], lost[tool])
	}
	for _, team := range slices.Sorted(maps.Keys(teams)) {
		for _, tool := range d.grants.Teams[team] {
			back, err := d.restore(ctx, kv, tool, team)
			if err != nil {
				warn(err)
			} else if back {
				fmt.Fprintf(stdout, "catalog: %s put back (team %s)\n", tool, team)
			}
		}
	}
}

// ungranted are the catalog's tools, each with its owner, whose owner is one of teams
// and whose grants do not give it the tool.
func (d *deployment) ungranted(ctx context.Context, kv jetstream.KeyValue, teams map[string]bool) (map[string]string, error) {
	out := map[string]string{}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return out, fmt.Errorf("list the catalog: %w", err)
	}
	var errs []error
	for tool := range keys.Keys() {
		e, err := kv.Get(ctx, tool)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", tool, err))
			continue
		}
		var c toolbus.ToolContract
		if json.Unmarshal(e.Value(), &c) == nil && teams[c.Owner] && !slices.Contains(d.grants.Teams[c.Owner], tool) {
			out[tool] = c.Owner
		}
	}
	return out, errors.Join(errs...)
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
