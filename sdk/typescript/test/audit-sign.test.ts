// The TypeScript executor signs its events (TOOLBUS_SIGNING_KEY) and chains them to the
// call's tool.requested, as the Go executor does. The Go test TestNPMAuditTrail runs this
// file on a pipeline whose roles sign (TOOLBUS_TEST_AUDIT: the keys, the tool, where to
// write the runs), then verifies the runs with the Go verifier: the signed one verifies,
// the one served without the key is reported unsigned. Skipped without it.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import type { NatsConnection } from '@nats-io/transport-node';
import { Client, wire } from '../src/index.js';
import { connectTest, eventsOf, eventually, startExecutor, stopServer, unique } from './helpers.js';

const cfg = process.env.TOOLBUS_TEST_AUDIT ? JSON.parse(process.env.TOOLBUS_TEST_AUDIT) as
  { team_key: string; team: string; client_key: string; tool: string; out: string } : undefined;

let nc: NatsConnection;
before(async () => { if (cfg) nc = await connectTest(); });
after(async () => {
  await nc?.drain();
  stopServer();
});

/** Serves the tool (reporting progress) with env, runs one call of it as the signing client, waits for the run's end. */
async function runOnce(env: Record<string, string>): Promise<string> {
  const { ex, done } = await startExecutor(nc, [{
    name: cfg!.tool, description: 'adds', inputSchema: { type: 'object' },
    run: async (_args, ctx) => { ctx.progress(1, 2, 'half'); return 'ok'; },
  }], { TOOLBUS_TEAM: cfg!.team, TOOLBUS_EXECUTOR_PROGRESS_INTERVAL: '1ms', ...env });
  try {
    const client = await Client.connect({ connection: nc, identity: 'tester', signingKey: cfg!.client_key });
    const run = await client.startRun({ runId: unique('audit'), messages: [{ role: 'user', content: 'call it' }],
      calls: [{ call_id: 'c1', tool: cfg!.tool, arguments: '{}' }] });
    await eventually(async () => (await eventsOf(client.bus, run, wire.Type.runCompleted))[0], 60000, `the end of ${run}`);
    const fin = await eventsOf(client.bus, run, wire.Type.toolFinished);
    assert.equal(fin.length, 1);
    assert.equal(!!fin[0].attrs.dssematerial, !!env.TOOLBUS_SIGNING_KEY, 'signed only with the key');
    assert.match(fin[0].attrs.prevdigest ?? '', /^sha256:[0-9a-f]{64}$/, 'chained to its call');
    return run;
  } finally {
    ex.stop();
    await done;
  }
}

test('a run calling a TypeScript tool, served with and without the team\'s key', { skip: !cfg && 'TOOLBUS_TEST_AUDIT unset (the Go test TestNPMAuditTrail sets it)' }, async () => {
  const signed = await runOnce({ TOOLBUS_SIGNING_KEY: cfg!.team_key });
  const unsigned = await runOnce({});
  writeFileSync(cfg!.out, JSON.stringify({ signed, unsigned }));
});
