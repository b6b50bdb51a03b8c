package packs_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/packs"
)

func TestCalculate(t *testing.T) {
	tests := []struct {
		expr string
		want float64
	}{
		// numbers
		{"42", 42},
		{"3.25", 3.25},
		{".5", 0.5},
		{"5.", 5},
		{"1e3", 1000},
		{"2.5E-2", 0.025},
		{"1e+2", 100},
		{"  7\t\n", 7},
		// precedence
		{"1+2*3", 7},
		{"(1+2)*3", 9},
		{"2*3+4*5", 26},
		{"10-4/2", 8},
		{"2+3^2", 11},
		{"2*3^2", 18},
		{"7%4*2", 6},
		{"1+7%4", 4},
		// associativity
		{"10-4-3", 3},
		{"100/10/5", 2},
		{"2^3^2", 512},
		{"(2^3)^2", 64},
		{"2**3**2", 512},
		{"17%5%3", 2},
		// unary
		{"-3", -3},
		{"+3", 3},
		{"--3", 3},
		{"-+-3", 3},
		{"-2^2", -4},
		{"(-2)^2", 4},
		{"2^-1", 0.5},
		{"2*-3", -6},
		{"2--3", 5},
		{"-(1+2)", -3},
		{"-0", 0},
		// remainder keeps the sign of the dividend
		{"-7%3", -1},
		{"7.5%2", 1.5},
		// functions
		{"sqrt(16)", 4},
		{"abs(-2.5)", 2.5},
		{"floor(-2.5)", -3},
		{"ceil(-2.5)", -2},
		{"round(2.5)", 3},
		{"round(-2.5)", -3},
		{"round(2.4)", 2},
		{"min(3)", 3},
		{"min(3, 1, 2)", 1},
		{"max(3, 1, 2)", 3},
		{"max(1, min(5, 9), -2)", 5},
		{"sqrt(3^2 + 4^2)", 5},
		{"SQRT(4)", 2},
		{"2*sqrt(16)^2", 32},
		// constants
		{"pi", math.Pi},
		{"e", math.E},
		{"2*pi", 2 * math.Pi},
		{"e^2", math.E * math.E},
		{"PI", math.Pi},
		// a longer one
		{"(2+3)*sqrt(16)^2 - max(1, 7, 3)", 73},
		{"((((1))))", 1},
	}
	for _, tt := range tests {
		got, err := packs.Calculate(tt.expr)
		if err != nil {
			t.Errorf("Calculate(%q) error: %v", tt.expr, err)
			continue
		}
		if math.Abs(got-tt.want) > 1e-12*math.Max(1, math.Abs(tt.want)) {
			t.Errorf("Calculate(%q) = %v, want %v", tt.expr, got, tt.want)
		}
		if got == 0 && math.Signbit(got) {
			t.Errorf("Calculate(%q) = -0, want +0", tt.expr)
		}
	}
}

func TestCalculateErrors(t *testing.T) {
	tests := []struct {
		expr string
		code string
		msg  string // substring of the message, including the position
	}{
		{"", packs.CodeInvalidExpression, "expression is empty at position 1"},
		{"   ", packs.CodeInvalidExpression, "expression is empty"},
		{"1+", packs.CodeInvalidExpression, "unexpected end of expression, expected a number, constant, function or '(' at position 3"},
		{"1 + * 2", packs.CodeInvalidExpression, "unexpected operator '*'"},
		{"1 + * 2", packs.CodeInvalidExpression, "at position 5"},
		{"(1+2", packs.CodeInvalidExpression, "missing ')' at position 5 (the '(' at position 1 is never closed)"},
		{"1+2)", packs.CodeInvalidExpression, "unmatched ')' at position 4"},
		{"()", packs.CodeInvalidExpression, "unexpected ')'"},
		{"2 3", packs.CodeInvalidExpression, "unexpected number 3, expected an operator at position 3"},
		{"2pi", packs.CodeInvalidExpression, `unexpected name "pi", expected an operator at position 2`},
		{"2(3)", packs.CodeInvalidExpression, "unexpected '(', expected an operator at position 2"},
		{"1 $ 2", packs.CodeInvalidExpression, "unexpected character '$' at position 3"},
		{"é+1", packs.CodeInvalidExpression, "unexpected character 'é' at position 1"},
		{"é+$", packs.CodeInvalidExpression, "unexpected character 'é' at position 1"},
		{"1+é", packs.CodeInvalidExpression, "unexpected character 'é' at position 3"},
		{"'é'", packs.CodeInvalidExpression, "at position 1"},
		{"x+1", packs.CodeInvalidExpression, `unknown name "x"`},
		{"1 + foo(2)", packs.CodeInvalidExpression, `unknown name "foo" (functions: sqrt, abs, floor, ceil, round, min, max; constants: pi, e) at position 5`},
		{"sqrt 4", packs.CodeInvalidExpression, "function sqrt needs '(' after its name, found number 4 at position 6"},
		{"sqrt", packs.CodeInvalidExpression, "function sqrt needs '(' after its name, found end of expression at position 5"},
		{"sqrt(1, 2)", packs.CodeInvalidExpression, "function sqrt takes exactly 1 argument(s), got 2 at position 1"},
		{"max()", packs.CodeInvalidExpression, "function max takes at least 1 argument(s), got 0 at position 1"},
		{"max(1,)", packs.CodeInvalidExpression, "unexpected ')', expected a number, constant, function or '(' at position 7"},
		{"max(1 2)", packs.CodeInvalidExpression, "unexpected number 2, expected an operator or ')' at position 7 (to close the '(' at position 4)"},
		{"pi(2)", packs.CodeInvalidExpression, "pi is a constant, not a function at position 1"},
		{"1..2", packs.CodeInvalidExpression, `malformed number "1.." at position 1`},
		{"1.2.3", packs.CodeInvalidExpression, `malformed number "1.2." at position 1`},
		{".", packs.CodeInvalidExpression, "malformed number: '.' without digits at position 1"},
		{"1 + 2e", packs.CodeInvalidExpression, `malformed number "2e": exponent needs digits at position 5`},
		{"2e+", packs.CodeInvalidExpression, `malformed number "2e+": exponent needs digits at position 1`},
		{"1e999", packs.CodeInvalidExpression, "number 1e999 is too large at position 1"},
		{"sqrt(-1)", packs.CodeInvalidExpression, "sqrt(...) is not a real number at position 1"},
		{"(-8)^(1/3)", packs.CodeInvalidExpression, "result of '^' is not a real number at position 5"},
		{"1e308*10", packs.CodeInvalidExpression, "result of '*' overflows (result is infinite) at position 6"},
		{"1e308+1e308", packs.CodeInvalidExpression, "result of '+' overflows"},
		{"-1e308-1e308", packs.CodeInvalidExpression, "result of '-' overflows"},
		{"10^400", packs.CodeInvalidExpression, "result of '^' overflows (result is infinite) at position 3"},
		{"0^-1", packs.CodeInvalidExpression, "result of '^' overflows"},
		{"1/0", packs.CodeDivisionByZero, "division by zero at position 2"},
		{"1 / (2-2)", packs.CodeDivisionByZero, "division by zero at position 3"},
		{"5 % 0", packs.CodeDivisionByZero, "remainder of division by zero at position 3"},
		{"0/0", packs.CodeDivisionByZero, "division by zero"},
		{"1e-320/1e308", "", ""}, // underflow to 0 is fine
		{strings.Repeat("1", packs.MaxExpressionLength+1), packs.CodeInvalidExpression, "expression is too long: 1025 bytes (max 1024)"},
		{"\xff", packs.CodeInvalidExpression, "not valid UTF-8"},
	}
	for _, tt := range tests {
		v, err := packs.Calculate(tt.expr)
		if tt.code == "" {
			if err != nil {
				t.Errorf("Calculate(%q) error: %v", tt.expr, err)
			}
			continue
		}
		var xe *executor.Error
		if !errors.As(err, &xe) {
			t.Errorf("Calculate(%q) = %v, %v; want *executor.Error %s", tt.expr, v, err, tt.code)
			continue
		}
		if xe.Code != tt.code || !strings.Contains(xe.Message, tt.msg) {
			t.Errorf("Calculate(%q) error = %s: %q\n\twant %s containing %q", tt.expr, xe.Code, xe.Message, tt.code, tt.msg)
		}
		if xe.Retryable {
			t.Errorf("Calculate(%q) error is retryable", tt.expr)
		}
		if d, ok := xe.Details.(map[string]any); !ok || d["position"] == nil {
			t.Errorf("Calculate(%q) error details = %#v, want a position", tt.expr, xe.Details)
		}
	}
}

func TestCalculateLengthLimit(t *testing.T) {
	// 1024 bytes exactly is accepted: "1+1+...+1".
	expr := strings.Repeat("1+", packs.MaxExpressionLength/2-1) + "11"
	if len(expr) != packs.MaxExpressionLength {
		t.Fatalf("len = %d", len(expr))
	}
	if v, err := packs.Calculate(expr); err != nil || v != packs.MaxExpressionLength/2-1+11 {
		t.Fatalf("Calculate(1024 bytes) = %v, %v", v, err)
	}
}

func TestCalculateDepthLimit(t *testing.T) {
	nest := func(n int) string { return strings.Repeat("(", n) + "1" + strings.Repeat(")", n) }
	if v, err := packs.Calculate(nest(packs.MaxExpressionDepth)); err != nil || v != 1 {
		t.Fatalf("depth %d: %v, %v", packs.MaxExpressionDepth, v, err)
	}
	tooDeep := []struct {
		expr string
		pos  string
	}{
		{nest(packs.MaxExpressionDepth + 1), "at position 65"},
		{nest(200), "at position 65"},
		{strings.Repeat("-", 100) + "1", "at position 65"},
		{strings.Repeat("2^", 100) + "1", "at position 130"}, // the 65th '^'
		{strings.Repeat("abs(", 70) + "1" + strings.Repeat(")", 70), "at position 260"},
		{strings.Repeat("(", 500), "at position 65"},
	}
	for _, tt := range tooDeep {
		_, err := packs.Calculate(tt.expr)
		var xe *executor.Error
		if !errors.As(err, &xe) || xe.Code != packs.CodeInvalidExpression ||
			!strings.Contains(xe.Message, "nested too deeply (max depth 64) "+tt.pos) {
			t.Errorf("Calculate(%.20q...) error = %v, want nested too deeply %s", tt.expr, err, tt.pos)
		}
	}
	// Depth is nesting, not length: many siblings are fine.
	if _, err := packs.Calculate(strings.Repeat("(1)+", 200) + "1"); err != nil {
		t.Errorf("siblings: %v", err)
	}
	if _, err := packs.Calculate("2^2^2^2"); err != nil {
		t.Errorf("short power chain: %v", err)
	}
}

func FuzzCalculator(f *testing.F) {
	for _, s := range []string{
		"1+2*3", "2^3^2", "-(1+2)", "sqrt(16)", "max(1, 2, 3)", "1/0", "5%0", "pi*e",
		"1e308*10", "((((", "))))", "1.2.3", "2e", "é", "\xff", "min(", "round(-2.5)",
		"--+-1", "0^-1", "abs(", "1 2", "", "(-8)^(1/3)", "1e-320", strings.Repeat("(", 70),
	} {
		f.Add(s)
	}
	codes := map[string]bool{packs.CodeInvalidExpression: true, packs.CodeDivisionByZero: true}
	f.Fuzz(func(t *testing.T, expr string) {
		v, err := packs.Calculate(expr)
		if err != nil {
			var xe *executor.Error
			if !errors.As(err, &xe) || !codes[xe.Code] {
				t.Fatalf("Calculate(%q): unexpected error %#v", expr, err)
			}
			if !strings.Contains(xe.Message, "position ") {
				t.Fatalf("Calculate(%q): message without position: %q", expr, xe.Message)
			}
			return
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Fatalf("Calculate(%q) = %v", expr, v)
		}
	})
}
