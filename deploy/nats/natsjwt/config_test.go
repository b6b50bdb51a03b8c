package natsjwt_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
)

// The server configs GenerateGrants writes listen on loopback unless told otherwise
// (WithListen), keep monitoring on loopback, and store where the administrator says:
// WithStoreDir, else nowhere in the file, so that the server is given the directory
// (toolbus server -sd, and nats-server -sd, which refuses a store_dir in the file).
func TestGeneratedServerSettings(t *testing.T) {
	perms := filepath.Join("..", "permissions.conf")
	store := filepath.Join(t.TempDir(), "nats data")
	for _, tc := range []struct {
		name       string
		opts       []natsjwt.Option
		host       string
		port       int
		store      string
		wantErrSub string
	}{
		{name: "defaults", host: "127.0.0.1", port: 4222},
		{name: "listen and store", opts: []natsjwt.Option{natsjwt.WithListen("0.0.0.0:4333"), natsjwt.WithStoreDir(store)},
			host: "0.0.0.0", port: 4333, store: store},
		{name: "bad listen", opts: []natsjwt.Option{natsjwt.WithListen("4222")}, wantErrSub: `listen address "4222"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := natsjwt.GenerateGrants(perms, t.TempDir(), natsjwt.Grants{}, append(tc.opts, natsjwt.WithBcryptCost(bcrypt.MinCost))...)
			if tc.wantErrSub != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrSub) {
					t.Fatalf("err = %v, want %q", err, tc.wantErrSub)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, file := range []string{res.Config, res.UsersConfig, res.NkeysConfig} {
				opts, err := server.ProcessConfigFile(file)
				if err != nil {
					t.Fatalf("%s: %v", filepath.Base(file), err)
				}
				if opts.Host != tc.host || opts.Port != tc.port || opts.StoreDir != tc.store || !opts.JetStream || opts.HTTPHost != "127.0.0.1" {
					t.Errorf("%s: listen %s:%d, store %q, JetStream %v, monitoring on %q; want %s:%d, store %q, JetStream, monitoring on 127.0.0.1",
						filepath.Base(file), opts.Host, opts.Port, opts.StoreDir, opts.JetStream, opts.HTTPHost, tc.host, tc.port, tc.store)
				}
			}
		})
	}
}

// WithFullResolver: auth-jwt.conf's resolver is a full one storing in the directory
// given, still preloaded with every account; without the accounts layout (no
// system.creds to push with) it is refused. Without it, a memory resolver.
func TestFullResolverConfig(t *testing.T) {
	perms := filepath.Join("..", "permissions.conf")
	g := natsjwt.Grants{Teams: map[string][]string{"alpha": {"calc"}}}
	store := filepath.Join(t.TempDir(), "jwt")
	if _, err := natsjwt.GenerateGrants(perms, t.TempDir(), g, natsjwt.WithFullResolver(store), natsjwt.WithBcryptCost(bcrypt.MinCost)); err == nil || !strings.Contains(err.Error(), "needs the accounts layout") {
		t.Errorf("a full resolver without the accounts layout: %v", err)
	}
	for _, tc := range []struct {
		name string
		opts []natsjwt.Option
		full bool
	}{
		{name: "full", opts: []natsjwt.Option{natsjwt.WithAccounts(), natsjwt.WithFullResolver(store)}, full: true},
		{name: "memory", opts: []natsjwt.Option{natsjwt.WithAccounts()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := natsjwt.GenerateGrants(perms, t.TempDir(), g, append(tc.opts, natsjwt.WithBcryptCost(bcrypt.MinCost))...)
			if err != nil {
				t.Fatal(err)
			}
			if (res.ResolverDir != "") != tc.full {
				t.Errorf("Result.ResolverDir %q", res.ResolverDir)
			}
			opts, err := server.ProcessConfigFile(res.Config)
			if err != nil {
				t.Fatal(err)
			}
			_, full := opts.AccountResolver.(*server.DirAccResolver)
			_, mem := opts.AccountResolver.(*server.MemAccResolver)
			if full != tc.full || mem == tc.full {
				t.Errorf("resolver %T", opts.AccountResolver)
			}
			b, err := os.ReadFile(res.Config)
			if err != nil {
				t.Fatal(err)
			}
			for pub := range res.AccountJWTs {
				if !strings.Contains(string(b), "  "+pub+": "+res.AccountJWTs[pub]+"\n") {
					t.Errorf("%s is not preloaded", pub)
				}
			}
			if tc.full && !strings.Contains(string(b), "dir: "+strconv.Quote(store)) {
				t.Errorf("auth-jwt.conf does not store in %s:\n%s", store, b)
			}
		})
	}
}
