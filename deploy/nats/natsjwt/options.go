package natsjwt

import (
	"time"

	"github.com/toolbus/toolbus/events/accounts"
)

// Option changes how GenerateGrants issues credentials.
type Option func(*options)

type options struct {
	bcryptCost int
	rotate     []string
	// listen is the client address of the configs; store their JetStream store
	// directory ("": none, the server is given one: toolbus server -sd DIR).
	listen, store string
	// accounts: the accounts layout (WithAccounts).
	accounts bool
	// resolverDir is the full resolver's directory (WithFullResolver; "": a memory
	// resolver).
	resolverDir string
	// limits caps each tenant's account in the accounts layout (WithTenantLimits).
	limits accounts.TenantLimits
	// respThreshold is the core's exports' response threshold (WithResponseThreshold;
	// 0: accounts.ResponseThreshold).
	respThreshold time.Duration
	// noCoreWide: the accounts layout issues no CoreWide user (WithoutCoreWide).
	noCoreWide bool
	// kinds are the kinds of credentials issued (WithKinds; nil: every kind).
	kinds []string
}

// CoreWide are the role users of the core account that act for every tenant: the shared
// executor serves every team's tools and reads every run, the shared client starts,
// decides, cancels and reads every run in anyone's name. The one-account layout needs
// them; in the accounts layout teams and clients have accounts of their own, and these
// are for trusted deployments only (WithoutCoreWide leaves them out).
var CoreWide = []string{"executor", "client"}

// CoreWideNote says what a CoreWide user's credentials can do ("" for any other user).
func CoreWideNote(user string) string {
	switch user {
	case "executor":
		return "core-wide: serves every team's tools and reads every run of every team and client; for one trusted team only, teams get executor-<team> (add-team)"
	case "client":
		return "core-wide: starts, decides, cancels and reads every run in anyone's name; for a door trusted by everyone only, clients and doors get client-<name> bound to their identities (add-client)"
	}
	return ""
}

// WithoutCoreWide leaves the CoreWide users out of the accounts layout (WithAccounts):
// their files are not written, and a run on a directory that holds them removes them
// and revokes their JWTs, as for any user no longer issued. toolbus admin init issues
// them only when asked (-core-wide).
func WithoutCoreWide() Option { return func(o *options) { o.noCoreWide = true } }

// WithTenantLimits sets the limits of each team's and client's account in the accounts
// layout, in every kind of credentials (accounts.TenantLimits: a field of 0 is its
// default, -1 no limit); without it they are accounts.DefaultTenantLimits. The core
// account has none; -one-account (no WithAccounts) has no tenant account to limit.
func WithTenantLimits(l accounts.TenantLimits) Option { return func(o *options) { o.limits = l } }

// WithResponseThreshold sets the response threshold of the core's service exports in
// the accounts layout, in every kind of credentials (default accounts.ResponseThreshold:
// a stream of answers to a tenant silent longer than d loses its way back, so d must
// exceed events.TenantAnswerGap; tests shorten both).
func WithResponseThreshold(d time.Duration) Option { return func(o *options) { o.respThreshold = d } }

// WithFullResolver writes auth-jwt.conf with a full resolver storing the account JWTs
// in dir, a directory the server may write (an absolute path as the server sees it; a
// relative one is the server's working directory's, as a store_dir). The preload stays,
// so a server started on a new directory has every account; a push
// (PushAccounts) then stores a new or changed account at once, a new team's or client's
// too, with no reload. Only with WithAccounts, whose system.creds pushes: a full
// resolver takes a changed account from a push, not from a reload. Without it
// auth-jwt.conf has a memory resolver: the preload only, a new account needs a reload.
func WithFullResolver(dir string) Option { return func(o *options) { o.resolverDir = dir } }

// WithAccounts issues the accounts layout (docs/tenancy-design.md): the core account
// holds the stream, the buckets and every role's user; each team gets an account of its
// own (JWT kind: its own account key, kept across runs) holding its executor user, which
// imports of the core only what TeamExports lists, the JetStream API under CoreAPIPrefix.
// Its executors need TOOLBUS_NATS_API_PREFIX=JS.core.API (Result.Env). Each bound client
// gets one too (CLIENT_<name>, JWT client-<name>) holding its client-<name> user, which
// imports only ClientExports of its identities: no JetStream API at all, its reads go to
// the core's read service (TOOLBUS_NATS_READ_PREFIX, Result.Env). Off by default: one
// account with user permissions per role, team and client.
func WithAccounts() Option { return func(o *options) { o.accounts = true } }

// WithRotate issues new credentials for users (a new password, nkey and JWT, the old
// JWT revoked) and keeps everyone else's: a leaked or departing credential is replaced
// without touching another tenant. Result.Changes reports them as "rotated".
func WithRotate(users ...string) Option {
	return func(o *options) { o.rotate = append(o.rotate, users...) }
}

// WithBcryptCost sets the cost of the password hashes (default bcrypt.DefaultCost): the
// server pays it on every login; tests lower it.
func WithBcryptCost(cost int) Option { return func(o *options) { o.bcryptCost = cost } }

// DefaultListen is the client address of the configs GenerateGrants writes unless
// WithListen says otherwise: loopback, reachable from other hosts only on purpose.
const DefaultListen = "127.0.0.1:4222"

// WithListen sets the client address (host:port) the configs listen on (default
// DefaultListen; "0.0.0.0:4222" for every interface).
func WithListen(hostport string) Option { return func(o *options) { o.listen = hostport } }

// WithStoreDir writes dir as the configs' JetStream store_dir. Without it the configs
// name none and the server is given one when it starts (toolbus server -sd DIR, or
// nats-server -sd DIR, which refuses a store_dir in the file).
func WithStoreDir(dir string) Option { return func(o *options) { o.store = dir } }
