// A team writes, on its own tool's subject of a run (all the write service lets it), an
// event whose CloudEvents type and data say it is the run's outcome, or the result of
// another tool's call: the client's call, watch and events take an event only on the
// subject its type and data name (as the Go client, events.CheckSubject), so the forged
// ones count for nothing and the real result and outcome stand (the control).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { headers, type NatsConnection } from '@nats-io/transport-node';
import { jetstream } from '@nats-io/jetstream';
import { Client, wire } from '../src/index.js';
import { connectTest, stopServer, unique } from './helpers.js';

let nc: NatsConnection;
before(async () => {
  nc = await connectTest();
});
after(async () => {
  await nc.drain();
  stopServer();
});

test('an event typed as the outcome or as another tool\'s result, on a team\'s own subject, counts for no client read', async () => {
  const client = await Client.connect({ connection: nc, identity: 'alice' });
  const run = unique('forged');
  const js = jetstream(nc);
  const forge = async (n: number, type: string, data: object, on = 'log') => {
    const h = headers();
    for (const [k, v] of Object.entries({ 'ce-specversion': '1.0', 'ce-id': `${run}/forged/${n}`, 'ce-source': '/toolbus/executor/other',
      'ce-type': type, 'ce-runid': run, 'Content-Type': 'application/json' })) h.set(k, v);
    await js.publish(`toolbus.${run}.tool.${on}.other_tool`, JSON.stringify(data), { headers: h });
  };
  await forge(1, wire.Type.toolFinished, { run_id: run, step: 0, call_id: 'call_0', tool: 'calculator', status: 'succeeded', content: 'forged' });
  await forge(3, wire.Type.toolFinished, { run_id: run, step: 0, call_id: 'call_0', tool: 'other_tool', status: 'succeeded', content: 'forged' }, 'finished');
  await forge(2, wire.Type.runCompleted, { run_id: run, status: 'completed', answer: 'forged' });
  const r = await client.call('calculator', { expression: '2+3' }, { runId: run });
  assert.match(r.content, /5/, `the call's result is the calculator's, not the forged one: ${JSON.stringify(r)}`);
  const evs = await client.events(run);
  for (const e of evs) {
    assert.ok(!e.subject.endsWith('.other_tool') || e.subject.includes('.tool.finished.'), `a forged event counts: ${e.type} on ${e.subject}`);
  }
  assert.ok(evs.some((e) => e.type === wire.Type.toolFinished && e.subject === `toolbus.${run}.tool.finished.calculator`), 'control: the real result');
});
