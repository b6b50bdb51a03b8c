// OpenTelemetry spans of the calls, recorded by a tracer provider of the test's own
// registered as the global one (the package takes @opentelemetry/api as an optional peer).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { NatsConnection } from '@nats-io/transport-node';
import { trace, type Attributes, type Context, type Span, type SpanContext, type SpanOptions, type SpanStatus, type Tracer } from '@opentelemetry/api';
import { ToolError, wire } from '../src/index.js';
import { connectTest, eventually, request, result, startExecutor, stopServer, unique } from './helpers.js';

interface Recorded {
  name: string;
  kind?: number;
  parent?: SpanContext;
  attributes: Attributes;
  status?: SpanStatus;
  ended: boolean;
}

const spans: Recorded[] = [];

/** A tracer that records its spans (what an SDK's exporter would get). */
const tracer: Tracer = {
  startSpan(name: string, options: SpanOptions = {}, ctx?: Context): Span {
    const rec: Recorded = { name, kind: options.kind, parent: ctx ? trace.getSpanContext(ctx) : undefined, attributes: { ...options.attributes }, ended: false };
    spans.push(rec);
    const sc: SpanContext = { traceId: rec.parent?.traceId ?? '1'.repeat(32), spanId: (spans.length + 1).toString(16).padStart(16, '0'), traceFlags: 1 };
    const span: Span = {
      spanContext: () => sc,
      setAttribute: (k, v) => ((rec.attributes[k] = v), span),
      setAttributes: (a) => (Object.assign(rec.attributes, a), span),
      addEvent: () => span,
      addLink: () => span,
      addLinks: () => span,
      setStatus: (st) => ((rec.status = st), span),
      updateName: (n) => ((rec.name = n), span),
      end: () => void (rec.ended = true),
      isRecording: () => !rec.ended,
      recordException: () => {},
    };
    return span;
  },
  startActiveSpan(): never {
    throw new Error('not used');
  },
};

let nc: NatsConnection;
let bus: wire.Bus;
before(async () => {
  assert.ok(trace.setGlobalTracerProvider({ getTracer: () => tracer }), 'the global tracer provider is this test\'s');
  nc = await connectTest();
  bus = new wire.Bus(nc);
});
after(async () => {
  await nc.drain();
  stopServer();
});

test('spans: each call is an execute_tool span, a child of its traceparent, with the GenAI attributes and its outcome', async () => {
  const name = unique('traced');
  const { ex, done } = await startExecutor(nc, [{ name, description: 'd', inputSchema: { type: 'object', properties: { fail: { type: 'boolean' } } },
    run: (a: { fail?: boolean }) => {
      if (a.fail) throw new ToolError('upstream_down', 'the upstream is down');
      return 'ok';
    } }]);
  try {
    const ok = await request(bus, { tool: name, args: '{}' });
    const bad = await request(bus, { tool: name, args: '{"fail":true}' });
    assert.equal((await result(bus, ok)).status, 'succeeded');
    assert.equal((await result(bus, bad)).status, 'failed');
    const of = (run: string) => eventually(async () => spans.find((s) => s.attributes['toolbus.run_id'] === run && s.ended), 10000, `the span of ${run}`);
    const s = await of(ok);
    assert.equal(s.name, `execute_tool ${name}`);
    assert.equal(s.kind, 0, 'SpanKind.INTERNAL');
    // The call's traceparent (test/helpers.ts request) is the parent.
    assert.deepEqual([s.parent?.traceId, s.parent?.spanId, s.parent?.isRemote], ['4bf92f3577b34da6a3ce929d0e0e4736', '00f067aa0ba902b7', true]);
    assert.deepEqual({ ...s.attributes }, {
      'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': name, 'gen_ai.tool.call.id': 'call_1',
      'toolbus.run_id': ok, 'toolbus.step': 0, 'toolbus.attempt': 1, 'toolbus.tool.status': 'succeeded',
    });
    assert.equal(s.status, undefined, 'a succeeded call sets no error status');
    const f = await of(bad);
    assert.equal(f.attributes['toolbus.tool.status'], 'failed');
    assert.equal(f.attributes['error.type'], 'upstream_down');
    assert.deepEqual(f.status, { code: 2, message: 'upstream_down' }, 'SpanStatusCode.ERROR with the code');
  } finally {
    ex.stop();
    await done;
  }
});
