// What Tinode's web app does from its menus, through the real tinode-sdk
// (issue 40): a group made with `{sub topic="new…" set={desc}}` is named by
// the server and is the creator's to write in; members are added
// (`{set sub={user}}`), removed (`{del what="sub"}`), leave or dissolve
// (`{del what="topic"}`); a one-to-one chat's typing
// note reaches the peer under the name the peer knows the chat by
// (`usr<writer>`). Run by tests/realtime_tinode.rs with GATEWAY (host:port),
// TOKEN_A, TOKEN_B; prints the new group's name as `group=<topic>` and "ok"
// last. With TRACE set, the SDK's log goes to stderr.
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
const EVENT_TIMEOUT_MS = 20_000;

function within(ms, what, promise) {
  return Promise.race([
    promise,
    new Promise((_, reject) => setTimeout(() => reject(new Error(`${what}: nothing within ${ms} ms`)), ms)),
  ]);
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

  // A new group, as the app's "New group" makes it.
  const group = a.getTopic(a.newGroupTopicName());
  const made = await group.subscribe(null, { desc: { public: { fn: 'Picnic planning' } } });
  assert.equal(made.code, 200, `create: ${JSON.stringify(made)}`);
  assert.match(group.name, /^grp[A-Za-z0-9_-]+$/, `the new group's name: ${group.name}`);
  assert.ok(group.isSubscribed(), 'the creator is attached to the new group');
  const sent = await group.publishMessage(group.createMessage('who brings the cake?', false));
  assert.equal(sent.code, 202, `first message: ${JSON.stringify(sent)}`);
  console.log(`group=${group.name}`);

  // "Add members": B is added and writes there.
  const added = await group.invite(uidB, null);
  assert.equal(added.code, 200, `add B: ${JSON.stringify(added)}`);
  const groupB = b.getTopic(group.name);
  await groupB.subscribe();
  const fromB = await groupB.publishMessage(groupB.createMessage('I will', false));
  assert.equal(fromB.code, 202, `B writes in the group: ${JSON.stringify(fromB)}`);
  // Someone B does not name cannot be added by B (not an admin).
  await assert.rejects(groupB.invite('usr999999', null), /permission|denied|403|admin/i,
    'a member who is not an admin adds nobody');

  // "Remove": A removes B; B's next message is refused.
  const removed = await group.delSubscription(uidB);
  assert.equal(removed.code, 200, `remove B: ${JSON.stringify(removed)}`);
  assert.ok(await refused(groupB.publishMessage(groupB.createMessage('still here?', false))),
    'a removed member writes nothing');

  // "Leave" (delete the chat as a member), then "Delete" as the owner.
  const second = a.getTopic(a.newGroupTopicName());
  assert.equal((await second.subscribe(null, { desc: { public: { fn: 'Second' } } })).code, 200);
  assert.equal((await second.invite(uidB, null)).code, 200);
  const secondB = b.getTopic(second.name);
  await secondB.subscribe();
  // The add's `{pres what="acs"}` about B can reach B's fresh attach, and
  // the SDK then asks for B's own entry by itself; B's own read of the
  // members is answered after that one, so B leaves only once the SDK's
  // request has its answer (a leave first makes it a refusal nobody
  // catches).
  await secondB.getMeta(secondB.startMetaQuery().withSub().build());
  const left = await secondB.delTopic(true);
  assert.equal(left.code, 200, `B leaves: ${JSON.stringify(left)}`);
  const again = b.getTopic(second.name);
  await assert.rejects(again.subscribe(), 'B left: the group is not B\'s to read');
  const gone = await second.delTopic(true);
  assert.equal(gone.code, 200, `A dissolves: ${JSON.stringify(gone)}`);
  const after = a.getTopic(second.name);
  await assert.rejects(after.subscribe(), 'a dissolved group cannot be read');

  // A name the server cannot use is refused with a reason, not created.
  const bad = a.getTopic(a.newGroupTopicName());
  await assert.rejects(
    bad.subscribe(null, { desc: { public: { fn: 'x'.repeat(129) } } }),
    (e) => /name|long|129|128/i.test(String(e && e.message)),
    'a 129-character group name is refused with a reason',
  );

  // Typing in a one-to-one chat: B writes first, both attach.
  const toA = b.getTopic(uidA);
  await toA.subscribe();
  const hi = await toA.publishMessage(toA.createMessage('hi A', false));
  assert.equal(hi.code, 202, `B's first message: ${JSON.stringify(hi)}`);
  const toB = a.getTopic(uidB);
  await toB.subscribe();
  const typing = new Promise((resolve) => {
    toB.onInfo = (info) => {
      if (info.what === 'kp') resolve(info);
    };
  });
  toA.noteKeyPress();
  const info = await within(EVENT_TIMEOUT_MS, `A sees B typing in usr${uidB}`, typing);
  assert.equal(info.from, uidB, `the typing note is B's: ${JSON.stringify(info)}`);
  assert.equal(info.topic, uidB, `A knows the chat as B's name: ${JSON.stringify(info)}`);

  // "Change avatar": a small picture inline, as the app sends it (with
  // the delete marker in `ref`); the peer reads it as a data: URI.
  const png = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=';
  const me = a.getMeTopic();
  const set = await me.setMeta({ desc: { public: { fn: 'A', photo: { data: png, type: 'image/png', ref: '\u2421' } } } });
  assert.equal(set.code, 200, `avatar: ${JSON.stringify(set)}`);
  const seen = await within(EVENT_TIMEOUT_MS, 'B reads A\'s picture', (async () => {
    for (;;) {
      const meta = await b.getMeta(uidA, { what: 'desc' });
      const ref = meta && meta.desc && meta.desc.public && meta.desc.public.photo && meta.desc.public.photo.ref;
      if (ref && ref.startsWith('data:')) return ref;
      await new Promise((r) => setTimeout(r, 300));
    }
  })());
  assert.equal(seen, `data:image/png;base64,${png}`);
  // Too large to keep inline: refused with a reason (the app uploads it).
  await assert.rejects(
    me.setMeta({ desc: { public: { photo: { data: 'A'.repeat(12000), type: 'image/png' } } } }),
    /upload|longer|large/i,
    'a picture past the inline limit is refused with a reason',
  );

  a.disconnect();
  b.disconnect();
}

main().then(() => {
  console.log('ok');
  process.exit(0);
}).catch((e) => {
  console.error(e && e.stack || e);
  if (process.env.TRACE) console.error(trace.join('\n'));
  else console.error(trace.slice(-60).join('\n'));
  process.exit(1);
});
