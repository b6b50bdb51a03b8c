package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Instance is the heartbeat record of one executor process in the instances bucket
// (key = InstanceKey(team, name, boot)). It disappears TTL after the last heartbeat.
type Instance struct {
	// Team is the team whose executors this instance belongs to (worker.Config.Team;
	// empty: the deployment's single, untokened team). It is a token of the key, so
	// per-team credentials may write only their own team's records; a reader takes it
	// from the key, never from the value.
	Team string `json:"team,omitempty"`
	Name string `json:"name"`
	// Boot is random per process start: a process restarted under the same name (a
	// container keeps its hostname and runs as pid 1 again) is a new instance, so the
	// calls its predecessor claimed are taken over once the predecessor's record expires.
	Boot        string    `json:"boot,omitempty"`
	Tools       []string  `json:"tools"`
	Concurrency int       `json:"concurrency"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
}

// Serves reports whether the instance counts as serving tool, whose catalog entry names
// owner: it names the tool and its team (the team token of its key, as Instances and
// the catalog read it) is the tool's owner. With per-team credentials a team may write
// instance records only under its own token and catalog entries only of its own tools,
// so another team's heartbeat naming a tool does not make the tool look served (offered
// to models, listed as served, while nobody can run it).
func (in Instance) Serves(owner, tool string) bool {
	return in.Team == owner && slices.Contains(in.Tools, tool)
}

// InstanceKey maps an instance (team, name and boot id) to its key in the instances
// bucket: <instance>.<boot> for the untokened team (a deployment of one team), and
// <team>.<instance>.<boot> for a team's instance (injective: kvSafe escapes dots, so the
// key of a team's instance has three tokens and no other key has). The team token comes
// first so that a subject permission ($KV.toolbus_instances.<team>.*.*, which
// `go run ./deploy/nats/gen -grants` gives a team's executors) lets a team write, and
// delete, only its own instance records: another team cannot make its executors look
// gone (their calls taken over and run again) or alive.
func InstanceKey(team, name, boot string) string {
	if team != "" {
		// Always three tokens: a team's key never reads as an untokened one.
		return team + "." + kvSafe(name) + "." + kvSafe(boot)
	}
	if boot == "" {
		return kvSafe(name)
	}
	return kvSafe(name) + "." + kvSafe(boot)
}

// InstanceTeam returns the team of an instance key (InstanceKey): its first token when
// it has three, else "" (the untokened team).
func InstanceTeam(key string) string {
	if strings.Count(key, ".") != 2 {
		return ""
	}
	team, _, _ := strings.Cut(key, ".")
	return team
}

// ValidTeam reports whether team may name a team: 1 to 32 of [a-z0-9_-], starting with
// a letter or digit (a subject token as it is, and a user name suffix).
func ValidTeam(team string) bool { return teamRE.MatchString(team) }

var teamRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

// PutInstance records (or refreshes) the heartbeat of an executor instance under its
// team's key; it returns the record's revision.
func (s *Store) PutInstance(ctx context.Context, in Instance) (uint64, error) {
	if in.Team != "" && !ValidTeam(in.Team) {
		return 0, fmt.Errorf("store: instance %s: invalid team %q: 1 to 32 of [a-z0-9_-]", in.Name, in.Team)
	}
	rev, err := s.instances.Put(ctx, InstanceKey(in.Team, in.Name, in.Boot), mustJSON(in))
	if err != nil {
		return 0, fmt.Errorf("store: instance heartbeat %s: %w", in.Name, err)
	}
	return rev, nil
}

// InstanceStoredAt returns when the server stored the instance record of team, name and
// boot at revision rev or later, by the server's clock: the record expires one TTL after
// that, which is what an executor's fencing deadline is measured from (see
// toolbus.ToolResult.LeaseUntil). ErrNotFound when the record is gone or older than rev
// (a read served by a replica that lags).
func (s *Store) InstanceStoredAt(ctx context.Context, team, name, boot string, rev uint64) (time.Time, error) {
	e, err := s.instances.Get(ctx, InstanceKey(team, name, boot))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return time.Time{}, fmt.Errorf("%w: instance %s", ErrNotFound, name)
	case err != nil:
		return time.Time{}, fmt.Errorf("store: instance %s: %w", name, err)
	case e.Revision() < rev:
		return time.Time{}, fmt.Errorf("%w: instance %s at revision %d (read %d)", ErrNotFound, name, rev, e.Revision())
	}
	return e.Created(), nil
}

// DeleteInstance removes an instance at shutdown, so the catalog drops it at once.
func (s *Store) DeleteInstance(ctx context.Context, team, name, boot string) error {
	if err := s.instances.Delete(ctx, InstanceKey(team, name, boot)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("store: delete instance %s: %w", name, err)
	}
	return nil
}

// InstanceAlive reports whether an instance (team, name and boot id, as a claim records
// them) heartbeated within the instance TTL.
func (s *Store) InstanceAlive(ctx context.Context, team, name, boot string) (bool, error) {
	_, err := s.instances.Get(ctx, InstanceKey(team, name, boot))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("store: instance %s: %w", name, err)
	}
}

// Instances lists the live executor instances, sorted by name; each one's Team is the
// team of its key (InstanceTeam), whatever its value says.
func (s *Store) Instances(ctx context.Context) ([]Instance, error) {
	var out []Instance
	err := s.walk(ctx, s.instances, func(key string, val []byte) {
		var in Instance
		if json.Unmarshal(val, &in) == nil {
			in.Team = InstanceTeam(key)
			out = append(out, in)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("store: list instances: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// InstanceTTL is how long an instance stays live after its last heartbeat.
func (s *Store) InstanceTTL() time.Duration { return s.instanceTTL }
