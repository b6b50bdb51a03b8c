package mcpauth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"golang.org/x/oauth2"
)

// TokenStore is where a deployment's instances share the tokens of a server, so that
// ten replicas do not log in ten times: on a bus, the executor team's keys of the
// toolbus_secrets bucket (events.Bus.Secrets). Values are secrets.
type TokenStore interface {
	// Load returns the value of name and its revision; nil and 0 when there is none.
	Load(ctx context.Context, name string) ([]byte, uint64, error)
	// Swap writes value as name if its revision is still rev (0: if there is none);
	// swapped is false when another instance wrote first.
	Swap(ctx context.Context, name string, value []byte, rev uint64) (newRev uint64, swapped bool, err error)
}

// LeaseTTL is how long an instance that renews a shared token keeps the others from
// renewing it too: longer than a token request may take (RequestTimeout), so a lease
// only expires when its holder died.
const LeaseTTL = RequestTimeout + 5*time.Second

// storeTimeout bounds each read or write of the token store.
const storeTimeout = 5 * time.Second

// sharedRecord is the value of a shared token: the token, the lease of the instance
// renewing it, and for the authorization-code grant what refreshing needs (the client
// and its token endpoint) and the login it was seeded from (the SHA-256 of its refresh
// token, never the token, and the token file's time).
type sharedRecord struct {
	Token       *oauth2.Token `json:"token,omitempty"`
	Client      *storedToken  `json:"client,omitempty"`
	Seed        string        `json:"seed,omitempty"`
	SeededAt    time.Time     `json:"seeded_at,omitzero"`
	LeaseHolder string        `json:"lease_holder,omitempty"`
	LeaseUntil  time.Time     `json:"lease_until,omitzero"`
}

// sharedName is the store name of a server's token: a hash of the server, grant,
// client and scopes (key-safe, and no part of it readable from the key).
func sharedName(server, grant, client string, scopes []string) string {
	s := slices.Clone(scopes)
	slices.Sort(s)
	sum := sha256.Sum256([]byte(strings.Join([]string{server, grant, client, strings.Join(s, " ")}, "\x00")))
	return "oauth-" + hex.EncodeToString(sum[:16])
}

// sharedSource is the oauth2.TokenSource of a token shared through a TokenStore. It
// keeps the token it read while it is valid beyond early; then it reads the shared one,
// and when that is due too, takes the lease with a compare-and-set, renews it, writes
// the new token with a compare-and-set and releases the lease: one instance renews for
// all, the others wait for its token (or use theirs while it has not expired).
type sharedSource struct {
	store  TokenStore
	name   string
	early  time.Duration
	holder string
	log    *slog.Logger
	// renew takes a new token given the shared record (nil when none): a refresh with
	// its refresh token, or a new client-credentials token.
	renew func(rec *sharedRecord) (*sharedRecord, error)
	// seed, when set, is a record to start from when the store has none (or one seeded
	// from an older login): the token file of `toolbus mcp-login`.
	seed func() *sharedRecord
	// needsRecord: renew needs a token to start from (a refresh token); without one
	// Token fails with errNoToken.
	needsRecord bool
	// obs sees every record read or written (OnSecret).
	obs func(*sharedRecord)

	mu       sync.Mutex
	cached   *sharedRecord
	rejected string // an access token the server refused: renewed even if not due
}

func newSharedSource(store TokenStore, name string, early time.Duration, log *slog.Logger) *sharedSource {
	return &sharedSource{store: store, name: name, early: early, holder: rand.Text(), log: log}
}

// fresh reports whether rec holds a token to use without renewing it.
func (s *sharedSource) fresh(rec *sharedRecord) bool {
	if rec == nil || rec.Token == nil || rec.Token.AccessToken == "" || rec.Token.AccessToken == s.rejected {
		return false
	}
	return rec.Token.Expiry.IsZero() || time.Now().Add(s.early).Before(rec.Token.Expiry)
}

// reject marks tok refused by the server: the next Token renews it.
func (s *sharedSource) reject(tok string) {
	if tok == "" {
		return
	}
	s.mu.Lock()
	s.rejected = tok
	s.mu.Unlock()
}

// Token returns the shared token, renewing it when it is due.
func (s *sharedSource) Token() (*oauth2.Token, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fresh(s.cached) {
		return s.cached.Token, nil
	}
	rec, err := s.shared()
	if err != nil {
		if errors.Is(err, errStore) {
			// The store is unreachable or refused (credentials without the secrets
			// grant): this process renews on its own, as without a bus.
			s.log.Warn("shared OAuth token store unavailable; this instance renews its token alone", "error", err)
			return s.local()
		}
		return nil, err
	}
	s.cached = rec
	return rec.Token, nil
}

// errNoToken: the authorization-code grant has no token to refresh. An invalid_grant
// error, so the SDK's transport sends the request without a token and authorizes on
// its 401 (ErrLoginRequired in an executor), as without a shared store.
var errNoToken = &oauth2.RetrieveError{ErrorCode: "invalid_grant", ErrorDescription: "no token yet: an operator logs in with toolbus mcp-login"}

// errStore wraps the failures of the token store itself.
var errStore = errors.New("mcpauth: token store")

// local renews the token in this process only (the store failed).
func (s *sharedSource) local() (*oauth2.Token, error) {
	rec := s.cached
	if rec == nil && s.seed != nil {
		rec = s.seed()
	}
	n, err := s.renew(rec)
	if err != nil {
		return nil, err
	}
	s.obs(n)
	s.cached = n
	return n.Token, nil
}

func (s *sharedSource) load(ctx context.Context) (*sharedRecord, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	b, rev, err := s.store.Load(ctx, s.name)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", errStore, err)
	}
	if b == nil {
		return nil, 0, nil
	}
	var rec sharedRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, rev, nil // not ours, or an older layout: renewed over
	}
	s.obs(&rec)
	return &rec, rev, nil
}

func (s *sharedSource) swap(ctx context.Context, rec *sharedRecord, rev uint64) (uint64, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, false, fmt.Errorf("mcpauth: encode the shared token: %w", err)
	}
	n, ok, err := s.store.Swap(ctx, s.name, b, rev)
	if err != nil {
		return 0, false, fmt.Errorf("%w: %w", errStore, err)
	}
	return n, ok, nil
}

// shared reads the shared record until it holds a fresh token, taking the lease and
// renewing it when it is due and nobody else is renewing it.
func (s *sharedSource) shared() (*sharedRecord, error) {
	ctx, cancel := context.WithTimeout(context.Background(), LeaseTTL+storeTimeout)
	defer cancel()
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		rec, rev, err := s.load(ctx)
		if err != nil {
			return nil, err
		}
		if s.seed != nil {
			if sd := s.seed(); sd != nil && (rec == nil || rec.Seed != sd.Seed && sd.SeededAt.After(rec.SeededAt)) {
				// No shared token yet, or one from an older login: the login's seeds it
				// (an instance with an older token file than the record's does not).
				if _, ok, err := s.swap(ctx, sd, rev); err != nil {
					return nil, err
				} else if ok {
					s.obs(sd)
				}
				continue
			}
		}
		if s.fresh(rec) {
			return rec, nil
		}
		if s.needsRecord && (rec == nil || rec.Token == nil) {
			return nil, errNoToken
		}
		now := time.Now()
		if rec != nil && rec.LeaseHolder != "" && rec.LeaseHolder != s.holder && now.Before(rec.LeaseUntil) {
			// Another instance is renewing: use ours while it has not expired, else wait.
			if c := s.cached; c != nil && c.Token != nil && c.Token.Valid() && c.Token.AccessToken != s.rejected {
				return c, nil
			}
			select {
			case <-time.After(wait):
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("mcpauth: waiting for another instance to renew the token: %w", ctx.Err())
			}
		}
		leased := &sharedRecord{}
		if rec != nil {
			*leased = *rec
		}
		leased.LeaseHolder, leased.LeaseUntil = s.holder, now.Add(LeaseTTL)
		lrev, ok, err := s.swap(ctx, leased, rev)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue // another instance wrote first: read what it wrote
		}
		return s.renewLeased(ctx, leased, lrev)
	}
}

// renewLeased renews the token under the lease (revision lrev) and writes it.
func (s *sharedSource) renewLeased(ctx context.Context, leased *sharedRecord, lrev uint64) (*sharedRecord, error) {
	var prev *sharedRecord
	if leased.Token != nil || leased.Client != nil {
		prev = leased
	}
	n, err := s.renew(prev)
	if err != nil {
		// Release the lease, so another instance may try at once.
		leased.LeaseHolder, leased.LeaseUntil = "", time.Time{}
		_, _, _ = s.swap(ctx, leased, lrev)
		return nil, err
	}
	n.Seed, n.SeededAt = leased.Seed, leased.SeededAt
	if n.Client == nil {
		n.Client = leased.Client
	}
	s.obs(n)
	if _, ok, err := s.swap(ctx, n, lrev); err != nil || !ok {
		// Our lease was taken over (it expired): the token still serves this process.
		s.log.Warn("the renewed OAuth token was not shared: another instance took the lease over")
	}
	return n, nil
}

// sharedAuthorizationCode is the authorization-code handler whose tokens live in
// opts.Tokens: the token file of `toolbus mcp-login` seeds the shared token (when the
// store has none, or one of an older login) and is never written by the executors;
// refreshed tokens live in the store only, so a rotated refresh token is the one every
// instance refreshes with.
func sharedAuthorizationCode(cfg Config, hc *http.Client, opts Options, file *tokenFile) (auth.OAuthHandler, error) {
	secret := opts.OnSecret
	ss := newSharedSource(opts.Tokens, sharedName(opts.Server, GrantAuthorizationCode, cfg.ClientID+"\x00"+cfg.ClientMetadataURL, nil),
		opts.early(), opts.logger())
	ss.needsRecord = true
	ss.obs = func(r *sharedRecord) {
		if r.Token != nil {
			secret(r.Token.AccessToken, r.Token.RefreshToken)
		}
		if r.Client != nil {
			secret(r.Client.ClientSecret)
		}
	}
	ss.seed = func() *sharedRecord {
		oc, t, mt, err := file.load()
		if err != nil || t == nil || t.RefreshToken == "" {
			return nil
		}
		sum := sha256.Sum256([]byte(t.RefreshToken))
		return &sharedRecord{Token: t, Client: client(oc), Seed: hex.EncodeToString(sum[:]), SeededAt: mt}
	}
	ss.renew = func(prev *sharedRecord) (*sharedRecord, error) {
		if prev == nil || prev.Token == nil || prev.Token.RefreshToken == "" || prev.Client == nil {
			return nil, errNoToken
		}
		ctx := context.WithValue(context.Background(), oauth2.HTTPClient, hc)
		t, err := prev.Client.config().TokenSource(ctx, &oauth2.Token{RefreshToken: prev.Token.RefreshToken}).Token()
		if err != nil {
			return nil, err
		}
		return &sharedRecord{Token: t, Client: prev.Client}, nil
	}
	if _, err := file.loadChecked(); err != nil {
		return nil, err
	}
	ac := codeHandlerConfig(cfg, hc, opts.Fetcher)
	ac.InitialTokenSource = ss
	ac.NewTokenSource = func(_ context.Context, oc *oauth2.Config, t *oauth2.Token) (oauth2.TokenSource, error) {
		// A login in this process (a Fetcher): its token becomes the shared one.
		secret(t.AccessToken, t.RefreshToken, oc.ClientSecret)
		ss.publish(&sharedRecord{Token: t, Client: client(oc)})
		return ss, nil
	}
	h, err := auth.NewAuthorizationCodeHandler(ac)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return h, nil
}

// publish makes rec the shared token (over whatever is there) and this process's.
func (s *sharedSource) publish(rec *sharedRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cached, s.rejected = rec, ""
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	for range 5 {
		old, rev, err := s.load(ctx)
		if err != nil {
			s.log.Warn("the new OAuth token was not shared", "error", err)
			return
		}
		rec.SeededAt = time.Now() // newer than any login's file until another login
		if old != nil {
			rec.Seed = old.Seed
		}
		if _, ok, err := s.swap(ctx, rec, rev); err != nil || ok {
			return
		}
	}
}
