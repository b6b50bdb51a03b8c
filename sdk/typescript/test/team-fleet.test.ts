// The executor's fleet-wide rules in its team's own NATS account (TOOLBUS_NATS_API_PREFIX)
// against a real two-account server: what it writes for them must be under the keys the
// core exports for the team's tools.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as wait } from 'node:timers/promises';
import { Executor, wire } from '../src/index.js';
import { COUNT, countTool, eventually, teamFixture, teamSkip as skip, unique } from './helpers.js';

const fx = teamFixture();
const dec = new TextDecoder();
const enc = new TextEncoder();

/** Publishes, as the core's planner does, the n calls of step 0 of a new run of the count tool. */
async function step(bus: wire.Bus, run: string, n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    const callId = `c${i}`;
    const req: wire.ToolRequested = { run_id: run, step: 0, call_index: i, call_count: n, call: { call_id: callId, tool: COUNT, arguments: `{"n":${i}}` },
      principal: { id: 'alice' } };
    await bus.js.publish(wire.subject.toolRequested(run, COUNT), enc.encode(JSON.stringify(req)), {
      headers: wire.eventHeaders(wire.callAttrs(wire.Type.toolRequested, '/toolbus/planner/test', wire.id.toolRequested(run, 0, callId), run, 0, callId, i, n)) });
  }
}

test('team account: run slots are taken under the tool\'s claims prefix, at most runMaxInFlight calls at once', { skip }, async () => {
  const bus = new wire.Bus(fx.core);
  const claims = await bus.kv(wire.Bucket.claims);
  let now = 0;
  let most = 0;
  const slots = new Set<string>();
  const ex = new Executor({ connection: fx.team, settings: { runMaxInFlight: 2 },
    env: { TOOLBUS_INSTANCE: unique('ts'), TOOLBUS_ACK_WAIT: '2s', TOOLBUS_LOG_LEVEL: 'warn', TOOLBUS_GRACE: '2s',
      TOOLBUS_TEAM: fx.tb.team_name, TOOLBUS_NATS_API_PREFIX: fx.tb.api_prefix } });
  ex.register(countTool(async (a, ctx) => {
    now++;
    most = Math.max(most, now);
    for await (const k of await claims.keys(`${COUNT}.${ctx.runId}.slot.>`)) slots.add(k);
    await wait(300);
    now--;
    return { double: 2 * a.n };
  }));
  const done = ex.serve();
  await Promise.race([ex.serving(), done]);
  try {
    const run = `slots-${process.pid}-${Date.now()}`;
    await step(bus, run, 5);
    // Each call's claim is marked done once its result is stored (team accounts).
    await eventually(async () => {
      for (let i = 0; i < 5; i++) {
        const e = await claims.get(wire.key.claim(COUNT, run, 0, `c${i}`));
        if (e?.operation !== 'PUT' || !(JSON.parse(dec.decode(e.value)) as wire.Claim).done) return undefined;
      }
      return true;
    }, 30000, 'the five calls done');
    assert.ok(most <= 2, `at most 2 calls of the run at once (saw ${most})`);
    assert.ok(slots.size >= 1, 'the calls held slots');
    for (const k of slots) assert.match(k, new RegExp(`^${COUNT}\\.${run}\\.slot\\.[01]$`));
    const left: string[] = [];
    for await (const k of await claims.keys(`${COUNT}.${run}.slot.>`)) left.push(k);
    assert.deepEqual(left, [], 'slots left behind');
  } finally {
    ex.stop();
    await done;
  }
});
