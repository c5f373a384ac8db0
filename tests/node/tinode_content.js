// Messages with the content Tinode clients make (tinode-sdk's Drafty, as
// the Tinode web app builds them), sent through imstream's WebSocket
// gateway. Run by tests/message_content.rs with GATEWAY_HOST, TOKEN,
// TOPIC (a grp… topic the token's user is a member of) and STEPS, a JSON
// array of what to send, in order:
//
//   {"text": "hello"}                        plain text
//   {"mention": "usr1002", "name": "Bob"}    "hi @Bob" (an MN entity)
//   {"all": true}                            "@all …" as typed (Drafty.parse)
//   {"reply": 12, "author": "usr1001", "name": "Alice", "quoted": "…",
//    "text": "…"}                            a reply: the web app's quote of
//                                            the parent + text, head.reply
//
// Prints `seq <n>` per step (the seq the server acknowledged), then "ok".
// Exits non-zero with a message on any refusal. With TRACE set, the SDK's
// log goes to stderr.
'use strict';
const assert = require('node:assert/strict');
const { Drafty } = require('tinode-sdk');
const { trace, client, connect } = require('./sdk');

const host = process.env.GATEWAY_HOST;
const token = process.env.TOKEN;
const topicName = process.env.TOPIC;
const steps = JSON.parse(process.env.STEPS || '[]');
if (!host || !token || !topicName || steps.length == 0) {
  console.error('GATEWAY_HOST, TOKEN, TOPIC and STEPS are required');
  process.exit(2);
}

// The web app's send: createMessage(content, false), then its head merged in.
async function send(topic, content, head) {
  const msg = topic.createMessage(content, false);
  if (head) {
    msg.head = Object.assign(msg.head || {}, head);
  }
  const ctrl = await topic.publishMessage(msg);
  assert.ok(ctrl && ctrl.code == 202, `publish refused: ${JSON.stringify(ctrl)}`);
  assert.ok(Number.isInteger(ctrl.params.seq), `no seq: ${JSON.stringify(ctrl)}`);
  return ctrl.params.seq;
}

async function main() {
  const t = client('content', host);
  await connect(t);
  const login = await t.loginToken(token);
  assert.equal(login.code, 200, JSON.stringify(login));
  const topic = t.getTopic(topicName);
  const sub = await topic.subscribe();
  assert.equal(sub.code, 200, `subscribe: ${JSON.stringify(sub)}`);
  for (const step of steps) {
    let seq;
    if (step.reply) {
      // messages-view.jsx: the quote (a mention of the parent's author and
      // a preview of it) before the text, head.reply the parent's seq.
      const quote = Drafty.quote(step.name, step.author,
        Drafty.replyContent(Drafty.parse(step.quoted), 30));
      const content = Drafty.append(quote, Drafty.parse(step.text));
      seq = await send(topic, content, { reply: '' + step.reply });
    } else if (step.text !== undefined) {
      seq = await send(topic, step.text);
    } else if (step.mention) {
      const content = Drafty.append(Drafty.parse('hi '), Drafty.mention(step.name, step.mention));
      assert.equal(content.ent[0].tp, 'MN');
      seq = await send(topic, content);
    } else if (step.all) {
      const content = Drafty.parse('@all meeting at noon');
      assert.deepEqual(content.ent, [{ tp: 'MN', data: { val: 'all' } }]);
      seq = await send(topic, content);
    } else {
      throw new Error(`unknown step ${JSON.stringify(step)}`);
    }
    console.log(`seq ${seq}`);
  }
  await topic.leave(false);
  t.disconnect();
}

const timer = setTimeout(() => {
  console.error('timed out\n' + trace.join('\n'));
  process.exit(1);
}, 30_000);
main().then(() => {
  clearTimeout(timer);
  console.log('ok');
  process.exit(0);
}).catch((e) => {
  console.error(e && e.stack || e);
  if (process.env.TRACE) console.error(trace.join('\n'));
  process.exit(1);
});
