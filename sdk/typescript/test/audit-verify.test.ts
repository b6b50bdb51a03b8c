// An auditor's verifier outside Go (src/audit.ts, written from CONTRACT.md, "Signed and
// chained events"): a bundle `toolbus audit export` wrote verifies, and each tampering an
// administrator of the stream could make fails naming the event. The bundle: the one the
// Go test TestNPMAuditTrail exports from a live run (TOOLBUS_TEST_AUDIT_BUNDLE), or the
// one it last wrote to test/fixtures (go test -run TestNPMAuditTrail -update).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { AuditFailure, verifyBundle, type Bundle } from '../src/index.js';
import { canonicalTime } from '../src/audit.js';

const file = process.env.TOOLBUS_TEST_AUDIT_BUNDLE ??
  path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', 'test', 'fixtures', 'audit-bundle.json');
const bundle = () => JSON.parse(readFileSync(file, 'utf8')) as Bundle;
const type = (r: Bundle['events'][number]) => r.header['ce-type'][0];
const indexOf = (b: Bundle, t: string) => {
  const i = b.events.findIndex((r) => type(r) === t);
  assert.ok(i >= 0, `no ${t} in the bundle`);
  return i;
};

/** verifyBundle must fail at event i with check. */
function mustFail(b: Bundle, check: string, i: number) {
  assert.throws(() => verifyBundle(b), (err: unknown) => {
    assert.ok(err instanceof AuditFailure, String(err));
    assert.equal(err.check, check, err.message);
    assert.equal(err.index, i, err.message);
    assert.equal(err.id, b.events[i].header['ce-id'][0]);
    assert.match(err.message, new RegExp(`^event ${i + 1} \\(stream seq ${b.events[i].seq}, id `));
    return true;
  });
}

test('a bundle the Go side exported verifies: every signature, the canonical form, the chain', () => {
  const b = bundle();
  const res = verifyBundle(b);
  assert.equal(res.events, b.events.length);
  assert.ok(res.keyIDs.some((k) => k.startsWith('team.')), `a team signed the tool's events (${res.keyIDs})`);
  assert.ok(b.events.some((r) => type(r) === 'toolbus.tool.progress'), 'the bundle holds a progress report');
});

test('an altered event\'s data fails its signature, naming the event', () => {
  const b = bundle();
  const i = indexOf(b, 'toolbus.tool.finished');
  const data = JSON.parse(Buffer.from(b.events[i].data, 'base64').toString());
  data.content = 'forged';
  b.events[i].data = Buffer.from(JSON.stringify(data)).toString('base64');
  mustFail(b, 'signature', i);
});

test('a removed event breaks the chain at the event that follows it', () => {
  const b = bundle();
  const i = indexOf(b, 'toolbus.tool.requested');
  b.events.splice(i, 1);
  const next = b.events.findIndex((r, j) => j >= i && r.header['ce-prevdigest'] !== undefined &&
    ['toolbus.tool.progress', 'toolbus.tool.finished'].includes(type(r)));
  mustFail(b, 'chain', next);
});

test('two swapped events break the chain at the one moved before its parent', () => {
  const b = bundle();
  const i = indexOf(b, 'toolbus.tool.requested');
  const j = indexOf(b, 'toolbus.tool.finished');
  [b.events[i], b.events[j]] = [b.events[j], b.events[i]];
  mustFail(b, 'chain', i);
});

test('CONTROL: the tampering tests fail for their reason: an untouched copy verifies', () => {
  assert.doesNotThrow(() => verifyBundle(bundle()));
});

test('time in the canonical form: UTC, trailing zeros of the fraction dropped, as Go formats', () => {
  assert.equal(canonicalTime('2026-12-07T16:01:02.120Z'), '2026-12-07T16:01:02.12Z');
  assert.equal(canonicalTime('2026-12-07T16:01:02.000Z'), '2026-12-07T16:01:02Z');
  assert.equal(canonicalTime('2026-12-07T18:01:02.123456789+02:00'), '2026-12-07T16:01:02.123456789Z');
  assert.equal(canonicalTime('not a time'), 'not a time');
});

test('another tenant\'s stray write is reported foreign and the run verifies; the principal\'s own unsigned answer fails', () => {
  const b = bundle();
  const run = b.run;
  const answer = (who: string) => ({
    seq: b.events[b.events.length - 1].seq + 1, subject: `toolbus.${run}.tool.answer.${who}`,
    header: { 'ce-specversion': ['1.0'], 'ce-id': [`${run}/0/x/tool.answer/${who}`], 'ce-source': [`/toolbus/client/${who}`],
      'ce-type': ['toolbus.tool.answer'], 'ce-time': [new Date().toISOString()], 'ce-runid': [run], 'ce-step': ['0'], 'ce-callid': ['x'] },
    data: Buffer.from(JSON.stringify({ run_id: run, call_id: 'x', who, seq: 1, action: 'accept' })).toString('base64'),
  });
  b.events.push(answer('mallory'));
  const res = verifyBundle(b);
  assert.deepEqual(res.foreign.map((f) => f.index), [b.events.length - 1], JSON.stringify(res.foreign));
  const start = b.events.find((r) => type(r) === 'toolbus.run.started')!;
  const principal = JSON.parse(Buffer.from(start.data, 'base64').toString()).principal.id as string;
  const own = bundle();
  own.events.push(answer(principal));
  mustFail(own, 'signature', own.events.length - 1);
});

test('a removed request cannot pass its call\'s results off as foreign: with the step\'s model.responded removed too, verification fails', () => {
  const b = bundle();
  b.events.splice(indexOf(b, 'toolbus.tool.requested'), 1);
  b.events.splice(indexOf(b, 'toolbus.model.responded'), 1);
  assert.throws(() => verifyBundle(b), AuditFailure);
});

test('a tenant\'s write is judged by its subject, not by the type it sends: headerless, typed as the core\'s, naming another run', () => {
  const b = bundle();
  const run = b.run;
  const tool = b.events.find((r) => type(r) === 'toolbus.tool.finished')!.subject.split('.').pop()!;
  const stray = (subject: string, header: Record<string, string[]>) => ({
    seq: b.events[b.events.length - 1].seq + 1, subject, header, data: Buffer.from('junk').toString('base64'),
  });
  const requested = b.events[indexOf(b, 'toolbus.tool.requested')];
  const log = { 'ce-specversion': ['1.0'], 'ce-id': [`${run}/0/c9/tool.log/0/1`], 'ce-source': ['/toolbus/executor/x'],
    'ce-time': [new Date().toISOString()], 'ce-runid': [run], 'ce-step': ['0'], 'ce-callid': ['c9'] };
  for (const [what, s] of [
    ['headerless', stray(`toolbus.${run}.tool.log.${tool}`, {})],
    ['typed as the outcome', stray(`toolbus.${run}.tool.log.${tool}`, { ...log, 'ce-type': ['toolbus.run.completed'] })],
    ['an answer typed as a model.requested', stray(`toolbus.${run}.tool.answer.mallory`, { ...log, 'ce-type': ['toolbus.model.requested'] })],
    ['naming another run', stray(`toolbus.${run}.tool.log.${tool}`, { ...log, 'ce-type': ['toolbus.tool.log'], 'ce-runid': ['other'] })],
    ['typed as a call', stray(`toolbus.${run}.tool.log.${tool}`, { ...log, 'ce-type': ['toolbus.tool.requested'] })],
    ['the core\'s signed call copied onto another tool\'s subject', { ...requested, seq: requested.seq + 1000, subject: `toolbus.${run}.tool.log.other_tool` }],
  ] as const) {
    const c = bundle();
    c.events.push(s);
    const res = verifyBundle(c);
    assert.deepEqual(res.foreign.map((f) => f.index), [c.events.length - 1], `${what}: ${JSON.stringify(res.foreign)}`);
  }
  // CONTROL: the same headerless message on the core's own subject fails.
  const core = bundle();
  core.events.push(stray(`toolbus.${run}.model.requested`, {}));
  assert.throws(() => verifyBundle(core), AuditFailure);
});
