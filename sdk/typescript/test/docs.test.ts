// Every TypeScript snippet of the docs type-checks against this package (imported by its
// name, @toolbus/sdk, as a user imports it), and the Node example is what the docs show.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const pkg = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const repo = path.resolve(pkg, '..', '..');
const docs = ['docs/writing-tools.md', 'sdk/typescript/README.md'];

function snippets(file: string): string[] {
  const text = readFileSync(path.join(repo, file), 'utf8');
  return [...text.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]);
}

test('the TypeScript snippets of the docs type-check against the package', () => {
  const dir = path.join(pkg, 'dist', 'snippets');
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const files: string[] = [];
  for (const doc of docs) {
    const found = snippets(doc);
    assert.ok(found.length > 0, `${doc} has no ts snippet`);
    found.forEach((s, i) => {
      const f = path.join(dir, `${path.basename(doc, '.md')}-${i}.ts`);
      writeFileSync(f, s);
      files.push(f);
    });
  }
  writeFileSync(path.join(dir, 'tsconfig.json'), JSON.stringify({
    compilerOptions: { target: 'ES2022', module: 'NodeNext', moduleResolution: 'NodeNext', strict: true, noEmit: true, skipLibCheck: true },
    files,
  }));
  try {
    execFileSync(process.execPath, [path.join(pkg, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', path.join(dir, 'tsconfig.json')], { stdio: 'pipe' });
  } catch (err) {
    assert.fail(`a snippet does not type-check:\n${(err as { stdout?: Buffer }).stdout}`);
  }
});

test('docs/writing-tools.md shows the Node example whole', () => {
  const example = readFileSync(path.join(repo, 'examples', 'node-executor', 'executor.js'), 'utf8');
  const text = readFileSync(path.join(repo, 'docs', 'writing-tools.md'), 'utf8');
  assert.ok(text.includes('```js\n' + example + '```'), 'the js block of docs/writing-tools.md is not examples/node-executor/executor.js');
});
