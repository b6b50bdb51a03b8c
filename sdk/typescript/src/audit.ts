// Signed and chained events (CONTRACT.md, "Signed and chained events"), in TypeScript
// with node:crypto only: what the executor signs its events with, and a verifier of an
// exported audit bundle (toolbus-audit-bundle/v1) written from the contract alone, so
// that an auditor outside Go can check a run. The Go twin is events/seal and
// audit/trail; the verifier here checks signatures, the canonical form, the chain and
// that each call of a step was requested, and reports foreign events as the Go one
// does, not the signers' grants (which tool a team owned when).
import { createHash, createPrivateKey, createPublicKey, sign as edSign, verify as edVerify, type KeyObject } from 'node:crypto';
import { readFileSync } from 'node:fs';

export const PAYLOAD_TYPE = 'https://cloudevents.io/verifiability/dsse/v0.1';
export const BUNDLE_FORMAT = 'toolbus-audit-bundle/v1';
const CORE = ['id', 'source', 'specversion', 'type', 'datacontenttype', 'dataschema', 'subject', 'time'];
const NOT_EXT = new Set([...CORE, 'dssematerial', 'signedextattrs']);
/** The events that begin a chain: a start, a decision, a cancel, an answer. */
const CHAIN_STARTS = ['toolbus.run.started', 'toolbus.approval.granted', 'toolbus.approval.denied', 'toolbus.run.cancel', 'toolbus.tool.answer'];

/** The headers of a binary-mode event, names matched exactly (as NATS keeps them). */
export interface Headers {
  keys(): string[];
  get(k: string): string;
  set(k: string, v: string): void;
  delete(k: string): void;
}

/** Headers over a bundle record's header map. */
export function recordHeaders(h: Record<string, string[]>): Headers {
  return {
    keys: () => Object.keys(h),
    get: (k) => h[k]?.[0] ?? '',
    set: (k, v) => { h[k] = [v]; },
    delete: (k) => { delete h[k]; },
  };
}

const attr = (h: Headers, name: string) => h.get(name === 'datacontenttype' ? 'Content-Type' : `ce-${name}`);
const sha256 = (b: Uint8Array | string) => createHash('sha256').update(b).digest();

/**
 * A time as the material digests it: RFC 3339 in UTC, the fraction kept as written but
 * its trailing zeros dropped (none left: no fraction), as Go's RFC3339Nano formats; a
 * value that is no RFC 3339 time is taken as written.
 */
export function canonicalTime(v: string): string {
  const m = /^(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d\d):(\d\d))$/.exec(v);
  if (!m) return v;
  let ms = Date.UTC(+m[1], +m[2] - 1, +m[3], +m[4], +m[5], +m[6]);
  if (!m[8]) ms -= (m[9] === '-' ? -1 : 1) * (+m[10] * 60 + +m[11]) * 60000;
  const frac = (m[7] ?? '').replace(/0+$/, '');
  return new Date(ms).toISOString().slice(0, 19) + (frac ? '.' + frac : '') + 'Z';
}

/** The extension attributes a signer signs: every ce-* header but the core's and the extension's own, sorted. */
export function extensions(h: Headers): string[] {
  return h.keys().filter((k) => k.startsWith('ce-') && !NOT_EXT.has(k.slice(3))).map((k) => k.slice(3)).sort();
}

/** The verification material: SHA-256 of the digests of the core attributes, the data and each extension's name and value. */
export function material(h: Headers, data: Uint8Array, exts: string[]): Buffer {
  const parts = CORE.map((a) => sha256(a === 'time' ? canonicalTime(attr(h, a)) : attr(h, a)));
  parts.push(sha256(data));
  for (const e of exts) parts.push(sha256(e), sha256(attr(h, e)));
  return sha256(Buffer.concat(parts));
}

/** The extensions an event says it signed (ce-signedextattrs), null when they break the extension's constraints. */
function signedList(h: Headers): string[] | null {
  const v = h.get('ce-signedextattrs');
  if (!v) return [];
  const names = v.split(',');
  if (names.some((n, i) => !n || NOT_EXT.has(n) || names.indexOf(n) !== i)) return null;
  return names;
}

/** The digest a child event names in ce-prevdigest: "sha256:" and the hex of the material over its signed extensions (every extension of an unsigned event). */
export function digest(h: Headers, data: Uint8Array): string {
  let exts = signedList(h);
  if (exts === null || (!h.get('ce-signedextattrs') && !h.get('ce-dssematerial'))) exts = extensions(h);
  return 'sha256:' + material(h, data, exts).toString('hex');
}

/** DSSE's pre-authentication encoding. */
export const pae = (type: string, body: Buffer) =>
  Buffer.concat([Buffer.from(`DSSEv1 ${Buffer.byteLength(type)} ${type} ${body.length} `), body]);

const PKCS8_ED25519 = Buffer.from('302e020100300506032b657004220420', 'hex');
const SPKI_ED25519 = Buffer.from('302a300506032b6570032100', 'hex');
/** An ed25519 public key from its 32 raw bytes. */
export const publicKey = (raw: Buffer): KeyObject => createPublicKey({ key: Buffer.concat([SPKI_ED25519, raw]), format: 'der', type: 'spki' });

/** A signer of events: one ed25519 key and its key id. */
export class Signer {
  constructor(readonly keyID: string, private readonly key: KeyObject) {}

  /** The signer of a key file as toolbus admin writes it ({keyid, signer, seed}, seed base64): TOOLBUS_SIGNING_KEY. */
  static fromFile(file: string): Signer {
    let k: { keyid?: string; signer?: string; seed?: string };
    try {
      k = JSON.parse(readFileSync(file, 'utf8'));
    } catch (err) {
      throw new Error(`toolbus: signing key ${file}: ${(err as Error).message}`, { cause: err });
    }
    const seed = Buffer.from(k.seed ?? '', 'base64');
    if (seed.length !== 32 || !k.keyid || !k.signer) throw new Error(`toolbus: signing key ${file}: not a toolbus signing key (want {keyid, signer, seed})`);
    const priv = createPrivateKey({ key: Buffer.concat([PKCS8_ED25519, seed]), format: 'der', type: 'pkcs8' });
    const pub = createPublicKey(priv).export({ format: 'der', type: 'spki' }).subarray(SPKI_ED25519.length);
    const want = `${k.signer}/${sha256(pub).toString('hex').slice(0, 16)}`;
    if (k.keyid !== want) throw new Error(`toolbus: signing key ${file}: key id ${k.keyid} is not its key's (${want})`);
    return new Signer(k.keyid, priv);
  }

  /** Signs the event in place: ce-signedextattrs (every extension it carries, ce-prevdigest set before), then ce-dssematerial. */
  sign(h: Headers, data: Uint8Array): void {
    const exts = extensions(h);
    if (exts.length) h.set('ce-signedextattrs', exts.join(','));
    else h.delete('ce-signedextattrs');
    const m = material(h, data, exts);
    const env = { payload: m.toString('base64'), payloadType: PAYLOAD_TYPE,
      signatures: [{ keyid: this.keyID, sig: edSign(null, pae(PAYLOAD_TYPE, m), this.key).toString('base64') }] };
    h.set('ce-dssematerial', Buffer.from(JSON.stringify(env)).toString('base64'));
  }
}

/** A bundle as `toolbus audit export` writes it (CONTRACT.md). */
export interface Bundle {
  format: string;
  run: string;
  events: { seq: number; subject: string; header: Record<string, string[]>; data: string; stored?: string }[];
  keys: { keys: { keyid: string; signer: string; public: string; created?: string; retired?: string; revoked?: string }[] };
}

/** The first event of a bundle that does not verify, and why. */
export class AuditFailure extends Error {
  override name = 'AuditFailure';
  constructor(readonly index: number, readonly seq: number, readonly id: string, readonly check: string, readonly reason: string) {
    super(`event ${index + 1} (stream seq ${seq}, id ${id}): ${check}: ${reason}`);
  }
}

/** Checks the signature of one event; returns the key id that signed it, or throws why not. */
function verifySignature(h: Headers, data: Buffer, keys: Map<string, KeyObject>): string {
  const raw = h.get('ce-dssematerial');
  if (!raw) throw new Error(`unsigned ${h.get('ce-type')} (published by ${h.get('ce-source')})`);
  let env: { payload?: string; payloadType?: string; signatures?: { keyid: string; sig: string }[] };
  try {
    env = JSON.parse(Buffer.from(raw, 'base64').toString('utf8'));
  } catch {
    throw new Error('dssematerial is no DSSE envelope');
  }
  if (env.payloadType !== PAYLOAD_TYPE) throw new Error(`payload type ${env.payloadType}`);
  const payload = Buffer.from(env.payload ?? '', 'base64');
  if (payload.length !== 32) throw new Error('the payload is no 32-byte digest');
  const s = (env.signatures ?? []).find((s) => keys.has(s.keyid) && edVerify(null, pae(PAYLOAD_TYPE, payload), keys.get(s.keyid)!, Buffer.from(s.sig, 'base64')));
  if (!s) throw new Error(`no signature verifies with a key of the bundle (key ids ${(env.signatures ?? []).map((s) => s.keyid).join(', ')})`);
  const exts = signedList(h);
  if (exts === null) throw new Error(`signedextattrs ${h.get('ce-signedextattrs')} breaks the extension's constraints`);
  if (!material(h, data, exts).equals(payload)) throw new Error(`signed by ${s.keyid}, but the event is not the one signed (attributes or data altered)`);
  const unsigned = extensions(h).find((e) => !exts.includes(e));
  if (unsigned) throw new Error(`the extension attribute ${unsigned} is not signed`);
  return s.keyid;
}

type Ev = { r: Bundle['events'][number]; h: Headers; data: Buffer; digest: string };
const isCoreType = (t: string) => ['toolbus.model.requested', 'toolbus.model.responded', 'toolbus.tool.requested', 'toolbus.timer.deadline'].includes(t) ||
  (t.startsWith('toolbus.run.') && !CHAIN_STARTS.includes(t));
const last = (e: Ev) => e.r.subject.slice(e.r.subject.lastIndexOf('.') + 1);
/** The type the subject stands for (toolbus.<run>.<a>.<b>[.<last>]): a tenant's ce-type is its own word, the write service checked the subject. */
const subjectType = (e: Ev) => {
  const t = e.r.subject.split('.');
  return t.length >= 4 && t[0] === 'toolbus' ? `toolbus.${t[2]}.${t[3]}` : '';
};

/** Whether the model.responded r lists call of tool (its subject token: an invalid name is _unknown). */
function listed(r: Ev, call: string, tool: string): boolean {
  let calls: { call_id: string; tool: string }[] = [];
  try {
    calls = (JSON.parse(r.data.toString('utf8')) as { message?: { tool_calls?: typeof calls } }).message?.tool_calls ?? [];
  } catch { /* no calls: its signature check names why */ }
  return calls.some((c) => c.call_id === call && (/^[A-Za-z0-9_-]{1,64}$/.test(c.tool) ? c.tool : '_unknown') === tool);
}

/**
 * The events no reader counts (CONTRACT.md, "Verification"), by index and why: a start
 * after the run's, an answer not by the run's principal, a decision or cancel by neither
 * the principal nor an approver, none of them named by a core event; a tool's event of a
 * call the core never requested of that tool, unless the planner or the injector signed it.
 * Each is judged as what its subject is, never by its ce-type (the tenant's to choose).
 */
function foreignEvents(evs: Ev[], keys: Map<string, KeyObject>, run: string): Map<number, string> {
  const named = new Set(evs.filter((e) => isCoreType(subjectType(e))).map((e) => e.h.get('ce-prevdigest')));
  const starts = evs.filter((e) => subjectType(e) === 'toolbus.run.started');
  const start = starts.find((e) => named.has(e.digest)) ?? starts[0];
  let rs: { principal?: { id?: string }; approvers?: string[] } | undefined;
  try {
    rs = start ? JSON.parse(start.data.toString('utf8')) : undefined;
  } catch { /* no principal: its signature check names why */ }
  const principal = rs?.principal?.id ?? '';
  const out = new Map<number, string>();
  evs.forEach((e, i) => {
    const type = subjectType(e);
    if (isCoreType(type) || !type.startsWith('toolbus.tool.') && !CHAIN_STARTS.includes(type)) return;
    if (CHAIN_STARTS.includes(type)) {
      const who = last(e);
      if (named.has(e.digest)) return;
      if (type === 'toolbus.run.started' ? e === start : who !== '' && (who === principal || (type !== 'toolbus.tool.answer' && (rs?.approvers ?? []).includes(who)))) return;
      out.set(i, `${type} by ${who}, neither the run's principal (${principal}) nor named by the core as handled`);
      return;
    }
    const requested = evs.slice(0, i).some((r) => r.h.get('ce-step') === e.h.get('ce-step') && (r.h.get('ce-type') === 'toolbus.tool.requested'
      ? last(r) === last(e) && r.h.get('ce-callid') === e.h.get('ce-callid')
      : r.h.get('ce-type') === 'toolbus.model.responded' && listed(r, e.h.get('ce-callid'), last(e))));
    // The core's result in the executor's place, on this very subject and run: its signed
    // event copied whole onto a team's subject (a team sees its calls, signed) is not.
    let core = false;
    try {
      core = e.h.get('ce-type') === type && e.h.get('ce-runid') === run && /^role\.(planner|injector)\//.test(verifySignature(e.h, e.data, keys));
    } catch { /* not the core's */ }
    if (!requested && !core) out.set(i, `${type} of tool ${last(e)} for call ${e.h.get('ce-callid')}, which the core never requested of that tool`);
  });
  return out;
}

/**
 * Throws unless each of the ce-callcount calls of a step the run went on from (a later
 * model.requested, or an outcome) has the core's request or rejected result (core(i)).
 */
function requestedAll(evs: Ev[], core: (i: number) => boolean): void {
  const type = (e: Ev) => e.h.get('ce-type');
  const lastStep = Math.max(-1, ...evs.filter((e) => type(e) === 'toolbus.model.requested').map((e) => +e.h.get('ce-step')));
  const ended = evs.some((e) => type(e).startsWith('toolbus.run.') && !CHAIN_STARTS.includes(type(e)));
  const steps = new Map<number, { first: number; count: number; have: Set<number> }>();
  evs.forEach((e, i) => {
    if (!core(i) || !e.h.get('ce-callcount')) return;
    const st = steps.get(+e.h.get('ce-step')) ?? { first: i, count: 0, have: new Set<number>() };
    st.count = Math.max(st.count, +e.h.get('ce-callcount'));
    st.have.add(+e.h.get('ce-callindex'));
    steps.set(+e.h.get('ce-step'), st);
  });
  for (const [step, st] of [...steps].sort((a, b) => a[0] - b[0])) {
    if (step >= lastStep && !ended) continue;
    for (let k = 0; k < st.count; k++) {
      if (st.have.has(k)) continue;
      const e = evs[st.first];
      throw new AuditFailure(st.first, e.r.seq, e.h.get('ce-id'), 'complete', `call ${k + 1} of the ${st.count} of step ${step} was never requested, yet the run went on (a request removed)`);
    }
  }
}

/**
 * Verifies a bundle with no bus: every event signed by a key of the bundle over its
 * canonical form, and chained (its ce-prevdigest names an earlier event of the run; a
 * start, decision, cancel or answer may begin a chain); an event no reader counts (a
 * tenant's write with no standing in the run) is reported in foreign, not judged.
 * Returns the signers' key ids; throws an AuditFailure naming the first event that fails.
 */
export function verifyBundle(b: Bundle): { events: number; keyIDs: string[]; foreign: { index: number; reason: string }[] } {
  if (b.format !== BUNDLE_FORMAT) throw new Error(`toolbus: bundle format ${b.format}, want ${BUNDLE_FORMAT}`);
  const keys = new Map(b.keys.keys.map((k) => [k.keyid, publicKey(Buffer.from(k.public, 'base64'))]));
  const evs: Ev[] = b.events.map((r) => {
    const h = recordHeaders(r.header), data = Buffer.from(r.data ?? '', 'base64');
    return { r, h, data, digest: digest(h, data) };
  });
  const at = new Map<string, number>();
  evs.forEach((e, i) => { if (!at.has(e.digest)) at.set(e.digest, i); });
  const ignored = foreignEvents(evs, keys, b.run);
  const signers = new Set<string>();
  const keyOf = new Map<number, string>();
  evs.forEach((e, i) => {
    const fail = (check: string, reason: string) => new AuditFailure(i, e.r.seq, e.h.get('ce-id'), check, reason);
    if (ignored.has(i)) return;
    if (e.h.get('ce-runid') !== b.run) throw fail('decode', `the event is of run ${e.h.get('ce-runid')}, not ${b.run}`);
    try {
      keyOf.set(i, verifySignature(e.h, e.data, keys));
      signers.add(keyOf.get(i)!);
    } catch (err) {
      throw fail('signature', (err as Error).message);
    }
    const prev = e.h.get('ce-prevdigest');
    if (!prev) {
      if (!CHAIN_STARTS.includes(e.h.get('ce-type'))) throw fail('chain', `${e.h.get('ce-type')} names no previous event`);
      return;
    }
    const j = at.get(prev);
    if (j === undefined) throw fail('chain', `it follows event ${prev}, which the run does not hold (removed or altered)`);
    if (j >= i) throw fail('chain', `it follows event ${j + 1} (${evs[j].h.get('ce-id')}), stored after it (reordered)`);
    if (ignored.has(j)) throw fail('chain', `it follows event ${j + 1} (${evs[j].h.get('ce-id')}), which no reader counts (foreign): an event it needs removed or altered`);
  });
  requestedAll(evs, (i) => !ignored.has(i) && (evs[i].h.get('ce-type') === 'toolbus.tool.requested' ||
    evs[i].h.get('ce-type') === 'toolbus.tool.finished' && /^role\.(planner|injector)\//.test(keyOf.get(i) ?? '')));
  return { events: evs.length, keyIDs: [...signers].sort(), foreign: [...ignored].map(([index, reason]) => ({ index, reason })) };
}
