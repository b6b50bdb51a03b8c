// The client and the TypeScript executor in the whole pipeline (planner, injector and a
// Go executor of the demo and diag packs, run by the Go test or by testbus).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { setTimeout as wait } from 'node:timers/promises';
import type { NatsConnection } from '@nats-io/transport-node';
import { Client, RunExistsError, ToolError, wire, type RunEvent } from '../src/index.js';
import { connectTest, eventsOf, eventually, serverURL, startExecutor, stopServer, unique } from './helpers.js';
import { slowTool } from './fixtures/tools.js';

let nc: NatsConnection;
let client: Client;
before(async () => {
  nc = await connectTest();
  client = await Client.connect({ connection: nc, identity: 'alice' });
});
after(async () => {
  await nc.drain();
  stopServer();
});

/** The events of a run until its outcome. */
async function outcome(run: string, until = (e: RunEvent) => /^toolbus\.run\.(completed|failed|limit_reached|cancelled)$/.test(e.type)): Promise<RunEvent[]> {
  const evs: RunEvent[] = [];
  const ac = new AbortController();
  const t = setTimeout(() => ac.abort(), 60000);
  try {
    for await (const e of client.watch(run, { signal: ac.signal })) {
      evs.push(e);
      if (until(e)) break;
    }
  } finally {
    clearTimeout(t);
  }
  return evs;
}

const finished = (evs: RunEvent[]) => evs.filter((e) => e.type === wire.Type.toolFinished).map((e) => e.data as wire.ToolFinished);

describe('client', () => {
  test('startRun: the first run.started of its id, as the client\'s identity; an id that exists is refused', async () => {
    const run = await client.startRun({ messages: [{ role: 'user', content: 'hi' }], allowedTools: ['calculator'] });
    const started = await new wire.Bus(nc).runStarted(run);
    assert.equal(started?.rs.principal?.id, 'alice');
    const evs = await eventsOf(new wire.Bus(nc), run, wire.Type.runStarted);
    assert.equal(evs[0].subject, `toolbus.${run}.run.started.alice`);
    await assert.rejects(client.startRun({ runId: run }), RunExistsError);
  });

  test('call: one tool through the fleet (a Go tool)', async () => {
    const r = await client.call('calculator', { expression: '2+3' });
    assert.equal(r.status, 'succeeded', JSON.stringify(r));
    assert.match(r.content, /5/);
  });

  test('a run of a TypeScript tool (team-a) and a Go tool: both results, progress, a retry, the run completes', async () => {
    const name = unique('ts-team');
    const { ex, done } = await startExecutor(nc, [{
      name, description: 'Greets, after a flaky first attempt.', inputSchema: { type: 'object', properties: { who: { type: 'string' } }, required: ['who'] },
      retry: { maxAttempts: 3, initialBackoffMS: 20, maxBackoffMS: 100 },
      run: async ({ who }: { who: string }, ctx) => {
        ctx.progress(1, 1, 'greeting');
        if (ctx.attempt === 1) throw new ToolError('flaky', 'try again', { retryable: true });
        await wait(50);
        return `hello ${who}`;
      },
    }], { TOOLBUS_TEAM: 'team-a', TOOLBUS_EXECUTOR_PROGRESS_INTERVAL: '10ms' });
    try {
      const run = await client.startRun({ allowedTools: [name, 'calculator'], calls: [
        { call_id: 'c1', tool: name, arguments: '{"who":"bob"}' }, { call_id: 'c2', tool: 'calculator', arguments: '{"expression":"6*7"}' }] });
      const evs = await outcome(run);
      assert.equal(evs.at(-1)!.type, wire.Type.runCompleted);
      const res = finished(evs);
      assert.deepEqual(res.map((r) => [r.call_id, r.status]).sort(), [['c1', 'succeeded'], ['c2', 'succeeded']]);
      const ts = res.find((r) => r.call_id === 'c1')!;
      assert.equal(ts.content, 'hello bob');
      assert.equal(ts.attempt, 2);
      assert.equal(ts.retries?.length, 1);
      assert.ok(evs.some((e) => e.type === wire.Type.toolProgress), 'progress of the TypeScript call');
    } finally {
      ex.stop();
      await done;
    }
  });

  test('decide: a TypeScript tool that needs approval waits; a person\'s edit runs it with their arguments', async () => {
    const name = unique('ts-appr');
    const ran: string[] = [];
    const { ex, done } = await startExecutor(nc, [{
      name, description: 'Restarts a service.', needsApproval: true,
      inputSchema: { type: 'object', properties: { service: { type: 'string' } }, required: ['service'], additionalProperties: false },
      run: ({ service }: { service: string }) => { ran.push(service); return { restarted: service }; },
    }]);
    try {
      const run = await client.startRun({ allowedTools: [name], calls: [{ call_id: 'c1', tool: name, arguments: '{"service":"auth-api"}' }] });
      await outcome(run, (e) => e.type === wire.Type.runWaiting);
      assert.deepEqual(ran, []);
      await client.decide(run, 0, 'c1', { kind: 'edit', arguments: { service: 'auth-api-canary' } });
      const evs = await outcome(run);
      assert.equal(evs.at(-1)!.type, wire.Type.runCompleted);
      const r = finished(evs)[0];
      assert.equal(r.human?.kind, 'edited');
      assert.equal(r.human?.who, 'alice');
      assert.deepEqual(ran, ['auth-api-canary']);
    } finally {
      ex.stop();
      await done;
    }
  });

  test('cancel: the running TypeScript call is cancelled and the run ends cancelled', async () => {
    const name = unique('ts-cancel');
    const { ex, done } = await startExecutor(nc, [slowTool(name, async (ctx) => {
      ctx.progress(1, 2, 'working');
      await wait(120000, undefined, { signal: ctx.signal });
    })], { TOOLBUS_EXECUTOR_PROGRESS_INTERVAL: '10ms' });
    try {
      const run = await client.startRun({ allowedTools: [name], calls: [{ call_id: 'c1', tool: name, arguments: '{}' }] });
      await outcome(run, (e) => e.type === wire.Type.toolProgress);
      await client.cancel(run, 'changed my mind');
      const evs = await outcome(run);
      assert.equal(evs.at(-1)!.type, wire.Type.runCancelled);
      const r = await eventually(async () => (await eventsOf<wire.ToolFinished>(new wire.Bus(nc), run, wire.Type.toolFinished))[0]?.data);
      assert.equal(r.status, 'cancelled');
    } finally {
      ex.stop();
      await done;
    }
  });

  test('a killed TypeScript executor: its call is taken over once, with the same idempotency key', async () => {
    const name = unique('ts-killed');
    const fixture = fileURLToPath(new URL('./fixtures/slow-executor.js', import.meta.url));
    const child = spawn(process.execPath, [fixture, name], {
      env: { ...process.env, TOOLBUS_NATS_URL: await serverURL(), TOOLBUS_INSTANCE: 'doomed', TOOLBUS_ACK_WAIT: '2s', TOOLBUS_LOG_LEVEL: 'warn' },
      stdio: ['ignore', 'inherit', 'inherit'],
    });
    const bus = new wire.Bus(nc);
    try {
      await eventually(async () => ((await (await bus.kv(wire.Bucket.tools)).get(name)) ? true : undefined), 30000, 'the child\'s contract');
      const run = await client.startRun({ allowedTools: [name], calls: [{ call_id: 'c1', tool: name, arguments: '{}' }] });
      await outcome(run, (e) => e.type === wire.Type.toolProgress); // the child runs it
      child.kill('SIGKILL');
      const keys: string[] = [];
      const { ex, done } = await startExecutor(nc, [slowTool(name, async (ctx) => {
        keys.push(ctx.idempotencyKey);
        return { attempt: ctx.attempt };
      })]);
      try {
        const evs = await outcome(run);
        assert.equal(evs.at(-1)!.type, wire.Type.runCompleted);
        const res = finished(evs);
        assert.equal(res.length, 1);
        assert.deepEqual(res[0].output, { attempt: 2 });
        assert.deepEqual(keys, [`${run}/0/c1`], 'taken over once');
      } finally {
        ex.stop();
        await done;
      }
    } finally {
      child.kill('SIGKILL');
    }
  });
});
