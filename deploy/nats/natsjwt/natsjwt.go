// Package natsjwt makes the operator/JWT setup of toolbus: an operator, a system
// account, a TOOLBUS account with JetStream, and one user per role whose JWT carries the
// permissions of deploy/nats/permissions.conf. `go run ./deploy/nats/gen` calls it; the
// security tests start a server from what it writes.
package natsjwt

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nkeys"
)

// Roles are the toolbus roles, as named in permissions.conf (upper case there).
var Roles = []string{"admin", "planner", "executor", "injector", "client"}

// Permissions of one role: the publish and subscribe allow and deny lists.
type Permissions struct {
	PubAllow, PubDeny, SubAllow, SubDeny []string
}

// ReadPermissions parses permissions.conf and returns the lists of every role.
func ReadPermissions(file string) (map[string]Permissions, error) {
	m, err := conf.ParseFile(file)
	if err != nil {
		return nil, fmt.Errorf("natsjwt: %s: %w", file, err)
	}
	out := map[string]Permissions{}
	for _, role := range Roles {
		r, ok := m[strings.ToUpper(role)].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("natsjwt: %s: no %s permissions", file, strings.ToUpper(role))
		}
		var p Permissions
		p.PubAllow, p.PubDeny = lists(r["publish"])
		p.SubAllow, p.SubDeny = lists(r["subscribe"])
		if len(p.PubAllow) == 0 || len(p.SubAllow) == 0 {
			return nil, fmt.Errorf("natsjwt: %s: %s has no publish or subscribe allow list", file, role)
		}
		out[role] = p
	}
	return out, nil
}

func lists(v any) (allow, deny []string) {
	m, _ := v.(map[string]any)
	return strs(m["allow"]), strs(m["deny"])
}

func strs(v any) []string {
	var out []string
	switch x := v.(type) {
	case string:
		out = append(out, x)
	case []any:
		for _, e := range x {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// Result is what Generate wrote.
type Result struct {
	// Config is the server configuration (auth-jwt.conf): listen, JetStream, operator,
	// system account and a memory resolver preloaded with the account JWTs.
	Config string
	// Creds maps each role to its credentials file (TOOLBUS_NATS_CREDS).
	Creds map[string]string
	// Operator, System and Account are the public keys.
	Operator, System, Account string
}

// Generate writes, into dir, auth-jwt.conf, one <role>.creds per role and the seeds of
// the operator and the account (operator.nk, account.nk: keep them offline, they sign
// new users), with the role permissions read from permsFile.
func Generate(permsFile, dir string) (Result, error) {
	perms, err := ReadPermissions(permsFile)
	if err != nil {
		return Result{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Result{}, fmt.Errorf("natsjwt: %w", err)
	}
	write := func(name string, data []byte) (string, error) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return "", fmt.Errorf("natsjwt: %w", err)
		}
		return p, nil
	}
	okp, err := nkeys.CreateOperator()
	if err != nil {
		return Result{}, err
	}
	opub, _ := okp.PublicKey()
	skp, err := nkeys.CreateAccount()
	if err != nil {
		return Result{}, err
	}
	spub, _ := skp.PublicKey()
	akp, err := nkeys.CreateAccount()
	if err != nil {
		return Result{}, err
	}
	apub, _ := akp.PublicKey()

	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "toolbus"
	oc.SystemAccount = spub
	opJWT, err := oc.Encode(okp)
	if err != nil {
		return Result{}, err
	}
	sc := jwt.NewAccountClaims(spub)
	sc.Name = "SYS"
	sysJWT, err := sc.Encode(okp)
	if err != nil {
		return Result{}, err
	}
	ac := jwt.NewAccountClaims(apub)
	ac.Name = "TOOLBUS"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	accJWT, err := ac.Encode(okp)
	if err != nil {
		return Result{}, err
	}
	res := Result{Creds: map[string]string{}, Operator: opub, System: spub, Account: apub}
	for _, role := range Roles {
		ukp, err := nkeys.CreateUser()
		if err != nil {
			return Result{}, err
		}
		upub, _ := ukp.PublicKey()
		uc := jwt.NewUserClaims(upub)
		uc.Name = role
		p := perms[role]
		uc.Pub.Allow, uc.Pub.Deny = p.PubAllow, p.PubDeny
		uc.Sub.Allow, uc.Sub.Deny = p.SubAllow, p.SubDeny
		userJWT, err := uc.Encode(akp)
		if err != nil {
			return Result{}, err
		}
		seed, _ := ukp.Seed()
		creds, err := jwt.FormatUserConfig(userJWT, seed)
		if err != nil {
			return Result{}, err
		}
		if res.Creds[role], err = write(role+".creds", creds); err != nil {
			return Result{}, err
		}
	}
	oseed, _ := okp.Seed()
	aseed, _ := akp.Seed()
	if _, err := write("operator.nk", oseed); err != nil {
		return Result{}, err
	}
	if _, err := write("account.nk", aseed); err != nil {
		return Result{}, err
	}
	cfg := fmt.Sprintf(`# Operator/JWT mode for toolbus, written by go run ./deploy/nats/gen: one account
# (TOOLBUS, JetStream enabled) and one user per role, whose JWT carries the permissions
# of deploy/nats/permissions.conf. Give each process its <role>.creds file:
#   TOOLBUS_NATS_CREDS=/run/secrets/<role>.creds
# The admin runs toolbus init once. The accounts are preloaded into a memory resolver;
# for accounts managed at run time, use nsc and a full resolver instead.
server_name: toolbus-nats-1
listen: 0.0.0.0:4222
http: 0.0.0.0:8222
max_payload: 1MB
# A user JWT carries its permissions and travels in the CONNECT line: the executor's
# is longer than the default limit of 4 KB.
max_control_line: 64KB

jetstream {
  store_dir: /data
  max_memory_store: 256MB
  max_file_store: 10GB
}

operator: %s
system_account: %s
resolver: MEMORY
resolver_preload: {
  %s: %s
  %s: %s
}
`, opJWT, spub, spub, sysJWT, apub, accJWT)
	if res.Config, err = write("auth-jwt.conf", []byte(cfg)); err != nil {
		return Result{}, err
	}
	return res, nil
}
