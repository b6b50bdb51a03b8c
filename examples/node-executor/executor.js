// A toolbus executor in JavaScript on @toolbus/sdk: it serves one tool, `delay`, with
// the whole executor side of the contract (the package does claims, leases, validation,
// timeouts, cancellation, progress, bounding and redaction). Configured by the TOOLBUS_*
// variables of the Go executors; TOOLBUS_NODE_TOOL renames the tool.
import { setTimeout as wait } from 'node:timers/promises';
import { register, serve } from '@toolbus/sdk';

register({
  name: process.env.TOOLBUS_NODE_TOOL || 'delay',
  description: 'Wait for the given number of milliseconds, then echo the label. Served by a JavaScript executor.',
  inputSchema: {
    type: 'object',
    properties: {
      ms: { type: 'integer', minimum: 0, maximum: 600000, description: 'How long to wait in milliseconds' },
      label: { type: 'string', description: 'Text to echo back' },
    },
    required: ['ms'],
    additionalProperties: false,
  },
  readOnly: true,
  async run({ ms, label }, { signal, progress }) {
    const started = Date.now();
    const tick = setInterval(() => progress(Date.now() - started, ms, `waited ${Date.now() - started} of ${ms} ms`), 250);
    try {
      await wait(ms, undefined, { signal });
    } finally {
      clearInterval(tick);
    }
    return { waited_ms: Date.now() - started, ...(label !== undefined && { label }) };
  },
});
await serve();
