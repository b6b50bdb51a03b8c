// The executor in its team's own NATS account (the accounts layout, TOOLBUS_NATS_API_PREFIX)
// against a real two-account server: the core account runs the pipeline (planner,
// injector), the team account reaches the core only through the imports of its tools
// (events/eventstest.TeamImports). Each check breaks when the executor reaches for what
// the core does not export (a run, a bucket by name, the stream's info) or loses a rule.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as wait } from 'node:timers/promises';
import { Client, Executor, wire, type Tool, type ToolContext } from '../src/index.js';
import { capturing, COUNT, countTool, eventsOf, eventually, HANG, PAY, payTool, startExecutor, teamFixture, teamSkip as skip } from './helpers.js';

const fx = teamFixture();
const dec = new TextDecoder();

test('team account: two calls of one step run once each, an edited approval reaches the tool, claims are marked done', { skip }, async () => {
  assert.ok(fx.tb.tools.includes(COUNT) && fx.tb.tools.includes(PAY), `the team is granted ${COUNT} and ${PAY} (got ${fx.tb.tools})`);
  const counted = new Map<number, number>();
  const paid: string[] = [];
  const principals: string[] = [];
  const { ex, done } = await startExecutor(fx.team, [
    countTool((a, ctx) => {
      counted.set(a.n, (counted.get(a.n) ?? 0) + 1);
      principals.push(String(ctx.principal.id));
      return { double: 2 * a.n };
    }),
    payTool((a) => {
      paid.push(JSON.stringify(a));
      return 'paid';
    }),
  ], { TOOLBUS_TEAM: fx.tb.team_name, TOOLBUS_NATS_API_PREFIX: fx.tb.api_prefix });
  const client = await Client.connect({ connection: fx.core, identity: 'alice' });
  try {
    // The contracts reached the core's catalog through the exported keys.
    const tools = await new wire.Bus(fx.core).kv(wire.Bucket.tools);
    for (const t of [COUNT, PAY]) {
      const c = await eventually(async () => tools.get(t).then((e) => (e?.operation === 'PUT' ? JSON.parse(dec.decode(e.value)) : undefined)), 30000, `${t} in the catalog`);
      assert.equal(c.owner, fx.tb.team_name);
    }
    const run = await client.startRun({
      messages: [{ role: 'user', content: 'team' }], allowedTools: [COUNT, PAY], limits: { deadline: new Date(Date.now() + 120000) },
      calls: [{ call_id: 'c1', tool: COUNT, arguments: '{"n":1}' }, { call_id: 'c2', tool: COUNT, arguments: '{"n":2}' },
        { call_id: 'p1', tool: PAY, arguments: '{"amount":100}' }],
    });
    const results = new Map<string, wire.ToolFinished>();
    let outcome = '';
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(), 150000);
    try {
      for await (const ev of client.watch(run, { signal: ac.signal })) {
        if (ev.type === wire.Type.toolWaiting) await client.decide(run, 0, 'p1', { kind: 'edit', arguments: { amount: 90 } });
        if (ev.type === wire.Type.toolFinished) {
          const r = ev.data as wire.ToolFinished;
          results.set(r.call_id, r);
        }
        if (ev.type.startsWith('toolbus.run.') && (wire.TERMINAL as readonly string[]).includes(ev.type.slice('toolbus.run.'.length))) outcome = ev.type;
      }
    } finally {
      clearTimeout(timer);
    }
    assert.equal(outcome, wire.Type.runCompleted, `the run completed (results ${JSON.stringify([...results.values()])})`);
    assert.equal(results.get('c1')?.content, '{"double":2}');
    assert.equal(results.get('c2')?.content, '{"double":4}');
    assert.equal(results.get('p1')?.status, 'succeeded');
    assert.equal(results.get('p1')?.human?.kind, 'edited');
    assert.deepEqual([...counted.entries()].sort(), [[1, 1], [2, 1]], 'each call of the step ran once');
    assert.deepEqual(principals, ['alice', 'alice'], 'the principal the call carries');
    assert.deepEqual(paid, ['{"amount":90}'], 'the person\'s arguments reached the tool, once');
    // The claims say the calls are done: a take-over would not run them again.
    const claims = await new wire.Bus(fx.core).kv(wire.Bucket.claims);
    for (const [tool, call] of [[COUNT, 'c1'], [COUNT, 'c2'], [PAY, 'p1']]) {
      const e = await claims.get(wire.key.claim(tool, run, 0, call));
      assert.equal(e?.operation, 'PUT', `the claim of ${call}`);
      const c = JSON.parse(dec.decode(e!.value)) as wire.Claim;
      assert.ok(c.done && c.team === fx.tb.team_name, `the claim of ${call} is marked done by the team: ${JSON.stringify(c)}`);
    }
  } finally {
    await client.close();
    ex.stop();
    await done;
  }
});

test('team account: a call already done is not run again on a take-over', { skip }, async () => {
  // A call whose claim is marked done by a dead instance of the team: redelivered, the
  // executor takes the claim as stored (it may not walk the results) and acks it.
  let runs = 0;
  const { ex, done } = await startExecutor(fx.team, [countTool(() => ++runs)],
    { TOOLBUS_TEAM: fx.tb.team_name, TOOLBUS_NATS_API_PREFIX: fx.tb.api_prefix });
  try {
    const bus = new wire.Bus(fx.core);
    const run = `done-${process.pid}-${Date.now()}`;
    const claims = await bus.kv(wire.Bucket.claims);
    await claims.create(wire.key.claim(COUNT, run, 0, 'c1'), new TextEncoder().encode(JSON.stringify(
      { team: fx.tb.team_name, instance: 'gone', boot: 'x', attempt: 1, at: new Date().toISOString(), done: true } satisfies wire.Claim)));
    const req: wire.ToolRequested = { run_id: run, step: 0, call_index: 0, call_count: 1, call: { call_id: 'c1', tool: COUNT, arguments: '{"n":1}' },
      principal: { id: 'alice' } };
    // The queue is on the queue stream, whose sequences are not the event stream's: the
    // call is acknowledged once the queue's ack floor passes what it had delivered before.
    const jsm = await bus.jsm();
    const delivered = (await jsm.consumers.info(bus.queues, wire.toolConsumer(COUNT))).delivered.stream_seq;
    await bus.js.publish(wire.subject.toolRequested(run, COUNT), new TextEncoder().encode(JSON.stringify(req)), {
      headers: wire.eventHeaders(wire.callAttrs(wire.Type.toolRequested, '/toolbus/planner/test', wire.id.toolRequested(run, 0, 'c1'), run, 0, 'c1', 0, 1)) });
    // The executor acknowledges it without running it or taking the claim over.
    await eventually(async () => {
      const ci = await jsm.consumers.info(bus.queues, wire.toolConsumer(COUNT));
      return ci.ack_floor.stream_seq > delivered && ci.num_pending === 0 && ci.num_ack_pending === 0 ? true : undefined;
    }, 30000, 'the call acknowledged');
    const c = JSON.parse(dec.decode((await claims.get(wire.key.claim(COUNT, run, 0, 'c1')))!.value)) as wire.Claim;
    assert.deepEqual([c.instance, c.attempt], ['gone', 1], 'the done claim was taken over');
    assert.equal(runs, 0, 'a done call ran again');
  } finally {
    ex.stop();
    await done;
  }
});

test('team account: a cancelled run cancels the team call through the core notice', { skip }, async () => {
  // A team hears no run.cancel of the core account: the injector tells the executors of
  // the tools of a run that ended (toolbus_notice.<run>.ended.<tool>).
  assert.ok(fx.tb.tools.includes(HANG), `the team is granted ${HANG} (got ${fx.tb.tools})`);
  let started!: () => void;
  const running = new Promise<void>((r) => { started = r; });
  let aborted!: (why: unknown) => void;
  const ended = new Promise<unknown>((r) => { aborted = r; });
  const { ex, done } = await startExecutor(fx.team, [{
    name: HANG, description: 'waits for its signal', timeoutMS: 600000, inputSchema: { type: 'object' },
    run: (_a: unknown, ctx: ToolContext) => new Promise((_res, rej) => {
      started();
      ctx.signal.addEventListener('abort', () => { aborted(ctx.signal.reason); rej(ctx.signal.reason); });
    }),
  } as Tool], { TOOLBUS_TEAM: fx.tb.team_name, TOOLBUS_NATS_API_PREFIX: fx.tb.api_prefix });
  const client = await Client.connect({ connection: fx.core, identity: 'alice' });
  try {
    const run = await client.startRun({ messages: [{ role: 'user', content: 'hang' }], allowedTools: [HANG],
      calls: [{ call_id: 'h1', tool: HANG, arguments: '{}' }] });
    await within(running, 60000, 'the hanging call never started');
    await client.cancel(run, 'enough');
    const why = await within(ended, 60000, 'the team call was not cancelled');
    assert.match(String(why), /cancel/);
  } finally {
    ex.stop();
    await done;
  }
});

test('team account: an idle queue does not park (no consumer info: it cannot tell what is unacknowledged), and serves a call published for it', { skip }, async () => {
  // A team asks the core's JetStream API no consumer info (the server answers every
  // account's infos from one queue, which a team could flood): a redelivery rings no
  // doorbell, so its queues keep their pull.
  const bus = new wire.Bus(fx.core);
  const { ex, done } = await startExecutor(fx.team, [countTool((a) => ({ double: 2 * a.n }))],
    { TOOLBUS_TEAM: fx.tb.team_name, TOOLBUS_NATS_API_PREFIX: fx.tb.api_prefix, TOOLBUS_EXECUTOR_PARK_AFTER: '300ms' });
  try {
    await wait(1500); // past the idle time at which a queue in the core account parks
    assert.ok(!ex.parked(COUNT), 'the team queue parked');
    assert.match(ex.metrics.text(), /^toolbus_tool_queues_parked 0$/m);
    const run = `park-${process.pid}-${Date.now()}`;
    const req: wire.ToolRequested = { run_id: run, step: 0, call_index: 0, call_count: 1, call: { call_id: 'c1', tool: COUNT, arguments: '{"n":21}' },
      principal: { id: 'alice' } };
    await bus.js.publish(wire.subject.toolRequested(run, COUNT), new TextEncoder().encode(JSON.stringify(req)), {
      headers: wire.eventHeaders(wire.callAttrs(wire.Type.toolRequested, '/toolbus/planner/test', wire.id.toolRequested(run, 0, 'c1'), run, 0, 'c1', 0, 1)) });
    const r = await eventually(async () => (await eventsOf<wire.ToolFinished>(bus, run, wire.Type.toolFinished))[0]?.data, 30000, 'the result of the call');
    assert.equal(r.status, 'succeeded');
    assert.equal(r.content, '{"double":42}');
  } finally {
    ex.stop();
    await done;
  }
});

/** p, or a failure saying what did not happen within ms (the timer does not outlive it). */
async function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_r, rej) => { timer = setTimeout(() => rej(new Error(what)), ms); })]);
  } finally {
    clearTimeout(timer);
  }
}

test('team account: a revoked tool leaves the instance record with one line saying why, the other is served all along, granted again it comes back', { skip }, async (t) => {
  if (!fx.tb.grant_url) return t.skip('the server takes no grants (grant_url)');
  const reach = Executor.reachEveryMS;
  Executor.reachEveryMS = 100;
  await capturing(async (lines) => {
    const instance = `revoke-${process.pid}`;
    const { ex, done } = await startExecutor(fx.team, [countTool((a) => ({ double: 2 * a.n })), payTool()],
      { TOOLBUS_TEAM: fx.tb.team_name, TOOLBUS_NATS_API_PREFIX: fx.tb.api_prefix, TOOLBUS_INSTANCE: instance, TOOLBUS_LOG_LEVEL: 'info' });
    const instances = await new wire.Bus(fx.core).kv(wire.Bucket.instances);
    const listed = (want: string[]) => eventually(async () => {
      for await (const k of await instances.keys(`${fx.tb.team_name}.${instance}.*`)) {
        const e = await instances.get(k);
        if (e?.operation !== 'PUT') continue;
        const tools = (JSON.parse(dec.decode(e.value)).tools as string[]).sort();
        if (JSON.stringify(tools) === JSON.stringify([...want].sort())) return true;
      }
      return undefined;
    }, 30000, `the instance record listing ${want}`);
    const client = await Client.connect({ connection: fx.core, identity: 'alice' });
    try {
      await listed([COUNT, PAY]);
      await fx.grant(fx.tb.tools.filter((x) => x !== COUNT));
      await listed([PAY]);
      const line = `tool ${COUNT}: this team's credentials no longer reach its queue (revoked?); not serving it`;
      assert.equal(lines.filter((l) => l.includes(line)).length, 1, `the not-serving line once:\n${lines.join('')}`);
      // The control: the other tool is served as before.
      const run = await client.startRun({
        messages: [{ role: 'user', content: 'revoked' }], allowedTools: [PAY], limits: { deadline: new Date(Date.now() + 60000) },
        calls: [{ call_id: 'p1', tool: PAY, arguments: '{"amount":1}' }],
      });
      const ac = new AbortController();
      const timer = setTimeout(() => ac.abort(), 60000);
      let status = '';
      try {
        for await (const ev of client.watch(run, { signal: ac.signal })) {
          if (ev.type === wire.Type.toolWaiting) await client.decide(run, 0, 'p1', { kind: 'approve' });
          if (ev.type === wire.Type.toolFinished) {
            status = (ev.data as wire.ToolFinished).status;
            break;
          }
        }
      } finally {
        clearTimeout(timer);
      }
      assert.equal(status, 'succeeded', `${PAY} after ${COUNT} was revoked`);
      await fx.grant(fx.tb.tools);
      await listed([COUNT, PAY]);
      assert.ok(lines.some((l) => l.includes(`tool ${COUNT}: its queue is reachable again`)), 'a line says it is served again');
    } finally {
      await fx.grant(fx.tb.tools);
      Executor.reachEveryMS = reach;
      await client.close?.();
      ex.stop();
      await done;
    }
  });
});
