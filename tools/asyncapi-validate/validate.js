// Validates an AsyncAPI document with the official parser (@asyncapi/parser): the
// document must parse, resolve every $ref (the payloads live in ../../schemas) and pass
// the parser's rules with no error and no warning.
//
//   node validate.js <asyncapi.yaml>            diagnostics, exit 1 when invalid
//   node validate.js <asyncapi.yaml> --summary  also print the resolved channels,
//                                               messages and operations (with their
//                                               replies) as JSON, which the Go tests
//                                               TestAsyncAPI* check against the Go code
import path from 'node:path';
import { Parser, fromFile, DiagnosticSeverity } from '@asyncapi/parser';

const [file, flag] = process.argv.slice(2);
if (!file) {
  console.error('usage: node validate.js <asyncapi.yaml> [--summary]');
  process.exit(2);
}

const parser = new Parser();
const { document, diagnostics } = await fromFile(parser, path.resolve(file)).parse();

const severity = { [DiagnosticSeverity.Error]: 'error', [DiagnosticSeverity.Warning]: 'warning',
  [DiagnosticSeverity.Information]: 'info', [DiagnosticSeverity.Hint]: 'hint' };
let bad = 0;
for (const d of diagnostics) {
  const level = severity[d.severity] ?? String(d.severity);
  if (d.severity !== DiagnosticSeverity.Error && d.severity !== DiagnosticSeverity.Warning) {
    // Information and hints (e.g. "a newer AsyncAPI version exists") are not defects:
    // toolbus describes itself in AsyncAPI 3.0 on purpose.
    continue;
  }
  bad++;
  const where = d.path && d.path.length ? d.path.join('.') : '(document)';
  console.error(`${level} ${d.code}: ${d.message} at ${where}`);
}
if (!document || bad > 0) {
  console.error(`${file}: invalid (${bad} error(s) or warning(s))`);
  process.exit(1);
}

if (flag === '--summary') {
  const summary = {
    version: document.version(),
    channels: document.channels().all().map((c) => ({
      id: c.id(),
      address: c.address(),
      parameters: c.parameters().all().map((p) => p.id()),
      messages: c.messages().all().map((m) => m.id()),
    })),
    messages: document.components().messages().all().map((m) => ({
      id: m.id(),
      name: m.name(),
      contentType: m.contentType(),
      headers: m.hasHeaders() ? m.headers().json() : null,
      payload: m.hasPayload() ? m.payload().json() : null,
    })),
    operations: document.operations().all().map((o) => ({
      id: o.id(),
      action: o.action(),
      channels: o.channels().all().map((c) => c.id()),
      messages: o.messages().all().map((m) => m.id()),
      tags: o.tags().all().map((t) => t.name()),
      reply: o.reply() ? {
        channel: o.reply().channel() ? o.reply().channel().id() : null,
        address: o.reply().channel() ? o.reply().channel().address() : null,
        messages: o.reply().messages().all().map((m) => m.id()),
      } : null,
    })),
  };
  process.stdout.write(JSON.stringify(summary, null, 2) + '\n');
} else {
  console.error(`${file}: valid AsyncAPI ${document.version()}`);
}
