// The refusals of the core's write service (the accounts layout: CONTRACT.md, "Tenants'
// writes") as the package raises them, against a real server whose write service bounds
// each tenant (TOOLBUS_TEST_LIMITED_BUS, which the Go test TestNPMWriteRefusals passes:
// intake/intaketest.StartTenantsLimited with a team account, a client account and
// small bounds). A write it does not admit rejects with WriteRefusedError (400), one
// over the tenant's bytes per second with TenantQuotaError (429); the executor sends its
// own refused result again in place, so the call runs once.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { Client, TenantQuotaError, TenantStoreFullError, WriteRefusedError, wire, type Tool } from '../src/index.js';
import { request, result, startExecutor, unique } from './helpers.js';

interface LimitedBus {
  url: string;
  core_user: string;
  core_password: string;
  /** The team account (user and password), the team's name, its API prefix and its one tool. */
  team_user: string;
  team_password: string;
  team_name: string;
  api_prefix: string;
  tool: string;
  /** The client account, bound to the identity of its name. */
  client_user: string;
  client_password: string;
  /** The write service's bounds: TOOLBUS_MAX_START_BYTES and the bytes per second and burst of each tenant. */
  max_start_bytes: number;
  bytes_per_second: number;
  burst: number;
  /** The most keys of the tool in the outputs bucket. */
  output_keys: number;
}

const conf = process.env.TOOLBUS_TEST_LIMITED_BUS;
const skip = conf ? false : 'run by TestNPMWriteRefusals (go test ./sdk/typescript/), on a server whose write service bounds each tenant';

let lb: LimitedBus;
let core: NatsConnection;
let team: NatsConnection;
let carol: NatsConnection;
before(async () => {
  if (skip) return;
  lb = JSON.parse(conf!) as LimitedBus;
  core = await connect({ servers: lb.url, user: lb.core_user, pass: lb.core_password });
  team = await connect({ servers: lb.url, user: lb.team_user, pass: lb.team_password });
  carol = await connect({ servers: lb.url, user: lb.client_user, pass: lb.client_password });
});
after(async () => {
  await carol?.drain();
  await team?.drain();
  await core?.drain();
});

/** Asserts that err is a refusal of the write service of code and errCode whose reason matches why. */
function refused(err: unknown, code: number, errCode: number, why: RegExp): true {
  assert.ok(err instanceof WriteRefusedError, `a WriteRefusedError: ${err}`);
  assert.equal(err.code, code, String(err));
  assert.equal(err.errCode, errCode, String(err));
  assert.match(err.description, why);
  assert.equal(err instanceof TenantQuotaError, code === 429, `TenantQuotaError exactly for 429: ${err.name}`);
  assert.equal(err instanceof TenantStoreFullError, code === 507, `TenantStoreFullError exactly for 507: ${err.name}`);
  return true;
}

test('team account: a new output key over the tool\'s bound of keys is refused (TenantStoreFullError, 507); a key it holds passes', { skip, timeout: 60000 }, async () => {
  const bus = new wire.Bus(team, { apiPrefix: lb.api_prefix });
  const run = unique('run');
  const small = new TextEncoder().encode('small');
  // A small output is lb.output_keys keys (a chunk and its meta): within the bound.
  const ref = await bus.putOutput(lb.tool, run, 0, 'c1', small);
  assert.equal(ref, `kv://toolbus_outputs/${lb.tool}.${run}.0.c1`);
  await bus.putOutput(lb.tool, run, 0, 'c1', small); // the keys it holds: passes
  await assert.rejects(bus.putOutput(lb.tool, run, 0, 'c2', small), (e) => refused(e, 507, wire.WRITE_STORE_FULL_ERR_CODE, /store_full/));
});

test('client account: an oversized start, decision or cancel is refused (WriteRefusedError, 400); a flood of starts is over the quota (TenantQuotaError, 429)', { skip, timeout: 60000 }, async () => {
  const c = await Client.connect({ connection: carol, identity: lb.client_user, readPrefix: wire.readAPIPrefix(lb.client_user) });
  const big = 'x'.repeat(lb.max_start_bytes + 1);
  await assert.rejects(c.startRun({ messages: [{ role: 'user', content: big }] }), (e) => refused(e, 400, wire.WRITE_REFUSED_ERR_CODE, /TOOLBUS_MAX_START_BYTES/));
  const over64k = 'x'.repeat(65 << 10);
  await assert.rejects(c.decide('run-none', 0, 'c1', { kind: 'reject', why: over64k }), (e) => refused(e, 400, wire.WRITE_REFUSED_ERR_CODE, /MaxDecisionBytes/));
  await assert.rejects(c.cancel('run-none', over64k), (e) => refused(e, 400, wire.WRITE_REFUSED_ERR_CODE, /MaxDecisionBytes/));
  // Starts of a tenth of the burst each: the burst is spent within a few dozen.
  const pad = 'y'.repeat(Math.min(lb.max_start_bytes - 512, Math.ceil(lb.burst / 10)));
  let started = 0;
  let quota: unknown;
  for (; started < 200; started++) {
    try {
      await c.startRun({ messages: [{ role: 'user', content: pad }] });
    } catch (err) {
      quota = err;
      break;
    }
  }
  assert.ok(started > 0, 'the first start, within the burst, is stored');
  refused(quota, 429, wire.WRITE_QUOTA_ERR_CODE, /quota_exceeded/);
});

test('team account: a roll-up is refused (WriteRefusedError, 400)', { skip, timeout: 60000 }, async () => {
  const bus = new wire.Bus(team, { apiPrefix: lb.api_prefix });
  const run = unique('run');
  const attrs: wire.Attrs = { id: `${run}/rollup`, type: wire.Type.toolProgress, source: '/toolbus/test/suite', subject: run, runid: run, step: '0' };
  await assert.rejects(bus.publish(wire.subject.toolProgress(run, lb.tool), attrs, { run_id: run }, () => true, { 'Nats-Rollup': 'sub' }),
    (e) => refused(e, 400, wire.WRITE_REFUSED_ERR_CODE, /roll-up/));
});

test('team account: a result refused over the team\'s bytes per second is sent again in place; the call runs once', { skip, timeout: 90000 }, async () => {
  const flood = new wire.Bus(team, { apiPrefix: lb.api_prefix });
  let runs = 0;
  let quota: unknown;
  // The tool spends the team's budget (progress events of its own), halving its writes
  // at each refusal down to one byte of pad: the team is then left less than one small
  // write, and the result (over 1.5 KB) finds it over its quota for a second or more.
  const tool: Tool<Record<string, never>> = {
    name: lb.tool, description: 'spends the team\'s bytes', inputSchema: { type: 'object' },
    run: async (_a, ctx) => {
      runs++;
      let size = Math.ceil(lb.burst / 10);
      for (let i = 0; i < 1000 && size > 0; i++) {
        const attrs: wire.Attrs = { id: `${ctx.runId}/flood/${runs}/${i}`, type: wire.Type.toolProgress, source: '/toolbus/test/suite',
          subject: ctx.callId, runid: ctx.runId, step: String(ctx.step) };
        try {
          await flood.publish(wire.subject.toolProgress(ctx.runId, lb.tool), attrs, { run_id: ctx.runId, pad: 'z'.repeat(size) });
        } catch (err) {
          quota = err;
          if (!(err instanceof TenantQuotaError)) break;
          size = Math.floor(size / 2);
        }
      }
      return 'spent ' + 's'.repeat(1500);
    },
  };
  const { ex, done } = await startExecutor(team, [tool], { TOOLBUS_TEAM: lb.team_name, TOOLBUS_NATS_API_PREFIX: lb.api_prefix });
  try {
    const coreBus = new wire.Bus(core);
    const run = await request(coreBus, { tool: lb.tool, args: '{}' });
    const r = await result(coreBus, run);
    refused(quota, 429, wire.WRITE_QUOTA_ERR_CODE, /quota_exceeded/);
    assert.equal(r.status, 'succeeded', JSON.stringify(r));
    assert.match(r.content, /^spent s+$/);
    assert.ok(ex.metrics.writesRetried > 0, 'the executor\'s result was refused over the quota and sent again');
    assert.equal(r.attempt, 1, 'the call was not handed back');
    assert.equal(runs, 1, 'the tool ran once');
  } finally {
    ex.stop();
    await done;
  }
});
