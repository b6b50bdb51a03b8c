package packs_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/packs"
)

func ExampleRegister() {
	reg := executor.NewRegistry()
	if err := packs.Register(reg, "demo"); err != nil {
		panic(err)
	}
	ex, err := executor.New(reg)
	if err != nil {
		panic(err)
	}

	r := ex.Execute(context.Background(),
		toolbus.ToolCall{CallID: "c1", Tool: "calculator", Arguments: `{"expression":"2 + 3 * 4"}`},
		toolbus.Principal{ID: "example"})
	fmt.Println(r.Status, string(r.Output))

	r = ex.Execute(context.Background(),
		toolbus.ToolCall{CallID: "c2", Tool: "lookup_incident", Arguments: `{"incident_id":"INC-404"}`},
		toolbus.Principal{ID: "example"})
	fmt.Println(r.Status, r.Error.Code)

	err = packs.Register(reg, "nope")
	fmt.Println(errors.Is(err, packs.ErrUnknownPack))
	// Output:
	// succeeded {"value":14}
	// failed incident_not_found
	// true
}
