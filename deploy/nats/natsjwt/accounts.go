package natsjwt

import (
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/toolbus/toolbus/events/accounts"
)

// The list of what crosses lives in package events/accounts; these are its names here.
type Crossing = accounts.Crossing

// CoreAPIPrefix is accounts.CoreAPIPrefix.
const CoreAPIPrefix = accounts.CoreAPIPrefix

// CoreAccount is accounts.CoreAccount.
const CoreAccount = accounts.CoreAccount

// TeamExports is accounts.TeamExports.
func TeamExports(team string, tools []string) []Crossing { return accounts.TeamExports(team, tools) }

// CoreExports is accounts.CoreExports.
func CoreExports() []Crossing { return accounts.CoreExports() }

// TeamAccount is accounts.TeamAccount.
func TeamAccount(team string) string { return accounts.TeamAccount(team) }

// coreJWTExports are CoreExports as the core account JWT's exports, each service's with
// the response threshold (0: accounts.ResponseThreshold).
func coreJWTExports(threshold time.Duration) jwt.Exports {
	threshold = accounts.Layout{ResponseThreshold: threshold}.Threshold()
	var out jwt.Exports
	for _, c := range CoreExports() {
		e := &jwt.Export{Name: c.Subject, Subject: jwt.Subject(c.Subject), Type: jwt.Service, TokenReq: true, ResponseType: pullResponse(c),
			ResponseThreshold: threshold}
		if c.Stream {
			e.Type, e.ResponseType, e.ResponseThreshold = jwt.Stream, "", 0
		}
		out = append(out, e)
	}
	return out
}

// teamJWTImports are TeamExports(team, tools) as the team account JWT's imports from the
// core account (core), each with an activation token for the team's account (teamPub),
// signed by the core account.
func teamJWTImports(corePub, teamPub string, crossings []Crossing, sign func(*jwt.ActivationClaims) (string, error)) (jwt.Imports, error) {
	var out jwt.Imports
	for _, c := range crossings {
		typ := jwt.Service
		if c.Stream {
			typ = jwt.Stream
		}
		act := jwt.NewActivationClaims(teamPub)
		act.Name = c.Subject
		act.ImportSubject = jwt.Subject(c.Subject)
		act.ImportType = typ
		tok, err := sign(act)
		if err != nil {
			return nil, fmt.Errorf("natsjwt: activation of %s: %w", c.Subject, err)
		}
		out = append(out, &jwt.Import{Name: c.Subject, Subject: jwt.Subject(c.Subject), Account: corePub,
			LocalSubject: jwt.RenamingSubject(c.Local), Type: typ, Token: tok})
	}
	return out, nil
}

// pullResponse is the JWT response type of a crossing: stream for a pull.
func pullResponse(c Crossing) jwt.ResponseType {
	if c.Pull {
		return jwt.ResponseTypeStream
	}
	return ""
}
