// Results as the Go executor builds them (package executor): redaction of secrets by
// value and by pattern, the deterministic bounded content the model reads, error
// results, and argument validation with every violation and its path.
import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import { canonicalJSON, type Status, type ToolCall, type ToolResult } from './wire.js';

export const REDACTED = '[REDACTED]';
/** The shortest secret value redacted: a shorter one would match ordinary words. */
export const MIN_SECRET_LEN = 8;
export const MIN_OUTPUT_BYTES = 256;

// ---- redaction ---------------------------------------------------------------------

/** The forms a tool prints a secret in: itself, hex, URL escapes, base64 cores at three alignments. */
function secretForms(v: string): string[] {
  const b = Buffer.from(v, 'utf8');
  const h = b.toString('hex');
  const forms = [v, h, h.toUpperCase(), encodeURIComponent(v).replace(/%20/g, '+'), encodeURIComponent(v)];
  for (const url of [false, true]) {
    for (let k = 0; k < 3; k++) {
      let s = Buffer.concat([Buffer.alloc(k), b]).toString(url ? 'base64url' : 'base64').replace(/=+$/, '');
      const start = [0, 2, 3][k];
      let end = s.length;
      if ((k + b.length) % 3 !== 0) end--;
      s = s.slice(start, end);
      forms.push(s);
    }
  }
  return forms;
}

/** The pattern rules of executor.RedactText: each capture group is the secret replaced. */
const RULES: { re: RegExp; skip?: (s: string) => boolean }[] = [
  { re: /(-----BEGIN[A-Z0-9 ]*PRIVATE KEY[A-Z0-9 ]*-----(?:(?:[A-Za-z0-9+/=\s:,.-]|\\[nrt])*?-----END[A-Z0-9 ]*PRIVATE KEY[A-Z0-9 ]*-----|(?:[A-Za-z0-9+/=\s:,.-]|\\[nrt])*))/g },
  // The scheme is bounded: unbounded, each start in a long run of letters scanned the rest
  // of the run (quadratic: a 300 KiB output of one token took a minute). Go's RE2 is linear.
  { re: /[A-Za-z][A-Za-z0-9+.-]{0,31}:\/\/[^\s:/@"'\\[\]?#<>]*:([^\s/@"'\\[\]?#<>]+)@/g },
  { re: /\b(eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*)/g },
  { re: /\bbearer\s+([A-Za-z0-9._~+/-]+=*)/gi, skip: isProseWord },
  { re: /\bbasic\s+([A-Za-z0-9+/]{8,}={0,2})/gi, skip: isProseWord },
  { re: /\b(sk-[A-Za-z0-9_-]{20,})/g, skip: (s) => !/[0-9]/.test(s) },
  { re: /\b((?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})/g },
  { re: /\b(xox[abposr]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,})/g },
  { re: /\b((?:AKIA|ASIA)[A-Z0-9]{16})\b/g },
  { re: /\b(?:aws_?)?secret_?access_?key\\?["']?\s*[:=]\s*\\?["']?([A-Za-z0-9/+=]{16,})/gi, skip: (s) => /^[0-9eE+]*$/.test(s) },
];

function isProseWord(s: string): boolean {
  return s.length < 24 && /^[A-Za-z]+$/.test(s);
}

/** Replaces what the pattern rules find (API keys, tokens, private keys, URL passwords, JWTs). */
export function redactPatterns(s: string): [string, number] {
  let total = 0;
  for (let pass = 0; pass < 3; pass++) {
    let changed = 0;
    for (const r of RULES) {
      s = s.replace(r.re, (match: string, secret: string) => {
        if (secret === undefined || secret === '' || secret === REDACTED || r.skip?.(secret)) return match;
        changed++;
        const at = match.lastIndexOf(secret);
        return match.slice(0, at) + REDACTED + match.slice(at + secret.length);
      });
    }
    total += changed;
    if (changed === 0) break;
  }
  return [s, total];
}

/** The redactor of an executor: its secret values (and their encodings), then the patterns. */
export class Redactor {
  private readonly forms: string[];

  constructor(secrets: string[] = []) {
    const out = new Set<string>();
    for (const v of secrets) {
      if (Buffer.byteLength(v) < MIN_SECRET_LEN || REDACTED.includes(v)) continue;
      for (const f of secretForms(v)) if (Buffer.byteLength(f) >= MIN_SECRET_LEN) out.add(f);
    }
    this.forms = [...out].sort((a, b) => b.length - a.length);
  }

  /** Redacts a text; returns it and the number of replacements. */
  text(s: string): [string, number] {
    let n = 0;
    for (const f of this.forms) {
      const parts = s.split(f);
      if (parts.length > 1) {
        n += parts.length - 1;
        s = parts.join(REDACTED);
      }
    }
    const [out, m] = redactPatterns(s);
    return [out, n + m];
  }

  /** Redacts a JSON value: values of the redact_fields keys, then every string and key. */
  value(v: unknown, fields: string[] = []): [unknown, number] {
    const norm = fields.map(normKey);
    let n = 0;
    const walk = (x: unknown): unknown => {
      if (typeof x === 'string') {
        const [s, m] = this.text(x);
        n += m;
        return s;
      }
      if (Array.isArray(x)) return x.map(walk);
      if (x && typeof x === 'object') {
        const out: Record<string, unknown> = {};
        for (const [k, e] of Object.entries(x)) {
          if (norm.includes(normKey(k))) {
            if (e !== REDACTED) n++;
            out[k] = REDACTED;
            continue;
          }
          const [nk, m] = this.text(k);
          n += m;
          out[nk] = walk(e);
        }
        return out;
      }
      return x;
    };
    return [walk(v), n];
  }
}

const normKey = (k: string) => k.replace(/[_-]/g, '').toLowerCase();

// ---- bounding ------------------------------------------------------------------------

/**
 * Bounds s to max UTF-8 bytes, keeping a head and a tail around the marker
 * "\n…[truncated: kept K of N bytes]…\n" (counted inside max), never splitting a character.
 */
export function truncateText(s: string, max: number): [string, number] {
  const b = Buffer.from(s, 'utf8');
  const n = b.length;
  if (n <= max) return [s, n];
  if (max <= 0) return ['', 0];
  const marker = (kept: number) => `\n…[truncated: kept ${kept} of ${n} bytes]…\n`;
  const budget = max - Buffer.byteLength(marker(n));
  const cutBefore = (at: number) => {
    while (at > 0 && (b[at] & 0xc0) === 0x80) at--;
    return at;
  };
  const cutAfter = (at: number) => {
    while (at < n && (b[at] & 0xc0) === 0x80) at++;
    return at;
  };
  if (budget < 16) {
    const h = cutBefore(max);
    return [b.subarray(0, h).toString('utf8'), h];
  }
  const h = cutBefore(budget - Math.floor(budget / 2));
  const t = cutAfter(n - Math.floor(budget / 2));
  const kept = h + (n - t);
  return [b.subarray(0, h).toString('utf8') + marker(kept) + b.subarray(t).toString('utf8'), kept];
}

// ---- results -------------------------------------------------------------------------

const errorContent = (code: string, message: string, retryable: boolean) =>
  `{"error":{"code":${JSON.stringify(code)},"message":${JSON.stringify(message)},"retryable":${retryable}}}`;

/**
 * A result that is not a success: the message redacted and bounded so that the content
 * the model reads, {"error":{...}}, fits in maxOut.
 */
export function errorResult(call: ToolCall, status: Status, code: string, message: string,
  opts: { retryable?: boolean; details?: unknown; redactor?: Redactor; maxOut?: number; fields?: string[] } = {}): ToolResult {
  const red = opts.redactor ?? new Redactor();
  const maxOut = opts.maxOut ?? 16384;
  const retryable = !!opts.retryable;
  let [msg, n] = red.text(message);
  let details: unknown;
  if (opts.details !== undefined) {
    const [d, m] = red.value(opts.details, opts.fields);
    if (canonicalJSON(d).length <= 64 << 10) {
      details = d;
      n += m;
    }
  }
  let content = errorContent(code, msg, retryable);
  for (let i = 0; i < 8 && Buffer.byteLength(content) > maxOut; i++) {
    const over = Buffer.byteLength(content) - maxOut;
    [msg] = truncateText(msg, Math.max(0, Buffer.byteLength(msg) - over - 8));
    content = errorContent(code, msg, retryable);
  }
  return {
    call_id: call.call_id, tool: call.tool, status,
    error: { code, message: msg, retryable, ...(details !== undefined ? { details } : {}) },
    content, ...(n ? { redactions: n } : {}), attempt: 1, duration_ms: 0,
  };
}

/**
 * The result of a tool's output: redacted, and the content the model reads
 * deterministic (a string is the text itself; other JSON with sorted keys) and bounded.
 */
export function succeeded(call: ToolCall, out: unknown, red: Redactor, maxOut: number, fields: string[] = []): ToolResult {
  let output: unknown;
  let content: string;
  let n: number;
  if (out === undefined || out === null) {
    [output, content, n] = [null, 'null', 0];
  } else if (typeof out === 'string') {
    [content, n] = red.text(out);
    output = content;
  } else {
    [output, n] = red.value(JSON.parse(JSON.stringify(out)), fields);
    content = canonicalJSON(output);
  }
  const res: ToolResult = { call_id: call.call_id, tool: call.tool, status: 'succeeded', output, content, attempt: 1, duration_ms: 0 };
  if (n) res.redactions = n;
  const size = Buffer.byteLength(content);
  if (size > maxOut) {
    const [t, kept] = truncateText(content, maxOut);
    res.content = t;
    res.truncated = { original_bytes: size, kept_bytes: kept };
  }
  return res;
}

// ---- validation ----------------------------------------------------------------------

/** One violation of a schema: its JSON pointer and what is wrong. */
export interface Violation {
  path: string;
  message: string;
}

const ajv = new Ajv({ allErrors: true, strict: false, validateFormats: false });

/** Compiles a JSON Schema (refuses one that is not). */
export function compileSchema(schema: unknown, what: string): ValidateFunction {
  try {
    return ajv.compile(schema as object);
  } catch (err) {
    throw new Error(`toolbus: ${what} is not a valid JSON Schema: ${(err as Error).message}`);
  }
}

/**
 * A zod-like schema (zod 4, or anything with the same two methods): its JSON Schema for
 * the catalog and ajv, and a parse that also checks what JSON Schema cannot say
 * (refinements) and applies defaults and transforms.
 */
export interface SchemaLike {
  toJSONSchema(opts?: { target?: string; io?: 'input' | 'output' }): object;
  safeParse?(v: unknown): { success: true; data: unknown } | { success: false; error: { issues: { path: readonly PropertyKey[]; message: string }[] } };
}

/** Whether a tool's schema is zod-like (a toJSONSchema method) rather than a JSON Schema. */
export function isSchemaLike(s: unknown): s is SchemaLike {
  return !!s && typeof s === 'object' && typeof (s as SchemaLike).toJSONSchema === 'function';
}

/**
 * The JSON Schema of a tool's schema: a JSON Schema as it is; a zod-like schema's
 * toJSONSchema() in draft 7 (ajv's), without its $schema, of what it takes (io input:
 * a field with a default is optional) or of what it gives (io output). A zod 3 schema (_def, no
 * toJSONSchema) is refused with what to do.
 */
export function jsonSchemaOf(s: unknown, what: string, io: 'input' | 'output'): object {
  if (isSchemaLike(s)) {
    let js: Record<string, unknown>;
    try {
      js = { ...(s.toJSONSchema({ target: 'draft-7', io }) as Record<string, unknown>) };
    } catch (err) {
      throw new Error(`toolbus: ${what} cannot be written as a JSON Schema: ${(err as Error).message}`);
    }
    delete js.$schema;
    return js;
  }
  if (s && typeof s === 'object' && ('_def' in s || '_zod' in s) && !('type' in s)) {
    throw new Error(`toolbus: ${what} is a zod schema without toJSONSchema (zod 3): use zod 4, or pass its JSON Schema (zod-to-json-schema)`);
  }
  return s as object;
}

/** The violations of a zod-like parse, each with its path. */
export function parseViolations(issues: { path: readonly PropertyKey[]; message: string }[]): Violation[] {
  return issues.map((i) => ({ path: i.path.map((p) => '/' + String(p).replace(/~/g, '~0').replace(/\//g, '~1')).join(''), message: i.message }));
}

/** The violations of an ajv validation, each with its path. */
export function violations(errs: ErrorObject[] | null | undefined): Violation[] {
  return (errs ?? []).map((e) => {
    const p = e.params as Record<string, string>;
    if (e.keyword === 'required') return { path: `${e.instancePath}/${p.missingProperty}`, message: 'missing property' };
    if (e.keyword === 'additionalProperties') {
      return { path: `${e.instancePath}/${p.additionalProperty}`, message: 'additional property not allowed by the schema' };
    }
    return { path: e.instancePath, message: e.message ?? e.keyword };
  });
}

/**
 * Parses and validates a call's arguments: one JSON object that matches the schema.
 * Returns the arguments, or the invalid_arguments message and violations.
 */
export function checkArguments(raw: string, validate: ValidateFunction, tool: string):
  { ok: true; args: Record<string, unknown> } | { ok: false; message: string; details: Violation[] } {
  if (raw.trim() === '') {
    return { ok: false, message: 'arguments are empty: send the arguments as one JSON object, e.g. {} when the tool needs none',
      details: [{ path: '', message: 'empty arguments' }] };
  }
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch (err) {
    const m = `arguments are not valid JSON: ${(err as Error).message}`;
    return { ok: false, message: m, details: [{ path: '', message: m }] };
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) {
    const m = `arguments must be one JSON object, not ${Array.isArray(v) ? 'an array' : v === null ? 'null' : typeof v}`;
    return { ok: false, message: m, details: [{ path: '', message: m }] };
  }
  if (!validate(v)) {
    const vs = violations(validate.errors);
    const n = vs.length === 1 ? '1 violation' : `${vs.length} violations`;
    return { ok: false, details: vs,
      message: `arguments do not match the input schema of ${tool} (${n}; fix all of them and call again):\n` +
        vs.map((x) => `- ${x.path || '/'}: ${x.message}`).join('\n') };
  }
  return { ok: true, args: v as Record<string, unknown> };
}

/** checkArguments, then a zod-like schema's own parse (refinements, defaults, transforms): its result is what the tool gets. */
export function checkArgumentsWith(raw: string, validate: ValidateFunction, tool: string, schema: unknown):
  { ok: true; args: Record<string, unknown> } | { ok: false; message: string; details: Violation[] } {
  const r = checkArguments(raw, validate, tool);
  if (!r.ok || !isSchemaLike(schema) || typeof schema.safeParse !== 'function') return r;
  const p = schema.safeParse(r.args);
  if (p.success) return { ok: true, args: p.data as Record<string, unknown> };
  const vs = parseViolations(p.error.issues);
  const n = vs.length === 1 ? '1 violation' : `${vs.length} violations`;
  return { ok: false, details: vs,
    message: `arguments do not match the input schema of ${tool} (${n}; fix all of them and call again):\n` +
      vs.map((x) => `- ${x.path || '/'}: ${x.message}`).join('\n') };
}
