package packs

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/toolbus/toolbus/executor"
)

// Calculator limits.
const (
	// MaxExpressionLength is the longest expression, in bytes, that Calculate accepts.
	MaxExpressionLength = 1024
	// MaxExpressionDepth is the deepest nesting Calculate accepts. Every parenthesis,
	// function call, unary sign and power exponent opens one level.
	MaxExpressionDepth = 64
)

// Error codes of the demo pack's tools.
const (
	// CodeInvalidExpression: the calculator could not parse or evaluate the expression
	// (syntax error, unknown name, wrong argument count, non-finite result, limits).
	CodeInvalidExpression = "invalid_expression"
	// CodeDivisionByZero: the expression divides (or takes a remainder) by zero.
	CodeDivisionByZero = "division_by_zero"
	// CodeIncidentNotFound: lookup_incident has no incident with that id.
	CodeIncidentNotFound = "incident_not_found"
)

// Calculate evaluates an arithmetic expression with a hand-written recursive descent
// parser (there is no eval and no third-party code).
//
// Grammar, loosest binding first:
//
//	expr    = term { ("+" | "-") term }
//	term    = unary { ("*" | "/" | "%") unary }
//	unary   = ("+" | "-") unary | power
//	power   = primary [ ("^" | "**") unary ]      (right-associative: 2^3^2 = 2^9)
//	primary = number | constant | function "(" [ expr { "," expr } ] ")" | "(" expr ")"
//
// Numbers are decimal: 42, 3.14, .5, 1e3, 2.5E-4. Unary minus binds looser than power,
// so -2^2 = -4 and 2^-1 = 0.5. % is the floating-point remainder (sign of the dividend).
// Constants: pi, e. Functions: sqrt, abs, floor, ceil, round (half away from zero) with
// one argument; min and max with one or more. Names are case-insensitive.
//
// Errors are *executor.Error values: CodeDivisionByZero for a zero divisor, and
// CodeInvalidExpression otherwise, including results that are NaN or infinite. Their
// messages give a 1-based character position and Details is {"position": n}.
func Calculate(expression string) (float64, error) {
	if len(expression) > MaxExpressionLength {
		return 0, calcErr(CodeInvalidExpression, 1,
			fmt.Sprintf("expression is too long: %d bytes (max %d)", len(expression), MaxExpressionLength))
	}
	if !utf8.ValidString(expression) {
		return 0, calcErr(CodeInvalidExpression, 1, "expression is not valid UTF-8")
	}
	toks, err := lex(expression)
	if err != nil {
		return 0, err
	}
	if len(toks) == 1 { // only EOF
		return 0, calcErr(CodeInvalidExpression, 1, "expression is empty")
	}
	p := parser{toks: toks}
	v, err := p.expr()
	if err != nil {
		return 0, err
	}
	if t := p.peek(); t.kind != tokEOF {
		if t.kind == tokRParen {
			return 0, calcErr(CodeInvalidExpression, t.pos, "unmatched ')'")
		}
		return 0, calcErr(CodeInvalidExpression, t.pos, fmt.Sprintf("unexpected %s, expected an operator", t.describe()))
	}
	if v == 0 {
		v = 0 // no negative zero in results
	}
	return v, nil
}

func calcErr(code string, pos int, msg string) *executor.Error {
	return calcErrNote(code, pos, msg, "")
}

// calcErrNote builds "<msg> at position <pos>[ (<note>)]".
func calcErrNote(code string, pos int, msg, note string) *executor.Error {
	m := fmt.Sprintf("%s at position %d", msg, pos)
	if note != "" {
		m += " (" + note + ")"
	}
	e := executor.NewError(code, m)
	e.Details = map[string]any{"position": pos}
	return e
}

type tokKind uint8

const (
	tokEOF tokKind = iota
	tokNum
	tokIdent
	tokOp // + - * / % ^ (** is lexed as ^)
	tokLParen
	tokRParen
	tokComma
)

type token struct {
	kind tokKind
	op   byte    // tokOp
	text string  // source text (tokNum, tokIdent, tokOp)
	num  float64 // tokNum
	pos  int     // 1-based character position
}

func (t token) describe() string {
	switch t.kind {
	case tokEOF:
		return "end of expression"
	case tokNum:
		return fmt.Sprintf("number %s", t.text)
	case tokIdent:
		return fmt.Sprintf("name %q", t.text)
	case tokOp:
		return fmt.Sprintf("operator '%s'", t.text)
	case tokLParen:
		return "'('"
	case tokRParen:
		return "')'"
	case tokComma:
		return "','"
	}
	return "token"
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_'
}

// lex splits s into tokens. Positions count characters (runes), starting at 1.
func lex(s string) ([]token, error) {
	toks := make([]token, 0, len(s)/2+2)
	pos := 1 // character position of s[i]
	for i := 0; i < len(s); {
		c := s[i]
		start, startPos := i, pos
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
			pos++
			continue
		case isDigit(c) || c == '.':
			for i < len(s) && isDigit(s[i]) {
				i++
			}
			digits := i - start
			if i < len(s) && s[i] == '.' {
				i++
				fs := i
				for i < len(s) && isDigit(s[i]) {
					i++
				}
				digits += i - fs
			}
			if digits == 0 {
				return nil, calcErr(CodeInvalidExpression, startPos, "malformed number: '.' without digits")
			}
			if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
				j := i + 1
				if j < len(s) && (s[j] == '+' || s[j] == '-') {
					j++
				}
				if j >= len(s) || !isDigit(s[j]) {
					return nil, calcErr(CodeInvalidExpression, startPos,
						fmt.Sprintf("malformed number %q: exponent needs digits", s[start:min(j+1, len(s))]))
				}
				for j < len(s) && isDigit(s[j]) {
					j++
				}
				i = j
			}
			if i < len(s) && s[i] == '.' {
				return nil, calcErr(CodeInvalidExpression, startPos,
					fmt.Sprintf("malformed number %q", s[start:i+1]))
			}
			text := s[start:i]
			v, err := strconv.ParseFloat(text, 64)
			if err != nil && !isRangeErr(err) {
				return nil, calcErr(CodeInvalidExpression, startPos, fmt.Sprintf("malformed number %q", text))
			}
			if math.IsInf(v, 0) {
				return nil, calcErr(CodeInvalidExpression, startPos, fmt.Sprintf("number %s is too large", text))
			}
			toks = append(toks, token{kind: tokNum, text: text, num: v, pos: startPos})
		case isIdentStart(c):
			for i < len(s) && (isIdentStart(s[i]) || isDigit(s[i])) {
				i++
			}
			toks = append(toks, token{kind: tokIdent, text: s[start:i], pos: startPos})
		case c == '*' && i+1 < len(s) && s[i+1] == '*':
			i += 2
			toks = append(toks, token{kind: tokOp, op: '^', text: "**", pos: startPos})
		case strings.IndexByte("+-*/%^", c) >= 0:
			i++
			toks = append(toks, token{kind: tokOp, op: c, text: s[start:i], pos: startPos})
		case c == '(':
			i++
			toks = append(toks, token{kind: tokLParen, pos: startPos})
		case c == ')':
			i++
			toks = append(toks, token{kind: tokRParen, pos: startPos})
		case c == ',':
			i++
			toks = append(toks, token{kind: tokComma, pos: startPos})
		default:
			r, _ := utf8.DecodeRuneInString(s[i:])
			return nil, calcErr(CodeInvalidExpression, startPos, fmt.Sprintf("unexpected character %q", r))
		}
		pos += utf8.RuneCountInString(s[start:i])
	}
	return append(toks, token{kind: tokEOF, pos: pos}), nil
}

func isRangeErr(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}

type parser struct {
	toks  []token
	i     int
	depth int
}

func (p *parser) peek() token { return p.toks[p.i] }

func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tokEOF {
		p.i++
	}
	return t
}

func (p *parser) enter(pos int) error {
	if p.depth >= MaxExpressionDepth {
		return calcErr(CodeInvalidExpression, pos,
			fmt.Sprintf("expression is nested too deeply (max depth %d)", MaxExpressionDepth))
	}
	p.depth++
	return nil
}

func (p *parser) leave() { p.depth-- }

// finite checks v, the result of the operator t (or of the function named by t).
func finite(v float64, t token) (float64, error) {
	if !math.IsNaN(v) && !math.IsInf(v, 0) {
		return v, nil
	}
	what := fmt.Sprintf("result of '%s'", t.text)
	if t.kind == tokIdent {
		what = strings.ToLower(t.text) + "(...)"
	}
	if math.IsNaN(v) {
		return 0, calcErr(CodeInvalidExpression, t.pos, what+" is not a real number")
	}
	return 0, calcErr(CodeInvalidExpression, t.pos, what+" overflows (result is infinite)")
}

func (p *parser) expr() (float64, error) {
	left, err := p.term()
	if err != nil {
		return 0, err
	}
	for {
		t := p.peek()
		if t.kind != tokOp || (t.op != '+' && t.op != '-') {
			return left, nil
		}
		p.next()
		right, err := p.term()
		if err != nil {
			return 0, err
		}
		if t.op == '+' {
			left = left + right
		} else {
			left = left - right
		}
		if left, err = finite(left, t); err != nil {
			return 0, err
		}
	}
}

func (p *parser) term() (float64, error) {
	left, err := p.unary()
	if err != nil {
		return 0, err
	}
	for {
		t := p.peek()
		if t.kind != tokOp || (t.op != '*' && t.op != '/' && t.op != '%') {
			return left, nil
		}
		p.next()
		right, err := p.unary()
		if err != nil {
			return 0, err
		}
		switch t.op {
		case '*':
			left = left * right
		case '/':
			if right == 0 {
				return 0, calcErr(CodeDivisionByZero, t.pos, "division by zero")
			}
			left = left / right
		case '%':
			if right == 0 {
				return 0, calcErr(CodeDivisionByZero, t.pos, "remainder of division by zero")
			}
			left = math.Mod(left, right)
		}
		if left, err = finite(left, t); err != nil {
			return 0, err
		}
	}
}

func (p *parser) unary() (float64, error) {
	t := p.peek()
	if t.kind == tokOp && (t.op == '+' || t.op == '-') {
		p.next()
		if err := p.enter(t.pos); err != nil {
			return 0, err
		}
		v, err := p.unary()
		p.leave()
		if err != nil {
			return 0, err
		}
		if t.op == '-' {
			v = -v
		}
		return v, nil
	}
	return p.power()
}

func (p *parser) power() (float64, error) {
	base, err := p.primary()
	if err != nil {
		return 0, err
	}
	t := p.peek()
	if t.kind != tokOp || t.op != '^' {
		return base, nil
	}
	p.next()
	if err := p.enter(t.pos); err != nil {
		return 0, err
	}
	exp, err := p.unary() // right-associative; allows 2^-1
	p.leave()
	if err != nil {
		return 0, err
	}
	return finite(math.Pow(base, exp), t)
}

func (p *parser) primary() (float64, error) {
	t := p.next()
	switch t.kind {
	case tokNum:
		return t.num, nil
	case tokLParen:
		if err := p.enter(t.pos); err != nil {
			return 0, err
		}
		v, err := p.expr()
		p.leave()
		if err != nil {
			return 0, err
		}
		if err := p.closeParen(t.pos); err != nil {
			return 0, err
		}
		return v, nil
	case tokIdent:
		return p.ident(t)
	case tokEOF:
		return 0, calcErr(CodeInvalidExpression, t.pos,
			"unexpected end of expression, expected a number, constant, function or '('")
	default:
		return 0, calcErr(CodeInvalidExpression, t.pos,
			fmt.Sprintf("unexpected %s, expected a number, constant, function or '('", t.describe()))
	}
}

// closeParen consumes the ')' matching the '(' at open.
func (p *parser) closeParen(open int) error {
	t := p.peek()
	if t.kind == tokRParen {
		p.next()
		return nil
	}
	if t.kind == tokEOF {
		return calcErrNote(CodeInvalidExpression, t.pos, "missing ')'",
			fmt.Sprintf("the '(' at position %d is never closed", open))
	}
	return calcErrNote(CodeInvalidExpression, t.pos, fmt.Sprintf("unexpected %s, expected an operator or ')'", t.describe()),
		fmt.Sprintf("to close the '(' at position %d", open))
}

var constants = map[string]float64{"pi": math.Pi, "e": math.E}

type function struct {
	minArgs, maxArgs int // maxArgs < 0: variadic
	apply            func(args []float64) float64
}

var functions = map[string]function{
	"sqrt":  {1, 1, func(a []float64) float64 { return math.Sqrt(a[0]) }},
	"abs":   {1, 1, func(a []float64) float64 { return math.Abs(a[0]) }},
	"floor": {1, 1, func(a []float64) float64 { return math.Floor(a[0]) }},
	"ceil":  {1, 1, func(a []float64) float64 { return math.Ceil(a[0]) }},
	"round": {1, 1, func(a []float64) float64 { return math.Round(a[0]) }},
	"min": {1, -1, func(a []float64) float64 {
		m := a[0]
		for _, v := range a[1:] {
			m = math.Min(m, v)
		}
		return m
	}},
	"max": {1, -1, func(a []float64) float64 {
		m := a[0]
		for _, v := range a[1:] {
			m = math.Max(m, v)
		}
		return m
	}},
}

func (p *parser) ident(t token) (float64, error) {
	name := strings.ToLower(t.text)
	open := p.peek()
	if v, ok := constants[name]; ok {
		if open.kind == tokLParen {
			return 0, calcErr(CodeInvalidExpression, t.pos, fmt.Sprintf("%s is a constant, not a function", t.text))
		}
		return v, nil
	}
	fn, ok := functions[name]
	if !ok {
		return 0, calcErr(CodeInvalidExpression, t.pos, fmt.Sprintf(
			"unknown name %q (functions: sqrt, abs, floor, ceil, round, min, max; constants: pi, e)", t.text))
	}
	if open.kind != tokLParen {
		return 0, calcErr(CodeInvalidExpression, open.pos,
			fmt.Sprintf("function %s needs '(' after its name, found %s", t.text, open.describe()))
	}
	p.next()
	if err := p.enter(open.pos); err != nil {
		return 0, err
	}
	var args []float64
	if p.peek().kind != tokRParen {
		for {
			v, err := p.expr()
			if err != nil {
				p.leave()
				return 0, err
			}
			args = append(args, v)
			if p.peek().kind != tokComma {
				break
			}
			p.next()
		}
	}
	p.leave()
	if err := p.closeParen(open.pos); err != nil {
		return 0, err
	}
	if len(args) < fn.minArgs || (fn.maxArgs >= 0 && len(args) > fn.maxArgs) {
		want := fmt.Sprintf("exactly %d argument(s)", fn.minArgs)
		if fn.maxArgs < 0 {
			want = fmt.Sprintf("at least %d argument(s)", fn.minArgs)
		}
		return 0, calcErr(CodeInvalidExpression, t.pos,
			fmt.Sprintf("function %s takes %s, got %d", name, want, len(args)))
	}
	return finite(fn.apply(args), t)
}
