// The client in a client account of its own (the accounts layout, readPrefix) against a
// real server whose client accounts import from the core only their identities' starts,
// decisions and cancellations and the core's read service (TOOLBUS_TEST_CLIENT_BUS, which
// the Go test TestNPMClientAccount passes; the core account runs the pipeline and the
// read service). alice starts, watches, decides and reads her runs through the read
// service alone; bob sees none of them and cannot act as alice.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { jetstreamManager } from '@nats-io/jetstream';
import { Client, NotBoundError, RunExistsError, wire, type RunEvent } from '../src/index.js';
import { unique } from './helpers.js';

interface ClientBus {
  url: string;
  /** Users (and passwords) of the client accounts alice (bound to alice) and bob (bound to bob). */
  alice_user: string;
  alice_password: string;
  bob_user: string;
  bob_password: string;
  /** events.ReadAPIPrefix of alice and bob (TOOLBUS_NATS_READ_PREFIX). */
  alice_read_prefix: string;
  bob_read_prefix: string;
}

const conf = process.env.TOOLBUS_TEST_CLIENT_BUS;
const skip = conf ? false : 'run by TestNPMClientAccount (go test ./sdk/typescript/), on a server with client accounts and the read service';

let cb: ClientBus;
let aliceConn: NatsConnection;
let bobConn: NatsConnection;
let alice: Client;
let bob: Client;
before(async () => {
  if (skip) return;
  cb = JSON.parse(conf!) as ClientBus;
  aliceConn = await connect({ servers: cb.url, user: cb.alice_user, pass: cb.alice_password });
  bobConn = await connect({ servers: cb.url, user: cb.bob_user, pass: cb.bob_password });
  alice = await Client.connect({ connection: aliceConn, identity: 'alice', readPrefix: cb.alice_read_prefix });
  bob = await Client.connect({ connection: bobConn, identity: 'bob', readPrefix: cb.bob_read_prefix });
});
after(async () => {
  await aliceConn?.drain();
  await bobConn?.drain();
});

const isOutcome = (type: string) => (wire.TERMINAL as readonly string[]).some((t) => type === `toolbus.run.${t}`);

/** The events watch yields until until(e) (default: the run's outcome), or what came within ms. */
async function watchUntil(c: Client, run: string, ms: number, until = (e: RunEvent) => isOutcome(e.type), each?: (e: RunEvent) => Promise<void>): Promise<RunEvent[]> {
  const evs: RunEvent[] = [];
  const ac = new AbortController();
  const t = setTimeout(() => ac.abort(), ms);
  try {
    for await (const e of c.watch(run, { signal: ac.signal })) {
      evs.push(e);
      await each?.(e);
      if (until(e)) break;
    }
  } finally {
    clearTimeout(t);
  }
  return evs;
}

test('client account: the settings and the prefixes the Go side uses; the account has no JetStream of its own', { skip, timeout: 60000 }, async () => {
  assert.equal(wire.readAPIPrefix('alice'), cb.alice_read_prefix, 'readAPIPrefix is events.ReadAPIPrefix');
  assert.equal(wire.readAPIPrefix('bob'), cb.bob_read_prefix);
  // What makes every read below go through the read service: the core's API is not there.
  const jsm = await jetstreamManager(aliceConn, { checkAPI: false });
  await assert.rejects(jsm.streams.info('TOOLBUS'), /not enabled/i, 'the client account reaches a JetStream API');
  const c = await Client.connect({ connection: aliceConn, identity: 'alice' });
  await assert.rejects(c.events('run-x'), /not enabled.*readPrefix/s, 'without readPrefix the reads are refused, naming the setting');
});

test('client account: alice calls a tool through the fleet, starts a run, watches it to completion, reads its events', { skip, timeout: 60000 }, async () => {
  const r = await alice.call('calculator', { expression: '2+3' });
  assert.equal(r.status, 'succeeded', JSON.stringify(r));
  assert.match(r.content, /5/);

  const run = await alice.startRun({ runId: unique('alice'), messages: [{ role: 'user', content: 'restart' }], allowedTools: ['calculator', 'restart_service'],
    limits: { deadline: new Date(Date.now() + 120000) },
    calls: [{ call_id: 'c1', tool: 'calculator', arguments: '{"expression":"6*7"}' }, { call_id: 'c2', tool: 'restart_service', arguments: '{"service":"auth-api"}' }] });
  let refused: unknown;
  const bobAsAlice = await Client.connect({ connection: bobConn, identity: 'alice', readPrefix: cb.bob_read_prefix });
  const evs = await watchUntil(alice, run, 90000, undefined, async (e) => {
    if (e.type !== wire.Type.toolWaiting) return;
    // bob's account is not bound to alice: his approval as alice is refused, naming the fix.
    refused = await bobAsAlice.decide(run, 0, 'c2', { kind: 'approve', why: 'mine now' }).then(() => 'published', (err) => err);
    await alice.decide(run, 0, 'c2', { kind: 'approve', why: 'go' });
  });
  assert.ok(refused instanceof NotBoundError, `bob approving as alice: ${refused}`);
  assert.equal((refused as NotBoundError).identity, 'alice');
  assert.match((refused as Error).message, /not bound to the identity "alice".*toolbus admin add-client NAME alice/s);

  assert.equal(evs[0]?.type, wire.Type.runStarted, `the first event: ${evs[0]?.type}`);
  assert.equal(evs[0].subject, `toolbus.${run}.run.started.alice`);
  assert.equal(evs.at(-1)?.type, wire.Type.runCompleted, `the run's outcome (events ${evs.map((e) => e.type)})`);
  const results = evs.filter((e) => e.type === wire.Type.toolFinished).map((e) => e.data as wire.ToolFinished);
  assert.deepEqual(results.map((x) => [x.call_id, x.status]).sort(), [['c1', 'succeeded'], ['c2', 'succeeded']],
    `the results (events ${JSON.stringify(evs.map((e) => [e.seq, e.subject, e.attrs.id]))})`);
  assert.ok(evs.some((e) => e.type === wire.Type.approvalGranted && e.subject.endsWith('.alice')), 'alice\'s approval is in the run');
  assert.ok(!evs.some((e) => e.subject.startsWith(`toolbus.${run}.approval.`) && !e.subject.endsWith('.alice')), 'an approval of another identity is in the run');

  // events(): the run as stored, read through the read service: what watch saw.
  const stored = await alice.events(run);
  assert.deepEqual(stored.map((e) => [e.seq, e.type]), evs.map((e) => [e.seq, e.type]));
  // Dialed from the environment (TOOLBUS_NATS_READ_PREFIX), the client reads the same.
  const fromEnv = await Client.connect({ identity: 'alice', env: { TOOLBUS_NATS_URL: cb.url, TOOLBUS_NATS_USER: cb.alice_user,
    TOOLBUS_NATS_PASSWORD: cb.alice_password, TOOLBUS_NATS_READ_PREFIX: cb.alice_read_prefix } });
  try {
    assert.equal(fromEnv.bus.readPrefix, cb.alice_read_prefix);
    assert.deepEqual((await fromEnv.events(run)).map((e) => e.seq), evs.map((e) => e.seq));
  } finally {
    await fromEnv.close();
  }
  // A run id that exists is refused through the read service too.
  await assert.rejects(alice.startRun({ runId: run }), RunExistsError);
});

test('client account: bob does not see alice\'s run (watch and events answer as absent), nor start one under its id', { skip, timeout: 60000 }, async () => {
  const run = await alice.startRun({ runId: unique('alice-secret'), messages: [{ role: 'user', content: 'secret' }], allowedTools: ['calculator'],
    calls: [{ call_id: 'c1', tool: 'calculator', arguments: '{"expression":"1+1"}' }] });
  const mine = await watchUntil(alice, run, 90000);
  assert.equal(mine.at(-1)?.type, wire.Type.runCompleted, 'alice\'s run completed');

  assert.deepEqual(await bob.events(run), [], 'bob reads alice\'s run');
  assert.deepEqual(await watchUntil(bob, run, 1500), [], 'bob watches alice\'s run');
  assert.equal(await bob.bus.runStarted(run), null, 'bob reads alice\'s run.started');
  assert.equal(await bob.bus.getMsg({ last_by_subj: `toolbus.${run}.run.completed` }), null, 'bob reads alice\'s outcome by subject');
  // The id exists (bob cannot see it): bob's start under it is refused, and alice's run keeps its start.
  await assert.rejects(bob.startRun({ runId: run, messages: [{ role: 'user', content: 'squat' }] }), RunExistsError);
  const after = await alice.events(run);
  assert.equal(after.filter((e) => e.type === wire.Type.runStarted)[0]?.subject, `toolbus.${run}.run.started.alice`);
  // And nothing of bob's is stored in it: the conflict is the answer (as in Go).
  assert.ok(!after.some((e) => e.subject === `toolbus.${run}.run.started.bob`), 'bob\'s refused start is stored in alice\'s run');

  // bob sees his own run (the absences above are the read service's, not a broken bob).
  const his = await bob.startRun({ runId: unique('bob'), messages: [{ role: 'user', content: 'bob' }], allowedTools: ['calculator'],
    calls: [{ call_id: 'c1', tool: 'calculator', arguments: '{"expression":"2*2"}' }] });
  const hisEvents = await watchUntil(bob, his, 90000);
  assert.equal(hisEvents.at(-1)?.type, wire.Type.runCompleted, `bob's own run (events ${hisEvents.map((e) => e.type)})`);
  assert.deepEqual(await alice.events(his), [], 'alice reads bob\'s run');

  // Each lists its own runs through the read service, and not the other's.
  const aliceRuns = (await alice.runs()).map((r) => r.run_id);
  const bobRuns = (await bob.runs()).map((r) => r.run_id);
  assert.ok(aliceRuns.includes(run) && !aliceRuns.includes(his), `alice lists ${aliceRuns}`);
  assert.ok(bobRuns.includes(his) && !bobRuns.includes(run), `bob lists ${bobRuns}`);
});

test('client account: starting and cancelling as an identity the account is not bound to is refused, naming it and the fix', { skip, timeout: 60000 }, async () => {
  const bobAsAlice = await Client.connect({ connection: bobConn, identity: 'alice', readPrefix: cb.bob_read_prefix });
  const notBound = (err: unknown) => err instanceof NotBoundError && err.identity === 'alice' && /toolbus admin add-client NAME alice/.test(err.message);
  await assert.rejects(bobAsAlice.startRun({ runId: unique('forged'), messages: [{ role: 'user', content: 'as alice' }] }), notBound);
  await assert.rejects(bobAsAlice.cancel(unique('forged'), 'as alice'), notBound);
});

test('client account: many reads of one identity at once are all answered (the read service\'s 429s are sent again)', { skip, timeout: 60000 }, async () => {
  const run = await alice.startRun({ runId: unique('many'), messages: [{ role: 'user', content: 'many' }] });
  // More than the service works on at once for one identity (reads.PerIdentity, 16).
  const all = await Promise.allSettled(Array.from({ length: 64 }, () => alice.events(run)));
  const refused = all.filter((r) => r.status === 'rejected').map((r) => String((r as PromiseRejectedResult).reason));
  assert.deepEqual(refused, [], `${refused.length} of 64 reads refused`);
  for (const r of all) assert.equal((r as PromiseFulfilledResult<RunEvent[]>).value[0]?.subject, `toolbus.${run}.run.started.alice`);
});
