// The executor: serves registered tools on the bus with the executor side of the
// contract (CONTRACT.md; the Go twin is executor/worker). A delivery of a call goes
//
//   admit (decode, subject and body agree, the run, the lease, the claim)
//   → decide (run ended, not allowed, approvals)
//   → execute (arguments, timeouts, cancellation, progress, heartbeats)
//   → retry by the tool's policy, or publish the one result, then ack.
import { randomBytes } from 'node:crypto';
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import type { Consumer, ConsumerMessages, JsMsg } from '@nats-io/jetstream';
import type { ValidateFunction } from 'ajv';
import {
  Bus, ContractChangedError, PoisonError, TenantQuotaError, TenantStoreFullError, Type, WriteRefusedError, agreeingRun, callAttrs, callSubject, parentDigest, decodeEvent, id, isNoResponders, key, queueAckWait, source, subject,
  namesDecider, toolConsumer, toolTokenOfSubject, validRunID, validToolName,
  type Cancel, type Claim, type Decision, type FailedAttempt, type Principal, type RunStarted, type ToolCall, type ToolContract,
  type ToolProgress, type ToolRequested, type ToolResult,
} from './wire.js';
import { Redactor, checkArgumentsWith, compileSchema, jsonSchemaOf, errorResult, succeeded, violations, MIN_OUTPUT_BYTES } from './result.js';
import { Logger, Metrics, serveMetrics } from './ops.js';
import { RunOutcomes } from './outcomes.js';
import { otel, startCallSpan, type CallSpan } from './trace.js';
import { Signer } from './audit.js';
import { ConfigError, dial, msgKeyOf, secretsOf, settingsFromEnv, type Settings } from './settings.js';

// ---- the API of tools ------------------------------------------------------------------

/** What a running tool knows of its call. */
export interface ToolContext {
  /** Aborted when the call times out, its run is cancelled, or the executor lost its lease. */
  signal: AbortSignal;
  runId: string;
  step: number;
  callId: string;
  callIndex: number;
  tool: string;
  /** Who the run acts for, from the run's own run.started. */
  principal: Principal;
  /** The execution of the call, from 1 (a retry or a take-over runs it again). */
  attempt: number;
  /** Stable across attempts (<run>/<step>/<call_id>): pass it to side-effecting APIs. */
  idempotencyKey: string;
  /** The W3C trace context of the call, when the request carried one. */
  traceparent?: string;
  /**
   * Reports progress (tool.progress, throttled to one per interval, the latest kept).
   * It resets the heartbeat timeout of a long-running tool. False once the call's result
   * was decided: the report is not published.
   */
  progress(done: number, total?: number, message?: string): boolean;
  /** Whether the executor still holds the call (no other executor can have taken it over): check before an irreversible step. */
  leaseValid(): boolean;
}

/** A tool's retry policy: the runtime retries a failure it names with backoff, within the run's deadline. */
export interface Retry {
  /** Every attempt, the first included: 2 to 20. */
  maxAttempts: number;
  initialBackoffMS: number;
  maxBackoffMS: number;
  /** The error codes retried; empty: every failure the tool marked retryable. */
  codes?: string[];
}

/** A tool: its contract and its function. */
export interface Tool<A = any> {
  /** 1 to 64 of [A-Za-z0-9_-]. */
  name: string;
  /** What the model reads to choose the tool. */
  description: string;
  /**
   * The arguments' schema: a JSON Schema (an object), or a zod-like schema (zod 4: an
   * object with toJSONSchema(), whose JSON Schema the catalog gets; its safeParse then
   * checks refinements too, and its result, defaults and transforms applied, is what run
   * gets). Calls that violate it are rejected before run is called.
   */
  inputSchema: object;
  /** The output's schema (JSON Schema or zod-like): an output that violates it fails the call (invalid_tool_output). */
  outputSchema?: object;
  readOnly?: boolean;
  /** Each call waits for a person's decision (tool.waiting) before it runs. */
  needsApproval?: boolean;
  /** The tool's timeout (default TOOLBUS_CALL_TIMEOUT). */
  timeoutMS?: number;
  /** A long-running tool: a call that reports no progress for this long is timed out. */
  heartbeatTimeoutMS?: number;
  /** A call must be answered as a task: the MCP door refuses it to a host without tasks. */
  taskRequired?: boolean;
  /** The bound of what the model reads (default TOOLBUS_MAX_OUTPUT_BYTES; at least 256). */
  maxOutputBytes?: number;
  /** Calls of the tool run at once in this process (0: no bound but the executor's). */
  maxConcurrency?: number;
  /** Output keys whose values are always redacted. */
  redactFields?: string[];
  /** The contract's version: a changed contract needs a higher one. */
  version?: number;
  retry?: Retry;
  /** Runs the call; its return value is the output (a string is the text itself). Throw a ToolError for a failure with a code. */
  run(args: A, ctx: ToolContext): unknown | Promise<unknown>;
}

/** A tool's failure with a stable code (default tool_error) the model and the retry policy read. */
export class ToolError extends Error {
  override name = 'ToolError';
  readonly code: string;
  readonly retryable: boolean;
  readonly details?: unknown;
  constructor(code: string, message: string, opts: { retryable?: boolean; details?: unknown } = {}) {
    super(message);
    this.code = code || 'tool_error';
    this.retryable = !!opts.retryable;
    this.details = opts.details;
  }
}

// ---- registration ------------------------------------------------------------------------

interface Entry {
  tool: Tool;
  contract: ToolContract;
  input: ValidateFunction;
  output?: ValidateFunction;
  running: number;
  waiters: (() => void)[];
}

const NS = 1e6; // nanoseconds per millisecond: the catalog's durations are Go's

function contractOf(t: Tool, s: Settings, input: object, output?: object): ToolContract {
  const c: ToolContract = {
    name: t.name, description: t.description, input_schema: input, read_only: !!t.readOnly,
    timeout: Math.round((t.timeoutMS || s.callTimeoutMS) * NS),
    max_output_bytes: t.maxOutputBytes || s.maxOutputBytes,
  };
  if (output) c.output_schema = output;
  if (t.needsApproval) c.needs_approval = true;
  if (t.heartbeatTimeoutMS) c.heartbeat_timeout = Math.round(t.heartbeatTimeoutMS * NS);
  if (t.taskRequired) c.task_required = true;
  if (t.maxConcurrency) c.max_concurrency = t.maxConcurrency;
  if (t.redactFields?.length) c.redact_fields = t.redactFields;
  if (s.team) c.owner = s.team;
  if (t.version) c.version = t.version;
  if (t.retry) {
    c.retry = { max_attempts: t.retry.maxAttempts, initial_backoff: Math.round(t.retry.initialBackoffMS * NS),
      max_backoff: Math.round(t.retry.maxBackoffMS * NS), ...(t.retry.codes?.length ? { codes: t.retry.codes } : {}) };
  }
  return c;
}

function checkTool(t: Tool): void {
  const bad = (why: string) => new Error(`toolbus: tool ${JSON.stringify(t?.name)}: ${why}`);
  if (!validToolName(t?.name)) throw bad('a name is 1 to 64 of [A-Za-z0-9_-]');
  if (!t.description) throw bad('no description (the model reads it)');
  if (typeof t.run !== 'function') throw bad('no run function');
  if (!t.inputSchema || typeof t.inputSchema !== 'object') throw bad('no input schema');
  if (t.maxOutputBytes !== undefined && t.maxOutputBytes !== 0 && t.maxOutputBytes < MIN_OUTPUT_BYTES) throw bad(`maxOutputBytes below ${MIN_OUTPUT_BYTES}`);
  for (const [k, v] of [['timeoutMS', t.timeoutMS], ['heartbeatTimeoutMS', t.heartbeatTimeoutMS], ['maxConcurrency', t.maxConcurrency]] as const) {
    if (v !== undefined && !(v >= 0)) throw bad(`${k} ${v}: want 0 or more`);
  }
  const r = t.retry;
  if (r) {
    if (!Number.isInteger(r.maxAttempts) || r.maxAttempts < 2 || r.maxAttempts > 20) throw bad(`retry.maxAttempts ${r.maxAttempts}: want 2 to 20 (the first attempt included)`);
    if (!(r.initialBackoffMS >= 1)) throw bad(`retry.initialBackoffMS ${r.initialBackoffMS}: want at least 1`);
    if (!(r.maxBackoffMS >= r.initialBackoffMS) || r.maxBackoffMS > 3600000) throw bad(`retry.maxBackoffMS ${r.maxBackoffMS}: want initialBackoffMS to 1h`);
  }
}

// ---- the lease -----------------------------------------------------------------------------

/**
 * The executor's hold on the calls it claimed: its instance record, renewed every fifth
 * of the TTL. It holds until start of the last acknowledged renewal + TTL − TTL/5; a
 * lapse ends it for every call that started under it (a new generation).
 */
class Lease {
  until = 0;
  /** The deadline by the server's clock (ms since the epoch; 0: unknown): what results carry as lease_until. */
  serverUntil = 0;
  gen = 0;
  private timer?: NodeJS.Timeout;
  constructor(readonly ttl: number, private readonly onLapse: () => void) {}
  renewed(start: number) {
    if (this.until && Date.now() >= this.until) this.lapse();
    const until = start + this.ttl - this.ttl / 5;
    if (until > this.until) {
      this.until = until;
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.fire(), Math.max(0, until - Date.now()));
      this.timer.unref();
    }
  }
  private fire() {
    if (Date.now() < this.until) {
      this.timer = setTimeout(() => this.fire(), this.until - Date.now());
      return;
    }
    this.lapse();
  }
  private lapse() {
    this.gen++;
    this.onLapse();
  }
  /**
   * Records when the server stored a renewal sent at start and acknowledged rtt later:
   * the record expires one TTL after that, so stored + TTL − margin − rtt is not later,
   * in real time, than the deadline the renewal set, with no clock offset involved.
   */
  stamp(stored: Date, rtt: number) {
    const until = stored.getTime() + this.ttl - this.ttl / 5 - rtt;
    if (until > this.serverUntil) this.serverUntil = until;
  }
  valid(gen = this.gen) {
    return gen === this.gen && Date.now() < this.until;
  }
  stop() {
    clearTimeout(this.timer);
  }
}

// ---- one delivery ----------------------------------------------------------------------------

class Handback extends Error {
  constructor(readonly delayMS: number, why: string) {
    super(why);
  }
}

const LEASE_LOST = 'lease lost (instance heartbeat not renewed in time): the call is handed back';

interface Delivery {
  msg: JsMsg;
  req: ToolRequested;
  traceparent?: string;
  /** The digest of the call's tool.requested, which the call's events name (ce-prevdigest). */
  prev: string;
  queue: string;
  rs: RunStarted;
  /** The stream sequence of the run's first run.started (0: unknown, in a team account). */
  startSeq: number;
  claimKey: string;
  claim: Claim;
  rev: number;
  gen: number;
  res?: ToolResult;
  ran: boolean;
  edit?: { who?: string; arguments: string };
  /** Gives back the run slot the call holds (a call of a step over runMaxInFlight calls). */
  releaseSlot?: () => Promise<void>;
  /** The call's span (OpenTelemetry, when installed). */
  span?: CallSpan;
}

/** A tool's queue as this executor pulls it, or parks it. */
interface Feed {
  tool: string;
  consumer: Consumer;
  messages?: ConsumerMessages;
  /** When it last delivered or finished a call (ms). */
  last: number;
  /** Its calls being handled. */
  busy: number;
  parked: boolean;
  rung: boolean;
  bell?: Subscription;
  /** The reconnections counted when it parked. */
  missed: number;
  nextCheck: number;
  checking: boolean;
}

function fmtDuration(ms: number): string {
  if (ms % 3600000 === 0 && ms) return `${ms / 3600000}h0m0s`;
  if (ms >= 60000) return `${Math.floor(ms / 60000)}m${(ms % 60000) / 1000}s`;
  if (ms >= 1000) return `${ms / 1000}s`;
  return `${ms}ms`;
}

const dec = new TextDecoder();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * How long the executor retries in place a write of a call that the core's write service
 * refused over the team's bytes per second (TenantQuotaError) or could not forward (503),
 * backing off from 100 ms to 2 s with heartbeats on the call meanwhile (the Go worker's
 * busRetryFor): the call is not handed back, so it is not run again. A refusal of the
 * write's form (400) is not retried: sending it again is refused again.
 */
export const WRITE_RETRY_MS = 120000;

/** Whether a refusal of the write service may pass when sent again. */
const passesLater = (err: unknown) => err instanceof TenantQuotaError || (err instanceof WriteRefusedError && err.code === 503);

/**
 * Whether a write at start-up (the instance record, the contracts) may pass when sent
 * again: also when nothing answers or it times out. In a team account the writes go
 * through the core's write service, which no injector may serve yet: a fleet started in
 * any order comes up (the Go worker's startupWrite).
 */
const passesAtStart = (err: unknown): boolean => {
  if (passesLater(err) || isNoResponders(err)) return true;
  for (let e = err as { name?: string; message?: string; cause?: unknown } | undefined, i = 0; e && i < 8; e = e.cause as typeof e, i++) {
    if (e.name === 'TimeoutError' || /no response from stream|timeout/i.test(String(e.message ?? ''))) return true;
  }
  return false;
};

/**
 * The reason of a write of a call the write service refused for good (400: its form, a
 * roll-up, its size), or undefined: no delivery of the call could make it, so the call
 * ends as one the credentials may not handle (denied), as in the Go worker.
 */
const refusedForGood = (err: unknown) => (err instanceof WriteRefusedError && !passesLater(err) ? err.message : undefined);

// ---- the executor --------------------------------------------------------------------------

export interface ExecutorOptions {
  /** Settings over those of the environment. */
  settings?: Partial<Settings>;
  /** The environment to read TOOLBUS_* from (default process.env). */
  env?: Record<string, string | undefined>;
  /** An open connection to use instead of dialling TOOLBUS_NATS_URL. */
  connection?: NatsConnection;
  /**
   * Decides whether the run's principal may call the tool with these arguments (already
   * validated), as the Go executor's Authorizer (executor.WithAuthorizer): a throw or a
   * rejection refuses the call, rejected / not_authorized, its message (a ToolError's, or
   * the error's) shown to the model after redaction, so it must carry no secret. Absent:
   * every call is allowed.
   */
  authorize?: Authorizer;
}

/** An authorization hook (ExecutorOptions.authorize). */
export type Authorizer = (principal: Principal, tool: string, args: unknown) => void | Promise<void>;

/**
 * Serves tools on the bus. register() the tools, then serve(): it binds each tool's
 * queue, records the instance (its lease) and the contracts, and runs calls until
 * stop() (or SIGINT/SIGTERM with handleSignals), then drains.
 */
export class Executor {
  readonly settings: Settings;
  readonly metrics = new Metrics();
  private readonly env: Record<string, string | undefined>;
  private readonly entries = new Map<string, Entry>();
  private readonly boot = randomBytes(6).toString('hex');
  private readonly src: string;
  private red: Redactor;
  private log: Logger;
  private bus?: Bus;
  private nc?: NatsConnection;
  private ownConn: boolean;
  private lease: Lease;
  private beatEveryMS = 10000;
  private inflight = new Map<string, Set<AbortController>>();
  private handled = new Set<string>();
  private cancelled = new Set<string>();
  private running = new Set<Promise<void>>();
  private feeds: Feed[] = [];
  private outcomes?: RunOutcomes;
  /** The last operation the server refused to the credentials, and when (ms). */
  private denial?: { op: string; subject: string; at: number };
  private reconnects = 0;
  /** Why the connection closed for good while serving (serve() then rejects with it). */
  private lost?: string;
  /** The tools served, in the order offered; unreachable those of them whose queue the credentials no longer reach (reachCheck). */
  private servedList: string[] = [];
  private unreachable = new Set<string>();
  private reachNext = 0;
  /**
   * The period of the reach check (the Go twin is executor/worker/reach.go): every period
   * the executor asks the server about one of its tools' queues in turn. A tool revoked
   * from the team (`toolbus admin revoke <team> <tool> -push`) takes the imports of its
   * queue away from the team's account, and the server answers "no responders": the
   * executor stops offering the tool (its instance record drops it, calls of it are
   * refused as unknown) and says why in one line; once the queue answers again (granted
   * again) it offers it again, with no restart.
   *
   * On a cluster a queue also answers "no responders" while its consumer elects a leader
   * (a node killed: only the leader subscribes the pulls), for seconds; a tool is dropped
   * only when its queue keeps answering so for reachConfirm more probes reachEveryMS/2 apart.
   */
  static reachEveryMS = 10000;
  /** How many more probes must find the queue gone before a tool is dropped. */
  static reachConfirm = 4;
  private reaching = false;
  /** Set once stop is requested (a confirmation in progress ends). */
  private stopping = false;
  private bellRefused = false;
  private pullOpts: { max_messages: number; expires: number; bind?: boolean } = { max_messages: 1, expires: 30000 };
  private readonly stopped: Promise<void>;
  private stopRequested!: () => void;
  private readonly servingP: Promise<void>;
  private servingResolve!: () => void;
  private readonly breakRule: string;
  private readonly authorize?: Authorizer;
  private metricsServer?: import('node:http').Server;

  constructor(opts: ExecutorOptions = {}) {
    this.env = opts.env ?? process.env;
    this.settings = { ...settingsFromEnv(this.env), ...opts.settings };
    const s = this.settings;
    if (s.readPrefix) {
      throw new ConfigError(`TOOLBUS_NATS_READ_PREFIX=${s.readPrefix} is a client's setting (a client account reads through the core's read service): ` +
        'an executor serves tools from its team\'s account (TOOLBUS_NATS_API_PREFIX) or the core account');
    }
    this.src = source('executor', s.instance);
    this.red = new Redactor(secretsOf(s.connection, this.env));
    this.log = new Logger(s.logLevel, s.logFormat, { component: 'executor', instance: s.instance, boot: this.boot }, this.red);
    this.nc = opts.connection;
    this.ownConn = !opts.connection;
    this.lease = new Lease(s.instanceTTLMS, () => this.leaseLost());
    // Breaks one rule of the contract on purpose (two_results, no_heartbeat,
    // ignore_live_claims), so the
    // conformance suite can show it notices. Never set it in production.
    this.breakRule = this.env.TOOLBUS_SDK_BREAK ?? '';
    this.authorize = opts.authorize;
    this.stopped = new Promise((r) => (this.stopRequested = r));
    void this.stopped.then(() => { this.stopping = true; });
    this.servingP = new Promise((r) => (this.servingResolve = r));
  }

  /** The address (host:port) of /metrics, /healthz and /readyz once serve() listens there (TOOLBUS_METRICS_ADDR). */
  metricsAddress(): string | undefined {
    const a = this.metricsServer?.address();
    return a && typeof a === 'object' ? `${a.address}:${a.port}` : undefined;
  }

  /** Resolves once serve() consumes every queue (the instance and the contracts are recorded). */
  serving(): Promise<void> {
    return this.servingP;
  }

  /** Adds a tool; its schemas are compiled now (an invalid one throws). */
  register<A>(tool: Tool<A>): this {
    checkTool(tool);
    if (this.entries.has(tool.name)) throw new Error(`toolbus: tool ${tool.name} registered twice`);
    // A zod-like schema stands for its JSON Schema in the catalog and for ajv.
    const inJSON = jsonSchemaOf(tool.inputSchema, `the input schema of ${tool.name}`, 'input');
    const outJSON = tool.outputSchema ? jsonSchemaOf(tool.outputSchema, `the output schema of ${tool.name}`, 'output') : undefined;
    this.entries.set(tool.name, {
      tool, contract: contractOf(tool, this.settings, inJSON, outJSON), running: 0, waiters: [],
      input: compileSchema(inJSON, `the input schema of ${tool.name}`),
      output: outJSON ? compileSchema(outJSON, `the output schema of ${tool.name}`) : undefined,
    });
    return this;
  }

  /** The contracts of the registered tools, as the catalog will hold them. */
  contracts(): ToolContract[] {
    return [...this.entries.values()].map((e) => e.contract);
  }

  private served(): string[] {
    const names = [...this.entries.keys()];
    if (!this.settings.tools.length) return names;
    for (const t of this.settings.tools) if (!this.entries.has(t)) throw new Error(`toolbus: tool ${t} of TOOLBUS_EXECUTOR_TOOLS is not registered`);
    return this.settings.tools;
  }

  /**
   * Serves until stop() is called (or, with handleSignals, SIGINT or SIGTERM), then
   * drains: intake stops, running calls get the grace period, then are cancelled and
   * handed back, the instance leaves the catalog. Rejects when it cannot start.
   */
  async serve(opts: { handleSignals?: boolean } = {}): Promise<void> {
    const s = this.settings;
    const served = this.served();
    if (!served.length) throw new Error('toolbus: no tools registered');
    this.servedList = served;
    if (s.metricsAddr) this.metricsServer = await serveMetrics(s.metricsAddr, this.metrics, this.log);
    this.nc ??= await dial(s.connection, `toolbus executor ${s.instance}`);
    this.metrics.connected = true;
    let draining = false;
    // A connection nats.js gave up on (a credential revoked and not replaced: the same
    // authentication error twice in a row) cannot work again: the executor stops, serve()
    // rejects with the reason (a process exits non-zero) and /healthz fails meanwhile, as
    // the Go executor does. A rotated credential is taken on the reconnection instead
    // (connectionOptions reads the file again). A connection the caller passed in is the
    // caller's to watch.
    if (this.ownConn) void this.nc.closed().then((err) => {
      if (draining) return;
      this.lost = `the NATS connection closed for good: ${err?.message ?? 'closed'} (a revoked credential? give the executor its new credentials file, TOOLBUS_NATS_CREDS)`;
      this.metrics.failed = this.lost;
      this.metrics.connected = false;
      this.log.error('executor stopping: it cannot work', { error: this.lost });
      this.stop();
    });
    void (async () => {
      for await (const st of this.nc!.status()) {
        if (st.type === 'disconnect') this.metrics.connected = false;
        if (st.type === 'error' && (st.error as Error)?.name === 'PermissionViolationError') this.recordDenial(st.error as Error & { operation?: string; subject?: string });
        if (st.type === 'reconnect') {
          this.metrics.connected = true;
          this.reconnects++; // rings may have been lost: parked queues pull again
        }
      }
    })().catch(() => {});
    // TOOLBUS_SIGNING_KEY: the team's key; every event the executor publishes is signed with it (CONTRACT.md, "Signed and chained events").
    const signer = this.env.TOOLBUS_SIGNING_KEY ? Signer.fromFile(this.env.TOOLBUS_SIGNING_KEY) : undefined;
    const bus = (this.bus = new Bus(this.nc, { stream: s.stream, apiPrefix: s.apiPrefix, msgKey: s.apiPrefix ? msgKeyOf(s.connection) : undefined, signer }));
    const onSignal = (sig: string) => {
      this.log.info('stopping', { signal: sig });
      this.stop();
    };
    if (opts.handleSignals) {
      process.once('SIGINT', onSignal);
      process.once('SIGTERM', onSignal);
    }
    // Cancellations: the run of the subject, once the body agrees.
    // In a team account no run.cancel arrives: the core tells the executors of a tool
    // that a run ended (toolbus_notice.<run>.ended.<tool>).
    const cancelSubs = s.apiPrefix
      ? served.map((t) => this.nc!.subscribe(subject.runEndedFor(t), { callback: (err, m) => { if (!err) this.onEndNotice(m.subject, m.data); } }))
      : [this.nc.subscribe(subject.runCancelAll, { callback: (err, m) => { if (!err) this.onCancel(m.subject, m.headers, m.data); } })];
    if (!s.apiPrefix) {
      // Run outcomes followed: a call of a run that goes on reads no run state.
      const outcomes = new RunOutcomes(this.nc, bus, () => this.reconnects);
      // A run the core ended otherwise than completed (a cancel the injector accepted from
      // a decider the run does not name, TOOLBUS_DECIDERS) ends its calls here too.
      outcomes.onEnded = (run, status) => {
        if (status !== 'completed' && this.inflight.get(run)?.size) this.cancelRun(run);
      };
      try {
        await outcomes.listen();
        this.outcomes = outcomes;
      } catch (err) {
        outcomes.close();
        this.log.warn('run outcomes not followed: each call reads its run\'s state (give the executor\'s credentials subscribe permission on toolbus.*.run.<outcome>)',
          { error: String((err as Error)?.message ?? err) });
      }
    }
    let stopBeat = async () => {};
    let parkWatch: NodeJS.Timeout | undefined;
    let reachWatch: NodeJS.Timeout | undefined;
    try {
      // Queues, then the instance (live before the tools are offered), then the contracts.
      let ackWait = queueAckWait(s.ackWaitMS, s.instanceTTLMS);
      for (const t of served) ackWait = Math.min(ackWait, await bus.bindQueue(t, queueAckWait(s.ackWaitMS, s.instanceTTLMS), s.maxAckPending));
      this.beatEveryMS = Math.max(ackWait / 3, 100);
      stopBeat = await this.startupWrite('instance record', () => this.heartbeat());
      for (const t of served) {
        try {
          await this.startupWrite(`catalog entry of ${t}`, () => bus.publishTool(this.entries.get(t)!.contract, s.replaceContracts));
        } catch (err) {
          if (err instanceof ContractChangedError) {
            this.metrics.contractRefused(t);
            this.log.error('tool contract refused: the catalog holds a different contract for this tool',
              { tool: t, registered_owner: err.registered.owner ?? '', registered_version: err.registered.version ?? 0 });
          }
          throw err;
        }
      }
      this.pullOpts = { max_messages: Math.min(s.concurrency, 256), expires: Math.max(1000, Math.min(30000, ackWait)), ...(bus.team ? { bind: true } : {}) };
      for (const t of served) {
        const consumer = bus.team ? bus.teamQueue(t, ackWait) : await bus.js.consumers.get(bus.queues, toolConsumer(t));
        const f: Feed = { tool: t, consumer, last: Date.now(), busy: 0,
          parked: false, rung: false, missed: 0, nextCheck: 0, checking: false };
        this.feeds.push(f);
        await this.pull(f);
      }
      // In a team account too: the core exports to the team, as a stream, where the calls of
      // each of its tools are published (toolbus.*.tool.requested.<tool>, the doorbell), and
      // the consumer info of each queue (under the team's API prefix).
      reachWatch = setInterval(() => void this.reachCheck(), Executor.reachEveryMS);
      if (s.parkAfterMS >= 0) parkWatch = setInterval(() => void this.watchFeeds(), Math.max(20, Math.min(500, s.parkAfterMS / 4)));
      this.metrics.ready = true;
      this.servingResolve();
      this.log.info('executor serving', { tools: served, concurrency: s.concurrency, stream: s.stream, team: s.team });
      await this.stopped;
      if (this.lost) throw new Error(`toolbus: ${this.lost}`);
    } finally {
      draining = true;
      this.metrics.ready = false;
      clearInterval(parkWatch);
      clearInterval(reachWatch);
      for (const f of this.feeds) {
        f.messages?.stop();
        f.bell?.unsubscribe();
      }
      await this.drain();
      for (const sub of cancelSubs) sub.unsubscribe();
      this.outcomes?.close();
      await stopBeat();
      if (opts.handleSignals) {
        process.off('SIGINT', onSignal);
        process.off('SIGTERM', onSignal);
      }
      if (this.ownConn) await this.nc.drain().catch(() => {});
      this.metricsServer?.close();
      this.log.info('executor stopped');
    }
  }

  /** Stops serving: serve() resolves once the executor drained. */
  stop(): void {
    this.stopRequested();
  }

  /** The tools offered now: the served ones whose queue the credentials reach. */
  private advertised(): string[] {
    return this.servedList.filter((t) => !this.unreachable.has(t));
  }

  /** Asks the server about the next tool's queue, and drops or restores the tool (reachEveryMS). */
  private async reachCheck(): Promise<void> {
    if (!this.servedList.length || !this.bus || this.reaching) return; // one check at a time (a confirmation outlasts a period)
    this.reaching = true;
    try {
      await this.checkReach([...this.servedList].sort()[this.reachNext++ % this.servedList.length]);
    } finally {
      this.reaching = false;
    }
  }

  /** Asks the server about tool's queue once: 'gone' (no responders), 'ok', or 'error' (anything else). */
  private async probe(tool: string): Promise<'gone' | 'ok' | 'error'> {
    try {
      // A team asks no consumer info (the core exports none): a pull that takes nothing.
      if (this.bus!.team) await this.bus!.probeQueue(tool);
      else await this.bus!.js.consumers.get(this.bus!.queues, toolConsumer(tool));
      return 'ok';
    } catch (err) {
      return isNoResponders(err) ? 'gone' : 'error';
    }
  }

  /** Drops (confirmed: reachConfirm) or restores tool after asking about its queue. */
  private async checkReach(tool: string): Promise<void> {
    const first = await this.probe(tool);
    if (first === 'error') return; // a slow server, a queue being created: not the credentials
    let gone = first === 'gone';
    if (gone && !this.unreachable.has(tool)) {
      this.log.debug(`tool ${tool}: its queue answers no responders; asking again before dropping it (a consumer electing its leader answers so for seconds)`, { tool });
    }
    for (let i = 0; gone && !this.unreachable.has(tool) && i < Executor.reachConfirm; i++) {
      await new Promise((r) => setTimeout(r, Executor.reachEveryMS / 2).unref());
      if (this.stopping) return;
      gone = (await this.probe(tool)) === 'gone';
    }
    if (gone && !this.unreachable.has(tool)) {
      this.unreachable.add(tool);
      this.log.error(`tool ${tool}: this team's credentials no longer reach its queue (revoked?); not serving it`, { tool, serving: this.advertised() });
    } else if (!gone && this.unreachable.delete(tool)) {
      this.log.info(`tool ${tool}: its queue is reachable again (granted again?); serving it`, { tool });
      const f = this.feeds.find((x) => x.tool === tool);
      if (f && !f.parked) {
        // Its pull may have ended on the refusals: pull afresh.
        f.messages?.stop();
        await this.pull(f).catch((err) => this.log.warn('pulling again failed', { tool, error: String((err as Error)?.message ?? err) }));
      }
    }
  }

  /** Starts pulling a tool's queue. */
  private async pull(f: Feed): Promise<void> {
    const messages = await f.consumer.consume(this.pullOpts);
    f.messages = messages;
    f.last = Date.now();
    void this.loop(messages, f);
  }

  private async loop(messages: ConsumerMessages, f: Feed): Promise<void> {
    for await (const m of messages) {
      f.last = Date.now();
      f.busy++;
      while (this.running.size >= this.settings.concurrency) await Promise.race(this.running);
      const p = this.handle(m).catch((err) => {
        this.log.warn('call handed back for redelivery', { subject: m.subject, error: String(err?.message ?? err) });
        m.nak(1000);
      });
      this.running.add(p);
      void p.finally(() => {
        this.running.delete(p);
        f.busy--;
        f.last = Date.now();
      });
    }
  }

  // -- parking idle queues (the Go twin is events/consume/park.go)
  //
  // A queue that delivered nothing for parkAfterMS listens to its doorbell (a core
  // subscription to where its calls are published, toolbus.*.tool.requested.<tool>:
  // nothing is published on its filter toolbus_queue.<tool>, the server copies the calls
  // into the queue stream; events.QueuePublishedOn), asks the server whether
  // anything is pending or unacknowledged on its consumer and, if nothing is, stops
  // pulling. It pulls again when the doorbell rings, when the connection reconnected
  // (rings may have been lost), and when a check finds work: one a second after parking
  // (a call stored before the doorbell listened), then every parkCheckMS.

  private async watchFeeds(): Promise<void> {
    const now = Date.now();
    for (const f of this.feeds) {
      if (f.checking) continue;
      f.checking = true;
      try {
        if (f.parked) await this.parkedFeed(f, now);
        else await this.park(f, now);
      } catch (err) {
        this.log.debug('park watch', { tool: f.tool, error: String((err as Error)?.message ?? err) });
      } finally {
        f.checking = false;
      }
    }
  }

  private async park(f: Feed, now: number): Promise<void> {
    // A team's queue does not park: it cannot ask whether anything is unacknowledged
    // (no consumer info), and a redelivery rings no doorbell.
    if (this.bus?.team || this.bellRefused || f.busy > 0 || now - f.last < this.settings.parkAfterMS || this.metrics.ready === false) return;
    const missed = this.reconnects;
    f.rung = false;
    let refused: Error | undefined;
    const bell = this.nc!.subscribe(subject.toolRequestedAll(f.tool), {
      callback: (err) => {
        if (err) refused = err;
        else f.rung = true;
      },
    });
    try {
      await this.nc!.flush();
    } catch (err) {
      bell.unsubscribe();
      f.last = now; // try again once idle for as long again
      throw err;
    }
    if (refused || bell.isClosed()) {
      // The credentials may not listen: no queue of this executor tries again.
      this.bellRefused = true;
      bell.unsubscribe();
      this.log.warn('idle queues keep pulling (grant the credentials subscribe permission on toolbus.*.tool.requested.<tool>, where their calls are published: deploy/nats/permissions.conf)',
        { tool: f.tool, error: String(refused?.message ?? 'subscription refused') });
      return;
    }
    // Asked once the doorbell listens: a call published after this rings it.
    if (!(await this.nothingWaits(f)) || f.busy > 0 || !this.metrics.ready) {
      bell.unsubscribe();
      f.last = now;
      return;
    }
    f.bell = bell;
    f.missed = missed;
    f.parked = true;
    f.nextCheck = now + 1000;
    // Stopped after what the pull already holds is handled (stop() ends the loop after it).
    f.messages?.stop();
    f.messages = undefined;
    this.metrics.queuesParked++;
    this.log.debug('queue parked', { tool: f.tool });
  }

  private async parkedFeed(f: Feed, now: number): Promise<void> {
    let why = '';
    if (f.rung) why = 'rung';
    else if (this.reconnects !== f.missed) why = 'reconnected';
    else if (now >= f.nextCheck) {
      const check = this.settings.parkCheckMS;
      f.nextCheck = now + check / 2 + Math.random() * (check / 2);
      if (!(await this.nothingWaits(f))) why = 'work waits';
    }
    if (!why || !this.metrics.ready) return;
    f.bell?.unsubscribe();
    f.bell = undefined;
    f.parked = false;
    f.rung = false;
    this.metrics.queuesParked--;
    this.log.debug('queue pulls again', { tool: f.tool, why });
    try {
      await this.pull(f);
    } catch (err) {
      // Parked again with a ring pending: tried at the next tick.
      f.parked = true;
      this.metrics.queuesParked++;
      f.rung = true;
      this.log.warn('pulling again failed', { tool: f.tool, error: String((err as Error)?.message ?? err) });
    }
  }

  /** Whether the server has nothing pending or unacknowledged on the feed's consumer (false when it cannot tell). */
  private async nothingWaits(f: Feed): Promise<boolean> {
    try {
      const ci = await f.consumer.info();
      return ci.num_pending === 0 && ci.num_ack_pending === 0;
    } catch {
      return false;
    }
  }

  /** Whether a tool's queue is parked (it pulls nothing until a call is published for it). */
  parked(tool: string): boolean {
    return !!this.feeds.find((f) => f.tool === tool)?.parked;
  }

  private async drain(): Promise<void> {
    const all = Promise.allSettled([...this.running]);
    const grace = new Promise((r) => setTimeout(r, this.settings.graceMS).unref());
    if (await Promise.race([all.then(() => true), grace.then(() => false)])) return;
    for (const set of this.inflight.values()) for (const ac of set) ac.abort(new Error('shutdown'));
    await all;
  }

  // -- liveness

  private async heartbeat(): Promise<() => Promise<void>> {
    const s = this.settings;
    const bus = this.bus!;
    const started = new Date().toISOString();
    const put = async () => {
      const start = Date.now();
      const rev = await bus.putInstance({ ...(s.team ? { team: s.team } : {}), name: s.instance, boot: this.boot, tools: this.advertised(), concurrency: s.concurrency,
        started_at: started, heartbeat_at: new Date(start).toISOString() });
      this.lease.renewed(start);
      const rtt = Date.now() - start;
      // The fencing deadline by the server's clock; on a failed read results keep the earlier one.
      const stored = await bus.instanceStoredAt(s.team, s.instance, this.boot, rev).catch(() => null);
      if (stored) this.lease.stamp(stored, rtt);
    };
    await put();
    const every = Math.max(s.instanceTTLMS / 5, 20);
    // A renewal the write service refuses over the team's bytes per second (or could not
    // forward) is sent again within half a period, as the Go worker's renew: left to the
    // next period, a few refusals in a row would lapse the lease and hand every call back.
    const renew = async () => {
      const end = Date.now() + every / 2;
      for (let pause = 20; ; pause = Math.min(pause * 2, 250)) {
        try {
          return await put();
        } catch (err) {
          if (!passesLater(err) || Date.now() + pause > end) throw err;
          await sleep(pause / 2 + Math.random() * (pause / 2));
        }
      }
    };
    const timer = setInterval(() => renew().catch((err) => this.log.warn('instance heartbeat failed', { error: String(err?.message ?? err) })), every);
    return async () => {
      clearInterval(timer);
      this.lease.stop();
      await bus.deleteInstance(s.team, s.instance, this.boot).catch((err) =>
        this.log.warn('instance not removed from the catalog; it expires by itself', { error: String(err?.message ?? err) }));
    };
  }

  private leaseLost() {
    let n = 0;
    for (const set of this.inflight.values()) for (const ac of set) {
      ac.abort(new Error(LEASE_LOST));
      n++;
    }
    this.log.warn('lease lost: instance heartbeat not renewed in time; running calls cancelled and handed back', { calls_cancelled: n });
  }

  /** A run-ended notice of the core (team accounts): the run of the subject, once the body agrees. */
  private onEndNotice(subj: string, data: Uint8Array) {
    const run = subj.split('.')[1];
    let body: { run_id?: string } = {};
    try {
      body = JSON.parse(new TextDecoder().decode(data));
    } catch {
      body = {};
    }
    if (!run || body.run_id !== run) {
      this.log.warn('run-ended notice ignored: not a notice of the run its subject names', { subject: subj });
      return;
    }
    this.cancelRun(run);
  }

  /**
   * Cancels the calls of a run at once on a run.cancel by the run's principal or one of
   * its approvers (its first run.started names them: the rule of the injector's decision
   * policy and of every read). Anyone may publish a run.cancel on their own subject,
   * naming any run: a cancel by someone else (which the injector refuses unless its
   * TOOLBUS_DECIDERS lists them) cancels nothing here; accepted, it ends the run, whose
   * outcome cancels the calls (outcomes.onEnded in serve). The Go twin is
   * executor/worker/cancel.go.
   */
  private onCancel(subj: string, h: JsMsg['headers'] | undefined, data: Uint8Array) {
    let run: string | undefined;
    let who: string | undefined;
    try {
      const ev = decodeEvent<Cancel>(h, data);
      run = agreeingRun(subj, ev, Type.runCancel);
      who = ev.data?.who;
    } catch {
      run = undefined;
    }
    if (!run) {
      this.log.warn('run.cancel ignored: not a cancel of the run its subject names', { subject: subj });
      return;
    }
    const cancelled = run;
    void this.bus!.runStarted(cancelled).then((first) => {
      if (first && namesDecider(first.rs, who)) return this.cancelRun(cancelled);
      this.log.warn('run.cancel not applied here: its actor is neither the run\'s principal nor an approver (the injector decides; an end of the run reaches the calls)',
        { run_id: cancelled, who: who ?? '' });
    }, (err) => this.log.warn('run.cancel not applied here: its run\'s start not read (the injector decides; an end of the run reaches the calls)',
      { run_id: cancelled, who: who ?? '', error: String((err as Error)?.message ?? err) }));
  }

  private cancelRun(run: string) {
    if (this.cancelled.size > 100000) this.cancelled.clear();
    this.cancelled.add(run);
    const set = this.inflight.get(run);
    for (const ac of set ?? []) ac.abort(new Error('run cancelled'));
    this.log.info('run cancelled', { run_id: run, calls_cancelled: set?.size ?? 0 });
  }

  /** Sends InProgress every third of the queue's ack wait until the returned function is called. */
  private working(msg: JsMsg): () => void {
    if (this.breakRule === 'no_heartbeat') return () => {};
    const t = setInterval(() => msg.working(), this.beatEveryMS);
    return () => clearInterval(t);
  }

  // -- a delivery

  private async handle(msg: JsMsg): Promise<void> {
    const start = Date.now();
    try {
      await this.handleOnce(msg);
    } catch (err) {
      const pe = this.deniedSince(start) ?? refusedForGood(err);
      if (!pe) throw err;
      await this.denied(msg, pe);
    }
  }

  private recordDenial(err: Error & { operation?: string; subject?: string }) {
    const op = err.operation === 'subscription' ? 'subscribe' : (err.operation || 'publish');
    this.denial = { op, subject: err.subject || err.message, at: Date.now() };
    this.metrics.permissionDenied++;
    this.log.error('the server refused an operation to the executor\'s credentials', { op, subject: this.denial.subject });
  }

  /** The permission the server refused since start (ms) as a message naming it, or undefined. */
  private deniedSince(start: number): string | undefined {
    const d = this.denial;
    if (!d || d.at < start) return undefined;
    const c = this.settings.connection;
    const who = c.user ? `the credentials of user ${c.user}` : c.creds ? `the credentials of ${c.creds}` : c.nkey ? `the credentials of nkey ${c.nkey}` : 'the credentials';
    return `permission denied: ${who} may not ${d.op} to ${JSON.stringify(d.subject)}: add it to the role's permissions`;
  }

  /**
   * Ends a call that the executor's credentials do not let it handle, or a write of which
   * the core's write service refused for good (400), as the Go executor's denied: a failed
   * result whose code (permission_denied) and message name the missing permission or the
   * refusal, at once, instead of the call timing out (or running again) on every delivery.
   * If even that publish is refused the message is terminated with the reason.
   */
  private async denied(msg: JsMsg, why: string): Promise<void> {
    let req: ToolRequested | undefined;
    let traceparent: string | undefined;
    try {
      const ev = decodeEvent<ToolRequested>(msg.headers, msg.data);
      if (ev.attrs.type === Type.toolRequested && ev.data?.run_id && ev.data.call?.call_id) {
        req = ev.data;
        traceparent = ev.attrs.traceparent;
      }
    } catch {
      req = undefined;
    }
    if (!req) {
      msg.term(why);
      return;
    }
    const call = { ...req.call, arguments: typeof req.call.arguments === 'string' ? req.call.arguments : JSON.stringify(req.call.arguments ?? '') };
    const res = errorResult(call, 'failed', 'permission_denied', `the executor could not handle this call: ${why}`, { redactor: this.red });
    res.executor = this.settings.instance;
    res.duration_ms = 0;
    // The queue the call came from (toolbus_queue.<tool>): its result goes on that tool's subject.
    const queue = toolTokenOfSubject(msg.subject) || call.tool;
    const tf = { run_id: req.run_id, step: req.step, call_index: req.call_index, call_count: req.call_count, ...res };
    const start = Date.now();
    try {
      await this.bus!.publish(subject.toolFinished(req.run_id, queue),
        callAttrs(Type.toolFinished, this.src, id.toolFinished(req.run_id, req.step, call.call_id), req.run_id, req.step, call.call_id,
          req.call_index, req.call_count, traceparent, parentDigest(msg)), tf,
        (x: { run_id?: string; call_id?: string; step?: number }) => x.run_id === req!.run_id && x.call_id === call.call_id && x.step === req!.step);
    } catch (err) {
      const also = this.deniedSince(start) ?? String((err as Error)?.message ?? err);
      this.log.error('call terminated: the executor\'s credentials miss a permission, and its result could not be published', { run_id: req.run_id, call_id: call.call_id, error: why, publish_error: also });
      msg.term(`${why} (and its result could not be published: ${also})`);
      return;
    }
    this.log.error('call ended: the executor\'s credentials miss a permission', { run_id: req.run_id, call_id: call.call_id, error: why });
    this.metrics.callFinished(call.tool, res.status, 'permission_denied', 0, false);
    msg.ack();
  }

  private async handleOnce(msg: JsMsg): Promise<void> {
    if (msg.info.redelivered) this.metrics.redeliveries++;
    let d: Delivery | undefined;
    try {
      d = await this.admit(msg);
    } catch (err) {
      if (err instanceof PoisonError) {
        this.metrics.poison++;
        this.log.warn('poison message terminated', { subject: msg.subject, reason: err.message });
        msg.term(err.message);
        return;
      }
      if (err instanceof Handback) {
        msg.nak(err.delayMS);
        return;
      }
      throw err;
    }
    if (!d) return; // done elsewhere, acknowledged
    try {
      await this.process(d);
    } catch (err) {
      if (err instanceof Handback) {
        msg.nak(err.delayMS);
        return;
      }
      throw err;
    } finally {
      this.handled.delete(d.claimKey);
      await d.releaseSlot?.();
    }
  }

  /** Decodes and admits a call: well formed, of a started run, from its own queue, with a valid lease, claimed. */
  private async admit(msg: JsMsg): Promise<Delivery | undefined> {
    const ev = decodeEvent<ToolRequested>(msg.headers, msg.data);
    const req = ev.data;
    if (ev.attrs.type !== Type.toolRequested || !req || !validRunID(req.run_id) || !Number.isInteger(req.step) || req.step < 0 ||
      !Number.isInteger(req.call_count) || req.call_count <= 0 || !Number.isInteger(req.call_index) || req.call_index < 0 ||
      req.call_index >= req.call_count || typeof req.call?.call_id !== 'string' || !req.call.call_id || typeof req.call.tool !== 'string') {
      throw new PoisonError(`bad tool.requested ${ev.attrs.id}`);
    }
    if (typeof req.call.arguments !== 'string') req.call.arguments = req.call.arguments === undefined ? '' : JSON.stringify(req.call.arguments);
    // Subject and body agree: the subject the call was published on (the server's
    // Nats-Stream-Source of the queue stream's copy) names its run and tool, and the
    // queue it came from (toolbus_queue.<tool>) is that tool's (executor/worker decode).
    const published = callSubject(msg);
    const parts = published.split('.');
    if (parts.length !== 5 || parts[0] !== 'toolbus' || parts[2] !== 'tool' || parts[3] !== 'requested' || !parts[1]) {
      throw new PoisonError(`tool.requested ${ev.attrs.id} on ${msg.subject} was not published on a tool.requested subject (${JSON.stringify(published)})`);
    }
    const [, run, , , publishedTool] = parts;
    const queue = toolTokenOfSubject(msg.subject);
    if (queue !== publishedTool) {
      throw new PoisonError(`tool.requested ${ev.attrs.id} published on ${published} is on the queue of ${JSON.stringify(queue)}`);
    }
    if (req.run_id !== run || (ev.attrs.runid && ev.attrs.runid !== run) || (ev.attrs.callid && ev.attrs.callid !== req.call.call_id)) {
      throw new PoisonError(`subject and body disagree: ${published} carries a call of run ${req.run_id}`);
    }
    if (queue !== req.call.tool) throw new PoisonError(`tool.requested ${ev.attrs.id} for tool ${JSON.stringify(req.call.tool)} on the queue of ${queue}`);
    const started = await this.runOf(req);
    if (!started) throw new PoisonError(`call ${ev.attrs.id} of a run that was never started`);
    if (!this.lease.valid()) throw new Handback(Math.max(this.beatEveryMS, 1000), 'no valid lease: instance heartbeat not renewed');
    const gen = this.lease.gen;
    const claimKey = key.claim(queue, run, req.step, req.call.call_id);
    if (this.handled.has(claimKey)) throw new Handback(Math.max(this.beatEveryMS, 1000), 'call already being handled by this process');
    this.handled.add(claimKey);
    let releaseSlot: (() => Promise<void>) | undefined;
    try {
      releaseSlot = await this.runSlot(queue, req, claimKey);
      const own = await this.claim(msg, queue, req, claimKey);
      if (!own) {
        this.handled.delete(claimKey);
        await releaseSlot?.();
        msg.ack();
        return undefined;
      }
      return { msg, req, traceparent: ev.attrs.traceparent, prev: parentDigest(msg), queue, rs: started.rs, startSeq: started.seq ?? 0, claimKey, claim: own.claim, rev: own.rev, gen, ran: false, releaseSlot };
    } catch (err) {
      this.handled.delete(claimKey);
      await releaseSlot?.();
      throw err;
    }
  }

  /**
   * Takes one of the run's slots for a call of a large step, or hands the delivery back
   * when the run is at its cap (the Go executor's runSlot). A run's calls in flight are
   * those of its current step, so a step of at most runMaxInFlight calls stays under the
   * cap by itself: only the calls of larger steps take a slot (a KV create and a delete).
   */
  private async runSlot(queue: string, req: ToolRequested, claimKey: string): Promise<(() => Promise<void>) | undefined> {
    const s = this.settings;
    const limit = s.runMaxInFlight;
    if (!(limit > 0) || req.call_count <= limit) return undefined;
    const slot = await this.bus!.acquireRunSlot(queue, req.run_id, limit, claimKey,
      { ...(s.team ? { team: s.team } : {}), instance: s.instance, boot: this.boot });
    if (slot === null) {
      throw new Handback(250 + Math.floor(Math.random() * 250), `run ${req.run_id} has ${limit} calls in flight`);
    }
    return async () => {
      await this.bus!.releaseRunSlot(queue, req.run_id, slot).catch((err) =>
        this.log.warn('run slot not released; it frees when this instance\'s heartbeat expires',
          { run_id: req.run_id, call_id: req.call.call_id, error: String(err?.message ?? err) }));
    };
  }

  /**
   * What the run says of the call: its first run.started, or, in a team account (where
   * only the core account publishes tool.requested and the team may not read runs), what
   * the call carries of it (principal, allowlist, deadline).
   */
  private async runOf(req: ToolRequested): Promise<{ rs: RunStarted; seq?: number } | null> {
    if (this.bus!.team) {
      return { rs: { run_id: req.run_id, ...(req.principal ? { principal: req.principal } : {}),
        ...(req.allowed_tools ? { allowed_tools: req.allowed_tools } : {}), ...(req.deadline ? { limits: { deadline: req.deadline } } : {}) } };
    }
    return this.bus!.runStarted(req.run_id);
  }

  /** A person's decision on the call (null: none yet): from the approval store, or, in a team account, carried by the re-issued call. */
  private async decisionOf(req: ToolRequested): Promise<Decision | null> {
    if (!this.bus!.team) return this.bus!.decision(req.run_id, req.step, req.call.call_id);
    return req.approved && req.decision ? req.decision : null;
  }

  /**
   * Claims the call before it runs. Null when the call is done elsewhere (its result is
   * stored). A claim of a live executor is waited on (with heartbeats) until its result
   * is stored, it dies or it hands the call back; then it is taken over with a
   * compare-and-set on its revision, the fencing token.
   */
  private async claim(msg: JsMsg, queue: string, req: ToolRequested, k: string): Promise<{ claim: Claim; rev: number } | null> {
    const s = this.settings;
    const bus = this.bus!;
    const mine = (): Claim => ({ ...(s.team ? { team: s.team } : {}), instance: s.instance, boot: this.boot, attempt: 1, at: new Date().toISOString() });
    let r = await this.write(msg, 'claim the call', () => bus.claimCall(k, mine()));
    if (r.created) return { claim: mine(), rev: r.rev };
    const stopBeat = this.working(msg);
    try {
      for (;;) {
        if (r.created) return { claim: mine(), rev: r.rev };
        const { cur, rev } = r;
        // A claim marked done (team accounts) or a stored result: the call is done.
        if (cur.done || await bus.resultStored(queue, req.run_id, req.step, req.call.call_id)) {
          this.log.info('result already stored, call not run again', { run_id: req.run_id, call_id: req.call.call_id, claimed_by: cur.instance });
          return null;
        }
        let alive = false;
        if (!cur.abandoned && (cur.instance !== s.instance || cur.boot !== this.boot) && this.breakRule !== 'ignore_live_claims') {
          alive = await bus.instanceAlive(cur.team ?? '', cur.instance, cur.boot ?? '');
        }
        if (!alive) {
          const c: Claim = { ...mine(), attempt: (cur.attempt || 1) + 1, ...(cur.retries?.length ? { retries: cur.retries } : {}) };
          const nrev = await this.write(msg, 'take the call over', () => bus.updateClaim(k, c, rev));
          if (nrev !== null) {
            // A result stored between the look-up and the take-over is the call's: yield to it.
            if (await bus.resultStored(queue, req.run_id, req.step, req.call.call_id)) {
              await bus.updateClaim(k, { ...c, yielded: true }, nrev);
              return null;
            }
            if (!cur.retry) {
              this.log.warn(cur.abandoned ? 'the executor that claimed this call lost its lease and handed it back: running it again with the same idempotency key'
                : 'the executor that claimed this call is gone: running it again with the same idempotency key',
              { run_id: req.run_id, call_id: req.call.call_id, claimed_by: cur.instance, attempt: c.attempt });
            }
            return { claim: c, rev: nrev };
          }
        }
        await sleep(1000);
        r = await this.write(msg, 'claim the call', () => bus.claimCall(k, mine()));
      }
    } finally {
      stopBeat();
    }
  }

  /** Handles an admitted call in its span ("execute_tool <tool>", a child of the call's traceparent). */
  private async process(d: Delivery): Promise<void> {
    const span = startCallSpan(await otel(), `execute_tool ${d.req.call.tool}`, d.traceparent, {
      'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': d.req.call.tool, 'gen_ai.tool.call.id': d.req.call.call_id,
      'toolbus.run_id': d.req.run_id, 'toolbus.step': d.req.step, 'toolbus.attempt': d.claim.attempt,
    });
    d.span = span;
    try {
      await this.processInSpan(d);
    } finally {
      span.end(d.res?.status, d.res?.error?.code);
    }
  }

  private async processInSpan(d: Delivery): Promise<void> {
    const s = this.settings;
    const bus = this.bus!;
    const call = d.req.call;
    const ended = await this.runEnded(d);
    if (ended) {
      d.res = errorResult(call, 'cancelled', 'run_ended', `the run had already ended (${ended}) when this call was taken: it was not run`);
    }
    // The last execution a call is allowed reports tool_internal_error instead of running.
    const died = d.claim.attempt - (d.claim.retries?.length ?? 0);
    if (!d.res && died >= s.maxDeliver && died > 1) {
      d.res = errorResult(call, 'failed', 'tool_internal_error', `the call did not finish in ${died - 1} attempts (its executor died each time); it was not run again`);
    }
    if (!d.res && (await this.decide(d)) === 'parked') return;
    if (!d.res) await this.execute(d);
    await this.retryLater(d);
    await this.publish(d);
  }

  /**
   * The outcome of a call's run that already ended ('' while it goes on): from the
   * outcome events followed when they answer for the run, else from the run state.
   */
  private async runEnded(d: Delivery): Promise<string> {
    const known = this.outcomes?.lookup(d.req.run_id, d.startSeq);
    if (known !== undefined) return known;
    this.metrics.runStateReads++;
    return this.bus!.runEnded(d.req.run_id);
  }

  /** Settles what the call gets without running, or parks a call that waits for a person. */
  private async decide(d: Delivery): Promise<'parked' | void> {
    const call = d.req.call;
    const ent = this.entries.get(call.tool);
    const served = this.settings.tools.length ? this.settings.tools.includes(call.tool) : true;
    if (!ent || !served || this.unreachable.has(call.tool)) {
      d.res = errorResult(call, 'rejected', 'unknown_tool', `no executor serves a tool named ${JSON.stringify(call.tool)}`);
      return;
    }
    if (d.rs.allowed_tools?.length && !d.rs.allowed_tools.includes(call.tool)) {
      d.res = errorResult(call, 'rejected', 'not_authorized', `tool ${JSON.stringify(call.tool)} is not allowed in this run`);
      return;
    }
    if (!ent.tool.needsApproval) return;
    const bus = this.bus!;
    const dec = await this.decisionOf(d.req);
    if (!dec) {
      // Nobody decided yet: the call does not run; the re-issue after the decision claims it anew.
      await this.write(d.msg, 'release the claim', () => bus.releaseClaim(d.claimKey));
      const w = { run_id: d.req.run_id, step: d.req.step, call_index: d.req.call_index, call_count: d.req.call_count, call };
      await this.write(d.msg, 'publish the wait', () => bus.publish(subject.toolWaiting(d.req.run_id, call.tool),
        callAttrs(Type.toolWaiting, this.src, id.toolWaiting(d.req.run_id, d.req.step, call.call_id), d.req.run_id, d.req.step, call.call_id,
          d.req.call_index, d.req.call_count, d.traceparent, d.prev), w, (x) => x.run_id === d.req.run_id && x.call?.call_id === call.call_id));
      this.log.info('call waits for approval', { run_id: d.req.run_id, step: d.req.step, call_id: call.call_id, tool: call.tool });
      d.msg.ack();
      return 'parked';
    }
    if (!dec.granted && dec.response) {
      d.res = {
        call_id: call.call_id, tool: call.tool, status: 'succeeded', output: dec.response,
        content: `[answered by a person (${dec.who ?? ''}) in place of the tool, which did not run]\n${dec.response}`,
        human: { kind: 'responded', ...(dec.who ? { who: dec.who } : {}) }, duration_ms: 0,
      };
    } else if (!dec.granted) {
      d.res = errorResult(call, 'rejected', 'approval_denied', 'a person denied this call' + (dec.why ? ': ' + dec.why : ''));
    } else if (dec.arguments) {
      d.edit = { who: dec.who, arguments: dec.arguments };
      d.req.call = { ...call, arguments: dec.arguments };
    }
  }

  /** Runs the tool: arguments, then its function under the earliest deadline, with progress and heartbeats. */
  private async execute(d: Delivery): Promise<void> {
    const s = this.settings;
    const call = d.req.call;
    const ent = this.entries.get(call.tool)!;
    const maxOut = ent.tool.maxOutputBytes || s.maxOutputBytes;
    const fields = ent.tool.redactFields ?? [];
    const start = Date.now();
    const checked = checkArgumentsWith(call.arguments, ent.input, call.tool, ent.tool.inputSchema);
    if (!checked.ok) {
      d.res = errorResult(call, 'rejected', 'invalid_arguments', checked.message, { details: checked.details, redactor: this.red, maxOut });
      return;
    }
    if (this.authorize) {
      // The principal may call the tool (gate 4 of the Go executor).
      let refusal: string | undefined;
      try {
        await this.authorize(d.rs.principal ?? {}, call.tool, checked.args);
      } catch (err) {
        refusal = (err as Error)?.message || String(err) || 'refused';
      }
      if (refusal !== undefined) {
        d.res = errorResult(call, 'rejected', 'not_authorized', `not authorized to call ${call.tool}: ${refusal}`, { redactor: this.red, maxOut });
        return;
      }
    }
    // The earliest of the tool's timeout, the call's deadline and the run's deadline.
    const timeout = ent.tool.timeoutMS || s.callTimeoutMS;
    const own = start + timeout;
    let deadline = own;
    for (const t of [d.req.deadline, d.rs.limits?.deadline]) {
      const ms = t ? Date.parse(t) : NaN;
      if (!Number.isNaN(ms) && ms < deadline && !t!.startsWith('0001-')) deadline = ms;
    }
    const ac = new AbortController();
    let why: { status: 'timed_out' | 'cancelled'; message: string } | undefined;
    const giveUp = (status: 'timed_out' | 'cancelled', message: string, reason: string) => {
      if (!why) why = { status, message };
      ac.abort(new Error(reason));
    };
    const expire = () => giveUp('timed_out', deadline === own
      ? `the tool did not finish within its timeout of ${fmtDuration(timeout)}; it may succeed if retried, possibly with a smaller request`
      : 'the call deadline expired before the tool finished', 'timeout');
    const timer = setTimeout(expire, Math.max(0, deadline - Date.now()));
    if (deadline <= Date.now()) expire();
    let lastBeat = Date.now();
    const hb = ent.tool.heartbeatTimeoutMS ?? 0;
    const hbTimer = hb ? setInterval(() => {
      if (Date.now() - lastBeat >= hb) giveUp('timed_out', `the tool reported no progress for ${fmtDuration(hb)} (its heartbeat timeout); it may succeed if retried`, 'no progress');
    }, Math.max(10, Math.min(hb / 4, 1000))) : undefined;
    const set = this.inflight.get(d.req.run_id) ?? new Set<AbortController>();
    this.inflight.set(d.req.run_id, set.add(ac));
    if (this.cancelled.has(d.req.run_id)) giveUp('cancelled', 'the call was cancelled before the tool finished', 'run cancelled');
    ac.signal.addEventListener('abort', () => {
      const reason = String((ac.signal.reason as Error)?.message);
      if (reason === 'run cancelled') why ??= { status: 'cancelled', message: 'the call was cancelled before the tool finished' };
    });
    const stopBeat = this.working(d.msg);
    const progress = this.progressReporter(d, () => (lastBeat = Date.now()));
    this.metrics.callStarted(call.tool);
    d.ran = true;
    const ctx: ToolContext = {
      signal: ac.signal, runId: d.req.run_id, step: d.req.step, callId: call.call_id, callIndex: d.req.call_index, tool: call.tool,
      principal: d.rs.principal ?? {}, attempt: d.claim.attempt, idempotencyKey: `${d.req.run_id}/${d.req.step}/${call.call_id}`,
      traceparent: d.traceparent, progress: progress.report, leaseValid: () => this.lease.valid(d.gen),
    };
    try {
      await this.acquire(ent, ac.signal);
      let out: unknown;
      let failure: unknown;
      let failed = false;
      try {
        const aborted = new Promise<never>((_, reject) => {
          if (ac.signal.aborted) reject(ac.signal.reason);
          ac.signal.addEventListener('abort', () => reject(ac.signal.reason), { once: true });
        });
        aborted.catch(() => {});
        if (ac.signal.aborted) throw ac.signal.reason; // given up before it started: the tool does not run
        const span = d.span;
        out = await Promise.race([Promise.resolve().then(() => (span ? span.within(() => ent.tool.run(checked.args, ctx)) : ent.tool.run(checked.args, ctx))), aborted]);
      } catch (err) {
        failed = true;
        failure = err;
      } finally {
        this.release(ent);
      }
      if (ac.signal.aborted && String((ac.signal.reason as Error)?.message) === LEASE_LOST) throw await this.handBack(d);
      if (ac.signal.aborted && String((ac.signal.reason as Error)?.message) === 'shutdown') throw new Handback(1000, 'shutdown');
      if (why) {
        d.res = errorResult(call, why.status, why.status === 'cancelled' ? 'cancelled' : 'timeout', why.message,
          { retryable: why.status === 'timed_out', redactor: this.red, maxOut });
      } else if (failed) {
        const te = failure instanceof ToolError ? failure : undefined;
        d.res = errorResult(call, 'failed', te?.code ?? 'tool_error', te?.message || (failure as Error)?.message || String(failure),
          { retryable: te?.retryable, details: te?.details, redactor: this.red, maxOut, fields });
      } else if (ent.output && !ent.output(out === undefined ? null : JSON.parse(JSON.stringify(out ?? null)))) {
        const vs = violations(ent.output.errors);
        d.res = errorResult(call, 'failed', 'invalid_tool_output', 'the tool returned an invalid output: it does not match the tool\'s output schema:\n' +
          vs.map((v) => `- ${v.path || '/'}: ${v.message}`).join('\n'), { details: vs, redactor: this.red, maxOut });
      } else {
        d.res = succeeded(call, out, this.red, maxOut, fields);
      }
    } finally {
      clearTimeout(timer);
      clearInterval(hbTimer);
      stopBeat();
      await progress.finish();
      this.metrics.callStopped(call.tool);
      set.delete(ac);
      if (!set.size) this.inflight.delete(d.req.run_id);
    }
    if (d.res) {
      d.res.duration_ms = Date.now() - start;
      if (d.edit && d.res.status) {
        let a = d.edit.arguments;
        if (a.length > 512) a = a.slice(0, 512) + '…';
        d.res.human = { kind: 'edited', ...(d.edit.who ? { who: d.edit.who } : {}), arguments: d.edit.arguments };
        d.res.content = `[a person (${d.edit.who ?? ''}) edited the arguments of this call; it ran with ${a}]\n${d.res.content}`;
      }
    }
  }

  /** Takes a slot of a tool with maxConcurrency, waiting until one frees or the call is given up. */
  private acquire(ent: Entry, signal: AbortSignal): Promise<void> {
    const n = ent.tool.maxConcurrency ?? 0;
    if (!n || ent.running < n) {
      ent.running++;
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      const go = () => {
        signal.removeEventListener('abort', onAbort);
        ent.running++;
        resolve();
      };
      const onAbort = () => {
        ent.waiters = ent.waiters.filter((w) => w !== go);
        reject(signal.reason);
      };
      ent.waiters.push(go);
      signal.addEventListener('abort', onAbort, { once: true });
    });
  }

  private release(ent: Entry) {
    ent.running--;
    const next = ent.waiters.shift();
    if (next) next();
  }

  /**
   * The progress of one running call: at most one tool.progress per interval, the latest
   * kept; finish() publishes the pending one and refuses any later report.
   */
  private progressReporter(d: Delivery, onReport: () => void) {
    const every = this.settings.progressIntervalMS;
    const call = d.req.call;
    let seq = 0;
    let last = 0;
    let pending: ToolProgress | null = null;
    let timer: NodeJS.Timeout | null = null;
    let finished = false;
    let sending: Promise<void> = Promise.resolve();
    const send = () => {
      timer = null;
      if (!pending) return sending;
      const p = pending;
      pending = null;
      last = Date.now();
      sending = sending.then(() => this.bus!.publish(subject.toolProgress(d.req.run_id, call.tool),
        callAttrs(Type.toolProgress, this.src, id.toolProgress(d.req.run_id, d.req.step, call.call_id, p.attempt, p.seq), d.req.run_id,
          d.req.step, call.call_id, 0, 0, d.traceparent, d.prev), p, (x) => x.call_id === p.call_id && x.seq === p.seq))
        .catch((err) => this.log.warn('progress not published', { run_id: d.req.run_id, call_id: call.call_id, error: String(err?.message ?? err) }));
      return sending;
    };
    return {
      report: (done: number, total?: number, message?: string): boolean => {
        if (finished) return false;
        onReport();
        seq++;
        const m = message ? this.red.text(message)[0] : undefined;
        pending = { run_id: d.req.run_id, step: d.req.step, call_id: call.call_id, tool: call.tool, attempt: d.claim.attempt, seq,
          done: Number(done) || 0, ...(total && total > 0 ? { total } : {}), ...(m ? { message: m } : {}) };
        if (!timer) timer = setTimeout(send, Math.max(0, last + every - Date.now()));
        return true;
      },
      finish: async () => {
        finished = true;
        if (timer) clearTimeout(timer);
        await send();
      },
    };
  }

  /** Hands a failed attempt back for another when the tool's retry policy asks for it. */
  private async retryLater(d: Delivery): Promise<void> {
    const res = d.res!;
    const ent = this.entries.get(d.req.call.tool);
    const r = ent?.tool.retry;
    if (!d.ran || !r || res.status === 'succeeded' || !res.error) return;
    if (r.codes?.length ? !r.codes.includes(res.error.code) : !res.error.retryable) return;
    const tried = (d.claim.retries?.length ?? 0) + 1;
    if (tried >= r.maxAttempts) return;
    let backoff = r.initialBackoffMS;
    for (let i = 1; i < tried && backoff < r.maxBackoffMS; i++) backoff *= 2;
    backoff = Math.min(backoff, r.maxBackoffMS);
    const delay = Math.round(backoff / 2 + Math.random() * (backoff / 2));
    const dl = [d.req.deadline, d.rs.limits?.deadline].map((t) => (t && !t.startsWith('0001-') ? Date.parse(t) : NaN)).filter((x) => !Number.isNaN(x));
    if (dl.length && Date.now() + delay > Math.min(...dl)) return; // no time for another attempt
    if (!this.lease.valid(d.gen)) throw await this.handBack(d);
    const failed: FailedAttempt = { attempt: d.claim.attempt, status: res.status, error: res.error, duration_ms: res.duration_ms,
      executor: this.settings.instance, at: new Date().toISOString(), retry_after_ms: delay };
    const c: Claim = { ...d.claim, abandoned: true, retry: true, retries: [...(d.claim.retries ?? []), failed] };
    await this.write(d.msg, 'record the failed attempt', () => this.bus!.updateClaim(d.claimKey, c, d.rev));
    this.log.info('call failed, retried by the tool\'s policy', { run_id: d.req.run_id, call_id: d.req.call.call_id, attempt: c.attempt,
      code: res.error.code, retry_after_ms: delay, max_attempts: r.maxAttempts });
    throw new Handback(delay, `attempt ${c.attempt} failed (${res.error.code}): retried by the tool's policy`);
  }

  /**
   * Runs op, a write of the call of msg, again while the write service refuses it over the
   * team's bytes per second or could not forward it, for up to WRITE_RETRY_MS (a refusal
   * of another kind, or any other error, rejects at once).
   */
  private async write<T>(msg: JsMsg, what: string, op: () => Promise<T>): Promise<T> {
    const end = Date.now() + WRITE_RETRY_MS;
    let stopBeat: (() => void) | undefined;
    try {
      for (let n = 1, pause = 100; ; n++, pause = Math.min(pause * 2, 2000)) {
        try {
          return await op();
        } catch (err) {
          if (!passesLater(err) || Date.now() + pause > end) throw err;
          stopBeat ??= this.working(msg); // heartbeats only once a write is refused
          this.metrics.writesRetried++;
          this.log.warn('bus write refused, retrying', { op: what, retry: n, error: String((err as Error).message) });
          await sleep(pause / 2 + Math.random() * (pause / 2));
        }
      }
    } finally {
      stopBeat?.();
    }
  }

  /**
   * Runs op, a write of the starting executor, again for up to WRITE_RETRY_MS while it
   * fails in a way that passes by itself (passesAtStart); any other error rejects at once.
   */
  private async startupWrite<T>(what: string, op: () => Promise<T>): Promise<T> {
    const end = Date.now() + WRITE_RETRY_MS;
    for (let n = 1, pause = 200; ; n++, pause = Math.min(pause * 2, 2000)) {
      try {
        return await op();
      } catch (err) {
        if (!passesAtStart(err) || Date.now() + pause > end) throw err;
        this.log.warn('bus write failed, retrying (in a team account: is an injector, which serves the core\'s write service, running?)',
          { op: what, retry: n, error: String((err as Error).message) });
        await sleep(pause / 2 + Math.random() * (pause / 2));
      }
    }
  }

  /** Marks the attempt abandoned (its lease ran out before its result was stored), so the next delivery runs the call again at once. */
  private async handBack(d: Delivery): Promise<Handback> {
    await this.bus!.updateClaim(d.claimKey, { ...d.claim, abandoned: true }, d.rev);
    this.log.warn('lease lost mid-call: attempt abandoned, the call is handed back', { run_id: d.req.run_id, call_id: d.req.call.call_id, attempt: d.claim.attempt });
    return new Handback(Math.max(this.beatEveryMS, 1000), LEASE_LOST);
  }

  /** Stores the call's one result (its large output in the outputs bucket first), then acks. */
  private async publish(d: Delivery): Promise<void> {
    const bus = this.bus!;
    const res = d.res!;
    if (!this.lease.valid(d.gen)) throw await this.handBack(d);
    res.attempt = d.claim.attempt;
    res.executor = this.settings.instance;
    if (this.lease.serverUntil && this.lease.valid(d.gen)) res.lease_until = new Date(this.lease.serverUntil).toISOString();
    if (d.claim.retries?.length) res.retries = d.claim.retries;
    if (res.output !== undefined) {
      const body = Buffer.from(JSON.stringify(res.output));
      if (body.length > this.settings.inlineOutputMax) {
        let ref: string | undefined;
        try {
          ref = await this.write(d.msg, 'store the large output', () => bus.putOutput(d.queue, d.req.run_id, d.req.step, res.call_id, body));
        } catch (err) {
          // The team holds its bound of output keys: as with a full bucket, the result
          // goes out without the whole output (no ref) rather than waiting for room.
          if (!(err instanceof TenantStoreFullError)) throw err;
          this.log.warn('large output not kept: the team holds its bound of output keys', { run_id: d.req.run_id, call_id: res.call_id, error: err.message });
        }
        res.truncated = { ...(res.truncated ?? { original_bytes: body.length, kept_bytes: Buffer.byteLength(res.content) }), ...(ref ? { ref } : {}) };
        delete res.output;
      }
    }
    const tf = { run_id: d.req.run_id, step: d.req.step, call_index: d.req.call_index, call_count: d.req.call_count, ...res };
    const attrs = callAttrs(Type.toolFinished, this.src, id.toolFinished(d.req.run_id, d.req.step, res.call_id), d.req.run_id, d.req.step,
      res.call_id, d.req.call_index, d.req.call_count, d.traceparent, d.prev);
    const ours = (x: { run_id?: string; call_id?: string; step?: number }) => x.run_id === d.req.run_id && x.call_id === res.call_id && x.step === d.req.step;
    await this.write(d.msg, 'publish the result', async () => {
      // Checked before each try: a lease lost while the write was refused hands the call back.
      if (!this.lease.valid(d.gen)) throw await this.handBack(d);
      await bus.publish(subject.toolFinished(d.req.run_id, d.queue), attrs, tf, ours);
    });
    if (this.breakRule === 'two_results') await bus.publish(subject.toolFinished(d.req.run_id, d.queue), attrs, tf, ours);
    if (bus.team) {
      // A take-over must find the call done without walking the results, which a team may not read.
      const rev = await this.write(d.msg, 'mark the claim done', () => bus.updateClaim(d.claimKey, { ...d.claim, done: true }, d.rev));
      if (rev === null) this.log.warn('claim not marked done: it changed meanwhile', { run_id: d.req.run_id, call_id: res.call_id });
    }
    this.metrics.callFinished(res.tool, res.status, res.error?.code ?? '', res.duration_ms, d.ran);
    this.log.debug('call finished', { run_id: d.req.run_id, call_id: res.call_id, tool: res.tool, status: res.status,
      code: res.error?.code ?? '', duration_ms: res.duration_ms, attempt: res.attempt });
    d.msg.ack(); // only once the result is stored: a crash before this redelivers the call
  }
}

// ---- the module-level executor -------------------------------------------------------------

let defaultExecutor: Executor | undefined;

/** Registers a tool with the process's executor (configured from TOOLBUS_*). */
export function register<A>(tool: Tool<A>): Executor {
  defaultExecutor ??= new Executor();
  return defaultExecutor.register(tool);
}

/** Serves the tools registered with register() until SIGINT or SIGTERM. */
export function serve(): Promise<void> {
  defaultExecutor ??= new Executor();
  return defaultExecutor.serve({ handleSignals: true });
}

export type { ToolCall };
