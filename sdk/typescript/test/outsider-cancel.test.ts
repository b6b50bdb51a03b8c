// A run.cancel by someone the run does not name (the Go twin of this test is
// executor/worker/outsider_cancel_test.go): anyone may write one on their own subject,
// naming any run, and the injector refuses it unless its TOOLBUS_DECIDERS lists them
// (this bus's injector lists ops, testbus and npm_test.go).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { NatsConnection } from '@nats-io/transport-node';
import { wire } from '../src/index.js';
import { connectTest, eventually, request, result, startExecutor, stopServer, unique } from './helpers.js';

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

const cancel = (run: string, who: string) => bus.publish(wire.subject.runCancel(run, who), { id: wire.id.runCancel(run), type: wire.Type.runCancel,
  source: '/toolbus/test/x', subject: run, runid: run, step: '0' }, { run_id: run, reason: 'test', who });

test('a cancel by an outsider leaves the call running; the principal\'s own cancel and an accepted decider\'s end of the run cancel theirs', async () => {
  const name = unique('hold');
  const started = new Map<string, AbortSignal>();
  const release = new Map<string, () => void>();
  const { ex, done } = await startExecutor(nc, [{ name, description: 'holds until released', timeoutMS: 120000,
    inputSchema: { type: 'object', properties: { key: { type: 'string' } }, required: ['key'] },
    run: ({ key }: { key: string }, ctx) => new Promise((resolve, reject) => {
      started.set(key, ctx.signal);
      release.set(key, () => resolve({ held: key }));
      ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason));
    }) }]);
  try {
    const runs: Record<string, string> = {};
    for (const k of ['victim', 'sentinel', 'ops']) {
      runs[k] = await request(bus, { tool: name, args: JSON.stringify({ key: k }) });
      await eventually(async () => (started.has(k) ? true : undefined), 30000, `${k}'s call started`);
    }
    // bob, named by neither the run nor the injector's policy: the injector refuses his cancel.
    await cancel(runs.victim, 'bob');
    // CONTROL: the principal's own cancel, written after bob's, cancels its call at once.
    await cancel(runs.sentinel, 'tester');
    assert.equal((await result(bus, runs.sentinel)).status, 'cancelled');
    // CONTROL: ops, whom the run does not name but the injector's policy does: the run ends,
    // and its end reaches the call in flight.
    await cancel(runs.ops, 'ops');
    assert.equal((await result(bus, runs.ops)).status, 'cancelled');
    assert.equal(started.get('victim')!.aborted, false, 'bob\'s refused cancel cancelled the principal\'s call in flight');
    release.get('victim')!();
    const r = await result(bus, runs.victim);
    assert.equal(r.status, 'succeeded', JSON.stringify(r.error));
    assert.deepEqual(r.output, { held: 'victim' });
  } finally {
    ex.stop();
    await done;
  }
});
