package events

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"
)

// The direct decoding of a binary-mode message: what the SDK path makes of the same
// headers, read into Meta without building the SDK's context (the path of every
// decoding; a message it refuses goes the SDK path).

// decodeBinaryDirect reads the attributes of a binary-mode message as decodeBinary's
// SDK path does (the same trimming, URI normalisation and checks, the source and
// dataschema checked with the SDK once per distinct value), into Meta directly. ok is
// false for anything that path would refuse: it then reports the error.
func decodeBinaryDirect(msg *nats.Msg) (m Meta, ct string, ok bool) {
	var (
		src, schema                    string
		haveSrc                        bool
		step, index, count             string
		haveStep, haveIndex, haveCount bool
	)
	for name, val := range binaryAttributes(msg) {
		switch name {
		case contentTypeAttr:
			ct = val
		case "id":
			m.ID = strings.TrimSpace(val)
		case "source":
			src, haveSrc = val, true
		case "type":
			m.Type = strings.TrimSpace(val)
		case "subject":
			m.Subject = strings.TrimSpace(val)
		case "time":
			ts, err := types.ParseTimestamp(val)
			if err != nil {
				return m, "", false
			}
			if ts != nil {
				m.Time = ts.Time
			}
		case "dataschema":
			schema = val
		case "datacontenttype":
			ct = val
		case ExtRunID:
			m.RunID = val
		case ExtTraceParent:
			m.TraceParent = val
		case ExtStep:
			step, haveStep = val, true
		case ExtCallID:
			m.CallID, m.HasCall = val, true
		case ExtCallIndex:
			index, haveIndex = val, true
		case ExtCallCount:
			count, haveCount = val, true
		}
	}
	if m.ID == "" || m.Type == "" || !haveSrc {
		return m, "", false
	}
	var err error
	n := decodedSources.get(src, readSource)
	if m.Source = n.value; !n.ok {
		return m, "", false
	}
	if n = decodedSchemas.get(schema, readSchema); !n.ok {
		return m, "", false
	}
	m.DataSchema = n.value
	atoi := func(s string, present bool) int {
		if !present || err != nil {
			return 0
		}
		var n int
		n, err = strconv.Atoi(s)
		return n
	}
	m.Step = atoi(step, haveStep)
	if m.HasCall {
		m.CallIndex = atoi(index, haveIndex)
		m.CallCount = atoi(count, haveCount)
	}
	if err != nil {
		return m, "", false
	}
	return m, ct, true
}

// decodedSources and decodedSchemas remember how the SDK reads the source and
// dataschema values met so far.
var (
	decodedSources = newMemo[string, normalized]()
	decodedSchemas = newMemo[string, normalized]()
)

type normalized struct {
	value string
	ok    bool
}

// readSource is what SetSource and Validate make of a ce-source value.
func readSource(raw string) normalized {
	ec := &event.EventContextV1{}
	if ec.SetSource(raw) != nil {
		return normalized{}
	}
	v := ec.Source.String()
	return normalized{value: v, ok: strings.TrimSpace(v) != ""}
}

// readSchema is what SetDataSchema and Validate make of a ce-dataschema value ("" for
// none).
func readSchema(raw string) normalized {
	ec := &event.EventContextV1{}
	if ec.SetDataSchema(raw) != nil {
		return normalized{}
	}
	if ec.DataSchema == nil {
		return normalized{ok: true}
	}
	return normalized{value: ec.DataSchema.String(), ok: ec.DataSchema.Validate()}
}

func (m *Meta) readExtensions(exts map[string]any) error {
	var err error
	m.RunID = extString(exts, ExtRunID)
	m.TraceParent = extString(exts, ExtTraceParent)
	if m.Step, err = extInt(exts, ExtStep); err != nil {
		return err
	}
	if _, ok := exts[ExtCallID]; ok {
		m.HasCall = true
		m.CallID = extString(exts, ExtCallID)
		if m.CallIndex, err = extInt(exts, ExtCallIndex); err != nil {
			return err
		}
		if m.CallCount, err = extInt(exts, ExtCallCount); err != nil {
			return err
		}
	}
	return nil
}

func extString(exts map[string]any, name string) string {
	v, ok := exts[name]
	if !ok {
		return ""
	}
	s, err := types.ToString(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return s
}

// extInt reads an integer extension; binary mode carries it as a string.
func extInt(exts map[string]any, name string) (int, error) {
	v, ok := exts[name]
	if !ok {
		return 0, nil
	}
	switch x := v.(type) {
	case int32:
		return int(x), nil
	case string:
		n, err := strconv.Atoi(x)
		if err != nil {
			return 0, fmt.Errorf("%w: extension %s=%q is not an integer", ErrNotCloudEvent, name, x)
		}
		return n, nil
	}
	n, err := types.ToInteger(v)
	if err != nil {
		return 0, fmt.Errorf("%w: extension %s: %w", ErrNotCloudEvent, name, err)
	}
	return int(n), nil
}
