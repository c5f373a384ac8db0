// A person's own settings of a chat from Tinode's web app, through the real
// tinode-sdk (issue 40): Block / Unblock (`topic.updateMode(null, '-JP')`,
// `'+JP'`), Mute (`'-P'`), Archive (`topic.archive(true)`), Pin
// (`topic.pinMessage`), Delete (`topic.delTopic(true)`), and a password
// change from a session that signed in by token (refused with a reason:
// the current password is asked for). Run by tests/realtime_tinode.rs
// with GATEWAY (host:port), TOKEN_A, TOKEN_B; prints "ok" last. With TRACE
// set, the SDK's log goes to stderr.
'use strict';
const assert = require('node:assert/strict');
const { trace, client, connect, refused } = require('./sdk');

const host = process.env.GATEWAY;
const tokenA = process.env.TOKEN_A;
const tokenB = process.env.TOKEN_B;
if (!host || !tokenA || !tokenB) {
  console.error('GATEWAY, TOKEN_A and TOKEN_B are required');
  process.exit(2);
}

// The server's list entry of chat `name` for `t`, asked again.
async function listedAcs(t, name) {
  const me = t.getMeTopic();
  await me.getMeta(me.startMetaQuery().withOneSub(undefined, name).build());
  const c = t.getTopic(name);
  return c && c.acs;
}

// Waits until `t`'s chat list (the `me` topic, asked again) has `name`.
async function listed(t, name) {
  const me = t.getMeTopic();
  for (let i = 0; i < 100; i++) {
    await me.getMeta(me.startMetaQuery().withSub().build());
    const names = [];
    me.contacts((c) => names.push(c.name));
    if (names.includes(name)) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`${name} never listed`);
}

async function main() {
  const a = client('A', host);
  await connect(a);
  assert.equal((await a.loginToken(tokenA)).code, 200);
  const b = client('B', host);
  await connect(b);
  assert.equal((await b.loginToken(tokenB)).code, 200);
  const uidA = a.getCurrentUserID();
  const uidB = b.getCurrentUserID();

  // A writes to B; B has the chat in the list of `me`.
  const chatA = a.getTopic(uidB);
  await chatA.subscribe();
  const first = await chatA.publishMessage(chatA.createMessage('hello B', false));
  assert.equal(first.code, 202, `A's first message: ${JSON.stringify(first)}`);
  const me = b.getMeTopic();
  await me.subscribe(me.startMetaQuery().withLaterSub().withDesc().build());
  const chatB = b.getTopic(uidA);
  await chatB.subscribe(chatB.startMetaQuery().withLaterData(24).withSub().withDesc().withAux().build());

  // Block: B's mode no longer joins; A's next message is refused.
  await chatB.updateMode(null, '-JP');
  assert.ok(!chatB.getAccessMode().isJoiner(), `B's mode after Block: ${chatB.getAccessMode()}`);
  assert.ok(await refused(chatA.publishMessage(chatA.createMessage('still there?', false))),
    'a blocked sender is refused');
  // Unblock: A writes again at once, and the server's list entry agrees,
  // although the relations projection may still be applying the block
  // (a stored newer version keeps it from putting the block back).
  await chatB.updateMode(null, '+JP');
  assert.ok(chatB.getAccessMode().isJoiner(), `B's mode after Unblock: ${chatB.getAccessMode()}`);
  const again = await chatA.publishMessage(chatA.createMessage('back again', false));
  assert.equal(again.code, 202, `A right after the unblock: ${JSON.stringify(again)}`);
  const listedAfter = await listedAcs(b, uidA);
  assert.ok(listedAfter && listedAfter.isJoiner(), `B's list after Unblock: ${listedAfter}`);

  // Mute and unmute: P out of B's mode, then back.
  await chatB.updateMode(null, '-P');
  assert.ok(chatB.getAccessMode().isMuted(), `B's mode after Mute: ${chatB.getAccessMode()}`);
  await chatB.updateMode(null, '+P');
  assert.ok(!chatB.getAccessMode().isMuted(), `B's mode after Unmute: ${chatB.getAccessMode()}`);

  // Archive: kept by the server (a second client of B reads it back, once
  // the chat list's projection has the chat).
  await chatB.archive(true);
  assert.ok(chatB.isArchived(), 'archived here');
  const b2 = client('B2', host);
  await connect(b2);
  assert.equal((await b2.loginToken(tokenB)).code, 200);
  const me2 = b2.getMeTopic();
  await me2.subscribe(me2.startMetaQuery().withLaterSub().build());
  await listed(b2, uidA);
  assert.ok(b2.getTopic(uidA).isArchived(), 'archived as read back by another client');
  await chatB.archive(false);

  // Pin: B pins A's first message; A reads the pins of the chat.
  const seq = first.params.seq;
  await chatB.pinMessage(seq, true);
  await chatA.getMeta(chatA.startMetaQuery().withAux().build());
  assert.deepEqual(chatA.aux('pins'), [seq], `the pins A reads: ${JSON.stringify(chatA.aux('pins'))}`);

  // A password change from a session that signed in by token: refused,
  // with what to do.
  await assert.rejects(b.updateAccountBasic(null, null, 'a brand new passphrase'),
    /sign in again/, 'a token session changes no password without the current one');

  // Delete the chat: gone from B's list (read back by the other client).
  const del = await chatB.delTopic(true);
  assert.equal(del.code, 200, `delete: ${JSON.stringify(del)}`);
  const b3 = client('B3', host);
  await connect(b3);
  assert.equal((await b3.loginToken(tokenB)).code, 200);
  const me3 = b3.getMeTopic();
  await me3.subscribe(me3.startMetaQuery().withLaterSub().build());
  const left = [];
  me3.contacts((c) => left.push(c.name));
  assert.ok(!left.includes(uidA), `the deleted chat is listed: ${left}`);

  console.log('ok');
  // Everything is checked: the process ends with its sockets (a request
  // the SDK still holds would otherwise be rejected by disconnect()).
  process.exit(0);
}

main().catch((e) => {
  console.error(e && e.stack || e);
  if (process.env.TRACE) console.error(trace.join('\n'));
  else console.error(trace.slice(-60).join('\n'));
  process.exit(1);
});
