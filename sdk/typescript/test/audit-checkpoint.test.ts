// An audit bundle with its checkpoint (toolbus audit export; CONTRACT.md, "Signed and chained events")
// verified with nothing but node:crypto, as an auditor's own verifier would: each
// event's DSSE signature over its CloudEvents verification material, the chain of
// prevdigest, and each event's inclusion in the signed checkpoint (C2SP signed note,
// RFC 6962 tree as golang.org/x/mod/sumdb/tlog builds it). The fixture is the one the
// Go verifier accepts (audit/trail, TOOLBUS_WRITE_FIXTURE=1 writes it).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, createPublicKey, verify } from 'node:crypto';
import { readFileSync } from 'node:fs';

type Header = Record<string, string[]>;
interface Bundle {
  run: string;
  stream: string;
  events: { seq: number; subject: string; header: Header; data: string }[];
  keys: { keys: { keyid: string; signer: string; public: string }[] };
  checkpoint: { checkpoint: string; leaves: { seq: number; index: number; proof: string[] }[] };
}

const payloadType = 'https://cloudevents.io/verifiability/dsse/v0.1';
const coreAttrs = ['id', 'source', 'specversion', 'type', 'datacontenttype', 'dataschema', 'subject', 'time'];
const sha = (...b: (Buffer | string)[]) => {
  const h = createHash('sha256');
  for (const x of b) h.update(x);
  return h.digest();
};
const attr = (h: Header, name: string) => h[name === 'datacontenttype' ? 'Content-Type' : 'ce-' + name]?.[0] ?? '';

// time in UTC with the fraction's trailing zeros dropped (toolbus writes UTC).
function normTime(v: string): string {
  const m = /^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?Z$/.exec(v);
  if (!m) throw new Error(`time ${v} is not UTC`);
  const frac = (m[2] ?? '').replace(/0+$/, '');
  return m[1] + (frac ? '.' + frac : '') + 'Z';
}

function material(h: Header, data: Buffer, exts: string[]): Buffer {
  const parts: Buffer[] = coreAttrs.map((a) => sha(a === 'time' && attr(h, a) ? normTime(attr(h, a)) : attr(h, a)));
  parts.push(sha(data));
  for (const e of exts) parts.push(sha(e), sha(attr(h, e)));
  return sha(Buffer.concat(parts));
}

const signedExts = (h: Header) => attr(h, 'signedextattrs').split(',').filter((x) => x !== '');
const pubKey = (raw: Buffer) =>
  createPublicKey({ key: Buffer.concat([Buffer.from('302a300506032b6570032100', 'hex'), raw]), format: 'der', type: 'spki' });

// verifyBundle throws naming the first event that fails and why.
function verifyBundle(b: Bundle): void {
  const keys = new Map(b.keys.keys.map((k) => [k.keyid, k]));
  const digests: string[] = [];
  b.events.forEach((ev, i) => {
    const where = `event ${i + 1} (${attr(ev.header, 'id')})`;
    const data = Buffer.from(ev.data, 'base64');
    const env = JSON.parse(Buffer.from(attr(ev.header, 'dssematerial'), 'base64').toString());
    assert.equal(env.payloadType, payloadType, `${where}: payload type`);
    const payload = Buffer.from(env.payload, 'base64');
    const pae = Buffer.concat([Buffer.from(`DSSEv1 ${payloadType.length} ${payloadType} ${payload.length} `), payload]);
    const ok = env.signatures.some((s: { keyid: string; sig: string }) => {
      const k = keys.get(s.keyid);
      return k !== undefined && verify(null, pae, pubKey(Buffer.from(k.public, 'base64')), Buffer.from(s.sig, 'base64'));
    });
    assert.ok(ok, `${where}: signature: no signature verifies with a key of the bundle`);
    const m = material(ev.header, data, signedExts(ev.header));
    assert.ok(m.equals(payload), `${where}: signature: the event is not the one signed`);
    const prev = attr(ev.header, 'prevdigest');
    if (prev !== '') assert.ok(digests.includes(prev), `${where}: chain: it follows ${prev}, which no earlier event is`);
    digests.push('sha256:' + m.toString('hex'));
  });
  const size = checkCheckpoint(b);
  b.events.forEach((ev, i) => {
    const leaf = b.checkpoint.leaves.find((l) => l.seq === ev.seq);
    assert.ok(leaf, `event ${i + 1}: checkpoint: no inclusion proof`);
    const rec = sha(Buffer.from([0]), Buffer.from(digests[i].slice('sha256:'.length), 'hex'));
    const root = runProof(leaf.proof.map((p) => Buffer.from(p, 'base64')), 0, size.n, leaf.index, rec);
    assert.ok(root.equals(size.root), `event ${i + 1}: checkpoint: its proof does not lead to the signed root`);
  });
}

// checkCheckpoint verifies the signed note with a core (role.*) key and returns its tree.
function checkCheckpoint(b: Bundle): { n: number; root: Buffer } {
  const [text, sigs] = b.checkpoint.checkpoint.split('\n\n');
  const body = text + '\n';
  const ok = sigs.split('\n').some((line) => {
    const m = /^\u2014 (\S+) (\S+)$/.exec(line);
    const k = m ? b.keys.keys.find((x) => x.keyid === m[1] && x.signer.startsWith('role.')) : undefined;
    return k !== undefined && verify(null, Buffer.from(body), pubKey(Buffer.from(k.public, 'base64')), Buffer.from(m![2], 'base64').subarray(4));
  });
  assert.ok(ok, 'checkpoint: no signature by a core key verifies');
  const [origin, n, root] = text.split('\n');
  assert.equal(origin, 'toolbus/' + b.stream, 'checkpoint: origin');
  return { n: Number(n), root: Buffer.from(root, 'base64') };
}

// runProof is tlog's record proof check: the root of leaves [lo, hi) holding leaf n.
function runProof(p: Buffer[], lo: number, hi: number, n: number, leaf: Buffer): Buffer {
  if (hi - lo === 1) {
    assert.equal(p.length, 0, 'checkpoint: proof too long');
    return leaf;
  }
  assert.ok(p.length > 0, 'checkpoint: proof too short');
  let k = 1;
  while (k * 2 < hi - lo) k *= 2;
  const last = p[p.length - 1];
  const node = (l: Buffer, r: Buffer) => sha(Buffer.from([1]), l, r);
  if (n < lo + k) return node(runProof(p.slice(0, -1), lo, lo + k, n, leaf), last);
  return node(last, runProof(p.slice(0, -1), lo + k, hi, n, leaf));
}

const fixture = (): Bundle => JSON.parse(readFileSync(new URL('../../test/fixtures/audit-bundle-checkpoint.json', import.meta.url), 'utf8'));

test('an exported audit bundle verifies: signatures, chain, checkpoint inclusion', () => {
  verifyBundle(fixture());
});

test('a tampered bundle fails naming the check: data, a removed event, a proof, the checkpoint', () => {
  const altered = fixture();
  const d = JSON.parse(Buffer.from(altered.events[2].data, 'base64').toString());
  d.message.content = 'tampered';
  altered.events[2].data = Buffer.from(JSON.stringify(d)).toString('base64');
  assert.throws(() => verifyBundle(altered), /event 3 .*signature: the event is not the one signed/);

  const removed = fixture();
  removed.events.splice(1, 1);
  assert.throws(() => verifyBundle(removed), /event 2 .*chain/);

  const proof = fixture();
  proof.checkpoint.leaves[0].index = 1;
  assert.throws(() => verifyBundle(proof), /event 1: checkpoint/);

  const resized = fixture();
  resized.checkpoint.checkpoint = resized.checkpoint.checkpoint.replace(/\n4\n/, '\n5\n');
  assert.throws(() => verifyBundle(resized), /checkpoint: no signature/);
});
