// Two real third-party clients (tinode-sdk from npm) on two different
// imstream gateways see each other in real time: {pres on/off}, {data} both
// ways, and {info} recv / read / kp. Run by tests/realtime_tinode.rs with
// GATEWAY_A, GATEWAY_B (host:port), TOKEN_A, TOKEN_B (session tokens of two
// members) and TOPIC (a grp… topic both are members of). Exits non-zero with
// a message on any mismatch, printing "ok" on success. With TRACE set, the
// SDK's log (every frame in and out) goes to stderr.
//
// Set-up follows shared/design/TINODE-PROTOCOL.md §3 (transport 'ws', the
// ws package as network provider, fake-indexeddb's `.indexedDB`).
'use strict';
const assert = require('node:assert/strict');
const { trace, client, connect } = require('./sdk');

const hostA = process.env.GATEWAY_A;
const hostB = process.env.GATEWAY_B;
const tokenA = process.env.TOKEN_A;
const tokenB = process.env.TOKEN_B;
const topicName = process.env.TOPIC;
if (!hostA || !hostB || !tokenA || !tokenB || !topicName) {
  console.error('GATEWAY_A, GATEWAY_B, TOKEN_A, TOKEN_B and TOPIC are required');
  process.exit(2);
}

const OVERALL_TIMEOUT_MS = 60_000;
// How long one expected event may take (it goes through Kafka and a
// projector pipeline, then Redis Pub/Sub to the other gateway).
const EVENT_TIMEOUT_MS = 20_000;





// Everything a topic's callbacks delivered, with waiters for what a test
// expects next.
class Seen {
  constructor(label) {
    this.label = label;
    this.data = [];
    this.info = [];
    this.pres = [];
    this.waiters = [];
  }
  push(kind, value) {
    if (!value) return; // onData() without a message: a refused publish
    this[kind].push(value);
    this.waiters = this.waiters.filter((w) => !(w.kind === kind && w.pred(value) && (w.resolve(value), true)));
  }
  // Resolves with the first (past or future) event of `kind` matching `pred`.
  expect(kind, what, pred) {
    const past = this[kind].find(pred);
    if (past) return Promise.resolve(past);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(
        `[${this.label}] no ${kind} "${what}" within ${EVENT_TIMEOUT_MS} ms; got ${JSON.stringify(this[kind])}`)),
      EVENT_TIMEOUT_MS);
      this.waiters.push({ kind, pred, resolve: (v) => { clearTimeout(timer); resolve(v); } });
    });
  }
  watch(topic) {
    topic.onData = (d) => this.push('data', d);
    topic.onInfo = (i) => this.push('info', i);
    topic.onPres = (p) => this.push('pres', p);
  }
}

function assertAccepted(ctrl, what) {
  assert.ok(ctrl, `${what}: publish refused (no ctrl)`);
  assert.equal(ctrl.code, 202, `${what}: ${JSON.stringify(ctrl)}`);
  assert.ok(ctrl.params && Number.isInteger(ctrl.params.seq) && ctrl.params.seq > 0,
    `${what}: params.seq must be a positive integer: ${JSON.stringify(ctrl)}`);
  return ctrl.params.seq;
}

async function main() {
  // A attaches first on gateway A.
  const a = client('A', hostA);
  await connect(a);
  assert.equal((await a.loginToken(tokenA)).code, 200);
  const uidA = a.getCurrentUserID();
  const ga = a.getTopic(topicName);
  const seenA = new Seen('A');
  seenA.watch(ga);
  assert.equal((await ga.subscribe()).code, 200);

  // B attaches on gateway B: A sees B come online.
  const b = client('B', hostB);
  await connect(b);
  assert.equal((await b.loginToken(tokenB)).code, 200);
  const uidB = b.getCurrentUserID();
  assert.notEqual(uidA, uidB);
  const gb = b.getTopic(topicName);
  const seenB = new Seen('B');
  seenB.watch(gb);
  assert.equal((await gb.subscribe()).code, 200);
  await seenA.expect('pres', 'B on', (p) => p.what === 'on' && p.src === uidB && p.topic === topicName);

  // A publishes: B gets the message from A.
  const seq1 = assertAccepted(await ga.publish('hello from A'), 'A publishes');
  const d1 = await seenB.expect('data', 'A\'s message', (d) => d.seq === seq1);
  assert.equal(d1.from, uidA);
  assert.equal(d1.content, 'hello from A');
  assert.ok(typeof d1.ts === 'object' && !isNaN(d1.ts), `ts parses: ${d1.ts}`);
  // B's SDK acknowledges receipt by itself; A sees it.
  await seenA.expect('info', 'B\'s recv', (i) => i.what === 'recv' && i.from === uidB && i.seq === seq1);
  // B reads; A sees it.
  gb.noteRead(seq1);
  await seenA.expect('info', 'B\'s read', (i) => i.what === 'read' && i.from === uidB && i.seq === seq1);

  // B answers; A gets it, with B as the author.
  const seq2 = assertAccepted(await gb.publish('hello from B'), 'B publishes');
  assert.ok(seq2 > seq1, `seq increases: ${seq1} then ${seq2}`);
  const d2 = await seenA.expect('data', 'B\'s message', (d) => d.seq === seq2);
  assert.equal(d2.from, uidB);
  assert.equal(d2.content, 'hello from B');
  await seenB.expect('info', 'A\'s recv', (i) => i.what === 'recv' && i.from === uidA && i.seq === seq2);

  // B types; A sees it.
  gb.noteKeyPress();
  await seenA.expect('info', 'B typing', (i) => i.what === 'kp' && i.from === uidB);

  // Each got the other's message once and never its own back.
  assert.deepEqual(seenA.data.filter((d) => d.from === uidB).map((d) => d.seq), [seq2]);
  assert.deepEqual(seenB.data.filter((d) => d.from === uidA).map((d) => d.seq), [seq1]);

  // B leaves: A sees B go offline.
  assert.equal((await gb.leave(false)).code, 200);
  await seenA.expect('pres', 'B off', (p) => p.what === 'off' && p.src === uidB && p.topic === topicName);

  b.disconnect();
  a.disconnect();
  if (process.env.TRACE) console.error(trace.join('\n'));
  console.log('ok');
}

const timer = setTimeout(() => {
  console.error(`FAILED: timed out after ${OVERALL_TIMEOUT_MS} ms`);
  console.error(trace.join('\n'));
  process.exit(1);
}, OVERALL_TIMEOUT_MS);

main().then(() => {
  clearTimeout(timer);
  process.exit(0);
}).catch((e) => {
  console.error('FAILED:', e && e.stack ? e.stack : e);
  console.error('--- SDK trace ---');
  console.error(trace.join('\n'));
  process.exit(1);
});
