// The TypeScript executor of the fault suite's mixed-language deployment
// (TestFaultMixedLanguages): two tools on @toolbus/sdk, served with the TOOLBUS_*
// settings of a team's executor (its credentials, TOOLBUS_TEAM, TOOLBUS_NATS_API_PREFIX).
//
//   - append_ts {"ms"}: waits ms milliseconds reporting progress, then appends
//     "<idempotency key> <instance> <attempt> append_ts" to TOOLBUS_FAULT_APPEND_FILE
//     (the side effect the suite counts, as faultbus's append tools do) and returns
//     {"key": <idempotency key>}. Its retry policy retries the code "flaky": the call
//     whose key is TOOLBUS_MIX_FAIL_ONCE fails its first attempt with it (after
//     appending the attempt to TOOLBUS_MIX_FAIL_FILE, and without the side effect); the
//     call whose key is TOOLBUS_MIX_SLOW waits 10 s, whatever its ms (the suite kills
//     the executor while it runs).
//   - approve_ts {"label"}: needs a person's approval; appends "<idempotency key>
//     <instance> <attempt> approve_ts <label>" to TOOLBUS_MIX_APPROVE_FILE.
//
// The package is the built sdk/typescript (TOOLBUS_SDK_ENTRY: its dist/src/index.js).
import { appendFileSync } from 'node:fs';
import { setTimeout as wait } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';

const { register, serve, ToolError } = await import(pathToFileURL(process.env.TOOLBUS_SDK_ENTRY).href);
const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};
const instance = env('TOOLBUS_INSTANCE');
const appendFile = env('TOOLBUS_FAULT_APPEND_FILE');
const approveFile = env('TOOLBUS_MIX_APPROVE_FILE');
const failFile = env('TOOLBUS_MIX_FAIL_FILE');

register({
  name: 'append_ts',
  description: 'Fault suite: wait ms milliseconds, then append the call\'s idempotency key to a file (a side effect). Served in TypeScript.',
  inputSchema: { type: 'object', properties: { ms: { type: 'integer', minimum: 0, maximum: 60000 } } },
  timeoutMS: 60000,
  retry: { maxAttempts: 3, initialBackoffMS: 100, maxBackoffMS: 500, codes: ['flaky'] },
  async run({ ms }, ctx) {
    const key = ctx.idempotencyKey;
    const total = key === process.env.TOOLBUS_MIX_SLOW ? 10000 : ms ?? 0;
    const started = Date.now();
    const tick = setInterval(() => ctx.progress(Date.now() - started, total, `waited ${Date.now() - started} of ${total} ms`), 200);
    try {
      await wait(total, undefined, { signal: ctx.signal });
    } finally {
      clearInterval(tick);
    }
    if (key === process.env.TOOLBUS_MIX_FAIL_ONCE && ctx.attempt === 1) {
      appendFileSync(failFile, `${key} ${instance} ${ctx.attempt} append_ts\n`);
      throw new ToolError('flaky', 'the first attempt fails on purpose', { retryable: true });
    }
    // A cooperative tool: the side effect only while the executor holds the call.
    if (!ctx.leaseValid()) throw new Error('lease lost before the side effect: not done');
    appendFileSync(appendFile, `${key} ${instance} ${ctx.attempt} append_ts\n`);
    return { key };
  },
});

register({
  name: 'approve_ts',
  description: 'Fault suite: append the call\'s idempotency key and label to a file, once a person approved. Served in TypeScript.',
  inputSchema: { type: 'object', properties: { label: { type: 'string' } }, required: ['label'], additionalProperties: false },
  needsApproval: true,
  async run({ label }, ctx) {
    appendFileSync(approveFile, `${ctx.idempotencyKey} ${instance} ${ctx.attempt} approve_ts ${label}\n`);
    return { key: ctx.idempotencyKey, label };
  },
});

await serve();
