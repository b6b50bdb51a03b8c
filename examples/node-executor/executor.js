// A toolbus executor in JavaScript. It serves one tool, `delay`, from nothing but the
// event contract (CONTRACT.md, schemas/, asyncapi.yaml): no Go code is involved. It
//
//   - joins the tool's queue: the durable consumer tool_<tool> on the TOOLBUS stream,
//     shared with every other executor serving the same tool (created if missing);
//   - records its instance in the KV bucket toolbus_instances (heartbeat every third of
//     TOOLBUS_INSTANCE_TTL, removed at stop) and publishes the tool's contract to
//     toolbus_tools, so planners offer the tool while this process lives;
//   - reads each call's run from its run.started (allowlist, deadline);
//   - claims the call in toolbus_claims before it runs, so a call runs once while its
//     executor lives;
//   - validates the arguments (malformed JSON, schema violations and unknown fields are
//     rejected as invalid_arguments before anything runs);
//   - runs the tool under the earliest of its timeout, the call's deadline and the run's
//     deadline, cancels it on run.cancel, and tells JetStream it is alive (working())
//     while a call runs longer than the ack wait;
//   - reports the call's progress while it runs (tool.progress, at most one a second,
//     the latest kept, the last one before the result);
//   - publishes exactly one tool.finished per call: a CloudEvent in binary mode (ce-*
//     headers) with the deterministic id <run>/<step>/<call_id>/tool.finished, also sent
//     as Nats-Msg-Id, and the ToolResult at the top level of the data; then acks.
//
// Configuration: the TOOLBUS_* variables the Go executor reads (TOOLBUS_NATS_URL,
// TOOLBUS_STREAM, TOOLBUS_INSTANCE, TOOLBUS_ACK_WAIT, TOOLBUS_MAX_DELIVER,
// TOOLBUS_INSTANCE_TTL, TOOLBUS_CALL_TIMEOUT), the operations settings of the binary
// (TOOLBUS_LOG_LEVEL, TOOLBUS_LOG_FORMAT, TOOLBUS_METRICS_ADDR: /metrics, /healthz,
// /readyz), plus TOOLBUS_NODE_TOOL to rename the tool.
import http from 'node:http';
import os from 'node:os';
import { randomUUID } from 'node:crypto';
import { connect, AckPolicy, DeliverPolicy, headers as natsHeaders, nanos } from 'nats';
import { CloudEvent } from 'cloudevents';

// ---- configuration ---------------------------------------------------------------

/** Parses a Go duration such as 30s, 1m30s, 500ms into milliseconds. */
function duration(text, fallbackMS) {
  if (!text) return fallbackMS;
  const units = { ns: 1e-6, us: 1e-3, µs: 1e-3, ms: 1, s: 1000, m: 60000, h: 3600000 };
  let ms = 0;
  const re = /([0-9.]+)(ns|us|µs|ms|s|m|h)/g;
  let m;
  let seen = '';
  while ((m = re.exec(text)) !== null) {
    ms += Number(m[1]) * units[m[2]];
    seen += m[0];
  }
  if (seen !== text) throw new Error(`not a duration: ${text}`);
  return ms;
}

const env = process.env;
const cfg = {
  url: env.TOOLBUS_NATS_URL || 'nats://127.0.0.1:4222',
  stream: env.TOOLBUS_STREAM || 'TOOLBUS',
  instance: env.TOOLBUS_INSTANCE || `${os.hostname()}-${process.pid}`,
  ackWaitMS: duration(env.TOOLBUS_ACK_WAIT, 30000),
  maxDeliver: Number(env.TOOLBUS_MAX_DELIVER || 5),
  instanceTTLMS: duration(env.TOOLBUS_INSTANCE_TTL, 5000),
  callTimeoutMS: duration(env.TOOLBUS_CALL_TIMEOUT, 30000),
  tool: env.TOOLBUS_NODE_TOOL || 'delay',
  // breakRule breaks one rule of the contract on purpose (two_results, no_heartbeat), so
  // the conformance suite can show it notices. Never set it in production.
  breakRule: env.TOOLBUS_NODE_BREAK || '',
};
const source = `/toolbus/executor/${cfg.instance}`;

// ---- logs, metrics, health: the settings of the toolbus binary ---------------------

const LEVELS = { debug: -4, info: 0, warn: 4, error: 8 };
const logLevel = (env.TOOLBUS_LOG_LEVEL || 'info').toLowerCase();
const logFormat = (env.TOOLBUS_LOG_FORMAT || 'text').toLowerCase();
if (!(logLevel in LEVELS)) throw new Error(`TOOLBUS_LOG_LEVEL ${logLevel}: want debug, info, warn or error`);
if (logFormat !== 'text' && logFormat !== 'json') throw new Error(`TOOLBUS_LOG_FORMAT ${logFormat}: want text or json`);
/** Logs on stderr like Go's slog: JSON lines, or key=value text. */
const log = (msg, fields = {}, level = 'info') => {
  if (LEVELS[level] < LEVELS[logLevel]) return;
  const rec = { time: new Date().toISOString(), level: level.toUpperCase(), msg, component: 'node-executor', instance: cfg.instance, ...fields };
  if (logFormat === 'json') {
    console.error(JSON.stringify(rec));
    return;
  }
  console.error(Object.entries(rec).map(([k, v]) => `${k}=${typeof v === 'string' && !/[\s"=]/.test(v) ? v : JSON.stringify(v)}`).join(' '));
};

/** toolbus_tool_calls_total by tool, status and code, as the Go executors export it. */
const callCounts = new Map();
const countCall = (tool, status, code) => {
  const key = JSON.stringify([tool, status, code || '']);
  callCounts.set(key, (callCounts.get(key) || 0) + 1);
};
const health = { connected: false, serving: false };
if (env.TOOLBUS_METRICS_ADDR) {
  const [host, port] = [env.TOOLBUS_METRICS_ADDR.replace(/:[^:]*$/, ''), Number(env.TOOLBUS_METRICS_ADDR.replace(/^.*:/, ''))];
  const srv = http.createServer((req, res) => {
    if (req.method !== 'GET') return res.writeHead(405).end();
    if (req.url === '/healthz') return res.writeHead(200).end('ok\n');
    if (req.url === '/readyz') {
      if (!health.connected) return res.writeHead(503).end('not connected to NATS\n');
      if (!health.serving) return res.writeHead(503).end('consumers not bound: executor\n');
      return res.writeHead(200).end('ready\n');
    }
    if (req.url === '/metrics') {
      const lines = ['# TYPE toolbus_tool_calls_total counter'];
      for (const [key, n] of callCounts) {
        const [tool, status, code] = JSON.parse(key);
        lines.push(`toolbus_tool_calls_total{code="${code}",status="${status}",tool="${tool}"} ${n}`);
      }
      lines.push('# TYPE toolbus_ready gauge', `toolbus_ready{role="executor"} ${health.serving ? 1 : 0}`);
      return res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(lines.join('\n') + '\n');
    }
    return res.writeHead(404).end();
  });
  srv.unref();
  srv.listen(port, host || '127.0.0.1', () => log('metrics serving', { addr: `${srv.address().address}:${srv.address().port}`, paths: '/metrics /healthz /readyz' }));
}

// ---- the tool ----------------------------------------------------------------------

const MAX_MS = 600000;

/** The tool's contract, as it goes to the catalog (events.ToolContract). */
const contract = {
  name: cfg.tool,
  description: 'Wait for the given number of milliseconds, then echo the label. Served by a JavaScript executor.',
  input_schema: {
    type: 'object',
    properties: {
      ms: { type: 'integer', minimum: 0, maximum: MAX_MS, description: 'How long to wait in milliseconds' },
      label: { type: 'string', description: 'Text to echo back' },
    },
    required: ['ms'],
    additionalProperties: false,
  },
  output_schema: {
    type: 'object',
    properties: { waited_ms: { type: 'integer' }, label: { type: 'string' } },
    required: ['waited_ms'],
  },
  read_only: true,
  timeout: cfg.callTimeoutMS * 1e6, // a Go time.Duration: nanoseconds
  max_output_bytes: 16384,
};

/**
 * Validates the arguments against the input schema. Returns null when they are valid,
 * else the violations ({path, message}), each with its JSON pointer.
 */
function violations(args) {
  const out = [];
  for (const k of Object.keys(args)) {
    if (!(k in contract.input_schema.properties)) out.push({ path: `/${k}`, message: `unknown property "${k}"` });
  }
  if (!('ms' in args)) out.push({ path: '', message: 'missing property "ms"' });
  else if (!Number.isInteger(args.ms)) out.push({ path: '/ms', message: 'must be an integer' });
  else if (args.ms < 0 || args.ms > MAX_MS) out.push({ path: '/ms', message: `must be between 0 and ${MAX_MS}` });
  if ('label' in args && typeof args.label !== 'string') out.push({ path: '/label', message: 'must be a string' });
  return out.length ? out : null;
}

/**
 * Runs the tool; it stops early when signal aborts. While it waits it reports how long
 * it has waited (progress(done, total, message)), every quarter of a second.
 */
function runTool(args, signal, progress = () => {}) {
  return new Promise((resolve, reject) => {
    const started = Date.now();
    const ticker = setInterval(() => {
      const waited = Date.now() - started;
      progress(Math.min(waited, args.ms), args.ms, `waited ${waited} of ${args.ms} ms`);
    }, 250);
    const timer = setTimeout(() => {
      clearInterval(ticker);
      signal.removeEventListener('abort', onAbort);
      resolve({ waited_ms: Date.now() - started, ...(args.label !== undefined ? { label: args.label } : {}) });
    }, args.ms);
    const onAbort = () => {
      clearTimeout(timer);
      clearInterval(ticker);
      reject(signal.reason);
    };
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort, { once: true });
  });
}

// ---- contract helpers ----------------------------------------------------------------

/** The KV key form of a string (events.kvSafe): [A-Za-z0-9_-] kept, other bytes =XX. */
function kvSafe(s) {
  let out = '';
  for (const b of Buffer.from(s, 'utf8')) {
    const c = String.fromCharCode(b);
    out += /[A-Za-z0-9_-]/.test(c) ? c : '=' + b.toString(16).toUpperCase().padStart(2, '0');
  }
  return out || '=';
}

const validName = (s) => typeof s === 'string' && /^[A-Za-z0-9_-]{1,64}$/.test(s);
const validRun = (s) => typeof s === 'string' && /^[A-Za-z0-9_-]{1,128}$/.test(s);
const enc = new TextEncoder();
const dec = new TextDecoder();

/** Decodes a CloudEvent in binary mode (ce-* headers) or structured mode. */
function decodeEvent(msg) {
  const h = {};
  for (const [k, v] of msg.headers ?? []) h[k.toLowerCase()] = v[0];
  const ct = h['content-type'] ?? '';
  if (ct.startsWith('application/cloudevents+json')) {
    const ev = JSON.parse(dec.decode(msg.data));
    return { attrs: ev, data: ev.data };
  }
  if (h['ce-specversion'] !== '1.0') throw new Error('not a CloudEvent');
  const attrs = {};
  for (const [k, v] of Object.entries(h)) if (k.startsWith('ce-')) attrs[k.slice(3)] = v;
  return { attrs, data: JSON.parse(dec.decode(msg.data)) };
}

/** Builds a result the executor decided without running the tool. */
const errorResult = (call, status, code, message, extra = {}) => ({
  call_id: call.call_id,
  tool: call.tool,
  status,
  error: { code, message, retryable: code === 'timeout', ...extra },
  content: JSON.stringify({ error: { code, message, retryable: code === 'timeout' } }),
  duration_ms: 0,
});

// ---- the executor --------------------------------------------------------------------

const nc = await connect({ servers: cfg.url.split(','), name: `toolbus node executor ${cfg.instance}` });
health.connected = true;
(async () => {
  for await (const st of nc.status()) {
    if (st.type === 'disconnect') health.connected = false;
    if (st.type === 'reconnect') health.connected = true;
  }
})().catch(() => {});
nc.closed().then(() => { health.connected = false; });
const js = nc.jetstream();
const jsm = await nc.jetstreamManager();
const kvTools = await js.views.kv('toolbus_tools', { bindOnly: true });
const kvInstances = await js.views.kv('toolbus_instances', { bindOnly: true });
const kvClaims = await js.views.kv('toolbus_claims', { bindOnly: true });
const kvRuns = await js.views.kv('toolbus_runs', { bindOnly: true });

// The tool's queue: bind, or create it as events.ToolConsumerConfig does, with the ack
// wait of events.QueueAckWait (no longer than the lease): a call whose executor died is
// redelivered about when its claim may be taken over. A running call tells JetStream it
// is alive every third of the queue's ack wait, as it is set.
const durable = `tool_${cfg.tool}`;
let queueAckWaitMS = Math.min(cfg.ackWaitMS, Math.max(cfg.instanceTTLMS, 1000));
try {
  const info = await jsm.consumers.info(cfg.stream, durable);
  queueAckWaitMS = Math.min(queueAckWaitMS, info.config.ack_wait / 1e6);
} catch (err) {
  if (!String(err?.message).includes('consumer not found')) throw err;
  await jsm.consumers.add(cfg.stream, {
    durable_name: durable,
    filter_subject: `toolbus.*.tool.requested.${cfg.tool}`,
    ack_policy: AckPolicy.Explicit,
    deliver_policy: DeliverPolicy.New,
    ack_wait: nanos(queueAckWaitMS),
    max_deliver: cfg.maxDeliver,
    max_ack_pending: 1000,
  });
}

// Live before the tool is offered: planners offer a tool only while an instance serves it.
const startedAt = new Date().toISOString();
const beat = () =>
  kvInstances.put(kvSafe(cfg.instance), enc.encode(JSON.stringify({
    name: cfg.instance, tools: [cfg.tool], concurrency: 64, started_at: startedAt, heartbeat_at: new Date().toISOString(),
  })));
await beat();
const beatTimer = setInterval(() => beat().catch((err) => log('instance heartbeat failed', { error: String(err) }, 'warn')),
  Math.max(cfg.instanceTTLMS / 3, 100));
await kvTools.put(cfg.tool, enc.encode(JSON.stringify(contract)));

// run.cancel: abort the run's calls in flight.
const inflight = new Map(); // run id -> Set<AbortController>
const cancelled = new Set();
// The subject is toolbus.<run>.run.cancel.<actor>: the last token is who cancels (the
// identity the server's permissions bound to the sender's credentials).
const cancelSub = nc.subscribe('toolbus.*.run.cancel.*', {
  callback: (err, m) => {
    if (err) return;
    const [, run, , , actor] = m.subject.split('.');
    // Subject and body agree (CONTRACT.md): a cancel whose data names another run cancels nothing.
    let ev;
    try {
      ev = decodeEvent(m);
    } catch {
      return;
    }
    if (ev.attrs.type !== 'toolbus.run.cancel' || ev.data?.run_id !== run || (ev.attrs.runid && ev.attrs.runid !== run) ||
        (ev.data?.who || '_none') !== actor) {
      log('run.cancel ignored: its data does not name the run and actor of its subject', { subject: m.subject });
      return;
    }
    cancelled.add(run);
    for (const ac of inflight.get(run) ?? []) ac.abort(new Error('run cancelled'));
  },
});

/**
 * The run.started data of a run: the first message on toolbus.<run>.run.started.<principal>
 * (whatever principal) whose data names the run and the principal of its subject; a later
 * one, or one that disagrees with its subject, never counts (CONTRACT.md).
 */
const runs = new Map();
async function runStarted(run) {
  if (runs.has(run)) return runs.get(run);
  for (let seq = 1; ;) {
    let sm;
    try {
      sm = await jsm.streams.getMessage(cfg.stream, { seq, next_by_subj: `toolbus.${run}.run.started.*` });
    } catch (err) {
      if (String(err?.message).includes('no message found')) return null;
      throw err;
    }
    seq = sm.seq + 1;
    let ev;
    try {
      ev = decodeEvent({ headers: sm.header, data: sm.data });
    } catch {
      continue;
    }
    const rs = ev.data;
    if (ev.attrs.type !== 'toolbus.run.started' || rs?.run_id !== run || (rs.principal?.id || '_none') !== sm.subject.split('.')[4]) {
      continue;
    }
    runs.set(run, rs);
    return rs;
  }
}

/** Whether the result of a call is already in the stream (by its deterministic ce-id). */
async function resultStored(req) {
  const want = `${req.run_id}/${req.step}/${req.call.call_id}/tool.finished`;
  const oc = await js.consumers.get(cfg.stream, { filterSubjects: [`toolbus.${req.run_id}.tool.finished.${req.call.tool}`] });
  const pending = (await oc.info(true)).num_pending;
  if (pending === 0) {
    await oc.delete().catch(() => {});
    return false;
  }
  const iter = await oc.fetch({ max_messages: pending, expires: 2000 });
  let found = false;
  for await (const m of iter) {
    if (m.headers?.get('ce-id') === want && m.headers?.get('ce-type') === 'toolbus.tool.finished') found = true;
    if (m.info.pending === 0) break;
  }
  await oc.delete().catch(() => {});
  return found;
}

/**
 * Claims the call. Returns 'run' when this process must run it, 'done' when its result
 * is already stored, 'later' when a live executor holds it (the message comes back).
 */
async function claim(req, attempt) {
  // <tool>.<run>.<step>.<call_id>: the tool (this queue's) first, so per-team credentials
  // can scope the claims a team writes to its own tools.
  const key = `${cfg.tool}.${req.run_id}.${req.step}.${kvSafe(req.call.call_id)}`;
  const mine = enc.encode(JSON.stringify({ instance: cfg.instance, attempt, at: new Date().toISOString() }));
  try {
    await kvClaims.create(key, mine);
    return 'run';
  } catch (err) {
    if (!String(err?.message).includes('wrong last sequence')) throw err;
  }
  if (await resultStored(req)) return 'done';
  const e = await kvClaims.get(key);
  const holder = e ? JSON.parse(dec.decode(e.value)).instance : null;
  const alive = holder && holder !== cfg.instance && (await kvInstances.get(kvSafe(holder)))?.operation === 'PUT';
  if (alive) return 'later';
  try {
    await kvClaims.update(key, mine, e.revision); // the holder died: take over, same idempotency key
    return 'run';
  } catch {
    return 'later';
  }
}

/** Decides the result of one call (runs the tool when it may). */
async function execute(req, rs, attempt, msg) {
  const call = req.call;
  const state = await kvRuns.get(req.run_id).catch(() => null);
  const status = state?.value?.length ? JSON.parse(dec.decode(state.value)).status : 'running';
  if (['completed', 'failed', 'limit_reached', 'cancelled'].includes(status) || cancelled.has(req.run_id)) {
    return errorResult(call, 'cancelled', status === 'running' ? 'cancelled' : 'run_ended',
      `the run had ended (${status === 'running' ? 'cancelled' : status}) when this call was taken: it was not run`);
  }
  if (attempt >= cfg.maxDeliver && attempt > 1) {
    return errorResult(call, 'failed', 'tool_internal_error',
      `the call did not finish in ${attempt - 1} attempts; it was not run again`);
  }
  if (call.tool !== cfg.tool) return errorResult(call, 'rejected', 'unknown_tool', `no executor serves a tool named "${call.tool}"`);
  if (rs.allowed_tools?.length && !rs.allowed_tools.includes(call.tool)) {
    return errorResult(call, 'rejected', 'not_authorized', `tool "${call.tool}" is not allowed in this run`);
  }
  let args;
  try {
    args = JSON.parse(call.arguments);
  } catch (err) {
    return errorResult(call, 'rejected', 'invalid_arguments', `arguments are not valid JSON: ${err.message}`);
  }
  if (args === null || typeof args !== 'object' || Array.isArray(args)) {
    return errorResult(call, 'rejected', 'invalid_arguments', 'arguments are not a JSON object');
  }
  const bad = violations(args);
  if (bad) {
    return errorResult(call, 'rejected', 'invalid_arguments', 'arguments violate the input schema: ' +
      bad.map((v) => `${v.path || '/'}: ${v.message}`).join('; '), { details: bad });
  }

  // The earliest of the tool's timeout, the call's deadline and the run's deadline.
  const deadlines = [Date.now() + cfg.callTimeoutMS];
  for (const d of [req.deadline, rs.limits?.deadline]) if (d) deadlines.push(Date.parse(d));
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(Object.assign(new Error('timeout'), { timeout: true })),
    Math.max(0, Math.min(...deadlines) - Date.now()));
  const set = inflight.get(req.run_id) ?? new Set();
  inflight.set(req.run_id, set.add(ac));
  const alive = setInterval(() => cfg.breakRule !== 'no_heartbeat' && msg.working(), Math.max(queueAckWaitMS / 3, 100)); // not redelivered while alive
  const started = Date.now();
  const progress = progressReporter(req, attempt);
  try {
    const output = await runTool(args, ac.signal, progress.report);
    const content = JSON.stringify(output);
    return { call_id: call.call_id, tool: call.tool, status: 'succeeded', output, content, duration_ms: Date.now() - started };
  } catch (err) {
    const r = err?.timeout
      ? errorResult(call, 'timed_out', 'timeout', 'the call did not finish before its deadline')
      : errorResult(call, 'cancelled', 'cancelled', 'the run was cancelled');
    return { ...r, duration_ms: Date.now() - started };
  } finally {
    await progress.finish(); // the last report goes out before the result
    clearTimeout(timer);
    clearInterval(alive);
    set.delete(ac);
    if (set.size === 0) inflight.delete(req.run_id);
  }
}

// How often a call's progress may be published (CONTRACT.md, "Progress and long-running
// tools"): a report made sooner replaces the pending one.
const PROGRESS_INTERVAL_MS = 1000;

/**
 * The progress of one running call: report(done, total, message) keeps the latest
 * report and publishes at most one tool.progress per PROGRESS_INTERVAL_MS; finish()
 * publishes the pending one and refuses any later report (the call is no longer
 * running: the report is dropped and report returns false).
 */
function progressReporter(req, attempt) {
  let seq = 0;
  let pending = null;
  let last = 0;
  let timer = null;
  let finished = false;
  let sending = Promise.resolve();
  const send = () => {
    timer = null;
    if (!pending) return sending;
    const p = pending;
    pending = null;
    last = Date.now();
    sending = sending.then(() => publishProgress(req, p)).catch((err) => log('progress not published', { run_id: req.run_id, call_id: req.call.call_id, error: String(err) }, 'warn'));
    return sending;
  };
  return {
    report(done, total, message) {
      if (finished) return false;
      seq += 1;
      pending = { run_id: req.run_id, step: req.step, call_id: req.call.call_id, tool: req.call.tool, attempt, seq, done, ...(total > 0 ? { total } : {}), ...(message ? { message } : {}) };
      if (!timer) timer = setTimeout(send, Math.max(0, last + PROGRESS_INTERVAL_MS - Date.now()));
      return true;
    },
    async finish() {
      finished = true;
      if (timer) clearTimeout(timer);
      await send();
    },
  };
}

/** Publishes one tool.progress of a running call (binary-mode CloudEvent). */
async function publishProgress(req, data) {
  const type = 'toolbus.tool.progress';
  const id = `${req.run_id}/${req.step}/${req.call.call_id}/tool.progress/${data.attempt}/${data.seq}`;
  const ev = new CloudEvent({
    id, source, type, subject: req.call.call_id, time: new Date().toISOString(),
    dataschema: `https://toolbus.dev/schemas/${type}.v1.json`, datacontenttype: 'application/json',
    runid: req.run_id, step: String(req.step), callid: req.call.call_id, callindex: '0', callcount: '0',
  });
  const h = natsHeaders();
  for (const [k, v] of Object.entries(ev.toJSON())) {
    if (k === 'data' || k === 'datacontenttype' || v === undefined) continue;
    h.set(`ce-${k}`, String(v));
  }
  h.set('Content-Type', 'application/json');
  await js.publish(`toolbus.${req.run_id}.tool.progress.${req.call.tool}`, enc.encode(JSON.stringify(data)), { msgID: id, headers: h });
}

/** Publishes the one tool.finished of a call (binary-mode CloudEvent). */
async function publishResult(req, meta, result) {
  const id = `${req.run_id}/${req.step}/${req.call.call_id}/tool.finished`;
  const type = 'toolbus.tool.finished';
  const attrs = {
    id, source, type, subject: req.call.call_id, time: new Date().toISOString(),
    dataschema: `https://toolbus.dev/schemas/${type}.v1.json`, datacontenttype: 'application/json',
    runid: req.run_id, step: String(req.step), callid: req.call.call_id,
    callindex: String(req.call_index), callcount: String(req.call_count),
    ...(meta.traceparent ? { traceparent: meta.traceparent } : {}),
  };
  const ev = new CloudEvent(attrs); // validates the attributes
  const h = natsHeaders();
  for (const [k, v] of Object.entries(ev.toJSON())) {
    if (k === 'data' || k === 'datacontenttype' || v === undefined) continue;
    h.set(`ce-${k}`, String(v));
  }
  h.set('Content-Type', 'application/json');
  const data = { run_id: req.run_id, step: req.step, call_index: req.call_index, call_count: req.call_count, ...result };
  const subject = `toolbus.${req.run_id}.tool.finished.${validName(req.call.tool) ? req.call.tool : '_unknown'}`;
  const body = enc.encode(JSON.stringify(data));
  const ack = await js.publish(subject, body, { msgID: id, headers: h });
  if (!ack.duplicate) return;
  // A duplicate acknowledgement only says that some message took the id (CONTRACT.md, "A
  // duplicate is the same event"): it is this result only if the message stored there has
  // its subject, type and id. Otherwise the id was squatted: store the result under the
  // per-subject guard.
  const isOurs = (sm) => {
    if (sm.subject !== subject || sm.header.get('ce-id') !== id || sm.header.get('ce-type') !== type) return false;
    try { // and its data names this run and call (a squat on our own subject does not)
      const d = JSON.parse(dec.decode(sm.data));
      return d.run_id === req.run_id && d.call_id === req.call.call_id;
    } catch {
      return false;
    }
  };
  try {
    if (isOurs(await jsm.streams.getMessage(cfg.stream, { seq: ack.seq }))) return;
  } catch (err) {
    if (!String(err?.message).includes('no message found')) throw err;
  }
  log('result id squatted: publishing under the per-subject guard', { id, subject, squatted_by_seq: ack.seq });
  h.set('Nats-Msg-Id', `${id}/guarded/${randomUUID()}`);
  let last = 0;
  for (let attempt = 0; attempt < 100; attempt++) {
    for (;;) {
      let sm;
      try {
        sm = await jsm.streams.getMessage(cfg.stream, { seq: last + 1, next_by_subj: subject });
      } catch (err) {
        if (String(err?.message).includes('no message found')) break;
        throw err;
      }
      if (isOurs(sm)) return; // stored already (a re-publish, or another process)
      last = sm.seq;
    }
    try {
      await js.publish(subject, body, { headers: h, expect: { lastSubjectSequence: last } });
      return;
    } catch (err) {
      if (!String(err?.message).includes('wrong last sequence')) throw err;
    }
  }
  throw new Error(`result ${id}: the subject ${subject} kept changing`);
}

async function handle(msg) {
  let ev;
  try {
    ev = decodeEvent(msg);
  } catch (err) {
    log('poison message terminated', { subject: msg.subject, reason: String(err) }, 'warn');
    msg.term();
    return;
  }
  const req = ev.data;
  // Subject and body agree (CONTRACT.md): the subject names the call's run and tool.
  const [, subjectRun, , , token] = msg.subject.split('.');
  if (req && (req.run_id !== subjectRun || (ev.attrs.runid && ev.attrs.runid !== subjectRun) ||
      (token !== '_unknown' && token !== req.call?.tool))) {
    log('poison message terminated', { subject: msg.subject, reason: 'subject and body disagree' });
    msg.term('subject and body disagree');
    return;
  }
  if (ev.attrs.type !== 'toolbus.tool.requested' || !req || !validRun(req.run_id) || !Number.isInteger(req.step) ||
      req.step < 0 || !Number.isInteger(req.call_count) || req.call_count <= 0 || !Number.isInteger(req.call_index) ||
      req.call_index < 0 || req.call_index >= req.call_count || typeof req.call?.call_id !== 'string' || !req.call.call_id) {
    log('poison message terminated', { subject: msg.subject, reason: 'bad tool.requested' }, 'warn');
    msg.term();
    return;
  }
  const rs = await runStarted(req.run_id);
  if (!rs) {
    log('poison message terminated', { subject: msg.subject, reason: 'call of a run that was never started' }, 'warn');
    msg.term();
    return;
  }
  const attempt = msg.info.redeliveryCount;
  const c = await claim(req, attempt);
  if (c === 'done') {
    msg.ack();
    return;
  }
  if (c === 'later') {
    msg.nak(1000);
    return;
  }
  const result = await execute(req, rs, attempt, msg);
  result.attempt = attempt;
  result.executor = cfg.instance;
  await publishResult(req, ev.attrs, result);
  countCall(result.tool, result.status, result.error && result.error.code);
  if (cfg.breakRule === 'two_results') await publishResult(req, ev.attrs, result);
  msg.ack(); // only once the result is stored: a crash before this redelivers the call
}

const consumer = await js.consumers.get(cfg.stream, durable);
const messages = await consumer.consume({ max_messages: 64 });
health.serving = true;
log('executor serving', { tools: [cfg.tool], queue: durable });

let stopping = false;
async function stop(signal) {
  if (stopping) return;
  stopping = true;
  log('stopping', { signal });
  health.serving = false;
  messages.stop();
  clearInterval(beatTimer);
  cancelSub.unsubscribe();
  await kvInstances.delete(kvSafe(cfg.instance)).catch(() => {});
  await nc.drain();
}
process.on('SIGINT', () => stop('SIGINT'));
process.on('SIGTERM', () => stop('SIGTERM'));

const running = new Set();
for await (const m of messages) {
  const p = handle(m).catch((err) => {
    log('call failed, handed back for redelivery', { subject: m.subject, error: String(err) }, 'warn');
    m.nak(1000);
  });
  running.add(p);
  p.finally(() => running.delete(p));
}
await Promise.allSettled(running);
