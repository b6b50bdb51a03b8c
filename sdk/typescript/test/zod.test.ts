// register(tool) with a zod-like schema (zod 4) as well as a JSON Schema, against a real
// NATS JetStream server: the catalog gets its JSON Schema, calls are validated by it (and
// by the schema's own parse: refinements, defaults) before the tool runs.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { NatsConnection } from '@nats-io/transport-node';
import { z } from 'zod';
import { Executor, wire } from '../src/index.js';
import { connectTest, request, result, startExecutor, stopServer, unique } from './helpers.js';

let nc: NatsConnection;
let bus: wire.Bus;
before(async () => {
  nc = await connectTest();
  bus = new wire.Bus(nc);
});
after(async () => {
  await nc.drain();
  stopServer();
});

test('zod: the catalog holds the schema\'s JSON Schema, and calls are checked by it and by its refinements', async () => {
  const name = unique('zod');
  const Args = z.object({
    incident_id: z.string().regex(/^INC-[0-9]+$/),
    limit: z.number().int().min(1).max(50).default(10),
    from: z.string().optional(),
    to: z.string().optional(),
  }).strict().refine((a) => !a.from || !a.to || a.from <= a.to, { message: 'from must not be after to', path: ['from'] });
  const got: unknown[] = [];
  const { ex, done } = await startExecutor(nc, [{
    name, description: 'looks an incident up', inputSchema: Args, outputSchema: z.object({ severity: z.enum(['low', 'high']) }),
    run: (a: z.infer<typeof Args>) => {
      got.push(a);
      return { severity: a.incident_id === 'INC-9' ? 'unknown' : 'high' };
    },
  }]);
  try {
    const kv = await bus.kv(wire.Bucket.tools);
    const c = JSON.parse(new TextDecoder().decode((await kv.get(name))!.value)) as wire.ToolContract;
    assert.deepEqual(c.input_schema, {
      type: 'object', additionalProperties: false, required: ['incident_id'],
      properties: {
        incident_id: { type: 'string', pattern: '^INC-[0-9]+$' },
        limit: { type: 'integer', minimum: 1, maximum: 50, default: 10 },
        from: { type: 'string' },
        to: { type: 'string' },
      },
    }, 'the JSON Schema of the zod schema, without $schema');
    assert.equal((c.output_schema as { type?: string }).type, 'object');

    // What the JSON Schema says: every violation with its path.
    const bad = await result(bus, await request(bus, { tool: name, args: '{"incident_id":"x","limit":99,"extra":1}' }));
    assert.equal(bad.status, 'rejected');
    assert.equal(bad.error?.code, 'invalid_arguments');
    const paths = (bad.error?.details as { path: string }[]).map((v) => v.path).sort();
    assert.deepEqual(paths, ['/extra', '/incident_id', '/limit']);
    // What only the zod schema says (a refinement), with its path.
    const refined = await result(bus, await request(bus, { tool: name, args: '{"incident_id":"INC-1","limit":5,"from":"b","to":"a"}' }));
    assert.equal(refined.error?.code, 'invalid_arguments', JSON.stringify(refined));
    assert.deepEqual(refined.error?.details, [{ path: '/from', message: 'from must not be after to' }]);
    // A valid call runs with the schema's defaults, once.
    const ok = await result(bus, await request(bus, { tool: name, args: '{"incident_id":"INC-1","limit":3}' }));
    assert.equal(ok.status, 'succeeded', JSON.stringify(ok));
    const out = await result(bus, await request(bus, { tool: name, args: '{"incident_id":"INC-9"}' }));
    assert.equal(out.error?.code, 'invalid_tool_output', 'the output is checked by the output schema');
    assert.deepEqual(got, [{ incident_id: 'INC-1', limit: 3 }, { incident_id: 'INC-9', limit: 10 }]);
  } finally {
    ex.stop();
    await done;
  }
});

test('zod: a zod 3 schema (no toJSONSchema) is refused at register, saying what to do', () => {
  const zod3Like = { _def: { typeName: 'ZodObject' }, parse: () => ({}) };
  assert.throws(() => new Executor({ env: {} }).register({ name: 'z3', description: 'd', inputSchema: zod3Like, run: () => 'x' }), /zod 3.*use zod 4/);
});
