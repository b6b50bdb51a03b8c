package mcpserver

import (
	"context"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolbus/toolbus"
)

// offeredTo reports whether a caller whose token names teams may list and call tc: a
// tool a team owns is offered to that team's tokens only; a tool no team owns (served by
// the shared executor user of a one-team deployment) and a token that names no team (a
// trusted door) see every tool.
func offeredTo(tc toolbus.ToolContract, teams []string) bool {
	return tc.Owner == "" || len(teams) == 0 || slices.Contains(teams, tc.Owner)
}

// teamTools narrows every tools/list answer to the tools offered to the caller's teams
// (offeredTo); call refuses the others as unknown, so a token of one team can neither
// see nor run another team's tools.
func (b *bridge) teamTools(def string) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			lr, ok := res.(*mcp.ListToolsResult)
			if err != nil || !ok || method != "tools/list" {
				return res, err
			}
			_, teams := callerOf(&mcp.CallToolRequest{Extra: req.GetExtra()}, def)
			if len(teams) == 0 {
				return res, nil
			}
			out := *lr
			out.Tools = nil
			for _, t := range lr.Tools {
				if tc, ok := b.cat.Lookup(t.Name); ok && offeredTo(tc, teams) {
					out.Tools = append(out.Tools, t)
				}
			}
			return &out, nil
		}
	}
}
