package packs

import (
	"context"
	"encoding/json"

	"github.com/toolbus/toolbus/executor"
)

// confirmSchema is the answer confirm asks for: one boolean.
const confirmSchema = `{"type":"object","properties":{"confirm":{"type":"boolean"}},"required":["confirm"]}`

type confirmInput struct {
	Question string `json:"question" jsonschema:"description=The yes-or-no question to ask the run's caller"`
}

// ConfirmOutput is what confirm returns: the caller's answer.
type ConfirmOutput struct {
	Confirmed bool   `json:"confirmed"`
	Action    string `json:"action"`
}

// registerConfirm registers confirm, the diag pack's question to the caller
// (executor.Ask): the smallest tool that waits for a person's answer, for trying
// `toolbus answer`, the console's form and an MCP host's elicitation.
func registerConfirm(r *executor.Registry) error {
	return executor.RegisterFunc(r, executor.Tool{
		Name: "confirm",
		Description: "Diagnostic: ask the run's caller the given yes-or-no question and wait for the answer " +
			"(toolbus answer, the console, an MCP host's form); returns {\"confirmed\", \"action\"}.",
		ReadOnly: true,
	}, func(ctx context.Context, in confirmInput) (ConfirmOutput, error) {
		a, err := executor.Ask(ctx, in.Question, json.RawMessage(confirmSchema))
		if err != nil {
			return ConfirmOutput{}, err
		}
		out := ConfirmOutput{Action: a.Action}
		if a.Action == "accept" {
			var ans struct {
				Confirm bool `json:"confirm"`
			}
			if err := json.Unmarshal(a.Content, &ans); err != nil {
				return ConfirmOutput{}, err
			}
			out.Confirmed = ans.Confirm
		}
		return out, nil
	})
}
