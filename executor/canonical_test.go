package executor

import (
	"testing"
)

// TestCanonicalAgainstEncodingJSON: the canonical encoder of outputs writes what
// encoding/json writes (keys sorted, numbers as written, no HTML escaping) for every
// decoded value, except four characters of strings: encoding/json escapes backspace and
// form feed as \b and \f and U+2028/U+2029 as \u2028/\u2029, where the canonical
// encoder writes \u0008, \u000c and the raw characters. That difference is why it is
// not replaced by encoding/json: the bytes of stored outputs and of what the model reads
// would change for strings holding them.
func TestCanonicalAgainstEncodingJSON(t *testing.T) {
	cases := []struct {
		name, in string
		differs  bool
	}{
		{"object keys sorted", `{"b":1,"a":{"d":[1,2,{"f":null,"e":true}],"c":"x"}}`, false},
		{"numbers as written", `[1.50,1e3,-0,12345678901234567890]`, false},
		{"html not escaped", `{"h":"<a href='x'>&</a>"}`, false},
		{"control characters", `"\u0001\n\r\t\u001f\"\\"`, false},
		{"unicode", `{"ключ":"значение ✓ 😀"}`, false},
		{"backspace", `"a\bb"`, true},
		{"form feed", `"a\fb"`, true},
		{"line separator", `"a\u2028b"`, true},
		{"paragraph separator", `"a\u2029b"`, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := decodeJSON([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			canon := string(appendCanonical(nil, v))
			std, err := marshalJSON(v)
			if err != nil {
				t.Fatal(err)
			}
			if same := canon == string(std); same == tc.differs {
				t.Errorf("canonical %s, encoding/json %s: same %v, want %v", canon, std, same, !tc.differs)
			}
		})
	}
}
