// The wire: everything this package knows of toolbus's event contract (CONTRACT.md) in
// one module — subjects, event ids, the CloudEvents binary mode over NATS headers, the
// data types, the stores' keys and values, and the bus operations an executor and a
// client make (publishing with the squat guard, reading a run, claims, instance
// records, decisions, outputs, the catalog). The executor and the client never build a
// subject, key or header themselves: when the wire changes (tenancy over NATS
// accounts), this module changes.
import { createHash, createHmac, randomUUID } from 'node:crypto';
import { headers as natsHeaders, nanos, type Msg, type MsgHdrs, type NatsConnection } from '@nats-io/transport-node';
import {
  AckPolicy,
  DeliverPolicy,
  JetStreamApiError,
  jetstream,
  jetstreamManager,
  type Consumer,
  type ConsumerInfo,
  type JetStreamClient,
  type JetStreamManager,
  type JetStreamPublishOptions,
  type PubAck,
  type StoredMsg,
} from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import { digest, type Headers, type Signer } from './audit.js';

// ---- the data (the JSON of schemas/) -----------------------------------------------

export type Status = 'succeeded' | 'failed' | 'rejected' | 'timed_out' | 'cancelled';

export interface Principal {
  id?: string;
  roles?: string[];
  [k: string]: unknown;
}

export interface ToolCall {
  call_id: string;
  tool: string;
  arguments: string;
}

export interface ToolRequested {
  run_id: string;
  step: number;
  call_index: number;
  call_count: number;
  call: ToolCall;
  deadline?: string;
  principal?: Principal;
  allowed_tools?: string[];
  /** Set on a call re-issued after a person's decision. */
  approved?: boolean;
  /** The decision a re-issued call carries (what an executor in a team account applies). */
  decision?: Decision;
}

export interface Message {
  role: 'system' | 'user' | 'assistant' | 'tool';
  content?: string;
  [k: string]: unknown;
}

export interface Limits {
  max_steps?: number;
  deadline?: string;
  token_budget?: number;
}

export interface RunStarted {
  run_id: string;
  messages?: Message[];
  allowed_tools?: string[];
  limits?: Limits;
  model?: string;
  principal?: Principal;
  /** Who may decide on this run's calls and cancel it besides its principal (and the injector's TOOLBUS_DECIDERS). */
  approvers?: string[];
  started_at?: string;
  calls?: ToolCall[];
}

/**
 * Whether who is the run's principal or one of its approvers: the identities the decision
 * policy accepts for every run, whatever the injector's TOOLBUS_DECIDERS add (the Go twin
 * is RunStarted.NamesDecider).
 */
export function namesDecider(rs: RunStarted, who?: string): boolean {
  const w = (who ?? '').trim();
  return w !== '' && (w === rs.principal?.id || (rs.approvers ?? []).includes(w));
}

export interface ToolError {
  code: string;
  message: string;
  retryable: boolean;
  details?: unknown;
}

export interface FailedAttempt {
  attempt: number;
  status: Status;
  error: ToolError;
  duration_ms: number;
  executor?: string;
  at: string;
  retry_after_ms?: number;
}

export interface HumanDecision {
  kind: 'edited' | 'responded';
  who?: string;
  arguments?: string;
}

export interface ToolResult {
  call_id: string;
  tool: string;
  status: Status;
  output?: unknown;
  error?: ToolError;
  content: string;
  truncated?: { original_bytes: number; kept_bytes: number; ref?: string };
  redactions?: number;
  human?: HumanDecision;
  retries?: FailedAttempt[];
  attempt?: number;
  lease_until?: string;
  duration_ms: number;
  executor?: string;
}

export interface ToolFinished extends ToolResult {
  run_id: string;
  step: number;
  call_index: number;
  call_count: number;
}

export interface ToolProgress {
  run_id: string;
  step: number;
  call_id: string;
  tool: string;
  attempt: number;
  seq: number;
  done: number;
  total?: number;
  message?: string;
}

export interface RetryPolicy {
  max_attempts: number;
  /** Nanoseconds, as every duration of the catalog. */
  initial_backoff: number;
  max_backoff: number;
  codes?: string[];
}

/** A tool's entry in the catalog (KV toolbus_tools); durations in nanoseconds. */
export interface ToolContract {
  name: string;
  description: string;
  input_schema: unknown;
  output_schema?: unknown;
  read_only: boolean;
  needs_approval?: boolean;
  timeout?: number;
  heartbeat_timeout?: number;
  task_required?: boolean;
  max_output_bytes?: number;
  max_concurrency?: number;
  redact_fields?: string[];
  owner?: string;
  version?: number;
  retry?: RetryPolicy;
}

export interface Approval {
  run_id: string;
  call_id: string;
  who?: string;
  why?: string;
  arguments?: string;
  response?: string;
}

export interface Cancel {
  run_id: string;
  reason?: string;
  who?: string;
}

export interface RunEnded {
  run_id: string;
  status: string;
  answer?: string;
  reason?: string;
  code?: string;
  pending?: ToolCall[];
  steps_used?: number;
  usage?: { input_tokens?: number; output_tokens?: number };
  [k: string]: unknown;
}

/** A run's state in KV toolbus_runs (store.RunState), as the read service lists them. */
export interface RunState {
  run_id: string;
  status: string;
  step: number;
  code?: string;
  reason?: string;
  started_at: string;
  updated_at: string;
  ended?: RunEnded;
}

/** A call's claim in KV toolbus_claims; its revision is the attempt's fencing token. */
export interface Claim {
  team?: string;
  instance: string;
  boot?: string;
  attempt: number;
  at: string;
  abandoned?: boolean;
  retry?: boolean;
  retries?: FailedAttempt[];
  yielded?: boolean;
  /** The attempt's result is stored (written by executors in a team account, which cannot walk the results). */
  done?: boolean;
}

/** An executor instance's record in KV toolbus_instances (its lease). */
export interface Instance {
  team?: string;
  name: string;
  boot?: string;
  tools: string[];
  concurrency: number;
  started_at: string;
  heartbeat_at: string;
}

/** A recorded approval decision (KV toolbus_approvals). */
export interface Decision extends Approval {
  granted: boolean;
}

// ---- names, subjects, ids, keys -----------------------------------------------------

export const SUBJECT_PREFIX = 'toolbus';
export const UNKNOWN_TOOL = '_unknown';
export const NO_IDENTITY = '_none';

export const Type = {
  runStarted: 'toolbus.run.started',
  modelRequested: 'toolbus.model.requested',
  modelResponded: 'toolbus.model.responded',
  toolRequested: 'toolbus.tool.requested',
  toolProgress: 'toolbus.tool.progress',
  toolFinished: 'toolbus.tool.finished',
  toolWaiting: 'toolbus.tool.waiting',
  approvalGranted: 'toolbus.approval.granted',
  approvalDenied: 'toolbus.approval.denied',
  runCancel: 'toolbus.run.cancel',
  runCompleted: 'toolbus.run.completed',
  runWaiting: 'toolbus.run.waiting_for_approval',
  runFailed: 'toolbus.run.failed',
  runLimitReached: 'toolbus.run.limit_reached',
  runCancelled: 'toolbus.run.cancelled',
} as const;

/** The run outcomes a run ends with (each a CloudEvents type "toolbus.run.<outcome>"). */
export const TERMINAL = ['completed', 'failed', 'limit_reached', 'cancelled'] as const;

export const Bucket = {
  tools: 'toolbus_tools',
  instances: 'toolbus_instances',
  claims: 'toolbus_claims',
  runs: 'toolbus_runs',
  approvals: 'toolbus_approvals',
  outputs: 'toolbus_outputs',
} as const;

const TOKEN = /^[A-Za-z0-9_-]+$/;
export const validToolName = (s: unknown): s is string => typeof s === 'string' && s.length >= 1 && s.length <= 64 && TOKEN.test(s);
export const validRunID = (s: unknown): s is string => typeof s === 'string' && s.length >= 1 && s.length <= 128 && TOKEN.test(s);
/** An identity (principal id, who): 1 to 128 of [A-Za-z0-9_-], or empty. */
export const validIdentity = (s: unknown): boolean => s === undefined || s === '' || validRunID(s);
export const validTeam = (s: string): boolean => /^[a-z0-9][a-z0-9_-]{0,31}$/.test(s);
export const identityToken = (s?: string): string => (s ? s : NO_IDENTITY);
export const toolToken = (tool: string): string => (validToolName(tool) ? tool : UNKNOWN_TOOL);

/** First token of the queue subjects (events.QueuePrefix): nobody publishes on them, the server copies the calls there. */
export const QUEUE_PREFIX = 'toolbus_queue';

/**
 * The queue stream of an event stream (events.QueueStreamName): the server sources every
 * toolbus.<run>.tool.requested.<tool> of the event stream into it on toolbus_queue.<tool>
 * (subject.queue), and it holds the tools' queues (toolConsumer). It has no subject of
 * its own, so only the server writes in it.
 */
export const queueStreamName = (stream: string) => `${stream}_QUEUES`;

/**
 * The header the server sets on every message it copies from one stream to another
 * (events.StreamSourceHeader): "<stream> <sequence> <filter> <transform> <subject>", the
 * last field the subject the message was published on.
 */
export const STREAM_SOURCE_HEADER = 'Nats-Stream-Source';

/** The subject of a call released by the core's fair scheduler (events.FairCallSubjectHeader). */
export const FAIR_CALL_SUBJECT_HEADER = 'Toolbus-Call-Subject';

/**
 * The subject a call was published on, toolbus.<run>.tool.requested.<tool>
 * (events.CallSubject): the message's own subject unless it is a queue subject; for a
 * message of the queue stream, the fifth field of the server's Nats-Stream-Source
 * header ('' when there is none: the call cannot be checked, it is poison).
 */
export function callSubject(msg: { subject: string; headers?: MsgHdrs }): string {
  if (!msg.subject.startsWith(QUEUE_PREFIX + '.')) return msg.subject;
  const vals = msg.headers?.values(STREAM_SOURCE_HEADER) ?? [];
  // A call the core's fair scheduler released names its subject itself (events.FairCallSubjectHeader).
  if (vals.length === 0) return msg.headers?.get(FAIR_CALL_SUBJECT_HEADER) ?? '';
  const f = vals[vals.length - 1].split(/\s+/).filter((x) => x !== '');
  return f.length < 5 ? '' : f[4];
}

/** The tool token a subject ends in (events.ToolTokenOfSubject): the queue of a call or a result. */
export const toolTokenOfSubject = (subj: string): string => subj.slice(subj.lastIndexOf('.') + 1);

/** Root of the core's notices to executors in team accounts (core NATS, not stored). */
export const NOTICE_PREFIX = 'toolbus_notice';

export const subject = {
  run: (run: string) => `${SUBJECT_PREFIX}.${run}.>`,
  runStarted: (run: string, principal?: string) => `${SUBJECT_PREFIX}.${run}.run.started.${identityToken(principal)}`,
  runStartedAny: (run: string) => `${SUBJECT_PREFIX}.${run}.run.started.*`,
  runCancel: (run: string, who?: string) => `${SUBJECT_PREFIX}.${run}.run.cancel.${identityToken(who)}`,
  runCancelAll: `${SUBJECT_PREFIX}.*.run.cancel.*`,
  /** The core's notices that a run ended for a tool's executors (team accounts: events.FilterRunEndedFor). */
  runEndedFor: (tool: string) => `${NOTICE_PREFIX}.*.ended.${toolToken(tool)}`,
  toolRequested: (run: string, tool: string) => `${SUBJECT_PREFIX}.${run}.tool.requested.${toolToken(tool)}`,
  /** Where the calls of a tool are published, in every run: what an idle queue's doorbell listens to (events.QueuePublishedOn). */
  toolRequestedAll: (tool: string) => `${SUBJECT_PREFIX}.*.tool.requested.${toolToken(tool)}`,
  /**
   * toolbus_queue.<tool> (events.SubjectQueue): a tool's calls in the queue stream, where
   * the server copies each tool.requested of the event stream; the filter of its queue.
   */
  queue: (tool: string) => `${QUEUE_PREFIX}.${toolToken(tool)}`,
  toolFinished: (run: string, tool: string) => `${SUBJECT_PREFIX}.${run}.tool.finished.${toolToken(tool)}`,
  toolWaiting: (run: string, tool: string) => `${SUBJECT_PREFIX}.${run}.tool.waiting.${toolToken(tool)}`,
  toolProgress: (run: string, tool: string) => `${SUBJECT_PREFIX}.${run}.tool.progress.${toolToken(tool)}`,
  approval: (run: string, granted: boolean, who?: string) =>
    `${SUBJECT_PREFIX}.${run}.approval.${granted ? 'granted' : 'denied'}.${identityToken(who)}`,
};

export const id = {
  toolFinished: (run: string, step: number, callID: string) => `${run}/${step}/${callID}/tool.finished`,
  toolWaiting: (run: string, step: number, callID: string) => `${run}/${step}/${callID}/tool.waiting`,
  toolProgress: (run: string, step: number, callID: string, attempt: number, seq: number) =>
    `${run}/${step}/${callID}/tool.progress/${attempt}/${seq}`,
  toolRequested: (run: string, step: number, callID: string) => `${run}/${step}/${callID}/tool.requested`,
  runStarted: (run: string) => `${run}/run.started`,
  runCancel: (run: string) => `${run}/run.cancel`,
  approval: (run: string, step: number, callID: string, granted: boolean, args?: string) => {
    let s = `${run}/${step}/${callID}/approval.${granted ? 'granted' : 'denied'}`;
    if (granted && args) s += '/edit/' + createHash('sha256').update(args).digest('hex').slice(0, 12);
    return s;
  },
};

export const dataSchema = (type: string) => `https://toolbus.dev/schemas/${type}.v1.json`;
export const source = (component: string, instance: string) => `/toolbus/${component}/${instance}`;

/** FNV-1a, 32 bits, of a string's UTF-8 bytes (Go's hash/fnv New32a). */
export function fnv32(s: string): number {
  let h = 0x811c9dc5;
  for (const b of Buffer.from(s, 'utf8')) {
    h ^= b;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

/** The KV key form of a string: [A-Za-z0-9_-] kept, any other byte =XX. */
export function kvSafe(s: string): string {
  let out = '';
  for (const b of Buffer.from(s, 'utf8')) {
    const c = String.fromCharCode(b);
    out += /[A-Za-z0-9_-]/.test(c) ? c : '=' + b.toString(16).toUpperCase().padStart(2, '0');
  }
  return out || '=';
}

export const key = {
  claim: (queue: string, run: string, step: number, callID: string) => `${queue}.${run}.${step}.${kvSafe(callID)}`,
  /** One of a run's slots for calls of steps over RunMaxInFlight calls (store.slotKey), under the tool's claims prefix. */
  runSlot: (queue: string, run: string, i: number) => `${queue}.${run}.slot.${i}`,
  instance: (team: string, name: string, boot: string) =>
    team ? `${team}.${kvSafe(name)}.${kvSafe(boot)}` : boot ? `${kvSafe(name)}.${kvSafe(boot)}` : kvSafe(name),
  decision: (run: string, step: number, callID: string) => `${run}.${step}.${kvSafe(callID)}`,
  output: (queue: string, run: string, step: number, callID: string) => `${queue}.${run}.${step}.${kvSafe(callID)}`,
};

/** The durable consumer of a tool's queue. */
export const toolConsumer = (tool: string) => `tool_${toolToken(tool)}`;
/** Chunks of a large output in KV toolbus_outputs. */
export const OUTPUT_CHUNK = 128 << 10;

/**
 * The ack wait of a tool's queue (events.QueueAckWait): the executors' ack wait, but no
 * longer than their lease (the instance TTL, at least 1 s).
 */
export const queueAckWait = (ackWaitMS: number, instanceTTLMS: number) => Math.min(ackWaitMS, Math.max(instanceTTLMS, 1000));

// ---- CloudEvents over NATS headers ----------------------------------------------------

/** The attributes of an event (the ce-* headers without the prefix). */
export interface Attrs {
  id: string;
  type: string;
  source: string;
  subject?: string;
  time?: string;
  dataschema?: string;
  runid?: string;
  step?: string;
  callid?: string;
  callindex?: string;
  callcount?: string;
  traceparent?: string;
  [ext: string]: string | undefined;
}

export interface Event<T = unknown> {
  attrs: Attrs;
  data: T;
}

/** Thrown for a message that is no CloudEvent of the contract (the consumer terminates it). */
export class PoisonError extends Error {
  override name = 'PoisonError';
}

const enc = new TextEncoder();
const dec = new TextDecoder();

/** Decodes a CloudEvent in binary mode (ce-* headers, names read case-insensitively) or structured mode. */
export function decodeEvent<T>(hdrs: MsgHdrs | undefined, body: Uint8Array): Event<T> {
  const h: Record<string, string> = {};
  if (hdrs) for (const k of hdrs.keys()) h[k.toLowerCase()] = hdrs.get(k);
  const ct = h['content-type'] ?? '';
  try {
    if (ct.startsWith('application/cloudevents+json')) {
      const ev = JSON.parse(dec.decode(body));
      if (ev?.specversion !== '1.0') throw new PoisonError('not a CloudEvent (specversion)');
      const attrs: Attrs = { id: '', type: '', source: '' };
      for (const [k, v] of Object.entries(ev)) if (k !== 'data' && k !== 'data_base64') attrs[k] = String(v);
      return { attrs, data: ev.data as T };
    }
    if (h['ce-specversion'] !== '1.0') throw new PoisonError('not a CloudEvent: no ce-specversion 1.0');
    const attrs: Attrs = { id: '', type: '', source: '' };
    for (const [k, v] of Object.entries(h)) if (k.startsWith('ce-') && k !== 'ce-specversion') attrs[k.slice(3)] = v;
    return { attrs, data: JSON.parse(dec.decode(body)) as T };
  } catch (err) {
    if (err instanceof PoisonError) throw err;
    throw new PoisonError(`not a CloudEvent: ${(err as Error).message}`);
  }
}

/** The headers of an event in binary mode, with its id in Nats-Msg-Id. */
export function eventHeaders(a: Attrs): MsgHdrs {
  const h = natsHeaders();
  const all: Attrs = { time: new Date().toISOString(), dataschema: dataSchema(a.type), ...a };
  h.set('ce-specversion', '1.0');
  for (const [k, v] of Object.entries(all)) if (v !== undefined && v !== '') h.set(`ce-${k}`, v);
  h.set('Content-Type', 'application/json');
  h.set('Nats-Msg-Id', a.id);
  return h;
}

/** The attributes of a tool event of a call (tool.finished, tool.waiting, tool.progress). */
export function callAttrs(type: string, src: string, eventID: string, run: string, step: number, callID: string,
  index: number, count: number, traceparent?: string, prevdigest?: string): Attrs {
  return {
    id: eventID, type, source: src, subject: callID, runid: run, step: String(step), callid: callID,
    callindex: String(index), callcount: String(count), ...(traceparent ? { traceparent } : {}), ...(prevdigest ? { prevdigest } : {}),
  };
}

/** The digest of the event a message carries, which the events its handling publishes name in ce-prevdigest (CONTRACT.md, "Signed and chained events"). */
export const parentDigest = (msg: { headers?: MsgHdrs; data: Uint8Array }): string =>
  msg.headers?.get('ce-id') ? digest(msg.headers as unknown as Headers, msg.data) : '';

/**
 * The run whose subject the message is on, when its data and attributes agree with it
 * (CONTRACT.md, "Subject and body agree"): type, run, and the identity of the subject's
 * last token (principal or who). Undefined for a message that disagrees.
 */
export function agreeingRun(subj: string, ev: Event<{ run_id?: string; who?: string; principal?: Principal }>, type: string): string | undefined {
  const tokens = subj.split('.');
  const run = tokens[1];
  const d = ev.data;
  if (ev.attrs.type !== type || !d || d.run_id !== run || (ev.attrs.runid && ev.attrs.runid !== run)) return undefined;
  const ident = type === Type.runStarted ? d.principal?.id : d.who;
  if (tokens.length === 5 && identityToken(ident) !== tokens[4]) return undefined;
  return run;
}

// ---- the bus ---------------------------------------------------------------------------

export interface BusOptions {
  stream?: string;
  /**
   * The prefix under which a team account imports the core account's JetStream API
   * (TOOLBUS_NATS_API_PREFIX, e.g. JS.core.API). Set, the bus opens no stream or bucket by
   * name: it binds durables, reads keys by direct get in subject form and writes them by
   * publishing on $KV.<bucket>.<key>, and reads only the last message of a subject.
   */
  apiPrefix?: string;
  /**
   * The key of a team account's message ids (settings.msgKeyOf, from the credentials):
   * <id>/guarded/<HMAC of id>, so that no other team can publish first under the id of
   * this team's result and have the stream drop it as a duplicate (events.Bus.msgID).
   */
  msgKey?: Buffer;
  /**
   * The prefix of the core's read service for a client in a client account
   * (TOOLBUS_NATS_READ_PREFIX, readAPIPrefix(id): toolbus_read.<id>.API). Set, the bus
   * reads only through it: events by direct get under the prefix ({seq, next_by_subj}
   * and last by subject), the stream's last sequence by STREAM.INFO under the prefix,
   * keys by direct get in subject form; never the core's $JS.API, never a consumer (a
   * client account has no JetStream). It publishes as before, on the imported subjects.
   */
  readPrefix?: string;
  /** Signs every event the bus publishes (TOOLBUS_SIGNING_KEY; none: unsigned). */
  signer?: Signer;
}

/**
 * The read service's JetStream API prefix for an identity (events.ReadAPIPrefix): the
 * core answers there only what the runs visible to the identity hold.
 */
export const readAPIPrefix = (identity: string) => `toolbus_read.${identityToken(identity)}.API`;

/**
 * toolbus_teamread.<stream>.<subject>: where a team's executor asks the core's read
 * service for the last message of subject in stream, which its account's import maps to
 * the team's own (events.TeamReadLocal). The service answers as a direct get would, for
 * the subjects the team's direct gets reach, on replicated streams that serve none.
 */
export const teamReadLocal = (stream: string, subject: string) => `toolbus_teamread.${stream}.${subject}`;

/** Whether err is (or wraps) a request nobody answered (NATS "no responders"). */
export function isNoResponders(err: unknown): boolean {
  for (let e = err as { name?: string; message?: string; cause?: unknown; isNoResponders?: () => boolean } | undefined, i = 0; e && i < 8; e = e.cause as typeof e, i++) {
    if (typeof e.isNoResponders === 'function' && e.isNoResponders()) return true;
    if (e.name === 'NoResponders' || /^no responders/i.test(String(e.message ?? ''))) return true;
  }
  return false;
}

/** Whether err is (or wraps) the answer of an account without JetStream, or no answer at all. */
function noJetStreamHere(err: unknown): boolean {
  if (isNoResponders(err)) return true;
  for (let e = err as { name?: string; message?: string; cause?: unknown; code?: unknown } | undefined, i = 0; e && i < 8; e = e.cause as typeof e, i++) {
    if (e.name === 'JetStreamNotEnabled' || e.code === 10039 || /jetstream (is )?not enabled/i.test(String(e.message ?? ''))) return true;
  }
  return false;
}

/**
 * A publish as an identity the client's account is not bound to: in a client account
 * only the identities its credential is bound to are imported, so the publish found no
 * responders.
 */
export class NotBoundError extends Error {
  override name = 'NotBoundError';
  constructor(readonly identity: string, readonly subject: string, options?: { cause?: unknown }) {
    super(`toolbus: this client's NATS account is not bound to the identity ${JSON.stringify(identity)} ` +
      `(publishing on ${subject} got no responders: a client account publishes only as the identities its credential is bound to); ` +
      `act as one of those, or use a credential bound to ${identity} (\`toolbus admin add-client NAME ${identity}\`)`, options);
  }
}

/** The err_code of a write the core's write service does not admit (events.WriteRefusedErrCode). */
export const WRITE_REFUSED_ERR_CODE = 10800;
/** The err_code of a write refused because its tenant is over its bytes per second (events.WriteQuotaErrCode). */
export const WRITE_QUOTA_ERR_CODE = 10801;
/** The err_code of a new key refused because its tenant holds its bound of keys in the bucket (events.WriteStoreFullErrCode). */
export const WRITE_STORE_FULL_ERR_CODE = 10802;

/**
 * A write the core's write service refused (the accounts layout: CONTRACT.md, "Tenants'
 * writes"; Go: events.ErrWriteRefused). code 400: a form the tenant may not write, a
 * roll-up (Nats-Rollup header), a client's run.started over TOOLBUS_MAX_START_BYTES or a
 * decision, cancel or answer over 64 KiB: sending it again is refused again. code 503:
 * the service could not forward it (its connection to the server failed). Nothing of the
 * write was stored. Its cause is the stream-style refusal (a JetStreamApiError).
 */
export class WriteRefusedError extends Error {
  override name = 'WriteRefusedError';
  /** The refusal's status: 400 or 503, and 429 in a TenantQuotaError. */
  readonly code: number;
  /** Its err_code: WRITE_REFUSED_ERR_CODE, or WRITE_QUOTA_ERR_CODE. */
  readonly errCode: number;
  /** The write service's reason. */
  readonly description: string;
  constructor(readonly subject: string, refusal: { code: number; err_code: number; description?: string }, options?: { cause?: unknown }) {
    const what = refusal.err_code === WRITE_QUOTA_ERR_CODE ? 'refused the write over the tenant\'s bytes per second (retry later)' : 'refused the write';
    super(`toolbus: publish ${subject}: the core's write service ${what}: ${refusal.code} ${refusal.description ?? ''} (err_code ${refusal.err_code})`, options);
    this.code = refusal.code;
    this.errCode = refusal.err_code;
    this.description = refusal.description ?? '';
  }
}

/**
 * A write the core's write service refused because its tenant (the team, or the client's
 * identity) is over its bytes per second (TOOLBUS_TENANT_BYTES_PER_SECOND; code 429,
 * err_code WRITE_QUOTA_ERR_CODE; Go: events.ErrTenantQuota): nothing was stored, and the
 * same write may pass later. The executor retries its own writes of a call in place (README,
 * "Refused writes"); a client's start, decision or cancel rejects with it.
 */
export class TenantQuotaError extends WriteRefusedError {
  override name = 'TenantQuotaError';
}

/**
 * A new key of a shared bucket (secrets, instances, claims, outputs) refused because its
 * tenant (the team, or the tool for claims and outputs) holds its bound of keys there
 * (TOOLBUS_TENANT_BUCKET_KEYS; code 507, err_code WRITE_STORE_FULL_ERR_CODE; Go:
 * events.ErrTenantStoreFull): nothing was stored. Writing a key the tenant holds passes;
 * a new one once some of its keys expire or an admin purges them. The executor keeps a
 * large output it cannot store as a full outputs bucket: the result goes out without it.
 */
export class TenantStoreFullError extends WriteRefusedError {
  override name = 'TenantStoreFullError';
}

/** err as a WriteRefusedError, TenantQuotaError or TenantStoreFullError when it is a refusal of the write service, else err itself. */
export function writeRefusal(err: unknown, subject: string): unknown {
  if (!(err instanceof JetStreamApiError) || (err.code !== WRITE_REFUSED_ERR_CODE && err.code !== WRITE_QUOTA_ERR_CODE && err.code !== WRITE_STORE_FULL_ERR_CODE)) return err;
  const r = { code: err.status, err_code: err.code, description: err.apiError().description };
  if (err.code === WRITE_STORE_FULL_ERR_CODE) return new TenantStoreFullError(subject, r, { cause: err });
  return err.code === WRITE_QUOTA_ERR_CODE ? new TenantQuotaError(subject, r, { cause: err }) : new WriteRefusedError(subject, r, { cause: err });
}

/** Publishes on JetStream; a refusal of the core's write service rejects as a WriteRefusedError or TenantQuotaError. */
async function jsPublish(js: JetStreamClient, subj: string, data: Uint8Array, opts?: Partial<JetStreamPublishOptions>): Promise<PubAck> {
  try {
    return await js.publish(subj, data, opts);
  } catch (err) {
    throw writeRefusal(err, subj);
  }
}

/** A key's entry as the executor reads it. */
export interface Entry {
  value: Uint8Array;
  revision: number;
  created: Date;
  operation: 'PUT' | 'DEL' | 'PURGE';
}

/** The operations the executor and the client make on a bucket. */
export interface Store {
  /** The key's last entry, delete and purge markers included (null: never written). */
  get(k: string): Promise<Entry | null>;
  put(k: string, v: Uint8Array): Promise<number>;
  /** Creates k (or replaces a delete marker); a key that exists rejects (isConflict). */
  create(k: string, v: Uint8Array): Promise<number>;
  /** Replaces k at revision rev; another revision rejects (isConflict). */
  update(k: string, v: Uint8Array, rev: number): Promise<number>;
  delete(k: string): Promise<void>;
}

/**
 * The status of an answer: from the status line (the server's), or from a Status header
 * (toolbus's read service, which a Go service cannot put in the status line). A stored
 * message's own headers may say Status too: a status answer has no data and no sequence
 * (the answers with a stored message carry one). 0: no status.
 */
function statusOf(m: { headers?: MsgHdrs; data: Uint8Array }): number {
  const h = m.headers;
  if (!h || m.data.length > 0 || h.has('Nats-Sequence')) return 0;
  return h.code || Number(h.get('Status') || 0);
}

/**
 * A request whose answer is not a 429: the read service refuses at once an identity's
 * requests beyond those it works on (reads.PerIdentity); they are sent again, pausing
 * 5 ms, growing to 200 ms, for up to 30 s (the server never answers 429).
 */
async function request(nc: NatsConnection, subj: string, body?: object): Promise<Msg> {
  const data = body ? enc.encode(JSON.stringify(body)) : new Uint8Array(0);
  const end = Date.now() + 30000;
  for (let pause = 5; ; pause = Math.min(pause * 2, 200)) {
    const m = await nc.request(subj, data, { timeout: 5000 });
    if (statusOf(m) !== 429 || Date.now() > end) return m;
    await new Promise((r) => setTimeout(r, pause / 2 + Math.random() * pause));
  }
}

/**
 * A stored message as a direct get returns it (null: none). body is the request form's
 * JSON ({seq, next_by_subj} or {last_by_subj}); none for the subject form. Its status is
 * read by statusOf, so a refusal of the read service is never taken for a message, nor a
 * stored message whose own headers say Status for a refusal.
 */
async function directGet(nc: NatsConnection, subj: string, body?: object): Promise<StoredMsg | null> {
  const m = await request(nc, subj, body);
  const h = m.headers;
  if (!h) throw new Error(`toolbus: direct get ${subj}: no headers in the reply`);
  const code = statusOf(m);
  if (code !== 0 && code >= 300) {
    if (code === 404) return null;
    throw new Error(`toolbus: direct get ${subj}: ${code} ${h.description || h.get('Description')}`);
  }
  const seq = Number(h.get('Nats-Sequence'));
  if (!Number.isInteger(seq) || seq <= 0) throw new Error(`toolbus: direct get ${subj}: no sequence in the reply`);
  const time = new Date(Date.parse(h.get('Nats-Time-Stamp')));
  return { subject: h.get('Nats-Subject'), seq, header: h, data: m.data, time, timestamp: time.toISOString(), lastSequence: 0,
    json: <T>() => JSON.parse(dec.decode(m.data)) as T, string: () => dec.decode(m.data) } as unknown as StoredMsg;
}

/**
 * A bucket as a team account reaches it (the Go twin is store.NewDirectKV): reads by
 * direct get in subject form (<apiPrefix>.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>,
 * which the core exports per key prefix), writes by publishing on $KV.<bucket>.<key>.
 * It needs no bucket info (which would list every key).
 */
class DirectKV implements Store {
  /** Set while the direct gets go unanswered: the read service (leader) is asked first. */
  private viaLeader = false;

  /**
   * leader is the prefix of the core's read service for the bucket's keys in a team
   * account (teamReadLocal of KV_<bucket> and $KV.<bucket>.; '' for none): a replicated
   * bucket serves no direct gets (nothing answers them), and the read service answers the
   * same get from the leader. The handle asks where the last answer came from first (the
   * Go twin is store.NewTeamKV).
   */
  constructor(private readonly nc: NatsConnection, private readonly js: JetStreamClient, private readonly apiPrefix: string,
    private readonly bucket: string, private readonly leader = '') {}

  private subject(k: string) {
    return `$KV.${this.bucket}.${k}`;
  }

  /** The last message of k, delete and purge markers included. */
  async last(k: string): Promise<Entry | null> {
    const sm = await this.getLast(k);
    if (!sm) return null;
    const op = sm.header.get('KV-Operation');
    return { value: sm.data, revision: sm.seq, created: sm.time, operation: op === 'DEL' || op === 'PURGE' ? op : 'PUT' };
  }

  /** The last message of k by a direct get, or through the read service when nobody answers that (or the other way round). */
  private async getLast(k: string): Promise<StoredMsg | null> {
    const direct = `${this.apiPrefix}.DIRECT.GET.KV_${this.bucket}.`;
    if (!this.leader) return directGet(this.nc, direct + this.subject(k));
    const [first, second] = this.viaLeader ? [this.leader, direct] : [direct, this.leader];
    try {
      return await directGet(this.nc, first + this.subject(k));
    } catch (err) {
      if (!isNoResponders(err)) throw err;
      this.viaLeader = first === direct;
      return directGet(this.nc, second + this.subject(k));
    }
  }

  /** The last entry of k, a delete marker included (as KV.get). */
  get(k: string): Promise<Entry | null> {
    return this.last(k);
  }

  async put(k: string, v: Uint8Array): Promise<number> {
    return (await jsPublish(this.js, this.subject(k), v)).seq;
  }

  async update(k: string, v: Uint8Array, rev: number): Promise<number> {
    return (await jsPublish(this.js, this.subject(k), v, { expect: { lastSubjectSequence: rev } })).seq;
  }

  async create(k: string, v: Uint8Array): Promise<number> {
    try {
      return await this.update(k, v, 0);
    } catch (err) {
      if (!isConflict(err)) throw err;
      const e = await this.last(k);
      if (e && e.operation !== 'PUT') return this.update(k, v, e.revision);
      throw err;
    }
  }

  async delete(k: string): Promise<void> {
    const h = natsHeaders();
    h.set('KV-Operation', 'DEL');
    await jsPublish(this.js, this.subject(k), new Uint8Array(0), { headers: h });
  }
}

const codeOf = (err: unknown) => (err instanceof JetStreamApiError ? err.code : 0);
/** JetStream's "wrong last sequence" (a compare-and-set or create lost). */
export const isConflict = (err: unknown) => codeOf(err) === 10071 || /wrong last sequence/i.test(String((err as Error)?.message));

/** The toolbus stream and stores on one connection: the operations of executors and clients. */
export class Bus {
  readonly js: JetStreamClient;
  readonly stream: string;
  /** The queue stream of the stream (queueStreamName): the stream of the tools' queues. */
  readonly queues: string;
  /** The JetStream API prefix of a team account ('' in the core account). */
  readonly apiPrefix: string;
  /** The read service's prefix of a client in a client account (BusOptions.readPrefix; '' otherwise). */
  readonly readPrefix: string;
  private kvs = new Map<string, Promise<Store>>();
  private jsmP?: Promise<JetStreamManager>;

  private readonly msgKey?: Buffer;
  private readonly signer?: Signer;

  constructor(readonly nc: NatsConnection, opts: BusOptions = {}) {
    this.apiPrefix = opts.apiPrefix ?? '';
    this.readPrefix = opts.readPrefix ?? '';
    if (this.apiPrefix && this.readPrefix) throw new Error('toolbus: a bus is in a team account (apiPrefix) or a client account (readPrefix), not both');
    this.msgKey = opts.msgKey;
    this.signer = opts.signer;
    this.js = jetstream(nc, this.apiPrefix ? { apiPrefix: this.apiPrefix } : {});
    this.stream = opts.stream || 'TOOLBUS';
    this.queues = queueStreamName(this.stream);
  }

  /** The Nats-Msg-Id of an event of id: the id, or in a team account with a key its keyed form. */
  msgID(id: string): string {
    if (!this.team || !this.msgKey) return id;
    return `${id}/guarded/${createHmac('sha256', this.msgKey).update(id).digest().subarray(0, 16).toString('base64url')}`;
  }

  /** Opened in a team account (BusOptions.apiPrefix): it trusts what a call says of its run and reads no run. */
  get team(): boolean {
    return this.apiPrefix !== '';
  }

  /** Opened in a client account (BusOptions.readPrefix): it reads only through the core's read service. */
  get clientAccount(): boolean {
    return this.readPrefix !== '';
  }

  /** The JetStream manager of the bus: the core's API, or what the account imports under its prefix. */
  jsm(): Promise<JetStreamManager> {
    const prefix = this.apiPrefix || this.readPrefix;
    this.jsmP ??= jetstreamManager(this.nc, { checkAPI: false, ...(prefix ? { apiPrefix: prefix } : {}) });
    return this.jsmP;
  }

  /** A bucket of the core account by name, with every KV operation (not in a team or client account). */
  kv(bucket: string): Promise<KV> {
    if (this.team) return Promise.reject(new Error(`toolbus: bucket ${bucket} is not available by name in a team account`));
    if (this.clientAccount) return Promise.reject(new Error(`toolbus: bucket ${bucket} is not available by name in a client account (read its keys with store())`));
    return this.store(bucket) as Promise<KV>;
  }

  /** A bucket for what executors and clients do with it: by name, or by exported keys in a team account. */
  store(bucket: string): Promise<Store> {
    let p = this.kvs.get(bucket);
    if (!p) {
      // A client account reads the keys of its runs (and the catalog) by direct get under
      // the read service's prefix; it writes none (its account imports no key).
      const prefix = this.apiPrefix || this.readPrefix;
      // A team reads through the core's read service where the bucket serves no direct gets (replicated).
      const leader = this.team ? teamReadLocal(`KV_${bucket}`, '') : '';
      p = prefix ? Promise.resolve(new DirectKV(this.nc, this.js, prefix, bucket, leader)) : new Kvm(this.nc).open(bucket);
      this.kvs.set(bucket, p);
      p.catch(() => this.kvs.delete(bucket));
    }
    return p;
  }

  /** The message of the stream at seq, or the next one on subj from seq (null: none). */
  async getMsg(q: { seq: number; next_by_subj?: string } | { last_by_subj: string }): Promise<StoredMsg | null> {
    if (this.team) {
      // A team reaches only the last message of the subjects exported to it (its tools' results).
      if (!('last_by_subj' in q)) throw new Error(`toolbus: reading the stream ${this.stream} is not available in a team account`);
      // Where the stream serves no direct gets, its read mirror does (the core exports the
      // last result of the team's tools there too); replicated, neither does, and the
      // core's read service answers from the stream's leader (the Go twin is
      // events.teamStream.GetLastMsgForSubject). With none of them, the claim's done mark
      // is all there is to go by.
      const tries = [`${this.apiPrefix}.DIRECT.GET.${this.stream}.`, `${this.apiPrefix}.DIRECT.GET.${this.stream}_READ.`, teamReadLocal(this.stream, '')];
      for (const at of tries) {
        try {
          return await directGet(this.nc, at + q.last_by_subj);
        } catch (err) {
          if (!isNoResponders(err) && !/no responders|503/i.test(String((err as Error)?.message ?? err))) throw err;
        }
      }
      return null;
    }
    if (this.clientAccount) {
      // The read service answers direct gets of the runs visible to the identity of its
      // prefix; any other run answers as absent (null).
      try {
        const base = `${this.readPrefix}.DIRECT.GET.${this.stream}`;
        return 'last_by_subj' in q ? await directGet(this.nc, `${base}.${q.last_by_subj}`) : await directGet(this.nc, base, q);
      } catch (err) {
        if (isNoResponders(err)) throw this.noReadService(err);
        throw err;
      }
    }
    try {
      return await (await this.jsm()).streams.getMessage(this.stream, q as never);
    } catch (err) {
      throw noJetStreamHere(err) ? this.noJetStream(err) : err;
    }
  }

  private noJetStream(err: unknown): Error {
    return new Error(`toolbus: reading the stream ${this.stream}: ${(err as Error).message}: ` +
      'no JetStream in this account; a client in a client account reads through the read service (readPrefix, TOOLBUS_NATS_READ_PREFIX)', { cause: err });
  }

  private noReadService(err: unknown): Error {
    return new Error(`toolbus: no read service answered under ${this.readPrefix} (${(err as Error).message}): ` +
      'it runs in every `toolbus injector` and `toolbus up`, and the client account imports toolbus_read.<id>.> only for the identities it is bound to', { cause: err });
  }

  /** The stream's last sequence (STREAM.INFO, under the read service's prefix in a client account). */
  async lastSeq(): Promise<number> {
    if (this.clientAccount) {
      const subj = `${this.readPrefix}.STREAM.INFO.${this.stream}`;
      let m: Msg;
      try {
        m = await request(this.nc, subj);
      } catch (err) {
        throw isNoResponders(err) ? this.noReadService(err) : err;
      }
      const code = statusOf(m);
      if (code >= 300) throw new Error(`toolbus: ${subj}: ${code} ${m.headers?.description || m.headers?.get('Description')}`);
      const info = JSON.parse(dec.decode(m.data)) as { error?: { code: number; err_code?: number; description?: string }; state?: { last_seq?: number } };
      if (info.error) throw new Error(`toolbus: ${subj}: ${info.error.code} ${info.error.description ?? ''} (${info.error.err_code ?? 0})`);
      const last = info.state?.last_seq;
      if (typeof last !== 'number') throw new Error(`toolbus: ${subj}: no last_seq in the answer`);
      return last;
    }
    try {
      return (await (await this.jsm()).streams.info(this.stream)).state.last_seq;
    } catch (err) {
      throw noJetStreamHere(err) ? this.noJetStream(err) : err;
    }
  }

  /** Every message of a subject filter, in order, read with gets (no consumer needed). */
  async *read(filter: string, from = 1): AsyncGenerator<StoredMsg> {
    for (let seq = from; ;) {
      const sm = await this.getMsg({ seq, next_by_subj: filter });
      if (!sm) return;
      if (sm.seq < seq) throw new Error(`toolbus: reading ${filter} from ${seq}: the answer is message ${sm.seq}, an earlier one`);
      yield sm;
      seq = sm.seq + 1;
    }
  }

  /**
   * Publishes an event once (CONTRACT.md, "A duplicate is the same event"): a duplicate
   * acknowledgement counts only when the message stored under the id is this event;
   * otherwise the id was squatted and the event is stored under the per-subject guard.
   * isOurs tells this event among stored messages (its data names the same thing);
   * conditions are headers of the first publish only (Nats-Expected-*): a failed one
   * rejects with the stream's error (isConflict).
   */
  async publish(subj: string, attrs: Attrs, data: unknown, isOurs: (d: any) => boolean = () => true,
    conditions: Record<string, string> = {}): Promise<void> {
    const body = enc.encode(JSON.stringify(data));
    const first = eventHeaders(attrs);
    for (const [k, v] of Object.entries(conditions)) first.set(k, v);
    this.signer?.sign(first as unknown as Headers, body);
    let ack: PubAck;
    try {
      ack = await jsPublish(this.js, subj, body, { msgID: this.msgID(attrs.id), headers: first });
    } catch (err) {
      if (err instanceof WriteRefusedError) throw err;
      if (this.clientAccount && isNoResponders(err)) throw new NotBoundError(subj.split('.').at(-1) ?? '', subj, { cause: err });
      throw err;
    }
    const h = eventHeaders(attrs);
    // In a team account only the core and the team publish on its tools' subjects: a
    // duplicate is this event (and the team may not read the stream to check).
    if (!ack.duplicate || this.team) return;
    const ours = (sm: StoredMsg | null) => {
      if (!sm || sm.subject !== subj || sm.header.get('ce-id') !== attrs.id || sm.header.get('ce-type') !== attrs.type) return false;
      try {
        return isOurs(JSON.parse(dec.decode(sm.data)));
      } catch {
        return false;
      }
    };
    // By subject from the acknowledged sequence: the read service of a client account
    // answers no get by sequence alone.
    if (ours(await this.getMsg({ seq: ack.seq, next_by_subj: subj }))) return;
    h.set('Nats-Msg-Id', `${attrs.id}/guarded/${randomUUID()}`);
    this.signer?.sign(h as unknown as Headers, body);
    for (let tries = 0; tries < 100; tries++) {
      let last = 0;
      for await (const sm of this.read(subj)) {
        if (ours(sm)) return; // stored already (a re-publish, or another process)
        last = sm.seq;
      }
      try {
        await jsPublish(this.js, subj, body, { headers: h, expect: { lastSubjectSequence: last } });
        return;
      } catch (err) {
        if (!isConflict(err)) throw err;
        if (this.clientAccount && last === 0) {
          // The subject holds messages the read service does not show: a run not visible to this identity.
          throw new Error(`toolbus: event ${attrs.id}: the run ${attrs.runid ?? ''} is not visible to the identity of ${this.readPrefix}`, { cause: err });
        }
      }
    }
    throw new Error(`toolbus: event ${attrs.id}: the subject ${subj} kept changing`);
  }

  /** The first run.started of a run whose data agrees with its subject, and its sequence; null: never started. */
  async runStarted(run: string): Promise<{ rs: RunStarted; seq: number } | null> {
    for await (const sm of this.read(subject.runStartedAny(run))) {
      let ev: Event<RunStarted>;
      try {
        ev = decodeEvent<RunStarted>(sm.header, sm.data);
      } catch {
        continue;
      }
      if (agreeingRun(sm.subject, ev, Type.runStarted) === run) return { rs: ev.data, seq: sm.seq };
    }
    return null;
  }

  /** The outcome of a run that ended (its run state), or '' while it goes on. */
  async runEnded(run: string): Promise<string> {
    if (this.team) return ''; // a team reads no run state: a run's end reaches it as a cancel
    const e = await (await this.store(Bucket.runs)).get(run);
    if (!e || e.operation !== 'PUT') return '';
    try {
      const st = JSON.parse(dec.decode(e.value));
      return (TERMINAL as readonly string[]).includes(st.status) ? st.status : '';
    } catch {
      return '';
    }
  }

  /** Whether the stream holds the tool.finished of a call (by its id, on its queue's result subject). */
  async resultStored(queue: string, run: string, step: number, callID: string): Promise<boolean> {
    const want = id.toolFinished(run, step, callID);
    const isIt = (sm: StoredMsg) => {
      if (sm.header.get('ce-id') !== want || sm.header.get('ce-type') !== Type.toolFinished) return false;
      try {
        const d = JSON.parse(dec.decode(sm.data));
        return d.run_id === run && d.call_id === callID && d.step === step;
      } catch {
        return false; // a forgery under the id: not the result
      }
    };
    if (this.team) {
      // Only the last result of the tool in the run is readable there; the claim's done
      // mark says the rest (Claim.done).
      const last = await this.getMsg({ last_by_subj: subject.toolFinished(run, queue) });
      return !!last && isIt(last);
    }
    for await (const sm of this.read(subject.toolFinished(run, queue))) if (isIt(sm)) return true;
    return false;
  }

  // -- claims: the revision is the fencing token; every change of owner is a compare-and-set.

  /** Creates a call's claim; returns its revision, or the current claim and revision when it exists. */
  async claimCall(k: string, c: Claim): Promise<{ created: true; rev: number } | { created: false; cur: Claim; rev: number }> {
    const kv = await this.store(Bucket.claims);
    try {
      return { created: true, rev: await kv.create(k, enc.encode(JSON.stringify(c))) };
    } catch (err) {
      if (!isConflict(err)) throw err;
    }
    const e = await kv.get(k);
    if (!e || e.operation !== 'PUT') return this.claimCall(k, c); // released meanwhile
    return { created: false, cur: JSON.parse(dec.decode(e.value)), rev: e.revision };
  }

  /** Replaces the claim at revision rev; null when someone changed it first. */
  async updateClaim(k: string, c: Claim, rev: number): Promise<number | null> {
    try {
      return await (await this.store(Bucket.claims)).update(k, enc.encode(JSON.stringify(c)), rev);
    } catch (err) {
      if (isConflict(err)) return null;
      throw err;
    }
  }

  async releaseClaim(k: string): Promise<void> {
    await (await this.store(Bucket.claims)).delete(k);
  }

  /**
   * Takes one of the limit slots of run and tool (the queue's token) for a call (callKey
   * is its claim key), as store.AcquireRunSlot does: a create of one of up to 8 keys from
   * the call's hash on, then a take-over of a slot whose holder is no longer alive.
   * Returns the slot, or null when the run has limit calls in flight.
   */
  async acquireRunSlot(queue: string, run: string, limit: number, callKey: string, holder: { team?: string; instance: string; boot: string }): Promise<number | null> {
    const kv = await this.store(Bucket.claims);
    const val = enc.encode(JSON.stringify({ ...(holder.team ? { team: holder.team } : {}), instance: holder.instance, ...(holder.boot ? { boot: holder.boot } : {}), call: callKey }));
    const start = fnv32(callKey) % limit;
    const tries = Math.min(limit, 8);
    for (let j = 0; j < tries; j++) {
      const i = (start + j) % limit;
      try {
        await kv.create(key.runSlot(queue, run, i), val);
        return i;
      } catch (err) {
        if (!isConflict(err)) throw err;
      }
    }
    // Full: take over the slots of executors that died holding them.
    const alive = new Map<string, boolean>();
    for (let j = 0; j < tries; j++) {
      const i = (start + j) % limit;
      const e = await kv.get(key.runSlot(queue, run, i)).catch(() => null);
      if (!e || e.operation !== 'PUT') continue; // released meanwhile: the next acquisition gets it
      let held: { team?: string; instance?: string; boot?: string };
      try {
        held = JSON.parse(dec.decode(e.value));
      } catch {
        continue;
      }
      const owner = JSON.stringify([held.team ?? '', held.instance ?? '', held.boot ?? '']);
      let ok = alive.get(owner);
      if (ok === undefined) {
        ok = await this.instanceAlive(held.team ?? '', held.instance ?? '', held.boot ?? '');
        alive.set(owner, ok);
      }
      if (!ok) {
        try {
          await kv.update(key.runSlot(queue, run, i), val, e.revision);
          return i;
        } catch (err) {
          if (!isConflict(err)) throw err;
        }
      }
    }
    return null;
  }

  /** Frees a slot taken by acquireRunSlot. */
  async releaseRunSlot(queue: string, run: string, slot: number): Promise<void> {
    await (await this.store(Bucket.claims)).delete(key.runSlot(queue, run, slot));
  }

  // -- instances: an executor's lease.

  async putInstance(in_: Instance): Promise<number> {
    return (await this.store(Bucket.instances)).put(key.instance(in_.team ?? '', in_.name, in_.boot ?? ''), enc.encode(JSON.stringify(in_)));
  }

  /** When the server stored the instance record at revision rev or later (null: gone, or a lagging read). */
  async instanceStoredAt(team: string, name: string, boot: string, rev: number): Promise<Date | null> {
    const e = await (await this.store(Bucket.instances)).get(key.instance(team, name, boot));
    return e && e.operation === 'PUT' && e.revision >= rev ? e.created : null;
  }

  async deleteInstance(team: string, name: string, boot: string): Promise<void> {
    await (await this.store(Bucket.instances)).delete(key.instance(team, name, boot));
  }

  async instanceAlive(team: string, name: string, boot: string): Promise<boolean> {
    const e = await (await this.store(Bucket.instances)).get(key.instance(team, name, boot));
    return !!e && e.operation === 'PUT';
  }

  // -- approvals, outputs, catalog.

  async decision(run: string, step: number, callID: string): Promise<Decision | null> {
    const e = await (await this.store(Bucket.approvals)).get(key.decision(run, step, callID));
    if (!e || e.operation !== 'PUT') return null;
    return JSON.parse(dec.decode(e.value));
  }

  /** Keeps a whole output in chunks, then its meta; returns its reference. */
  async putOutput(queue: string, run: string, step: number, callID: string, data: Uint8Array): Promise<string> {
    const kv = await this.store(Bucket.outputs);
    const k = key.output(queue, run, step, callID);
    let n = 0;
    const put = async (kk: string, v: Uint8Array) => {
      try {
        await kv.put(kk, v);
      } catch (err) {
        throw writeRefusal(err, `$KV.${Bucket.outputs}.${kk}`);
      }
    };
    for (let off = 0; off < data.length || n === 0; off += OUTPUT_CHUNK) {
      await put(`${k}.${n}`, data.subarray(off, Math.min(off + OUTPUT_CHUNK, data.length)));
      n++;
    }
    const sha256 = createHash('sha256').update(data).digest('hex');
    await put(`${k}.meta`, enc.encode(JSON.stringify({ size: data.length, chunks: n, sha256 })));
    return `kv://${Bucket.outputs}/${k}`;
  }

  /** Reads an output kept by putOutput, by its reference. */
  async output(ref: string): Promise<Uint8Array> {
    const kv = await this.store(Bucket.outputs);
    const k = ref.replace(`kv://${Bucket.outputs}/`, '');
    const me = await kv.get(`${k}.meta`);
    if (!me || me.operation !== 'PUT') throw new Error(`toolbus: output ${k} not found`);
    const meta = JSON.parse(dec.decode(me.value));
    const parts: Uint8Array[] = [];
    for (let i = 0; i < meta.chunks; i++) {
      const e = await kv.get(`${k}.${i}`);
      if (!e) throw new Error(`toolbus: output ${k} chunk ${i} not found`);
      parts.push(e.value);
    }
    const all = Buffer.concat(parts);
    if (createHash('sha256').update(all).digest('hex') !== meta.sha256) throw new Error(`toolbus: output ${k} does not match its checksum`);
    return all;
  }

  /**
   * Offers a contract to the catalog: created, kept when the same, replaced by a higher
   * version or on purpose (replace); any other offer is refused (ContractChangedError).
   */
  async publishTool(c: ToolContract, replace: boolean): Promise<void> {
    const kv = await this.store(Bucket.tools);
    const body = enc.encode(JSON.stringify(c));
    for (let attempt = 0; ; attempt++) {
      const e = await kv.get(c.name);
      if (!e || e.operation !== 'PUT') {
        try {
          await kv.create(c.name, body);
          return;
        } catch (err) {
          if (!isConflict(err) || attempt > 3) throw err;
          continue;
        }
      }
      let cur: ToolContract | undefined;
      try {
        cur = JSON.parse(dec.decode(e.value));
      } catch {
        cur = undefined;
      }
      if (cur) {
        if (canonicalJSON(normalizeContract(cur)) === canonicalJSON(normalizeContract(c))) return;
        if (!replace && (c.version ?? 0) <= (cur.version ?? 0)) throw new ContractChangedError(c.name, cur, c);
      }
      try {
        await kv.update(c.name, body, e.revision);
        return;
      } catch (err) {
        if (attempt > 3) throw err;
      }
    }
  }

  /**
   * Binds the durable consumer of a tool's queue on the queue stream, creating it when it
   * is missing (and the credentials allow), as provision.ToolConsumerConfig does: filtered
   * on the tool's one queue subject, deliveries unlimited (executors bound the executions
   * of a call through its claim). Returns its ack wait in ms.
   */
  /**
   * Whether a tool's queue is reachable, asked with a pull that can take nothing (no_wait,
   * max_bytes 1: the consumer answers 404 when nothing is pending, 409 when something is,
   * and delivers nothing). A team asks the core's JetStream API nothing whose cost the
   * tenants share (the server answers every account's infos from one queue, which a team
   * could flood): the core exports no consumer info to a team. Throws the no-responders
   * error when the credentials no longer reach the queue. The Go twin is
   * events.Bus.ProbeQueue.
   */
  async probeQueue(tool: string): Promise<void> {
    const subj = `${this.apiPrefix || '$JS.API'}.CONSUMER.MSG.NEXT.${this.queues}.${toolConsumer(tool)}`;
    const m = await this.nc.request(subj, JSON.stringify({ batch: 1, max_bytes: 1, no_wait: true }), { timeout: 5000 });
    if (m.headers?.code === 409 && m.headers.description === 'Consumer Deleted') throw new Error(`toolbus: consumer ${toolConsumer(tool)} deleted`);
  }

  /**
   * The consumer of a tool's queue as a team binds it: built from what `toolbus init`
   * makes, with no request (pulled with `bind: true`, so no consumer info is asked
   * either when heartbeats are missed).
   */
  teamQueue(tool: string, ackWaitMS: number): Consumer {
    const name = toolConsumer(tool);
    return this.js.consumers.getConsumerFromInfo({
      name, stream_name: this.queues, created: new Date(0).toISOString(),
      config: { durable_name: name, filter_subject: subject.queue(tool), ack_policy: AckPolicy.Explicit, ack_wait: nanos(ackWaitMS) },
    } as unknown as ConsumerInfo);
  }

  async bindQueue(tool: string, ackWaitMS: number, maxAckPending: number): Promise<number> {
    const name = toolConsumer(tool);
    if (this.team) {
      try {
        await this.probeQueue(tool);
        return ackWaitMS; // a team cannot read the queue's own: its executors beat by theirs
      } catch (err) {
        throw new Error(`toolbus: the queue of ${tool} (consumer ${name} of ${this.queues}) is not reachable under ${this.apiPrefix} (${(err as Error).message}): ` +
          `an admin creates it in the core account with \`toolbus init --tools ${tool}\` and exports it to the team (the accounts layout)`, { cause: err });
      }
    }
    const jsm = await this.jsm();
    try {
      const info = await jsm.consumers.info(this.queues, name);
      return (info.config.ack_wait ?? nanos(ackWaitMS)) / 1e6;
    } catch (err) {
      if (this.team) {
        // A team account binds its durables by name and never creates one (the core does).
        throw new Error(`toolbus: the queue of ${tool} (consumer ${name} of ${this.queues}) is not reachable under ${this.apiPrefix} (${(err as Error).message}): ` +
          `an admin creates it in the core account with \`toolbus init --tools ${tool}\` and exports it to the team (the accounts layout)`, { cause: err });
      }
      if (codeOf(err) === 10059) { // stream not found
        throw new Error(`toolbus: the queue stream ${this.queues} does not exist (${(err as Error).message}): ` +
          `an admin creates it with \`toolbus init\` (a deployment made before the queue stream is upgraded by it)`, { cause: err });
      }
      if (codeOf(err) !== 10014) throw err; // consumer not found
    }
    try {
      const info = await jsm.consumers.add(this.queues, {
        durable_name: name,
        filter_subject: subject.queue(tool),
        ack_policy: AckPolicy.Explicit,
        deliver_policy: DeliverPolicy.New,
        ack_wait: nanos(ackWaitMS),
        max_deliver: -1,
        max_ack_pending: maxAckPending,
      });
      return (info.config.ack_wait ?? nanos(ackWaitMS)) / 1e6;
    } catch (err) {
      throw new Error(`toolbus: the queue of ${tool} (consumer ${name}) does not exist and could not be created (${(err as Error).message}): ` +
        `an admin creates it with \`toolbus init --tools ${tool}\``, { cause: err });
    }
  }
}

/** The catalog holds a different contract for the tool and the offer has no higher version. */
export class ContractChangedError extends Error {
  override name = 'ContractChangedError';
  constructor(readonly tool: string, readonly registered: ToolContract, readonly offered: ToolContract) {
    super(`toolbus: the catalog holds a different contract for ${tool} (owner ${registered.owner || '-'}, version ${registered.version ?? 0}); ` +
      `offer a higher version, or replace it on purpose (TOOLBUS_EXECUTOR_REPLACE_CONTRACTS=true)`);
  }
}

/** The contract as Go encodes it (zero optional fields left out), for comparisons. */
function normalizeContract(c: ToolContract): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(c)) {
    if (v === undefined || v === null || v === 0 || v === '' || (v === false && k !== 'read_only') || (Array.isArray(v) && v.length === 0)) continue;
    out[k] = v;
  }
  out.read_only = !!c.read_only;
  return out;
}

/** JSON with object keys sorted at every level: the deterministic content the model reads. */
export function canonicalJSON(v: unknown): string {
  if (v === null || typeof v !== 'object') return JSON.stringify(v) ?? 'null';
  if (Array.isArray(v)) return '[' + v.map((e) => canonicalJSON(e === undefined ? null : e)).join(',') + ']';
  const keys = Object.keys(v as object).filter((k) => (v as Record<string, unknown>)[k] !== undefined).sort();
  return '{' + keys.map((k) => JSON.stringify(k) + ':' + canonicalJSON((v as Record<string, unknown>)[k])).join(',') + '}';
}
