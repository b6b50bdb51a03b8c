package packs

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"sync"

	"github.com/toolbus/toolbus/executor"
)

// calculatorInput is the argument object of the calculator tool.
type calculatorInput struct {
	Expression string `json:"expression" jsonschema:"description=Arithmetic expression to evaluate. Supports + - * / % and ^ (power; right-associative)\\, unary minus\\, parentheses\\, decimals and exponents such as 2.5e-3\\, functions sqrt abs floor ceil round min max (min and max take one or more arguments) and constants pi and e. Example: (2+3)*sqrt(16)^2 - max(1\\, 7\\, 3),minLength=1,maxLength=1024"`
}

// CalculatorOutput is the result of the calculator tool.
type CalculatorOutput struct {
	Value float64 `json:"value" jsonschema:"description=The value of the expression as a finite number"`
}

// Incident is one incident of the bundled fixture, the result of lookup_incident.
type Incident struct {
	IncidentID string   `json:"incident_id" jsonschema:"description=Incident id such as INC-001"`
	Service    string   `json:"service" jsonschema:"description=Affected service"`
	Severity   string   `json:"severity" jsonschema:"description=Severity: low\\, medium or high"`
	Status     string   `json:"status" jsonschema:"description=Status: open\\, mitigated or resolved"`
	Summary    string   `json:"summary" jsonschema:"description=One-line summary of the incident"`
	Evidence   []string `json:"evidence" jsonschema:"description=Log lines\\, metrics and events that support the summary"`
}

// lookupIncidentInput is the argument object of the lookup_incident tool.
type lookupIncidentInput struct {
	IncidentID string `json:"incident_id" jsonschema:"description=Incident id: INC- followed by digits (for example INC-001),pattern=^INC-[0-9]+$"`
}

// restartInput is the argument object of the restart_service tool.
type restartInput struct {
	Service string `json:"service" jsonschema:"description=Service to restart (for example auth-api),pattern=^[a-z][a-z0-9-]{0\\,62}$"`
}

// RestartOutput is the result of restart_service: the fixture only pretends, and says
// which idempotency key a real implementation would pass downstream.
type RestartOutput struct {
	Restarted      string `json:"restarted" jsonschema:"description=The service restarted"`
	IdempotencyKey string `json:"idempotency_key,omitempty" jsonschema:"description=Key that makes a retried restart a no-op downstream"`
}

//go:embed incidents.json
var incidentsJSON []byte

var incidentID = regexp.MustCompile(`^INC-[0-9]+$`)

// incidents parses the embedded fixture once.
var incidents = sync.OnceValue(func() map[string]Incident {
	var list []Incident
	if err := json.Unmarshal(incidentsJSON, &list); err != nil {
		panic("packs: bad embedded incidents.json: " + err.Error())
	}
	m := make(map[string]Incident, len(list))
	for _, in := range list {
		m[in.IncidentID] = in
	}
	return m
})

func registerDemo(r *executor.Registry) error {
	err := executor.RegisterFunc(r, executor.Tool{
		Name: "calculator",
		Description: "Evaluate an arithmetic expression exactly and return its numeric value. " +
			"Use it instead of doing arithmetic in your head. " +
			"Operators: + - * / % (remainder) ^ (power, right-associative; ** also works), unary minus, parentheses. " +
			"Functions: sqrt, abs, floor, ceil, round, min(a, b, ...), max(a, b, ...). Constants: pi, e. " +
			"No variables and no implicit multiplication (write 2*pi, not 2pi). " +
			"Errors name the character position of the problem (code invalid_expression, or division_by_zero).",
		ReadOnly: true,
	}, func(_ context.Context, in calculatorInput) (CalculatorOutput, error) {
		v, err := Calculate(in.Expression)
		if err != nil {
			return CalculatorOutput{}, err
		}
		return CalculatorOutput{Value: v}, nil
	})
	if err != nil {
		return err
	}
	err = executor.RegisterFunc(r, executor.Tool{
		Name: "restart_service",
		Description: "Restart a service to mitigate an incident (for example auth-api). This has a side effect " +
			"and needs a person's approval: the call waits until someone approves or denies it.",
		ReadOnly: false, NeedsApproval: true,
	}, func(ctx context.Context, in restartInput) (RestartOutput, error) {
		ci, _ := executor.CallInfoFrom(ctx)
		return RestartOutput{Restarted: in.Service, IdempotencyKey: ci.IdempotencyKey}, nil
	})
	if err != nil {
		return err
	}
	return executor.RegisterFunc(r, executor.Tool{
		Name: "lookup_incident",
		Description: "Look up an operations incident by id (for example INC-001) and return its service, " +
			"severity, status, one-line summary and the evidence lines (logs, metrics, deploy events) " +
			"collected for it. Use it to investigate or explain an incident; cite the evidence. " +
			"An unknown id fails with code incident_not_found.",
		ReadOnly: true,
	}, func(_ context.Context, in lookupIncidentInput) (Incident, error) {
		return LookupIncident(in.IncidentID)
	})
}

// LookupIncident returns the fixture incident with the given id, or an *executor.Error
// with code CodeIncidentNotFound (or invalid_arguments for a malformed id).
func LookupIncident(id string) (Incident, error) {
	if !incidentID.MatchString(id) {
		return Incident{}, executor.NewError("invalid_arguments",
			fmt.Sprintf("incident id %q is malformed: expected INC- followed by digits, for example INC-001", id))
	}
	in, ok := incidents()[id]
	if !ok {
		return Incident{}, executor.NewError(CodeIncidentNotFound, "no incident "+id)
	}
	in.Evidence = append([]string(nil), in.Evidence...) // callers may not alias the fixture
	return in, nil
}
