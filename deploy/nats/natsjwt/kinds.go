package natsjwt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The kinds of credentials a deployment issues, each a server config and one secret
// file per user: KindJWT auth-jwt.conf and <user>.creds, KindUsers auth-users.conf,
// <user>.password and k8s-secrets.yaml, KindNkeys auth-nkeys.conf and <user>.nk.
const (
	KindJWT   = "jwt"
	KindUsers = "users"
	KindNkeys = "nkeys"
)

// Kinds are every kind, in the order -auth lists them.
var Kinds = []string{KindJWT, KindUsers, KindNkeys}

// ParseKinds reads -auth: "all", or kinds separated by commas ("jwt", "jwt,users").
// The JWT kind is always among them: its kept .creds hold each user's permissions
// between runs, so that a run tells a changed user from an unchanged one.
func ParseKinds(s string) ([]string, error) {
	if s == "all" {
		return slices.Clone(Kinds), nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(Kinds, k) {
			return nil, fmt.Errorf("unknown kind of credentials %q (jwt, users, nkeys or all)", k)
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	if !slices.Contains(out, KindJWT) {
		return nil, errors.New("the kinds of credentials must include jwt (jwt, jwt,users, jwt,nkeys or all): the JWT kind's files keep each user's permissions between runs")
	}
	return out, nil
}

// WithKinds issues only the kinds of credentials named (ParseKinds); without it, every
// kind. A kind left out has no server config and no user file: each user then gets one
// secret file per kind issued (one, its .creds, with KindJWT alone), and the files of a
// kind left out since an earlier run are deleted.
func WithKinds(kinds ...string) Option { return func(o *options) { o.kinds = kinds } }

// issues reports whether o issues kind.
func (o options) issues(kind string) bool { return len(o.kinds) == 0 || slices.Contains(o.kinds, kind) }

// dropKinds deletes the files of the kinds o does not issue: each user's secret file of
// that kind and its config (and k8s-secrets.yaml, which holds the passwords).
func dropKinds(dir string, users []User, o options) error {
	drop := func(name string) error {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("natsjwt: %w", err)
		}
		return nil
	}
	for kind, files := range map[string][]string{KindUsers: {"auth-users.conf", "k8s-secrets.yaml"}, KindNkeys: {"auth-nkeys.conf"}} {
		if o.issues(kind) {
			continue
		}
		ext := map[string]string{KindUsers: ".password", KindNkeys: ".nk"}[kind]
		for _, u := range users {
			files = append(files, u.Name+ext)
		}
		for _, f := range files {
			if err := drop(f); err != nil {
				return err
			}
		}
	}
	return nil
}
