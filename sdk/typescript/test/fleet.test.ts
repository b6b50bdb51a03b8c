// The executor's fleet-wide rules against a real NATS JetStream server (the Go twins are
// in executor/worker): each test breaks when the rule it names is broken.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as wait } from 'node:timers/promises';
import type { NatsConnection } from '@nats-io/transport-node';
import { Executor, ToolError, wire, type Authorizer, type Tool } from '../src/index.js';
import { connectTest, eventsOf, eventually, stopServer, unique } from './helpers.js';

let nc: NatsConnection;
let bus: wire.Bus;
before(async () => {
  nc = await connectTest();
  bus = new wire.Bus(nc);
});
after(async () => {
  await nc.drain();
  stopServer();
});

const TRACEPARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

/** Starts a run and publishes the calls of its step 0 (one tool.requested each, as the planner does). */
async function step(b: wire.Bus, tool: string, args: string[], o: { run?: string; principal?: string; started?: boolean } = {}): Promise<string> {
  const run = o.run ?? unique('run');
  const principal = o.principal ?? 'tester';
  const rs: wire.RunStarted = { run_id: run, messages: [{ role: 'user', content: 'test' }], principal: { id: principal } };
  if (!o.started) {
    await b.publish(wire.subject.runStarted(run, principal), { id: wire.id.runStarted(run), type: wire.Type.runStarted,
      source: '/toolbus/test/suite', subject: run, runid: run, step: '0' }, rs);
  }
  for (const [i, a] of args.entries()) {
    const callId = `call_${i}`;
    const req: wire.ToolRequested = { run_id: run, step: 0, call_index: i, call_count: args.length,
      call: { call_id: callId, tool, arguments: a }, principal: { id: principal } };
    await b.publish(wire.subject.toolRequested(run, tool), wire.callAttrs(wire.Type.toolRequested, '/toolbus/planner/test',
      wire.id.toolRequested(run, 0, callId), run, 0, callId, i, args.length, TRACEPARENT), req);
  }
  return run;
}

/** Serves tools with settings over the test defaults for the length of fn. */
async function serving(c: NatsConnection, tools: Tool[], fn: (ex: Executor) => Promise<void>,
  o: { env?: Record<string, string>; settings?: object; authorize?: Authorizer } = {}) {
  const ex = new Executor({ connection: c, settings: o.settings, authorize: o.authorize,
    env: { TOOLBUS_INSTANCE: unique('ts'), TOOLBUS_ACK_WAIT: '2s', TOOLBUS_LOG_LEVEL: 'warn', TOOLBUS_GRACE: '2s', ...o.env } });
  for (const t of tools) ex.register(t);
  const done = ex.serve();
  await Promise.race([ex.serving(), done]);
  try {
    await fn(ex);
  } finally {
    ex.stop();
    await done;
  }
}

/** The results of a run once it has n, by call id. */
async function results(b: wire.Bus, run: string, n: number): Promise<Map<string, wire.ToolFinished>> {
  return eventually(async () => {
    const rs = await eventsOf<wire.ToolFinished>(b, run, wire.Type.toolFinished);
    return rs.length >= n ? new Map(rs.map((r) => [r.data.call_id, r.data])) : undefined;
  }, 30000, `${n} results of ${run}`);
}

describe('fleet', () => {
  test('run slots: a step of more calls than runMaxInFlight runs at most that many at once, each slot a key under the tool', async () => {
    const name = unique('slots');
    let now = 0;
    let most = 0;
    const slotKeys = new Set<string>();
    const claims = await bus.kv(wire.Bucket.claims);
    await serving(nc, [{ name, description: 'd', inputSchema: { type: 'object' }, run: async (_a, ctx) => {
      now++;
      most = Math.max(most, now);
      for await (const k of await claims.keys(`${name}.${ctx.runId}.slot.>`)) slotKeys.add(k);
      await wait(300);
      now--;
      return 'ok';
    } }], async () => {
      const run = await step(bus, name, ['{}', '{}', '{}', '{}', '{}', '{}']);
      const rs = await results(bus, run, 6);
      assert.deepEqual([...rs.values()].map((r) => r.status), Array(6).fill('succeeded'));
      assert.ok(most <= 2, `at most 2 calls of the run at once (saw ${most})`);
      assert.ok(most >= 1 && slotKeys.size >= 1, `the calls held slots ${[...slotKeys]}`);
      for (const k of slotKeys) assert.match(k, new RegExp(`^${name}\\.${run}\\.slot\\.[01]$`));
      // Every slot was given back.
      const left: string[] = [];
      for await (const k of await claims.keys(`${name}.${run}.slot.>`)) left.push(k);
      assert.deepEqual(left, [], 'slots left behind');
    }, { settings: { runMaxInFlight: 2 } });
  });

  test('parking: an idle queue stops pulling, and a call published for it rings it awake', async () => {
    const name = unique('park');
    const jsm = await bus.jsm();
    await serving(nc, [{ name, description: 'd', inputSchema: { type: 'object' }, run: () => 'awake' }], async (ex) => {
      // Served once, then idle: parked, with no pull waiting on the server.
      const first = await step(bus, name, ['{}']);
      assert.equal((await results(bus, first, 1)).get('call_0')?.status, 'succeeded');
      await eventually(async () => (ex.parked(name) ? true : undefined), 10000, 'the idle queue parked');
      assert.match(ex.metrics.text(), /^toolbus_tool_queues_parked 1$/m);
      await eventually(async () => ((await jsm.consumers.info(bus.queues, wire.toolConsumer(name))).num_waiting === 0 ? true : undefined),
        10000, 'no pull waiting on the parked queue');
      await wait(1500); // past the check a second after parking: only the doorbell wakes it now
      // The next check is parkCheckMS (30 minutes) away, past results()' deadline: a call
      // served now was served by the ring, with no clock read in the test.
      const run = await step(bus, name, ['{}']);
      assert.equal((await results(bus, run, 1)).get('call_0')?.content, 'awake');
      // It parks again once idle.
      await eventually(async () => (ex.parked(name) ? true : undefined), 10000, 'parked again');
    }, { env: { TOOLBUS_EXECUTOR_PARK_AFTER: '300ms' } });
  });

  test('run outcomes: a call of a run whose outcome was heard is not run, and a call of a run that goes on reads no run state', async () => {
    const name = unique('ends');
    let ran = 0;
    await serving(nc, [{ name, description: 'd', inputSchema: { type: 'object' }, run: () => ++ran }], async (ex) => {
      const reads = ex.metrics.runStateReads;
      const live = await step(bus, name, ['{}']);
      assert.equal((await results(bus, live, 1)).get('call_0')?.status, 'succeeded');
      assert.equal(ex.metrics.runStateReads, reads, 'a run that started while the outcomes were followed reads no run state');
      // An outcome event the run state does not record (yet): the executor knows it from the event.
      const run = unique('run');
      const rs: wire.RunStarted = { run_id: run, messages: [{ role: 'user', content: 'test' }], principal: { id: 'tester' } };
      await bus.publish(wire.subject.runStarted(run, 'tester'), { id: wire.id.runStarted(run), type: wire.Type.runStarted,
        source: '/toolbus/test/suite', subject: run, runid: run, step: '0' }, rs);
      await bus.publish(`toolbus.${run}.run.failed`, { id: `${run}/failed`, type: wire.Type.runFailed, source: '/toolbus/test/suite',
        subject: run, runid: run, step: '0' }, { run_id: run, status: 'failed' });
      await nc.flush();
      await step(bus, name, ['{}'], { run, started: true });
      const r = (await results(bus, run, 1)).get('call_0');
      assert.equal(r?.status, 'cancelled', JSON.stringify(r));
      assert.equal(r?.error?.code, 'run_ended');
      assert.equal(ran, 1, 'the call of the ended run ran');
    });
  });

  test('authorizer: a principal it refuses gets rejected / not_authorized with its reason, redacted, and the tool does not run', async () => {
    const name = unique('authz');
    const ran: string[] = [];
    const asked: unknown[] = [];
    const authorize: Authorizer = async (p, tool, args) => {
      asked.push([p.id, tool, args]);
      if (p.id !== 'alice') throw new ToolError('nope', `${p.id} is not on the on-call rota (token s3cr3t-token-value)`);
    };
    await serving(nc, [{ name, description: 'd', inputSchema: { type: 'object', properties: { n: { type: 'integer' } } },
      run: (_a, ctx) => (ran.push(String(ctx.principal.id)), 'done') }], async () => {
      const ok = await step(bus, name, ['{"n":1}'], { principal: 'alice' });
      const no = await step(bus, name, ['{"n":2}'], { principal: 'mallory' });
      assert.equal((await results(bus, ok, 1)).get('call_0')?.status, 'succeeded');
      const r = (await results(bus, no, 1)).get('call_0');
      assert.equal(r?.status, 'rejected', JSON.stringify(r));
      assert.equal(r?.error?.code, 'not_authorized');
      assert.match(r!.content, new RegExp(`not authorized to call ${name}: mallory is not on the on-call rota`));
      assert.doesNotMatch(r!.content, /s3cr3t-token-value/, 'the reason is redacted');
      assert.deepEqual(ran, ['alice'], 'only the allowed principal ran the tool');
      assert.deepEqual(asked.map((a) => JSON.stringify(a)).sort(), [['alice', name, { n: 1 }], ['mallory', name, { n: 2 }]].map((a) => JSON.stringify(a)),
        'the hook sees the principal, the tool and the validated arguments');
    }, { authorize, env: { TOOLBUS_NATS_TOKEN: 's3cr3t-token-value' } });
  });
});
