// The executor against a real NATS JetStream server: each test breaks if the rule of
// the contract it names is broken.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as wait } from 'node:timers/promises';
import type { NatsConnection } from '@nats-io/transport-node';
import { ToolError, wire, type Tool } from '../src/index.js';
import { connectTest, eventsOf, eventually, request, result, startExecutor, stopServer, unique } from './helpers.js';

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

const obj = (properties: object, required: string[] = []) => ({ type: 'object', properties, required, additionalProperties: false });

/** Serves tools for the length of fn. */
async function serving(tools: Tool[], fn: () => Promise<void>, env: Record<string, string> = {}) {
  const { ex, done } = await startExecutor(nc, tools, env);
  try {
    await fn();
  } finally {
    ex.stop();
    await done;
  }
}

describe('executor', () => {
  test('catalog and instance: the contract with its owner, an instance of the team serving it', async () => {
    const name = unique('cat');
    await serving([{ name, description: 'd', inputSchema: obj({}), timeoutMS: 1500, retry: { maxAttempts: 3, initialBackoffMS: 10, maxBackoffMS: 100 }, run: () => 'x' }], async () => {
      const kv = await bus.kv(wire.Bucket.tools);
      const c = JSON.parse(new TextDecoder().decode((await kv.get(name))!.value));
      assert.equal(c.owner, 'team-a');
      assert.equal(c.timeout, 1500 * 1e6, 'durations in nanoseconds, as Go writes them');
      assert.deepEqual(c.retry, { max_attempts: 3, initial_backoff: 10e6, max_backoff: 100e6 });
      const ins = await bus.kv(wire.Bucket.instances);
      const keys: string[] = [];
      for await (const k of await ins.keys('team-a.*.*')) keys.push(k);
      const mine = [];
      for (const k of keys) {
        const e = await ins.get(k);
        if (e?.operation !== 'PUT') continue; // an instance that stopped
        const v = JSON.parse(new TextDecoder().decode(e.value));
        if (v.tools.includes(name)) mine.push(v);
      }
      assert.equal(mine.length, 1, `one live instance of team-a serving ${name} (keys ${keys})`);
    }, { TOOLBUS_TEAM: 'team-a' });
  });

  test('operations: /healthz, /readyz and /metrics with the Go executors\' names', async () => {
    const name = unique('ops');
    const { ex, done } = await startExecutor(nc, [{ name, description: 'd', inputSchema: obj({}), run: () => 'ok' }], { TOOLBUS_METRICS_ADDR: '127.0.0.1:0' });
    try {
      const base = `http://${ex.metricsAddress()}`;
      assert.equal((await fetch(`${base}/healthz`)).status, 200);
      const ready = await fetch(`${base}/readyz`);
      assert.equal(ready.status, 200, await ready.text());
      await result(bus, await request(bus, { tool: name, args: '{}' }));
      const text = await (await fetch(`${base}/metrics`)).text();
      assert.match(text, new RegExp(`^toolbus_tool_calls_total\\{code="",status="succeeded",tool="${name}"\\} 1$`, 'm'));
      assert.match(text, /^toolbus_ready\{role="executor"\} 1$/m);
    } finally {
      ex.stop();
      await done;
    }
  });

  test('a changed contract without a higher version is refused', async () => {
    const name = unique('ver');
    const tool = (description: string, version?: number): Tool => ({ name, description, inputSchema: obj({}), version, run: () => 'x' });
    await serving([tool('first')], async () => {});
    await assert.rejects(serving([tool('second')], async () => {}), /different contract/);
    await serving([tool('second', 2)], async () => {}); // a higher version replaces it
  });

  test('invalid arguments: rejected before the tool runs, every violation with its path', async () => {
    const name = unique('args');
    let ran = 0;
    await serving([{ name, description: 'd', inputSchema: obj({ n: { type: 'integer' }, s: { type: 'string' } }, ['n']), run: () => ++ran }], async () => {
      const cases: [string, string[]][] = [['{"s":1,"x":2}', ['/n', '/s', '/x']], ['{"n":', ['']], ['[1]', ['']], ['', ['']]];
      for (const [args, paths] of cases) {
        const r = await result(bus, await request(bus, { tool: name, args }));
        assert.equal(r.status, 'rejected', args);
        assert.equal(r.error?.code, 'invalid_arguments', args);
        assert.deepEqual((r.error?.details as { path: string }[]).map((d) => d.path).sort(), paths, args);
        assert.match(r.content, /"code":"invalid_arguments"/);
      }
      assert.equal(ran, 0, 'the tool never ran');
    });
  });

  test('the run decides: not allowed, deadline, cancellation', async () => {
    const name = unique('run');
    await serving([{ name, description: 'd', inputSchema: obj({}), timeoutMS: 60000,
      run: async (_a, ctx) => { await wait(60000, undefined, { signal: ctx.signal }); } }], async () => {
      const notAllowed = await result(bus, await request(bus, { tool: name, args: '{}', allowed: ['other'] }));
      assert.equal(notAllowed.error?.code, 'not_authorized');
      const deadline = await result(bus, await request(bus, { tool: name, args: '{}', deadline: new Date(Date.now() + 500).toISOString() }));
      assert.equal(deadline.status, 'timed_out');
      assert.equal(deadline.error?.code, 'timeout');
      const run = await request(bus, { tool: name, args: '{}' });
      const claims = await bus.kv(wire.Bucket.claims);
      await eventually(async () => ((await claims.get(wire.key.claim(name, run, 0, 'call_1'))) ? true : undefined));
      await bus.publish(wire.subject.runCancel(run, 'tester'), { id: wire.id.runCancel(run), type: wire.Type.runCancel, source: '/toolbus/test/x',
        subject: run, runid: run, step: '0' }, { run_id: run, reason: 'test', who: 'tester' });
      const c = await result(bus, run);
      assert.equal(c.status, 'cancelled');
      assert.equal(c.error?.code, 'cancelled');
    });
  });

  test('timeouts: the tool\'s own, and no progress for the heartbeat timeout', async () => {
    const slow = unique('slow');
    const quiet = unique('quiet');
    await serving([
      { name: slow, description: 'd', inputSchema: obj({}), timeoutMS: 300, run: () => wait(10000) },
      { name: quiet, description: 'd', inputSchema: obj({}), timeoutMS: 20000, heartbeatTimeoutMS: 400, run: async (_a, ctx) => {
        for (let i = 0; i < 3; i++) {
          await wait(100);
          ctx.progress(i, 10);
        }
        await wait(10000, undefined, { signal: ctx.signal });
      } },
    ], async () => {
      const a = await result(bus, await request(bus, { tool: slow, args: '{}' }));
      assert.equal(a.status, 'timed_out');
      assert.match(a.error!.message, /timeout of 300ms/);
      assert.equal(a.error!.retryable, true);
      const b = await result(bus, await request(bus, { tool: quiet, args: '{}' }));
      assert.equal(b.status, 'timed_out');
      assert.match(b.error!.message, /no progress for 400ms/);
    });
  });

  test('results: bounded, redacted by value, deterministic, tool errors with their code, output schema', async () => {
    const name = unique('res');
    const secret = 'hunter2-the-nats-token';
    await serving([{ name, description: 'd', inputSchema: obj({ what: { type: 'string' } }, ['what']),
      outputSchema: { type: ['object', 'string'] }, maxOutputBytes: 300, redactFields: ['password'],
      run: ({ what }: { what: string }) => {
        switch (what) {
          case 'leak': return { b: `token ${secret}`, a: Buffer.from(secret).toString('hex'), password: 'pw-in-a-field' };
          case 'big': return 'é'.repeat(1000);
          case 'fail': throw new ToolError('incident_not_found', `no incident (token ${secret})`);
          case 'crash': throw new Error('boom');
          default: return 42;
        }
      } }], async () => {
      const leak = await result(bus, await request(bus, { tool: name, args: '{"what":"leak"}' }));
      assert.equal(leak.status, 'succeeded');
      assert.equal(leak.content, '{"a":"[REDACTED]","b":"token [REDACTED]","password":"[REDACTED]"}');
      assert.equal(leak.redactions, 3);
      assert.doesNotMatch(JSON.stringify(leak), /hunter2/);
      const big = await result(bus, await request(bus, { tool: name, args: '{"what":"big"}' }));
      assert.ok(Buffer.byteLength(big.content) <= 300, `content of ${Buffer.byteLength(big.content)} bytes`);
      assert.match(big.content, /…\[truncated: kept \d+ of 2000 bytes\]…/);
      assert.equal(big.truncated?.original_bytes, 2000);
      assert.ok(!big.content.includes('\uFFFD'), 'never cuts a character');
      const fail = await result(bus, await request(bus, { tool: name, args: '{"what":"fail"}' }));
      assert.equal(fail.status, 'failed');
      assert.equal(fail.error?.code, 'incident_not_found');
      assert.doesNotMatch(fail.error!.message, /hunter2/);
      const crash = await result(bus, await request(bus, { tool: name, args: '{"what":"crash"}' }));
      assert.equal(crash.error?.code, 'tool_error');
      const bad = await result(bus, await request(bus, { tool: name, args: '{"what":"number"}' }));
      assert.equal(bad.error?.code, 'invalid_tool_output');
    }, { TOOLBUS_NATS_TOKEN: secret });
  });

  test('large outputs: kept whole in toolbus_outputs, the result refers to them', async () => {
    const name = unique('large');
    const lines = Array.from({ length: 12000 }, (_, i) => `line ${i} of the log`);
    await serving([{ name, description: 'd', inputSchema: obj({}), run: () => ({ lines }) }], async () => {
      const r = await result(bus, await request(bus, { tool: name, args: '{}' }));
      assert.equal(r.status, 'succeeded');
      assert.equal(r.output, undefined);
      assert.match(r.truncated!.ref!, new RegExp(`^kv://toolbus_outputs/${name}\\.`));
      const whole = JSON.parse(new TextDecoder().decode(await bus.output(r.truncated!.ref!)));
      assert.deepEqual(whole.lines, lines);
    });
  });

  test('progress: only while the call runs, throttled, in sequence, with the call\'s id', async () => {
    const name = unique('prog');
    let late = true;
    await serving([{ name, description: 'd', inputSchema: obj({}), run: async (_a, ctx) => {
      // A burst within one interval: each report replaces the pending one.
      for (let i = 1; i <= 10; i++) ctx.progress(i, 10, `step ${i}`);
      setTimeout(() => (late = ctx.progress(11, 10, 'after the result')), 200);
      await wait(50);
      return 'done';
    } }], async () => {
      const run = await request(bus, { tool: name, args: '{}' });
      await result(bus, run);
      await wait(400);
      assert.equal(late, false, 'a report after the result is refused');
      const evs = await eventsOf<wire.ToolProgress>(bus, run, wire.Type.toolProgress);
      assert.deepEqual(evs.map((e) => [e.data.seq, e.data.done]), [[10, 10]], 'one report per interval: the latest of the burst, before the result');
      for (const e of evs) assert.equal(e.attrs.id, wire.id.toolProgress(run, 0, 'call_1', 1, e.data.seq));
      const all = [];
      for await (const sm of bus.read(wire.subject.run(run))) all.push(sm.header.get('ce-type'));
      assert.equal(all.at(-1), wire.Type.toolFinished, 'no report after the result');
    }, { TOOLBUS_EXECUTOR_PROGRESS_INTERVAL: '10s' });
  });

  test('approvals: tool.waiting and the claim released; an edit runs with the person\'s arguments; a denial and an answer do not run', async () => {
    const name = unique('appr');
    const ran: unknown[] = [];
    await serving([{ name, description: 'd', inputSchema: obj({ service: { type: 'string' } }, ['service']), needsApproval: true,
      run: (a: { service: string }) => { ran.push(a.service); return { restarted: a.service }; } }], async () => {
      const decide = async (run: string, d: Partial<wire.Decision>) => {
        await (await bus.kv(wire.Bucket.approvals)).create(wire.key.decision(run, 0, 'call_1'),
          new TextEncoder().encode(JSON.stringify({ run_id: run, call_id: 'call_1', who: 'bob', ...d })));
        await request(bus, { tool: name, args: '{"service":"auth-api"}', run, decided: true });
      };
      const waiting = async (run: string) => {
        await eventually(async () => (await eventsOf(bus, run, wire.Type.toolWaiting)).length ? true : undefined, 20000, 'tool.waiting');
        assert.equal(await (await bus.kv(wire.Bucket.claims)).get(wire.key.claim(name, run, 0, 'call_1')).then((e) => e?.operation ?? 'none'), 'DEL');
      };
      const edited = await request(bus, { tool: name, args: '{"service":"auth-api"}' });
      await waiting(edited);
      assert.deepEqual(ran, [], 'a call that waits does not run');
      await decide(edited, { granted: true, arguments: '{"service":"auth-api-canary"}' });
      const r = await result(bus, edited);
      assert.deepEqual(r.output, { restarted: 'auth-api-canary' });
      assert.equal(r.human?.kind, 'edited');
      assert.match(r.content, /^\[a person \(bob\) edited the arguments of this call; it ran with \{"service":"auth-api-canary"\}\]\n/);
      const denied = await request(bus, { tool: name, args: '{"service":"auth-api"}' });
      await waiting(denied);
      await decide(denied, { granted: false, why: 'freeze' });
      const d = await result(bus, denied);
      assert.equal(d.error?.code, 'approval_denied');
      assert.match(d.error!.message, /freeze$/);
      const answered = await request(bus, { tool: name, args: '{"service":"auth-api"}' });
      await waiting(answered);
      await decide(answered, { granted: false, response: 'restarted by hand' });
      const a = await result(bus, answered);
      assert.equal(a.status, 'succeeded');
      assert.equal(a.human?.kind, 'responded');
      assert.deepEqual(ran, ['auth-api-canary'], 'only the edited call ran');
    });
  });

  test('retries: a failure the policy names runs again; the one result carries the failed attempts', async () => {
    const name = unique('retry');
    const attempts: number[] = [];
    await serving([{ name, description: 'd', inputSchema: obj({}), retry: { maxAttempts: 3, initialBackoffMS: 50, maxBackoffMS: 200, codes: ['flaky'] },
      run: (_a, ctx) => {
        attempts.push(ctx.attempt);
        if (ctx.attempt < 3) throw new ToolError('flaky', `attempt ${ctx.attempt} failed`);
        return `ok at ${ctx.idempotencyKey}`;
      } }], async () => {
      const run = await request(bus, { tool: name, args: '{}' });
      const r = await result(bus, run);
      assert.equal(r.status, 'succeeded');
      assert.equal(r.attempt, 3);
      assert.deepEqual(r.retries?.map((f) => [f.attempt, f.error.code]), [[1, 'flaky'], [2, 'flaky']]);
      assert.deepEqual(attempts, [1, 2, 3]);
      assert.equal(r.content, `ok at ${run}/0/call_1`);
      await wait(300);
      assert.equal((await eventsOf(bus, run, wire.Type.toolFinished)).length, 1, 'exactly one result');
    });
  });

  test('claims: a call claimed by a live executor waits; one claimed by a dead executor is taken over with the next attempt', async () => {
    const name = unique('claim');
    let runs = 0;
    await serving([{ name, description: 'd', inputSchema: obj({}), run: (_a, ctx) => { runs++; return { attempt: ctx.attempt }; } }], async () => {
      const claims = await bus.kv(wire.Bucket.claims);
      const enc = new TextEncoder();
      // Dead: its instance record does not exist.
      const before = Date.now();
      const dead = unique('run');
      await claims.create(wire.key.claim(name, dead, 0, 'call_1'), enc.encode(JSON.stringify({ instance: 'gone', boot: 'b1', attempt: 1, at: new Date().toISOString() })));
      await request(bus, { tool: name, args: '{}', run: dead });
      const r = await result(bus, dead);
      assert.deepEqual(r.output, { attempt: 2 });
      assert.equal(r.attempt, 2);
      // The attempt's fencing deadline by the server's clock: within one TTL (5 s) of its last renewal.
      const until = Date.parse(r.lease_until!);
      assert.ok(until > before && until < Date.now() + 5000, `lease_until ${r.lease_until}`);
      // Live: an instance record that is renewed; the call is not run while it lives.
      const live = unique('run');
      await bus.putInstance({ name: 'alive', boot: 'b2', tools: [name], concurrency: 1, started_at: new Date().toISOString(), heartbeat_at: new Date().toISOString() });
      await claims.create(wire.key.claim(name, live, 0, 'call_1'), enc.encode(JSON.stringify({ instance: 'alive', boot: 'b2', attempt: 1, at: new Date().toISOString() })));
      await request(bus, { tool: name, args: '{}', run: live });
      await wait(1500);
      assert.equal((await eventsOf(bus, live, wire.Type.toolFinished)).length, 0, 'the live claim holds');
      assert.equal(runs, 1);
      await bus.deleteInstance('', 'alive', 'b2'); // it dies
      const r2 = await result(bus, live);
      assert.equal(r2.attempt, 2);
    });
  });

  test('subject and body agree; poison is terminated and the queue goes on', async () => {
    const name = unique('poison');
    await serving([{ name, description: 'd', inputSchema: obj({}), run: () => 'fine' }], async () => {
      const other = unique('run');
      const run = unique('run');
      await bus.js.publish(wire.subject.toolRequested(run, name), 'not json at all');
      // A call on run's subject whose data names another (started) run.
      await request(bus, { tool: name, args: '{}', run: other });
      const forged = { run_id: other, step: 0, call_index: 0, call_count: 1, call: { call_id: 'forged', tool: name, arguments: '{}' } };
      await bus.publish(wire.subject.toolRequested(run, name), wire.callAttrs(wire.Type.toolRequested, '/toolbus/x/y', 'forged-id', other, 0, 'forged', 0, 1), forged);
      const after = await result(bus, await request(bus, { tool: name, args: '{}' }));
      assert.equal(after.status, 'succeeded');
      // The queue the executor made: on the queue stream, on the tool's one queue subject (provision.ToolConsumerConfig).
      const ci = await (await bus.jsm()).consumers.info(bus.queues, wire.toolConsumer(name));
      assert.deepEqual([ci.stream_name, ci.config.filter_subject, ci.config.max_deliver], ['TOOLBUS_QUEUES', `toolbus_queue.${name}`, -1]);
      assert.equal(ci.num_ack_pending, 0, 'the poison was terminated, not left to redeliver');
      assert.equal((await eventsOf(bus, run, wire.Type.toolFinished)).length, 0);
      assert.equal((await eventsOf<wire.ToolFinished>(bus, other, wire.Type.toolFinished)).filter((e) => e.data.call_id === 'forged').length, 0);
    });
  });
});
