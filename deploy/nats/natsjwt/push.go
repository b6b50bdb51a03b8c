package natsjwt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// SystemUser is the name of the system account's user the accounts layout issues
// (system.creds): it may only push account JWTs to the servers (PushAccounts).
const SystemUser = "system"

// ErrPushSkipped is wrapped by PushAccounts for an account no server had loaded, with
// a memory resolver (auth-jwt.conf without WithFullResolver): it takes the account from
// its preload on the next reload (kill -HUP). A full resolver stores every account
// pushed, a new one too, and never skips.
var ErrPushSkipped = errors.New("natsjwt: account not loaded by the server: reload it to take the new JWT")

// PushAccounts sends each account JWT of jwts (public key -> JWT, as
// Result.AccountJWTs) to the running servers on $SYS.REQ.ACCOUNT.<key>.CLAIMS.UPDATE,
// over nc, a connection of the system account (Result.SystemCreds). A server applies
// it to the account at once: a team's connections keep running and see its new imports
// (a tool granted) or lose the old ones. The system account's own JWT is not pushed.
// A full resolver (WithFullResolver) stores each JWT in its directory, a new account's
// too, whose users then connect with no reload. A memory resolver keeps its preload: the
// next reload of the config gen wrote with the same JWTs changes nothing more.
//
// It returns the first error after trying every account; with a memory resolver an
// account no server has loaded (no connection yet, e.g. a new team) is ErrPushSkipped.
func PushAccounts(ctx context.Context, nc *nats.Conn, jwts map[string]string) error {
	var errs []error
	for _, pub := range slices.Sorted(maps.Keys(jwts)) {
		c, err := jwt.DecodeAccountClaims(jwts[pub])
		if err != nil {
			errs = append(errs, fmt.Errorf("natsjwt: push %s: %w", pub, err))
			continue
		}
		if c.Name == "SYS" {
			continue
		}
		m, err := nc.RequestWithContext(ctx, "$SYS.REQ.ACCOUNT."+pub+".CLAIMS.UPDATE", []byte(jwts[pub]))
		if err != nil {
			errs = append(errs, fmt.Errorf("natsjwt: push account %s (%s): %w", c.Name, pub, err))
			continue
		}
		var r struct {
			Data *struct {
				Message string `json:"message"`
			} `json:"data"`
			Error *struct {
				Description string `json:"description"`
			} `json:"error"`
		}
		switch err := json.Unmarshal(m.Data, &r); {
		case err != nil:
			errs = append(errs, fmt.Errorf("natsjwt: push account %s: %w: %s", c.Name, err, m.Data))
		case r.Error != nil:
			errs = append(errs, fmt.Errorf("natsjwt: push account %s: %s", c.Name, r.Error.Description))
		case r.Data != nil && r.Data.Message == "jwt update skipped":
			errs = append(errs, fmt.Errorf("push account %s: %w", c.Name, ErrPushSkipped))
		}
	}
	return errors.Join(errs...)
}

// systemCreds is the credentials file of the system account's user that may push
// account JWTs, signed by the system account skp: kept while it exists.
func (k keyring) systemCreds(skp nkeys.KeyPair, write func(string, []byte) (string, error)) (string, error) {
	file := SystemUser + ".creds"
	if uc, ok := k.userJWT(SystemUser); ok && uc.Issuer == mustPublic(skp) {
		return filepath.Join(k.dir, file), nil
	}
	u := User{Name: SystemUser, Perms: Permissions{
		PubAllow: []string{"$SYS.REQ.ACCOUNT.*.CLAIMS.UPDATE"},
		SubAllow: []string{"_INBOX.>"},
	}}
	creds, err := userCreds(u, skp)
	if err != nil {
		return "", err
	}
	return write(file, creds)
}

func mustPublic(kp nkeys.KeyPair) string {
	pub, _ := kp.PublicKey() //nolint:errcheck // a key pair made from a seed has one
	return pub
}
