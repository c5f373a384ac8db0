// A real third-party client (tinode-sdk from npm) against imstream's
// Tinode-compatible WebSocket gateway. Run by tests/gateway_tinode_sdk.rs
// with GATEWAY_HOST (host:port), TOKEN (a session token), TOPIC (a grp…
// topic the token's user is a member of) and optionally BASIC
// ("login:password" of a config dev user who is also a member). Exits
// non-zero with a message on any mismatch, printing "ok" on success. With
// TRACE set, the SDK's log (every frame in and out) goes to stderr.
//
// Set-up follows shared/design/TINODE-PROTOCOL.md §3: transport 'ws', the
// ws package as network provider, fake-indexeddb's `.indexedDB` as database
// provider. Only hi/login/sub/pub/leave are used: {get} is not implemented
// by the gateway yet, so subscribe() is called without a query.
'use strict';
const assert = require('node:assert/strict');
const { trace, client: sdkClient, connect } = require('./sdk');
const client = (label) => sdkClient(label, host);

const host = process.env.GATEWAY_HOST;
const token = process.env.TOKEN;
const topicName = process.env.TOPIC;
const basic = process.env.BASIC || '';
if (!host || !token || !topicName) {
  console.error('GATEWAY_HOST, TOKEN and TOPIC are required');
  process.exit(2);
}

const OVERALL_TIMEOUT_MS = 30_000;





// Awaits a promise that must reject with a server ctrl of `code`.
async function rejectsWith(promise, code, what) {
  let err = null;
  try {
    const ctrl = await promise;
    assert.fail(`${what}: expected code ${code}, got ${JSON.stringify(ctrl)}`);
  } catch (e) {
    if (e instanceof assert.AssertionError) throw e;
    err = e;
  }
  assert.equal(err.code, code, `${what}: expected code ${code}, got ${err.code} (${err.message})`);
  return err;
}

// Topic.publishMessage swallows server errors (returns undefined), so a
// missing ctrl means the server refused the message.
function assertAccepted(ctrl, what) {
  assert.ok(ctrl, `${what}: publish refused (no ctrl)`);
  assert.equal(ctrl.code, 202, `${what}: ${JSON.stringify(ctrl)}`);
  assert.ok(ctrl.params && Number.isInteger(ctrl.params.seq) && ctrl.params.seq > 0,
    `${what}: params.seq must be a positive integer: ${JSON.stringify(ctrl)}`);
  return ctrl.params.seq;
}

async function main() {
  const t = client('token');
  await connect(t);
  const info = t.getServerInfo();
  assert.ok(info && info.ver, `hi params: ${JSON.stringify(info)}`);

  // Token login.
  const login = await t.loginToken(token);
  assert.equal(login.code, 200, JSON.stringify(login));
  assert.ok(t.isAuthenticated(), 'isAuthenticated() after loginToken');
  const me = t.getCurrentUserID();
  assert.ok(typeof me === 'string' && me.startsWith('usr'), `current user id ${me}`);
  assert.ok(t.getAuthToken() && t.getAuthToken().token, 'a fresh token is stored');

  // Attach without a query ({get} is not implemented by the gateway yet).
  const g = t.getTopic(topicName);
  const sub = await g.subscribe();
  assert.equal(sub.code, 200, `subscribe: ${JSON.stringify(sub)}`);
  assert.ok(g.isSubscribed(), 'topic attached after subscribe');

  // Two publishes: accepted with increasing seqs.
  const seq1 = assertAccepted(await g.publish('hello from tinode-sdk'), 'first publish');
  const seq2 = assertAccepted(await g.publish('second message'), 'second publish');
  assert.ok(seq2 > seq1, `seq must increase: ${seq1} then ${seq2}`);

  // A message carrying an idempotency key in head; a retry with the same
  // key gets the same seq back and is not stored twice.
  const m3 = g.createMessage('with a client id');
  m3.head = { ...(m3.head || {}), client_mid: 'x1' };
  const seq3 = assertAccepted(await g.publishMessage(m3), 'publish with client_mid');
  assert.ok(seq3 > seq2, `seq must increase: ${seq2} then ${seq3}`);
  const retry = t.createMessage(topicName, 'with a client id');
  retry.head = { client_mid: 'x1' };
  const again = assertAccepted(await t.publishMessage(retry), 'retry with client_mid');
  assert.equal(again, seq3, 'a retry with the same client_mid keeps its seq');

  // {get what="desc"} is answered with {meta desc} (the SDK's getMeta resolves).
  const meta = await g.getMeta(g.startMetaQuery().withDesc().build());
  assert.ok(meta && meta.desc, `desc expected: ${JSON.stringify(meta)}`);
  assert.ok(meta.desc.acs, 'desc carries the access mode');
  assert.ok(meta.desc.seq >= seq3, `desc.seq ${meta.desc.seq} must cover ${seq3}`);

  // A topic the user is not a member of is refused.
  const other = t.getTopic(topicName + 'Nope');
  await rejectsWith(other.subscribe(), 403, 'subscribe to a non-member topic');
  assert.ok(!other.isSubscribed(), 'refused topic stays detached');

  // Leave, then a publish (sent directly: Topic.publish refuses locally on an
  // inactive topic) is refused by the server with 409.
  const left = await g.leave(false);
  assert.equal(left.code, 200, `leave: ${JSON.stringify(left)}`);
  assert.ok(!g.isSubscribed(), 'topic detached after leave');
  await rejectsWith(t.publishMessage(t.createMessage(topicName, 'too late')), 409,
    'publish after leave');

  // Basic login as a development user, if one is configured.
  if (basic) {
    const sep = basic.indexOf(':');
    assert.ok(sep > 0, 'BASIC must be login:password');
    const b = client('basic');
    await connect(b);
    const wrong = await rejectsWith(b.loginBasic(basic.slice(0, sep), 'wrong-password'), 401,
      'basic login with a wrong password');
    assert.ok(wrong, 'wrong password refused');
    assert.ok(!b.isAuthenticated(), 'not authenticated after a refused login');
    const ok = await b.loginBasic(basic.slice(0, sep), basic.slice(sep + 1));
    assert.equal(ok.code, 200, JSON.stringify(ok));
    assert.ok(b.isAuthenticated(), 'isAuthenticated() after loginBasic');
    const buid = b.getCurrentUserID();
    assert.ok(typeof buid === 'string' && buid.startsWith('usr'), `basic user id ${buid}`);
    const bg = b.getTopic(topicName);
    await bg.subscribe();
    const seq4 = assertAccepted(await bg.publish('hello from basic'), 'basic publish');
    assert.ok(seq4 > seq3, `seq must increase: ${seq3} then ${seq4}`);
    await bg.leave(false);
    b.disconnect();
  }

  t.disconnect();
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
