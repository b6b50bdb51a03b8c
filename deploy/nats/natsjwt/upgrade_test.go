package natsjwt_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbus/toolbus/deploy/nats/natsjwt"
	"github.com/toolbus/toolbus/events"
)

// The accounts layout's injector may subscribe to the write service's subjects even
// when its permissions.conf role does not list them, as the copy an earlier toolbus admin
// init kept in a deployment's permissions/ (docs/deployment-and-security.md, "Upgrading
// to the write service"): once issued again its injectors run the service. Issued from
// today's permissions.conf the subject is listed once; the one-account layout's injector
// keeps what its role says (the control).
func TestInjectorSubscribesToTheWriteService(t *testing.T) {
	svc := events.WriteServicePrefix + ".>"
	today, err := os.ReadFile(filepath.Join("..", "permissions.conf"))
	if err != nil {
		t.Fatal(err)
	}
	earlier := strings.Replace(string(today), `"`+svc+`"`, "", 1)
	if earlier == string(today) {
		t.Fatalf("permissions.conf lists no %s", svc)
	}
	for _, tc := range []struct {
		name     string
		perms    string
		accounts bool
		want     int // times the injector's JWT may subscribe to svc
	}{
		{name: "accounts, earlier permissions", perms: earlier, accounts: true, want: 1},
		{name: "accounts, today's permissions", perms: string(today), accounts: true, want: 1},
		{name: "one account, earlier permissions", perms: earlier, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range []string{"team-executor.conf", "single.conf"} { // beside it, as in permissions/
				b, err := os.ReadFile(filepath.Join("..", f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			perms := filepath.Join(dir, "permissions.conf")
			if err := os.WriteFile(perms, []byte(tc.perms), 0o600); err != nil {
				t.Fatal(err)
			}
			opts := []natsjwt.Option{natsjwt.WithBcryptCost(bcrypt.MinCost)}
			if tc.accounts {
				opts = append(opts, natsjwt.WithAccounts())
			}
			out := filepath.Join(dir, "out")
			if _, err := natsjwt.GenerateGrants(perms, out, natsjwt.Grants{Teams: map[string][]string{"alpha": {"calc"}}}, opts...); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(out, "injector.creds"))
			if err != nil {
				t.Fatal(err)
			}
			tok, err := jwt.ParseDecoratedJWT(b)
			if err != nil {
				t.Fatal(err)
			}
			uc, err := jwt.DecodeUserClaims(tok)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(slices.DeleteFunc(slices.Clone(uc.Sub.Allow), func(s string) bool { return s != svc })); got != tc.want {
				t.Errorf("the injector may subscribe to %s %d times, want %d: %v", svc, got, tc.want, uc.Sub.Allow)
			}
		})
	}
}
