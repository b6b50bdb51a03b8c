// The client: what a service does on the bus besides serving tools — start runs, call
// one tool through the fleet, decide on calls that wait for a person, cancel runs and
// watch a run's events. Identities are subject tokens: a client whose credentials are
// bound to one identity (deploy/nats/gen "clients" grants) publishes as it and only as it.
// In a client account of its own (readPrefix) it reads only through the core's read
// service, which shows the runs that name its identity as a decider and no other.
import { Signer } from './audit.js';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { NatsConnection } from '@nats-io/transport-node';
import type { StoredMsg } from '@nats-io/jetstream';
import {
  Bus, SUBJECT_PREFIX, TERMINAL, Type, UNKNOWN_TOOL, agreeingRun, decodeEvent, id, isConflict, source, subject, toolToken,
  validIdentity, validRunID, validToolName,
  type Attrs, type Event, type RunState, type Message, type Principal, type RunEnded, type RunStarted, type ToolCall, type ToolFinished,
} from './wire.js';
import { dial, settingsFromEnv, type ConnectionSettings } from './settings.js';

export interface ClientOptions {
  /** An open connection (default: dial TOOLBUS_NATS_* of env). */
  connection?: NatsConnection;
  env?: Record<string, string | undefined>;
  /** The identity this client acts as: the principal of the runs it starts and the who of its decisions and cancellations. */
  identity?: string;
  /** TOOLBUS_STREAM (TOOLBUS). */
  stream?: string;
  /** Names this client in event sources (default client-<random>). */
  name?: string;
  /**
   * The read service's prefix in a client account (TOOLBUS_NATS_READ_PREFIX when the
   * client dials; with a connection, only this option): `toolbus_read.<id>.API`
   * (wire.readAPIPrefix). Set, the client reads events by direct get under it and the
   * stream's last sequence by its STREAM.INFO, never the core's JetStream API or a
   * consumer; runs not visible to the identity read as absent. Publishing as an
   * identity the account is not bound to rejects with wire.NotBoundError.
   */
  readPrefix?: string;
  /**
   * Signs every event the client publishes with the client's key (CONTRACT.md, "Signed
   * and chained events"); default: TOOLBUS_SIGNING_KEY when the client dials.
   */
  signingKey?: string;
}

/** A run id that already has a run.started: nothing was published. */
export class RunExistsError extends Error {
  override name = 'RunExistsError';
}

export interface StartRun {
  /** Default: run-<12 hex digits>. */
  runId?: string;
  messages?: Message[];
  allowedTools?: string[];
  limits?: { maxSteps?: number; deadline?: Date; tokenBudget?: number };
  /** A TOOLBUS_MODEL value (script:..., openai:...); empty: the planner's. */
  model?: string;
  /** Roles and attributes of the principal; its id is the client's identity. */
  principal?: Omit<Principal, 'id'>;
  /** Pre-planned calls: the assistant message of step 0, no model call. */
  calls?: ToolCall[];
  traceparent?: string;
}

/** A person's decision on a call that waits (CONTRACT.md, "A person's four decisions"). */
export type Decision =
  | { kind: 'approve'; why?: string }
  | { kind: 'edit'; arguments: string | object; why?: string }
  | { kind: 'reject'; why: string }
  | { kind: 'respond'; response: string };

/** One event of a run, as watch yields it. */
export interface RunEvent<T = unknown> {
  type: string;
  subject: string;
  seq: number;
  attrs: Attrs;
  data: T;
}

const newID = (prefix: string) => `${prefix}-${randomBytes(6).toString('hex')}`;

export class Client {
  readonly bus: Bus;
  private readonly identity: string;
  private readonly src: string;

  private constructor(private readonly nc: NatsConnection, private readonly own: boolean, opts: ClientOptions) {
    this.bus = new Bus(nc, { stream: opts.stream, readPrefix: opts.readPrefix, signer: opts.signingKey ? Signer.fromFile(opts.signingKey) : undefined });
    this.identity = opts.identity ?? '';
    if (!validIdentity(this.identity)) throw new Error(`toolbus: identity ${JSON.stringify(this.identity)}: use 1-128 of [A-Za-z0-9_-]`);
    this.src = source('client', opts.name ?? newID('client'));
  }

  /** A client on opts.connection, or connected with TOOLBUS_NATS_* (every credential kind). */
  static async connect(opts: ClientOptions = {}): Promise<Client> {
    if (opts.connection) return new Client(opts.connection, false, opts);
    const s = settingsFromEnv(opts.env);
    const conn: ConnectionSettings = s.connection;
    return new Client(await dial(conn, `toolbus client ${opts.name ?? ''}`.trim()), true, { stream: s.stream, readPrefix: s.readPrefix, signingKey: (opts.env ?? process.env).TOOLBUS_SIGNING_KEY, ...opts });
  }

  /** Closes the connection this client opened. */
  async close(): Promise<void> {
    if (this.own) await this.nc.drain();
  }

  /**
   * Starts a run: its run.started, stored only as the first message of its run
   * (a conditional publish), so an id that exists is refused (RunExistsError). In a
   * client account another's run reads as absent: an id that has messages is then the
   * client's only when its run.started is the run's first (and so visible to it).
   */
  async startRun(r: StartRun): Promise<string> {
    const run = r.runId ?? newID('run');
    if (!validRunID(run)) throw new Error(`toolbus: invalid run id ${JSON.stringify(run)}: use 1-128 of [A-Za-z0-9_-]`);
    for (const t of r.allowedTools ?? []) if (!validToolName(t)) throw new Error(`toolbus: invalid tool name ${JSON.stringify(t)} in allowed tools`);
    const rs: RunStarted = {
      run_id: run, messages: r.messages ?? [], principal: { ...(r.principal ?? {}), ...(this.identity ? { id: this.identity } : {}) },
      started_at: new Date().toISOString(),
      ...(r.allowedTools?.length ? { allowed_tools: r.allowedTools } : {}),
      ...(r.model ? { model: r.model } : {}),
      ...(r.calls?.length ? { calls: r.calls } : {}),
    };
    if (r.limits) {
      rs.limits = {
        ...(r.limits.maxSteps ? { max_steps: r.limits.maxSteps } : {}),
        ...(r.limits.deadline ? { deadline: r.limits.deadline.toISOString() } : {}),
        ...(r.limits.tokenBudget ? { token_budget: r.limits.tokenBudget } : {}),
      };
    }
    const attrs: Attrs = { id: id.runStarted(run), type: Type.runStarted, source: this.src, subject: run, runid: run, step: '0',
      ...(r.traceparent ? { traceparent: r.traceparent } : {}) };
    const subj = subject.runStarted(run, this.identity);
    try {
      await this.bus.publish(subj, attrs, rs, (d) => d.run_id === run, {
        'Nats-Expected-Last-Subject-Sequence': '0', 'Nats-Expected-Last-Subject-Sequence-Subject': subject.run(run),
      });
      return run;
    } catch (err) {
      if (!isConflict(err)) throw err;
    }
    // The run has messages: refused if one is its run.started; forgeries do not keep the id.
    if (await this.bus.runStarted(run)) throw new RunExistsError(`toolbus: run id already exists: ${run}`);
    // In a client account the messages are another identity's run, which it does not see
    // (as the Go client: events.Bus.StartRun): the id is taken, and a start published
    // into that run would only be refused by its injector.
    if (this.bus.clientAccount) throw new RunExistsError(`toolbus: run id already exists: ${run}`);
    await this.bus.publish(subj, attrs, rs, (d) => d.run_id === run);
    // None readable: the run's first run.started is another's, which a client account does not see.
    const first = await this.bus.runStarted(run);
    if (!first || (first.rs.principal?.id ?? '') !== (this.identity || (rs.principal?.id ?? ''))) {
      throw new RunExistsError(`toolbus: run id already exists: ${run} (submitted concurrently)`);
    }
    return run;
  }

  /**
   * Calls one tool through the fleet: a pre-planned run of one call (as `toolbus call`),
   * and its result once the tool.finished is stored. timeoutMS bounds the run (its deadline).
   */
  async call(tool: string, args: string | object, opts: { timeoutMS?: number; runId?: string } = {}): Promise<ToolFinished> {
    if (!validToolName(tool)) throw new Error(`toolbus: invalid tool name ${JSON.stringify(tool)}`);
    const timeout = opts.timeoutMS ?? 75000;
    const run = await this.startRun({
      runId: opts.runId ?? newID('call'), allowedTools: [tool], messages: [{ role: 'user', content: `sdk ${tool}` }],
      limits: { maxSteps: 2, deadline: new Date(Date.now() + timeout) },
      calls: [{ call_id: 'call_0', tool, arguments: typeof args === 'string' ? args : JSON.stringify(args) }],
    });
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(), timeout + 15000);
    try {
      for await (const ev of this.watch(run, { signal: ac.signal })) {
        // Only the called tool's result: another team may write its own tool's into the run.
        if (ev.type === Type.toolFinished && (ev.data as ToolFinished).tool === tool) return ev.data as ToolFinished;
        if (isOutcome(ev.type)) {
          const end = ev.data as RunEnded;
          throw new Error(`toolbus: run ${run} ended ${end.status} without a result: ${end.reason ?? end.code ?? ''}`);
        }
      }
    } finally {
      clearTimeout(timer);
    }
    throw new Error(`toolbus: no result for run ${run} within ${timeout + 15000}ms`);
  }

  /** Decides on a call of step that waits for a person, as the client's identity. */
  async decide(runId: string, step: number, callId: string, d: Decision): Promise<void> {
    const granted = d.kind === 'approve' || d.kind === 'edit';
    const data: Record<string, unknown> = { run_id: runId, call_id: callId, ...(this.identity ? { who: this.identity } : {}) };
    if ('why' in d && d.why) data.why = d.why;
    if (d.kind === 'edit') data.arguments = typeof d.arguments === 'string' ? d.arguments : JSON.stringify(d.arguments);
    if (d.kind === 'respond') data.response = d.response;
    const attrs: Attrs = { id: id.approval(runId, step, callId, granted, data.arguments as string | undefined),
      type: granted ? Type.approvalGranted : Type.approvalDenied, source: this.src, subject: callId, runid: runId, step: String(step),
      callid: callId, callindex: '0', callcount: '0' };
    await this.bus.publish(subject.approval(runId, granted, this.identity), attrs, data, (x) => x.run_id === runId && x.call_id === callId);
  }

  /** Cancels a run, as the client's identity. */
  async cancel(runId: string, reason: string): Promise<void> {
    await this.bus.publish(subject.runCancel(runId, this.identity),
      { id: id.runCancel(runId), type: Type.runCancel, source: this.src, subject: runId, runid: runId, step: '0' },
      { run_id: runId, reason, ...(this.identity ? { who: this.identity } : {}) }, (x) => x.run_id === runId);
  }

  /**
   * The events of a run from its start, live, in order; it ends after the run's outcome
   * (a terminal one) or when signal aborts. Events whose subject and data disagree are
   * skipped. It creates no consumer: it polls with direct gets of the run's next event
   * (as the Go events.Watcher), pausing 5 ms, growing to 100 ms, while none is stored.
   * A run the client may not see (another's, in a client account) yields nothing.
   */
  async *watch(runId: string, opts: { signal?: AbortSignal } = {}): AsyncGenerator<RunEvent> {
    if (!validRunID(runId)) throw new Error(`toolbus: invalid run id ${JSON.stringify(runId)}`);
    const filter = subject.run(runId);
    let next = 1;
    let pause = 5;
    while (!opts.signal?.aborted) {
      const sm = await this.bus.getMsg({ seq: next, next_by_subj: filter });
      if (!sm) {
        try {
          await sleep(pause, undefined, { signal: opts.signal });
        } catch {
          return; // aborted
        }
        pause = Math.min(pause * 2, 100);
        continue;
      }
      if (sm.seq < next) throw new Error(`toolbus: watching ${runId} from ${next}: the answer is message ${sm.seq}, an earlier one`);
      next = sm.seq + 1;
      pause = 5;
      const ev = runEvent(runId, sm);
      if (!ev) continue;
      yield ev;
      if (isOutcome(ev.type)) return;
    }
  }

  /**
   * The states of the runs this client's identity may see (it started them, or their
   * start lists it as an approver): the read service's list (toolbus_read.<identity>.runs),
   * so only in a client account (readPrefix); in the core account, `toolbus runs` lists them.
   */
  async runs(): Promise<RunState[]> {
    if (!this.bus.clientAccount) throw new Error('toolbus: runs() lists through the read service of a client account: set readPrefix (TOOLBUS_NATS_READ_PREFIX)');
    const subj = `${this.bus.readPrefix.replace(/\.API$/, '')}.runs`;
    const m = await this.nc.request(subj, new Uint8Array(), { timeout: 10000 });
    if (m.data.length === 0) throw new Error(`toolbus: runs: ${m.headers?.get('Status') ?? ''} ${m.headers?.get('Description') ?? ''}`.trim());
    return JSON.parse(new TextDecoder().decode(m.data)) as RunState[];
  }

  /**
   * The events of a run stored when it is called, in order (a consistent prefix of the
   * run, as events.Bus.RunEvents), without waiting. A run the client may not see (another's,
   * in a client account) has none.
   */
  async events(runId: string): Promise<RunEvent[]> {
    if (!validRunID(runId)) throw new Error(`toolbus: invalid run id ${JSON.stringify(runId)}`);
    const last = await this.bus.lastSeq();
    const out: RunEvent[] = [];
    for await (const sm of this.bus.read(subject.run(runId))) {
      if (sm.seq > last) break;
      const ev = runEvent(runId, sm);
      if (ev) out.push(ev);
    }
    return out;
  }
}

const isOutcome = (type: string) => (TERMINAL as readonly string[]).some((t) => type === `toolbus.run.${t}`);

/** A stored message of a run as an event of it; undefined for one that is no event of the run. */
function runEvent(runId: string, sm: StoredMsg): RunEvent | undefined {
  let ev: Event<{ run_id?: string }>;
  try {
    ev = decodeEvent(sm.header, sm.data);
  } catch {
    return undefined;
  }
  if (ev.data?.run_id !== runId || !onItsSubject(runId, sm.subject, ev)) return undefined;
  return { type: ev.attrs.type, subject: sm.subject, seq: sm.seq, attrs: ev.attrs, data: ev.data };
}

/**
 * Whether subject is the one the event's type and data name (as the Go events.CheckSubject):
 * a tenant may write its own subjects of any run with any ce-type and data, so an event
 * typed as the run's outcome, or as another tool's result, on a team's tool.log counts
 * for nothing.
 */
function onItsSubject(runId: string, subj: string, ev: Event<{ run_id?: string }>): boolean {
  const type = ev.attrs.type, prefix = `${SUBJECT_PREFIX}.${runId}.`;
  if (!subj.startsWith(prefix) || !type.startsWith(`${SUBJECT_PREFIX}.`)) return false;
  const rest = subj.slice(prefix.length), base = type.slice(SUBJECT_PREFIX.length + 1);
  const d = ev.data as { tool?: string; call?: { tool?: string } };
  switch (type) {
    case Type.toolRequested:
      return rest === `${base}.${toolToken(d.call?.tool ?? '')}` || rest === `${base}.${UNKNOWN_TOOL}`;
    case Type.toolWaiting:
      return rest === `${base}.${toolToken(d.call?.tool ?? '')}`;
    case Type.toolFinished: case Type.toolProgress: case 'toolbus.tool.log': case 'toolbus.tool.question':
      return rest === `${base}.${toolToken(d.tool ?? '')}`;
    case Type.runStarted: case Type.runCancel: case Type.approvalGranted: case Type.approvalDenied: case 'toolbus.tool.answer':
      // One identity token, the data's.
      return rest.startsWith(`${base}.`) && !rest.slice(base.length + 1).includes('.') && agreeingRun(subj, ev, type) === runId;
  }
  return rest === base;
}
