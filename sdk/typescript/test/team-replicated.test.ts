// The team executor on a replicated deployment, on the two-account server of
// team.test.ts: a consumer electing its leader answers "no responders" for seconds
// (the tool must stay offered), and a replicated bucket serves no direct gets (the
// executor reads its keys through the core's read service, toolbus_teamread.>).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { jetstreamManager } from '@nats-io/jetstream';
import { Client, Executor, wire } from '../src/index.js';
import { capturing, COUNT, countTool, eventually, payTool, startExecutor, teamFixture, teamSkip as skip } from './helpers.js';

const fx = teamFixture();
const enc = new TextEncoder();
const dec = new TextDecoder();

test('team account: a queue answering no responders for a while (a leader election) keeps its tool offered and served', { skip }, async (t) => {
  if (!fx.tb.grant_url) return t.skip('the server takes no grants (grant_url)');
  // Probes 100 ms apart, and so many confirmations that the queue comes back before they
  // end: the revocation below stands for an election that outlasts one probe.
  const [every, confirm] = [Executor.reachEveryMS, Executor.reachConfirm];
  Executor.reachEveryMS = 200;
  Executor.reachConfirm = 100000;
  await capturing(async (lines) => {
    const { ex, done } = await startExecutor(fx.team, [countTool((a) => ({ double: 2 * a.n })), payTool()],
      { TOOLBUS_TEAM: fx.tb.team_name, TOOLBUS_NATS_API_PREFIX: fx.tb.api_prefix, TOOLBUS_LOG_LEVEL: 'debug' });
    const client = await Client.connect({ connection: fx.core, identity: 'alice' });
    try {
      await fx.grant(fx.tb.tools.filter((x) => x !== COUNT));
      const asking = `tool ${COUNT}: its queue answers no responders; asking again before dropping it`;
      const dropped = `tool ${COUNT}: this team's credentials no longer reach its queue`;
      await eventually(async () => (lines.some((l) => l.includes(asking) || l.includes(dropped)) ? true : undefined), 60000, 'a probe finding the queue gone');
      await fx.grant(fx.tb.tools);
      const run = await client.startRun({ messages: [{ role: 'user', content: 'election' }], allowedTools: [COUNT],
        limits: { deadline: new Date(Date.now() + 90000) }, calls: [{ call_id: 'c1', tool: COUNT, arguments: '{"n":4}' }] });
      const ac = new AbortController();
      const timer = setTimeout(() => ac.abort(), 90000);
      let r: wire.ToolFinished | undefined;
      try {
        for await (const ev of client.watch(run, { signal: ac.signal })) {
          if (ev.type === wire.Type.toolFinished) {
            r = ev.data as wire.ToolFinished;
            break;
          }
        }
      } finally {
        clearTimeout(timer);
      }
      assert.equal(r?.status, 'succeeded', `the call after the queue came back: ${JSON.stringify(r)}`);
      assert.equal(r?.content, '{"double":8}');
      assert.ok(!lines.some((l) => l.includes(dropped)), `the tool was dropped on a passing no responders:\n${lines.filter((l) => l.includes(COUNT)).join('')}`);
    } finally {
      await fx.grant(fx.tb.tools);
      Executor.reachEveryMS = every;
      Executor.reachConfirm = confirm;
      await client.close();
      ex.stop();
      await done;
    }
  });
});

test('team account: a claims bucket serving no direct gets (replicated) is read through the read service; another tool\'s claim is not', { skip }, async () => {
  let runs = 0;
  const bus = new wire.Bus(fx.core);
  const jsm = await jetstreamManager(fx.core);
  const claimsStream = `KV_${wire.Bucket.claims}`;
  const run = `r3-${process.pid}-${Date.now()}`;
  const own = wire.key.claim(COUNT, run, 0, 'c1');
  const other = wire.key.claim('not_granted', run, 0, 'c1');
  const claims = await bus.kv(wire.Bucket.claims);
  const done = { team: fx.tb.team_name, instance: 'gone', boot: 'x', attempt: 1, at: new Date().toISOString(), done: true } satisfies wire.Claim;
  await claims.create(own, enc.encode(JSON.stringify(done)));
  await claims.create(other, enc.encode(JSON.stringify(done)));
  const direct = (k: string) => `${fx.tb.api_prefix}.DIRECT.GET.${claimsStream}.$KV.${wire.Bucket.claims}.${k}`;
  const viaService = (k: string) => wire.teamReadLocal(claimsStream, `$KV.${wire.Bucket.claims}.${k}`);
  const answer = (subj: string) => fx.team.request(subj, new Uint8Array(0), { timeout: 5000 }).then((m) => dec.decode(m.data), (err) => (wire.isNoResponders(err) ? 'no responders' : `${err}`));
  // CONTROL: the team's direct get finds its tool's claim while the bucket serves them.
  assert.match(await answer(direct(own)), /"done":true/);
  await jsm.streams.update(claimsStream, { allow_direct: false });
  try {
    await eventually(async () => ((await answer(direct(own))) === 'no responders' ? true : undefined), 30000, 'the direct gets unanswered');
    // The read service answers the team its own tool's claim, and nothing answers it another's.
    assert.match(await eventually(async () => {
      const a = await answer(viaService(own));
      return /"done":true/.test(a) ? a : undefined;
    }, 30000, 'the read service answering the claim'), /"instance":"gone"/);
    assert.equal(await answer(viaService(other)), 'no responders', 'another tool\'s claim through the read service');
    // A call already done, redelivered: the executor reads its claim (through the
    // service) and acknowledges it without running it; unread, it would hand it back
    // for ever.
    const { ex, done: stopped } = await startExecutor(fx.team, [countTool(() => ++runs)],
      { TOOLBUS_TEAM: fx.tb.team_name, TOOLBUS_NATS_API_PREFIX: fx.tb.api_prefix });
    try {
      const delivered = (await jsm.consumers.info(bus.queues, wire.toolConsumer(COUNT))).delivered.stream_seq;
      const req: wire.ToolRequested = { run_id: run, step: 0, call_index: 0, call_count: 1, call: { call_id: 'c1', tool: COUNT, arguments: '{"n":1}' },
        principal: { id: 'alice' } };
      await bus.js.publish(wire.subject.toolRequested(run, COUNT), enc.encode(JSON.stringify(req)), {
        headers: wire.eventHeaders(wire.callAttrs(wire.Type.toolRequested, '/toolbus/planner/test', wire.id.toolRequested(run, 0, 'c1'), run, 0, 'c1', 0, 1)) });
      await eventually(async () => {
        const ci = await jsm.consumers.info(bus.queues, wire.toolConsumer(COUNT));
        return ci.ack_floor.stream_seq > delivered && ci.num_pending === 0 && ci.num_ack_pending === 0 ? true : undefined;
      }, 30000, 'the done call acknowledged');
      assert.equal(runs, 0, 'a done call ran again');
      // The team's bus reads the claim as stored.
      const e = await (await new wire.Bus(fx.team, { apiPrefix: fx.tb.api_prefix }).store(wire.Bucket.claims)).get(own);
      assert.equal((JSON.parse(dec.decode(e!.value)) as wire.Claim).instance, 'gone');
    } finally {
      ex.stop();
      await stopped;
    }
  } finally {
    await jsm.streams.update(claimsStream, { allow_direct: true });
  }
});
