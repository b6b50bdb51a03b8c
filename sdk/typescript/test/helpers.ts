// Test helpers: a real NATS JetStream server with toolbus's stream and buckets (from
// TOOLBUS_TEST_NATS_URL, which the Go test of this package sets, or started here with
// `go run ./testbus`), and the planner's side of a call (run.started, tool.requested).
import { after, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { Executor, type Tool, type ToolContext, wire } from '../src/index.js';
import type { ToolFinished } from '../src/wire.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
let server: ChildProcess | undefined;
let urlP: Promise<string> | undefined;

/** The URL of the test server (started once per test file). */
export function serverURL(): Promise<string> {
  urlP ??= (async () => {
    if (process.env.TOOLBUS_TEST_NATS_URL) return process.env.TOOLBUS_TEST_NATS_URL;
    server = spawn('go', ['run', './testbus'], { cwd: root, stdio: ['pipe', 'pipe', 'inherit'] });
    const line = await new Promise<string>((resolve, reject) => {
      const rl = createInterface({ input: server!.stdout! });
      rl.once('line', resolve);
      server!.once('exit', (code) => reject(new Error(`testbus exited (${code}) before printing its URL: is Go installed?`)));
    });
    return line.trim();
  })();
  return urlP;
}

/** Stops the server this file started (its stdin closes). */
export function stopServer(): void {
  server?.stdin?.end();
}

/**
 * A two-account server of the accounts layout (events/eventstest.AccountsConf): the core
 * account, where the pipeline's roles run, and a team account that reaches the core only
 * through the imports of its tools. What the Go test passes in TOOLBUS_TEST_TEAM_BUS, or
 * what `go run ./testbus -team` prints.
 */
export interface TeamBus {
  /** The server's URL. */
  url: string;
  /** The core account's user and password. */
  core_user: string;
  core_password: string;
  /** The team account's user and password. */
  team_user: string;
  team_password: string;
  /** The team's name (TOOLBUS_TEAM). */
  team_name: string;
  /** TOOLBUS_NATS_API_PREFIX of the team's executors. */
  api_prefix: string;
  /** The tools whose queues, subjects and keys the core exports to the team. */
  tools: string[];
  /** POST the tools the team is granted from then on, comma-separated: the server reloads (a revocation under running executors). */
  grant_url?: string;
}

let teamServer: ChildProcess | undefined;
let teamP: Promise<TeamBus> | undefined;

/** The two-account test server (started once per test file). */
export function teamBus(): Promise<TeamBus> {
  teamP ??= (async () => {
    const line = process.env.TOOLBUS_TEST_TEAM_BUS ?? await new Promise<string>((resolve, reject) => {
      teamServer = spawn('go', ['run', './testbus', '-team'], { cwd: root, stdio: ['pipe', 'pipe', 'inherit'] });
      const rl = createInterface({ input: teamServer.stdout! });
      rl.once('line', resolve);
      teamServer.once('exit', (code) => reject(new Error(`testbus -team exited (${code}) before printing its servers: is Go installed?`)));
    });
    return JSON.parse(line) as TeamBus;
  })();
  return teamP;
}

/** Stops the two-account server this file started. */
export function stopTeamServer(): void {
  teamServer?.stdin?.end();
}

export async function connectTest(): Promise<NatsConnection> {
  return connect({ servers: await serverURL() });
}

let n = 0;
/** A name unique to this test process (tool names, run ids). */
export function unique(prefix: string): string {
  n++;
  return `${prefix}-${process.pid}-${n}-${Date.now() % 100000}`;
}

/** Starts an executor serving tools on nc; returns it once it serves. */
export async function startExecutor(nc: NatsConnection, tools: Tool[], env: Record<string, string> = {}): Promise<{ ex: Executor; done: Promise<void> }> {
  const ex = new Executor({
    connection: nc,
    env: { TOOLBUS_INSTANCE: unique('ts'), TOOLBUS_ACK_WAIT: '2s', TOOLBUS_LOG_LEVEL: 'warn', TOOLBUS_GRACE: '2s', ...env },
  });
  for (const t of tools) ex.register(t);
  const done = ex.serve();
  await Promise.race([ex.serving(), done]);
  return { ex, done };
}

export interface CallOpts {
  tool: string;
  args: string;
  run?: string;
  callId?: string;
  step?: number;
  allowed?: string[];
  deadline?: string;
  decided?: boolean;
}

/** Starts a run and publishes one call of it, as a client and the planner do; returns the run id. */
export async function request(bus: wire.Bus, o: CallOpts): Promise<string> {
  const run = o.run ?? unique('run');
  const step = o.step ?? 0;
  const callId = o.callId ?? 'call_1';
  if (!o.decided) {
    const rs: wire.RunStarted = { run_id: run, messages: [{ role: 'user', content: 'test' }], principal: { id: 'tester' },
      ...(o.allowed ? { allowed_tools: o.allowed } : {}), ...(o.deadline ? { limits: { deadline: o.deadline } } : {}) };
    await bus.publish(wire.subject.runStarted(run, 'tester'), { id: wire.id.runStarted(run), type: wire.Type.runStarted,
      source: '/toolbus/test/suite', subject: run, runid: run, step: '0' }, rs);
  }
  const req: wire.ToolRequested = { run_id: run, step, call_index: 0, call_count: 1, call: { call_id: callId, tool: o.tool, arguments: o.args },
    principal: { id: 'tester' }, ...(o.deadline ? { deadline: o.deadline } : {}) };
  await bus.publish(wire.subject.toolRequested(run, o.tool),
    wire.callAttrs(wire.Type.toolRequested, '/toolbus/planner/test', wire.id.toolRequested(run, step, callId) + (o.decided ? '/decided' : ''),
      run, step, callId, 0, 1, '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'), req);
  return run;
}

/** Polls f until it returns a value (not undefined) or ms pass. */
export async function eventually<T>(f: () => Promise<T | undefined>, ms = 20000, what = 'condition'): Promise<T> {
  const end = Date.now() + ms;
  let last: unknown;
  for (;;) {
    try {
      const v = await f();
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}${last ? `: ${last}` : ''}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** The events of a run's subjects of one type, decoded, in order. */
export async function eventsOf<T>(bus: wire.Bus, run: string, type: string): Promise<{ subject: string; attrs: wire.Attrs; data: T }[]> {
  const out = [];
  for await (const sm of bus.read(wire.subject.run(run))) {
    let ev: wire.Event<T>;
    try {
      ev = wire.decodeEvent<T>(sm.header, sm.data);
    } catch {
      continue; // poison on the run's subjects
    }
    if (ev.attrs.type === type) out.push({ subject: sm.subject, ...ev });
  }
  return out;
}

/** The stored tool.finished of a run's one call. */
export function result(bus: wire.Bus, run: string): Promise<ToolFinished> {
  return eventually(async () => (await eventsOf<ToolFinished>(bus, run, wire.Type.toolFinished))[0]?.data, 30000, `the result of ${run}`);
}

// The team fixture: what the test files of the accounts layout (team*.test.ts) share.

/** The tools the core exports to the team (testbus -team and npm_test.go grant them). */
export const COUNT = 'team_count';
export const PAY = 'team_pay';
export const HANG = 'team_hang';

/** Set when the Go test of the package's other tests (TestNPMTest) leaves the team tests to TestNPMTeamAccount. */
export const teamSkip = process.env.TOOLBUS_TEST_SKIP_TEAM ? 'run by TestNPMTeamAccount, on its own server' : false;

/** The count tool (one contract for every test and file: the catalog keeps the first). */
export const countTool = (run: (a: { n: number }, ctx: ToolContext) => unknown): Tool<{ n: number }> => ({
  name: COUNT, description: 'doubles n, counting its executions', inputSchema: { type: 'object', properties: { n: { type: 'integer' } }, required: ['n'] }, run,
});

/** The pay tool (a person approves each call). */
export const payTool = (run: (a: { amount: number }) => unknown = () => 'paid'): Tool<{ amount: number }> => ({
  name: PAY, description: 'pays', needsApproval: true, inputSchema: { type: 'object', properties: { amount: { type: 'integer' } }, required: ['amount'] }, run,
});

/** The two-account server and a connection of each account, open while the file's tests run. */
export interface TeamFixture {
  tb: TeamBus;
  core: NatsConnection;
  team: NatsConnection;
  /** Grants the team exactly tools from then on (the server reloads: a revocation under running executors). */
  grant(tools: string[]): Promise<void>;
}

/** The team fixture of a test file: its before and after hooks connect (unless teamSkip) and close. */
export function teamFixture(): TeamFixture {
  const fx = {
    async grant(tools: string[]) {
      const r = await fetch(fx.tb.grant_url!, { method: 'POST', body: tools.join(',') });
      assert.equal(r.status, 200, await r.text());
    },
  } as TeamFixture;
  before(async () => {
    if (teamSkip) return;
    fx.tb = await teamBus();
    fx.core = await connect({ servers: fx.tb.url, user: fx.tb.core_user, pass: fx.tb.core_password });
    fx.team = await connect({ servers: fx.tb.url, user: fx.tb.team_user, pass: fx.tb.team_password });
  });
  after(async () => {
    await fx.team?.drain();
    await fx.core?.drain();
    stopTeamServer();
  });
  return fx;
}

/** The lines written to stderr (the executor's log) while f runs. */
export async function capturing<T>(f: (lines: string[]) => Promise<T>): Promise<T> {
  const lines: string[] = [];
  const write = process.stderr.write.bind(process.stderr);
  process.stderr.write = ((chunk: string | Uint8Array, ...rest: unknown[]) => {
    lines.push(String(chunk));
    return (write as (...a: unknown[]) => boolean)(chunk, ...rest);
  }) as typeof process.stderr.write;
  try {
    return await f(lines);
  } finally {
    process.stderr.write = write;
  }
}
