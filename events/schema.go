package events

import "github.com/toolbus/toolbus"

// EventTypes returns every CloudEvents type of the contract, in the order of the loop:
// each has a Go type for its data, a JSON Schema schemas/<type>.v1.json (SchemaFile) named
// by its dataschema attribute (DataSchema), a message in asyncapi.yaml and a row and a
// data example in CONTRACT.md. The injector's deadline timer is among them: it lives on
// the public stream, so subscribers of toolbus.> see it.
func EventTypes() []string {
	return []string{
		TypeRunStarted, TypeModelRequested, TypeModelResponded,
		TypeToolRequested, TypeToolProgress, TypeToolLog, TypeToolQuestion, TypeToolAnswer, TypeToolFinished, TypeToolWaiting,
		TypeApprovalGranted, TypeApprovalDenied, TypeRunCancel,
		TypeRunEnded(toolbus.RunCompleted), TypeRunEnded(toolbus.RunWaitingForApproval), TypeRunEnded(toolbus.RunFailed),
		TypeRunEnded(toolbus.RunLimitReached), TypeRunEnded(toolbus.RunCancelled),
		TypeRunTimer,
	}
}
