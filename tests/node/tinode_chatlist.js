// The chat list through a real Tinode client (tinode-sdk from npm): after
// login the `me` topic lists every conversation with names and unread
// counts; the login catch-up brings each conversation's few unread
// messages (only a count for many); a message to a conversation the client is not attached to moves
// it to the top and raises its count live; reading it on a second device
// clears the count on the first; a new one-to-one conversation appears for
// its recipient; a group is online while another member is attached (live:
// it turns on and off in the list as members come and go); a
// group's member list shows names, roles and online state.
//
// Run by tests/chat_list.rs with GATEWAY_A, GATEWAY_B (host:port), TOKEN_A,
// TOKEN_A2 (a second device of A), TOKEN_B, TOKEN_C, TEAM, PAIR (group
// topics), A, B, C (uids). Prints "ok" on success; exits non-zero with the
// SDK's trace otherwise.
'use strict';
const assert = require('node:assert/strict');
const { trace, client, connect } = require('./sdk');

const env = (name) => {
  const v = process.env[name];
  if (!v) {
    console.error(`${name} is required`);
    process.exit(2);
  }
  return v;
};
const [hostA, hostB] = [env('GATEWAY_A'), env('GATEWAY_B')];
const [TEAM, PAIR] = [env('TEAM'), env('PAIR')];
const [A, B, C] = [env('A'), env('B'), env('C')].map((u) => `usr${u}`);

const OVERALL_TIMEOUT_MS = 90_000;
const EVENT_TIMEOUT_MS = 20_000;




// Polls `check` until it returns a truthy value (never a fixed sleep).
async function until(what, check) {
  const deadline = Date.now() + EVENT_TIMEOUT_MS;
  for (;;) {
    const v = check();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

// A logged-in client subscribed to `me` with the full first query.
async function login(label, host, token) {
  const t = client(label, host);
  await connect(t);
  const ctrl = await t.loginToken(token);
  assert.equal(ctrl.code, 200, `${label} login`);
  const me = t.getMeTopic();
  me.onContactUpdate = () => {};
  await me.subscribe(me.startMetaQuery().withLaterSub().withDesc().withTags().withCred().build());
  return { t, me };
}

function contacts(me) {
  const out = [];
  me.contacts((c) => out.push(c));
  return out;
}

function contact(me, name) {
  return contacts(me).find((c) => c.name === name);
}

async function main() {
  // 1. The chat list after login: every conversation, names, unread.
  const a = await login('A', hostA, env('TOKEN_A'));
  const list = await until('A has three conversations', () => {
    const all = contacts(a.me);
    return all.length >= 3 && all;
  });
  const names = list.map((c) => c.name).sort();
  assert.deepEqual(names, [PAIR, TEAM, C].sort(), 'A lists the two groups and the one-to-one with C');
  const team = contact(a.me, TEAM);
  assert.equal(team.public && team.public.fn, 'Team', 'the group has its name');
  assert.equal(team.unread, 3, "B's three messages are unread for A");
  assert.equal(contact(a.me, PAIR).unread, 0, "A's own message is not unread");
  const withC = contact(a.me, C);
  assert.equal(withC.public && withC.public.fn, 'Carol', 'the one-to-one shows the peer');
  assert.equal(withC.unread, 1, "C's message is unread");
  assert.equal(a.me.public && a.me.public.fn, 'Alice', 'own profile in me desc');

  // 1b. The login catch-up (seed 003 §9.1) through `me`: each conversation
  // with at most N unread messages gets them, filed under its own topic;
  // the others are only counted.
  const caught = await a.me.getMeta(a.me.startMetaQuery().withData(undefined, undefined, 2).build());
  assert.equal(caught.code, 208, `catch-up answered: ${JSON.stringify(caught)}`);
  assert.deepEqual(caught.params.unread, { [TEAM]: 3 }, 'Team has more unread than asked: only its count');
  assert.equal(caught.params.count, 1, "C's one message came");
  // The SDK files {data} after the request's promise settles.
  const fromC = await until(`C's message filed under ${C}`, () => a.t.getTopic(C).latestMessage());
  assert.ok(JSON.stringify(fromC.content).includes('hi Alice') && fromC.from === C, `C's message: ${JSON.stringify(fromC)}`);
  await assert.rejects(
    a.me.getMeta(a.me.startMetaQuery().withData(undefined, undefined, 500).build()),
    /400/,
    'a catch-up beyond the cap is refused',
  );

  // 2. B writes to PAIR, where A is not attached: it moves to the top of
  // A's list and its unread count goes up, live.
  const b = await login('B', hostB, env('TOKEN_B'));
  const pairB = b.t.getTopic(PAIR);
  assert.equal((await pairB.subscribe()).code, 200);
  const sent = await pairB.publish('news for the pair', true);
  assert.equal(sent.code, 202);
  const seq = sent.params.seq;
  await until('PAIR unread 1 on A', () => contact(a.me, PAIR).unread === 1 && contact(a.me, PAIR).seq === seq);
  const top = contacts(a.me).sort((x, y) => (y.touched || 0) - (x.touched || 0))[0];
  assert.equal(top.name, PAIR, 'the conversation with the new message is on top');

  // 3. A reads it on a second device: the count clears on the first.
  const a2 = await login('A2', hostB, env('TOKEN_A2'));
  // A group is online in the list while another member is attached to it
  // (B to PAIR; nobody to Team): what lets the client show typing.
  await until('A2 lists the groups', () => contact(a2.me, PAIR) && contact(a2.me, TEAM));
  assert.equal(contact(a2.me, PAIR).online, true, 'PAIR is online: B is attached');
  assert.equal(contact(a2.me, TEAM).online, false, 'Team is offline: nobody is attached');
  const pairA2 = a2.t.getTopic(PAIR);
  assert.equal((await pairA2.subscribe()).code, 200);
  pairA2.noteRead(seq);
  await until('PAIR unread 0 on A after the read on A2', () => contact(a.me, PAIR).unread === 0);

  // 4. A new one-to-one conversation: B's first message to C appears in
  // C's chat list, with B's name.
  const c = await login('C', hostA, env('TOKEN_C'));
  assert.equal(contact(c.me, B), undefined, 'C has no conversation with B yet');
  const toC = b.t.getTopic(C);
  assert.equal((await toC.subscribe()).code, 200);
  assert.equal((await toC.publish('hello Carol', true)).code, 202);
  const fromB = await until('B appears in C\'s list', () => {
    const x = contact(c.me, B);
    return x && x.public && x.public.fn === 'Bob' && x.unread === 1 && x;
  });
  assert.equal(fromB.seq, 1);

  // 5. The member list of a group: names, roles (access modes), online.
  const teamA = a.t.getTopic(TEAM);
  await teamA.subscribe(teamA.startMetaQuery().withSub().withDesc().build());
  const members = await until('Team members', () => {
    const users = [];
    teamA.subscribers((s) => users.push(s));
    return users.length === 3 && users;
  });
  const byUser = Object.fromEntries(members.map((m) => [m.user, m]));
  assert.equal(byUser[A].public.fn, 'Alice');
  assert.equal(byUser[B].public.fn, 'Bob');
  assert.equal(byUser[C].public.fn, 'Carol');
  assert.ok(byUser[A].acs.isOwner(), 'A owns the group');
  assert.ok(!byUser[B].acs.isOwner() && byUser[B].acs.isWriter(), 'B is a writing member');
  assert.equal(byUser[A].online, true, 'A is attached to Team');
  assert.equal(byUser[B].online, false, 'B is not attached to Team');
  assert.equal(teamA.public && teamA.public.fn, 'Team', 'desc carries the name');
  assert.ok(teamA.getAccessMode().isOwner(), "A's own mode on Team");

  // 5b. The group's online in the chat list follows live: A alone on Team
  // sees it offline; B attaching turns it on in A's list, B leaving off.
  await until("Team offline in A's list (A is alone)", () => contact(a.me, TEAM).online === false);
  const teamB = b.t.getTopic(TEAM);
  assert.equal((await teamB.subscribe()).code, 200);
  await until("Team online in A's list once B is attached", () => contact(a.me, TEAM).online === true);
  await teamB.leave(false);
  await until("Team offline in A's list once B left", () => contact(a.me, TEAM).online === false);

  // 5c. Finding someone to talk to (the `fnd` topic): by the start of the
  // name (any case), by user id; never oneself; one letter, or a part
  // from the middle of a name, finds nobody.
  const fnd = a.t.getFndTopic();
  assert.equal((await fnd.subscribe()).code, 200);
  const search = async (q) => {
    await fnd.setMeta({ desc: { public: q } });
    await fnd.getMeta(fnd.startMetaQuery().withSub().build());
    const found = [];
    fnd.contacts((x) => found.push(x));
    return found;
  };
  const byName = await search('car');
  assert.deepEqual(byName.map((x) => x.user || x.topic), [C], 'the start of the name finds Carol');
  assert.equal(byName[0].public.fn, 'Carol');
  assert.deepEqual(await search('arol'), [], 'a part from the middle finds nobody');
  assert.deepEqual((await search(`${C} alice`)).map((x) => x.user || x.topic), [C], 'by id; not oneself');

  // 6. Presence of one-to-one peers on the chat list: B goes offline, C's
  // list shows it.
  await until("B online in C's list", () => contact(c.me, B).online === true);
  b.t.disconnect();
  await until("B offline in C's list", () => contact(c.me, B).online === false);

  for (const x of [a, a2, c]) x.t.disconnect();
}

const timer = setTimeout(() => {
  console.error(`overall timeout\n${trace.join('\n')}`);
  process.exit(1);
}, OVERALL_TIMEOUT_MS);

main()
  .then(() => {
    clearTimeout(timer);
    if (process.env.TRACE) console.error(trace.join('\n'));
    console.log('ok');
    process.exit(0);
  })
  .catch((e) => {
    clearTimeout(timer);
    console.error(`${e.stack || e}\n--- trace ---\n${trace.join('\n')}`);
    process.exit(1);
  });
