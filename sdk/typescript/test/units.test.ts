// Settings, redaction and bounding, without a bus.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync, mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ConfigError, Executor, Redactor, readAPIPrefix, connectionOptions, parseDuration, secretsOf, settingsFromEnv, truncateText } from '../src/index.js';
import { msgKeyOf } from '../src/settings.js';
import { Bus, callSubject, queueStreamName, subject, toolConsumer, toolTokenOfSubject } from '../src/wire.js';
import { headers } from '@nats-io/transport-node';

test('settings: the Go executors\' TOOLBUS_* variables, defaults and refusals', () => {
  const s = settingsFromEnv({ TOOLBUS_NATS_URL: 'nats://a:4222,nats://b:4222', TOOLBUS_TEAM: 'team-a', TOOLBUS_ACK_WAIT: '1m30s',
    TOOLBUS_CALL_TIMEOUT: '1.5s', TOOLBUS_EXECUTOR_TOOLS: 'x, y', TOOLBUS_CONCURRENCY: '8', TOOLBUS_EXECUTOR_REPLACE_CONTRACTS: 'true' });
  assert.equal(s.ackWaitMS, 90000);
  assert.equal(s.callTimeoutMS, 1500);
  assert.equal(s.instanceTTLMS, 5000);
  assert.equal(s.maxOutputBytes, 16384);
  assert.deepEqual(s.tools, ['x', 'y']);
  assert.equal(s.concurrency, 8);
  assert.equal(s.replaceContracts, true);
  assert.deepEqual(connectionOptions(s.connection, 'n').servers, ['nats://a:4222', 'nats://b:4222']);
  for (const [k, v] of [['TOOLBUS_TEAM', 'Team A'], ['TOOLBUS_ACK_WAIT', '500ms'], ['TOOLBUS_CALL_TIMEOUT', 'soon'],
    ['TOOLBUS_CONCURRENCY', '-1'], ['TOOLBUS_LOG_LEVEL', 'loud'], ['TOOLBUS_EXECUTOR_REPLACE_CONTRACTS', 'maybe']]) {
    assert.throws(() => settingsFromEnv({ [k]: v }), (e: Error) => e instanceof ConfigError && e.message.includes(k), `${k}=${v}`);
  }
  assert.equal(parseDuration('2h'), 7200000);
  assert.throws(() => connectionOptions({ url: '' }, 'n'), /TOOLBUS_NATS_URL/);
});

test('settings: TOOLBUS_NATS_API_PREFIX (a team account) is a subject prefix and needs TOOLBUS_TEAM', () => {
  assert.equal(settingsFromEnv({}).apiPrefix, '', 'unset: the core account');
  assert.equal(settingsFromEnv({ TOOLBUS_TEAM: 'alpha', TOOLBUS_NATS_API_PREFIX: 'JS.core.API.' }).apiPrefix, 'JS.core.API');
  for (const env of [{ TOOLBUS_NATS_API_PREFIX: 'JS.core.API' }, { TOOLBUS_TEAM: 'alpha', TOOLBUS_NATS_API_PREFIX: 'JS.*.API' },
    { TOOLBUS_TEAM: 'alpha', TOOLBUS_NATS_API_PREFIX: 'JS..API' }]) {
    assert.throws(() => settingsFromEnv(env), (e: Error) => e instanceof ConfigError && e.message.includes('TOOLBUS_NATS_API_PREFIX'), JSON.stringify(env));
  }
});

test('settings: TOOLBUS_NATS_READ_PREFIX (a client account) is a subject prefix, not with an API prefix, and no executor\'s', () => {
  assert.equal(settingsFromEnv({}).readPrefix, '');
  assert.equal(settingsFromEnv({ TOOLBUS_NATS_READ_PREFIX: 'toolbus_read.alice.API.' }).readPrefix, 'toolbus_read.alice.API');
  assert.equal(readAPIPrefix('alice'), 'toolbus_read.alice.API');
  for (const env of [{ TOOLBUS_NATS_READ_PREFIX: 'toolbus_read.*.API' }, { TOOLBUS_NATS_READ_PREFIX: 'toolbus_read..API' },
    { TOOLBUS_NATS_READ_PREFIX: 'toolbus_read.alice.API', TOOLBUS_TEAM: 'alpha', TOOLBUS_NATS_API_PREFIX: 'JS.core.API' }]) {
    assert.throws(() => settingsFromEnv(env), (e: Error) => e instanceof ConfigError && e.message.includes('TOOLBUS_NATS_READ_PREFIX'), JSON.stringify(env));
  }
  assert.throws(() => new Executor({ env: { TOOLBUS_NATS_READ_PREFIX: 'toolbus_read.alice.API' } }),
    (e: Error) => e instanceof ConfigError && /client's setting/.test(e.message));
});

test('credentials: every kind becomes a connection option, and each secret is one the executor redacts', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'toolbus-sdk-'));
  const creds = path.join(dir, 'u.creds');
  writeFileSync(creds, '-----BEGIN NATS USER JWT-----\neyJhbGciOi.jwt.sig\n------END NATS USER JWT------\n\n' +
    '************************* IMPORTANT *************************\nNKEY Seed printed below can be used.\n\n' +
    '-----BEGIN USER NKEY SEED-----\nSUACSEEDVALUEXXXX\n------END USER NKEY SEED------\n');
  const s = settingsFromEnv({ TOOLBUS_NATS_URL: 'tls://h:4222', TOOLBUS_NATS_CREDS: creds, TOOLBUS_NATS_USER: 'u', TOOLBUS_NATS_PASSWORD: 'pw-secret-1',
    TOOLBUS_NATS_TOKEN: 'tok-secret-2', TOOLBUS_NATS_TLS_CA: '/ca.pem', TOOLBUS_NATS_TLS_CERT: '/c.pem', TOOLBUS_NATS_TLS_KEY: '/k.pem' });
  const o = connectionOptions(s.connection, 'n');
  assert.ok(o.authenticator, 'creds file');
  assert.equal(o.user, 'u');
  assert.equal(o.pass, 'pw-secret-1');
  assert.equal(o.token, 'tok-secret-2');
  assert.deepEqual(o.tls, { caFile: '/ca.pem', certFile: '/c.pem', keyFile: '/k.pem' });
  const secrets = secretsOf(s.connection, {});
  assert.deepEqual(secrets.sort(), ['SUACSEEDVALUEXXXX', 'eyJhbGciOi.jwt.sig', 'pw-secret-1', 'tok-secret-2'].sort());
  assert.throws(() => connectionOptions({ url: 'nats://h', nkey: path.join(dir, 'missing.nk') }, 'n'), /TOOLBUS_NATS_NKEY/);
});

test('redaction: secret values and their encodings, the patterns, redact fields', () => {
  const secret = 'correct horse/battery';
  const r = new Redactor([secret, 'short']);
  const forms = [secret, Buffer.from(secret).toString('hex'), Buffer.from(secret).toString('hex').toUpperCase(),
    'correct+horse%2Fbattery', 'correct%20horse%2Fbattery', Buffer.from('user:' + secret).toString('base64'),
    Buffer.from(secret).toString('base64url')];
  for (const f of forms) {
    const [out, n] = r.text(`value ${f} end`);
    assert.ok(n >= 1 && out.includes('[REDACTED]'), `${f} -> ${out}`);
  }
  assert.deepEqual(r.text('a short word'), ['a short word', 0], 'values under 8 bytes are not secrets');
  assert.equal(r.text('Authorization: Bearer abcDEF123456789xyz')[0], 'Authorization: Bearer [REDACTED]');
  assert.equal(r.text('postgres://app:hunter2@db:5432/x')[0], 'postgres://app:[REDACTED]@db:5432/x');
  assert.equal(r.text('key sk-abcdefghijklmnopqrstuvwx0123')[0], 'key [REDACTED]');
  assert.deepEqual(r.value({ Pass_Word: 'x', nested: [{ note: `has ${secret}` }] }, ['password']),
    [{ Pass_Word: '[REDACTED]', nested: [{ note: 'has [REDACTED]' }] }, 2]);
});

test('bounding: head and tail around the marker, within the bound, never splitting a character', () => {
  const s = 'ab€'.repeat(500); // 2,500 bytes
  for (const max of [100, 257, 1000]) {
    const [out, kept] = truncateText(s, max);
    assert.ok(Buffer.byteLength(out) <= max, `${Buffer.byteLength(out)} > ${max}`);
    assert.match(out, new RegExp(`…\\[truncated: kept ${kept} of 2500 bytes\\]…`));
    assert.ok(!out.includes('\uFFFD'));
    assert.ok(out.startsWith('ab€') && out.endsWith('ab€'));
  }
  assert.deepEqual(truncateText('short', 100), ['short', 5]);
});

test('metrics: the Go executors\' names', async () => {
  const { Metrics } = await import('../src/index.js');
  const m = new Metrics();
  m.callFinished('lookup', 'failed', 'incident_not_found', 12, true);
  m.ready = m.connected = true;
  const text = m.text();
  assert.match(text, /^toolbus_tool_calls_total\{code="incident_not_found",status="failed",tool="lookup"\} 1$/m);
  assert.match(text, /^toolbus_tool_call_duration_seconds_count\{tool="lookup"\} 1$/m);
  assert.match(text, /^toolbus_ready\{role="executor"\} 1$/m);
});

test('team message ids: keyed by the credentials, the same as the Go executor\'s (events TestTeamMessageIDs)', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'msgid-'));
  const seed = path.join(dir, 'user.nk');
  // A seed made for this test only, the Go test's.
  writeFileSync(seed, 'SUADEYXX4S5WE5PO4XTB3ZL7MQEKTVIIZLSVIF3AXHGKSHZSALZMGOEI2M\n');
  const id = 'r1/0/c1/tool.finished';
  const idOf = (c: Parameters<typeof msgKeyOf>[0]) => new Bus({ options: {} } as never, { apiPrefix: 'JS.core.API', msgKey: msgKeyOf(c) }).msgID(id);
  assert.equal(idOf({ url: 'x', user: 'alpha', password: 'alpha' }), id + '/guarded/DybNudHESvt_6nimygzu_A');
  assert.equal(idOf({ url: 'x', token: 's3cret' }), id + '/guarded/EktPQI2NRnPa5wzZ-96Lqg');
  assert.equal(idOf({ url: 'x', nkey: seed }), id + '/guarded/NzsGKxcWiGjhsLCaUKV_mA');
  assert.equal(idOf({ url: 'x' }), id, 'no secret: the id itself');
  assert.equal(new Bus({ options: {} } as never, { msgKey: msgKeyOf({ url: 'x', token: 's3cret' }) }).msgID(id), id, 'the core account: the id itself');
});

test('queue stream: names and the published subject of a call, as events.QueueStreamName, SubjectQueue and CallSubject', () => {
  assert.equal(queueStreamName('TOOLBUS'), 'TOOLBUS_QUEUES');
  assert.equal(new Bus({ options: {} } as never, { stream: 'OTHER' }).queues, 'OTHER_QUEUES');
  assert.equal(subject.queue('lookup'), 'toolbus_queue.lookup');
  assert.equal(subject.queue('not a name'), 'toolbus_queue._unknown');
  assert.equal(toolConsumer('lookup'), 'tool_lookup');
  assert.equal(subject.toolRequestedAll('lookup'), 'toolbus.*.tool.requested.lookup', 'the doorbell: where the calls are published');
  assert.equal(toolTokenOfSubject('toolbus_queue.lookup'), 'lookup');
  const src = (...vals: string[]) => {
    const h = headers();
    for (const v of vals) h.append('Nats-Stream-Source', v);
    return h;
  };
  const published = 'toolbus.r1.tool.requested.lookup';
  const copied = `TOOLBUS 42 toolbus.*.tool.requested.* toolbus_queue.{{wildcard(2)}} ${published}`;
  for (const [why, msg, want] of [
    ['an event stream message: its subject', { subject: published }, published],
    ['a copy: the fifth field', { subject: 'toolbus_queue.lookup', headers: src(copied) }, published],
    ['with an ident field', { subject: 'toolbus_queue.lookup', headers: src(copied + ' ident') }, published],
    ['several: the last', { subject: 'toolbus_queue.lookup', headers: src('X 1 a b toolbus.r0.tool.requested.other', copied) }, published],
    ['no header: none', { subject: 'toolbus_queue.lookup' }, ''],
    ['released by the fair scheduler: its header', { subject: 'toolbus_queue.lookup', headers: (() => { const h = headers(); h.set('Toolbus-Call-Subject', published); return h; })() }, published],
    ['other headers only: none', { subject: 'toolbus_queue.lookup', headers: (() => { const h = headers(); h.set('ce-id', 'x'); return h; })() }, ''],
    ['a short header: none', { subject: 'toolbus_queue.lookup', headers: src('TOOLBUS 42 toolbus.*.tool.requested.*') }, ''],
  ] as const) {
    assert.equal(callSubject(msg as never), want, why);
  }
});
