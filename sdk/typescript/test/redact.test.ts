// The redactor's patterns stay linear in the text's length: a pattern that backtracks
// over long runs of letters blocked the event loop for minutes on a large output (and
// the executor lost its lease meanwhile).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Redactor } from '../src/index.js';

test('redaction of a 1 MiB run of letters ends (no quadratic pattern), and a URL password after it is still redacted', { timeout: 30000 }, () => {
  const red = new Redactor(['a-secret-value']);
  const [out, n] = red.text('x'.repeat(1 << 20) + 'https://bob:hunter22@example.com/ a-secret-value');
  assert.equal(n, 2);
  assert.ok(out.endsWith('https://bob:[REDACTED]@example.com/ [REDACTED]'), out.slice(-80));
});
