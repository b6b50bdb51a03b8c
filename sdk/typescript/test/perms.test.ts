// The executor on credentials that miss a permission it needs for a call, against a real
// NATS JetStream server with per-user permissions (TOOLBUS_TEST_PERMS_BUS, which the Go
// test TestNPMPermissionDenied passes): the call ends at once with failed /
// permission_denied naming the missing permission, instead of timing out on every delivery.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { Executor, wire } from '../src/index.js';
import { eventsOf, eventually, unique } from './helpers.js';

interface PermsBus {
  url: string;
  core_user: string;
  core_password: string;
  /** An executor's user that may not publish to $KV.toolbus_outputs.> (large outputs). */
  exec_user: string;
  exec_password: string;
}

const conf = process.env.TOOLBUS_TEST_PERMS_BUS;
const skip = conf ? false : 'run by TestNPMPermissionDenied (go test ./sdk/typescript/), on a server with per-user permissions';

let pb: PermsBus;
let core: NatsConnection;
let execConn: NatsConnection;
before(async () => {
  if (skip) return;
  pb = JSON.parse(conf!) as PermsBus;
  core = await connect({ servers: pb.url, user: pb.core_user, pass: pb.core_password });
  execConn = await connect({ servers: pb.url, user: pb.exec_user, pass: pb.exec_password });
});
after(async () => {
  await execConn?.drain();
  await core?.drain();
});

test('permission_denied: a call whose output the credentials may not store ends at once with the missing permission', { skip }, async () => {
  const bus = new wire.Bus(core);
  const name = unique('denied');
  let ran = 0;
  const ex = new Executor({ connection: execConn, env: { TOOLBUS_INSTANCE: unique('ts'), TOOLBUS_ACK_WAIT: '2s', TOOLBUS_LOG_LEVEL: 'error',
    TOOLBUS_GRACE: '2s', TOOLBUS_NATS_USER: pb.exec_user, TOOLBUS_NATS_PASSWORD: pb.exec_password } });
  ex.register({ name, description: 'returns more than a result holds', inputSchema: { type: 'object' }, run: () => {
    ran++;
    return { rows: Array.from({ length: 60000 }, (_, i) => i * 7) }; // over 256 KiB: kept in toolbus_outputs
  } });
  const done = ex.serve();
  await Promise.race([ex.serving(), done]);
  try {
    const run = unique('run');
    await bus.publish(wire.subject.runStarted(run, 'tester'), { id: wire.id.runStarted(run), type: wire.Type.runStarted,
      source: '/toolbus/test/suite', subject: run, runid: run, step: '0' }, { run_id: run, messages: [{ role: 'user', content: 'test' }], principal: { id: 'tester' } });
    const req: wire.ToolRequested = { run_id: run, step: 0, call_index: 0, call_count: 1, call: { call_id: 'call_1', tool: name, arguments: '{}' }, principal: { id: 'tester' } };
    await bus.publish(wire.subject.toolRequested(run, name), wire.callAttrs(wire.Type.toolRequested, '/toolbus/planner/test',
      wire.id.toolRequested(run, 0, 'call_1'), run, 0, 'call_1', 0, 1), req);
    const r = await eventually(async () => (await eventsOf<wire.ToolFinished>(bus, run, wire.Type.toolFinished))[0]?.data, 15000, 'the result');
    assert.equal(r.status, 'failed', JSON.stringify(r));
    assert.equal(r.error?.code, 'permission_denied');
    assert.match(r.error!.message, /permission denied: the credentials of user exec may not publish to "\$KV\.toolbus_outputs\./);
    assert.equal(ran, 1, 'the call was not run again');
    assert.ok(ex.metrics.permissionDenied >= 1, 'the refusal is counted');
    assert.match(ex.metrics.text(), /^toolbus_permission_denied_total [1-9]/m);
  } finally {
    ex.stop();
    await done;
  }
});
