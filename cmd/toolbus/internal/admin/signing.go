package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus/connect"
	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events/seal"
)

// Signing keys (CONTRACT.md, "Signed and chained events"): every user toolbus admin
// issues credentials to also gets a signing key, <user>.sign beside <user>.creds
// (TOOLBUS_SIGNING_KEY), and the deployment's keyring, signers.json, keeps the public
// half of every key ever issued with what it was granted and when: a rotation (rotate
// USER) retires the user's key and issues a new one, a removed team or client has its
// key revoked from then on, a tool or identity granted or revoked opens or closes its
// span. `toolbus admin push` publishes the keyring to the core's bucket
// toolbus_signers (audit.PublishKeyring), where verifiers read it.

// KeyringFile is the deployment's keyring.
const KeyringFile = "signers.json"

// SigningKeyFile is the signing key file of user in dir.
func SigningKeyFile(dir, user string) string { return filepath.Join(dir, user+".sign") }

// signerOf is the signer name of a user: role.<role>, team.<team>, client.<name>.
func signerOf(u natsjwt.User) string {
	switch {
	case u.Team != "":
		return seal.SignerName(seal.KindTeam, u.Team)
	case u.Client != "":
		return seal.SignerName(seal.KindClient, u.Client)
	}
	return seal.SignerName(seal.KindRole, u.Name)
}

// grantsOf are the tools (a team's; "*" for the core-wide executor) and identities (a
// bound client's; "*" for the core-wide client) user u holds under g.
func grantsOf(u natsjwt.User, g natsjwt.Grants) (tools, ids []string) {
	switch {
	case u.Team != "":
		return g.Teams[u.Team], nil
	case u.Client != "":
		return nil, g.Clients[u.Client]
	case u.Name == "executor":
		return []string{"*"}, nil
	case u.Name == "client" || u.Name == "admin":
		// admin starts and decides runs as anyone (toolbus run with its credentials);
		// it may sign no worker's event.
		return nil, []string{"*"}
	}
	return nil, nil
}

// issueSigningKeys gives each user of users a signing key (a new one for those in
// rotate, or whose key file is gone), records grants' changes and revokes the keys
// of signers no longer issued, in dir's keyring.
func issueSigningKeys(dir string, users []natsjwt.User, g natsjwt.Grants, rotate []string, now time.Time) error {
	file := filepath.Join(dir, KeyringFile)
	ring, err := seal.ReadKeyring(file)
	if err != nil {
		return err
	}
	present := map[string]bool{}
	for _, u := range users {
		signer := signerOf(u)
		present[signer] = true
		i := ring.Current(signer)
		_, statErr := os.Stat(SigningKeyFile(dir, u.Name))
		if i < 0 || errors.Is(statErr, fs.ErrNotExist) || slices.Contains(rotate, u.Name) {
			if i >= 0 {
				ring.Keys[i].Retired = now
			}
			kf, err := seal.NewKeyFile(signer)
			if err != nil {
				return err
			}
			if err := seal.WriteKeyFile(SigningKeyFile(dir, u.Name), kf); err != nil {
				return err
			}
			ring.Keys = append(ring.Keys, seal.Key{KeyID: kf.KeyID, Signer: signer, Public: kf.Public(), Created: now})
			i = len(ring.Keys) - 1
		}
		tools, ids := grantsOf(u, g)
		ring.Keys[i].Tools = spans(ring.Keys[i].Tools, tools, now)
		ring.Keys[i].Identities = spans(ring.Keys[i].Identities, ids, now)
	}
	for i, k := range ring.Keys {
		if !present[k.Signer] && k.Revoked.IsZero() && k.Retired.IsZero() {
			ring.Keys[i].Revoked = now
		}
	}
	if err := seal.WriteKeyring(file, ring); err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	return nil
}

// spans opens a span from now for each name of held without an open one, and closes
// the open span of each name no longer held.
func spans(m map[string][]seal.Span, held []string, now time.Time) map[string][]seal.Span {
	if m == nil && len(held) == 0 {
		return nil
	}
	if m == nil {
		m = map[string][]seal.Span{}
	}
	open := func(ss []seal.Span) int {
		return slices.IndexFunc(ss, func(s seal.Span) bool { return s.Until.IsZero() })
	}
	for _, name := range held {
		if open(m[name]) < 0 {
			m[name] = append(m[name], seal.Span{From: now})
		}
	}
	for name, ss := range m {
		if i := open(ss); i >= 0 && !slices.Contains(held, name) {
			ss[i].Until = now
		}
	}
	return m
}

// runPublishKeys is `toolbus admin publish-keys`: the keyring to the core's bucket, with
// the deployment's admin credentials (TOOLBUS_NATS_CREDS when the directory has none).
func runPublishKeys(ctx context.Context, args []string, url string, stdout, stderr io.Writer) error {
	fs := newFlagSet("publish-keys", "", stderr)
	o := editFlags(fs, false)
	if _, err := parse(fs, args); err != nil {
		return err
	}
	dir, err := defaultDir(*o.dir)
	if err != nil {
		return err
	}
	if *o.server != "" {
		url = *o.server
	}
	if url == "" {
		return refused("publish-keys needs the server: set TOOLBUS_NATS_URL or give -server URL")
	}
	ring, err := seal.ReadKeyring(filepath.Join(dir, KeyringFile))
	if err != nil {
		return err
	}
	opts := []nats.Option{nats.Name("toolbus admin publish-keys")}
	if creds := filepath.Join(dir, "admin.creds"); fileExists(creds) {
		opts = append(opts, nats.UserCredentials(creds))
	} else if c, err := connect.FromEnv(); err == nil {
		more, err := c.NATSOptions("toolbus admin publish-keys", nil)
		if err != nil {
			return err
		}
		opts = append(opts, more...)
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return fmt.Errorf("admin: publish-keys: connect to %s: %w", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	n, err := seal.PublishKeyring(ctx, js, ring)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "published %d of %d public keys to the bucket %s\n", n, len(ring.Keys), seal.BucketSigners)
	return nil
}

func fileExists(f string) bool { _, err := os.Stat(f); return err == nil }
