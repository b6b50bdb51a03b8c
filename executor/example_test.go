package executor_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/executor"
)

type WeatherArgs struct {
	City  string `json:"city" jsonschema:"description=City name, e.g. Paris,minLength=1"`
	Units string `json:"units,omitempty" jsonschema:"enum=metric,enum=imperial"`
}

type Weather struct {
	City  string  `json:"city"`
	TempC float64 `json:"temp_c"`
	Sky   string  `json:"sky"`
}

func Example() {
	reg := executor.NewRegistry()
	err := executor.RegisterFunc(reg, executor.Tool{
		Name:        "get_weather",
		Description: "Current weather of a city.",
		ReadOnly:    true,
	}, func(ctx context.Context, in WeatherArgs) (Weather, error) {
		if strings.EqualFold(in.City, "atlantis") {
			return Weather{}, executor.NewError("city_not_found", "no weather station in "+in.City)
		}
		return Weather{City: in.City, TempC: 21.5, Sky: "clear"}, nil
	})
	if err != nil {
		panic(err)
	}
	ex, err := executor.New(reg, executor.WithInstance("example"))
	if err != nil {
		panic(err)
	}

	for _, args := range []string{`{"city":"Paris"}`, `{"city":"Atlantis"}`, `{"town":"Paris"}`} {
		res := ex.Execute(context.Background(), toolbus.ToolCall{CallID: "call_1", Tool: "get_weather", Arguments: args},
			toolbus.Principal{ID: "user-1"})
		fmt.Println(res.Status, res.Content)
	}
	// Output:
	// succeeded {"city":"Paris","sky":"clear","temp_c":21.5}
	// failed {"error":{"code":"city_not_found","message":"no weather station in Atlantis","retryable":false}}
	// rejected {"error":{"code":"invalid_arguments","message":"arguments do not match the input schema of get_weather (2 violations; fix all of them and call again):\n- (root): additional properties 'town' not allowed\n- (root): missing property 'city'","retryable":false}}
}
