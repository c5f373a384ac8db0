// Drives the Tinode web app the gateway serves, in Debian's headless
// chromium through playwright-core, the way people use it: log in through
// the form, open a group, type and send, see it arrive live in another
// browser. Watches every WebSocket frame the app sends with an `id` (each
// must be answered by a ctrl/meta with that id within 5 s), every console
// error, and every request off the page's origin (there must be none).
// Screenshots of each step go to $ARTIFACTS. Prints "ok" last on success.
//
// Environment: BASE_URL (http://host:port), USER_A, USER_B, USER_C
// ("login:password"), GROUP (topic), GROUP_NAME, SEEDED (messages already in
// GROUP), ARTIFACTS (folder), CHAT_LIST=1 enables the steps that need the
// `me` topic (chat list with names, unread badges, paging, typing,
// one-to-one), NAME_A / NAME_B (the people's names), PHOTO_A (A's picture
// reference, optional), INVITE_NAME / INVITE_TEXT (a group C is invited
// to, and a message in it), CHROMIUM (default /usr/bin/chromium).

'use strict';

const fs = require('fs');
const path = require('path');
const { chromium } = require('playwright-core');

const BASE = process.env.BASE_URL;
const GROUP = process.env.GROUP;
const GROUP_NAME = process.env.GROUP_NAME || GROUP;
const SEEDED = Number(process.env.SEEDED || '0');
const ARTIFACTS = process.env.ARTIFACTS;
const CHAT_LIST = process.env.CHAT_LIST !== '0';
const ANSWER_MS = 5000;
// Generous: two cores shared with the gateway, pipelines and Kafka.
const WAIT = { timeout: 60000 };

function credentials(name) {
  const v = process.env[name] || '';
  const i = v.indexOf(':');
  if (i < 1) throw new Error(`${name} must be login:password`);
  return { login: v.slice(0, i), password: v.slice(i + 1) };
}

const problems = [];
const everyone = [];
let shot = 0;

/// One browser context for one person, with its watchers.
async function person(browser, label) {
  const context = await browser.newContext({ viewport: { width: 1100, height: 760 } });
  const page = await context.newPage();
  const who = { label, context, page, requests: new Map(), errors: [], offsite: [], log: [], notices: [], token: null, refs: [], expected: [] };
  everyone.push(who);
  page.on('console', (m) => {
    // A refusal the test itself asked for (its own fetch) is no error.
    if (m.type() === 'error' && !who.expected.some((e) => m.text().includes(e))) who.errors.push(m.text());
  });
  page.on('pageerror', (e) => who.errors.push(`uncaught: ${e.message} at ${String(e.stack || '').split('\n').slice(1, 4).join(' | ')}`));
  page.on('request', (r) => {
    const url = r.url();
    if (!url.startsWith(BASE) && !url.startsWith('ws://' + new URL(BASE).host) && !url.startsWith('data:') && !url.startsWith('blob:')) {
      who.offsite.push(url);
    }
  });
  page.on('websocket', (ws) => {
    ws.on('framesent', (f) => {
      who.log.push('> ' + String(f.payload).slice(0, 300));
      let msg;
      try { msg = JSON.parse(f.payload); } catch (_) { return; }
      const kind = Object.keys(msg)[0];
      const id = msg[kind] && msg[kind].id;
      if (id) who.requests.set(id, { kind, sentAt: Date.now(), answeredAt: null, frame: f.payload.slice(0, 200) });
    });
    ws.on('framereceived', (f) => {
      who.log.push('< ' + String(f.payload).slice(0, 300));
      let msg;
      try { msg = JSON.parse(f.payload); } catch (_) { return; }
      // The session's token (an address with `auth`/`secret` needs it) and
      // imstream's notices (`{pres topic="me" what="upd" event}`).
      if (msg.ctrl && msg.ctrl.params && msg.ctrl.params.token) who.token = msg.ctrl.params.token;
      if (msg.pres && msg.pres.event) who.notices.push(msg.pres);
      // The uploads messages refer to (`ent[].data.ref`), by name.
      const ents = msg.data && msg.data.content && msg.data.content.ent;
      for (const e of Array.isArray(ents) ? ents : []) {
        const ref = e && e.data && e.data.ref;
        if (typeof ref === 'string' && ref.startsWith('/v0/file/s/')) who.refs.push({ name: e.data.name, ref });
      }
      const reply = msg.ctrl || msg.meta;
      if (reply && reply.id && who.requests.has(reply.id)) {
        const r = who.requests.get(reply.id);
        if (!r.answeredAt) r.answeredAt = Date.now();
      }
    });
  });
  return who;
}

async function screenshot(who, step) {
  shot += 1;
  const file = path.join(ARTIFACTS, `${String(shot).padStart(2, '0')}-${who.label}-${step}.png`);
  await who.page.screenshot({ path: file });
}

/// Logs in through the login form and waits for the app's main screen
/// (the side panel with the user's own avatar, no login form, no error).
async function logIn(who, creds) {
  const { page } = who;
  // As a person waits for what they just did to take: a request the page
  // sent must get its answer before the page goes (else it is lost with
  // the socket, and counted unanswered).
  const settled = Date.now() + ANSWER_MS;
  const pending = () => [...who.requests.values()].some((r) => !r.answeredAt && Date.now() - r.sentAt < ANSWER_MS);
  while (pending() && Date.now() < settled) await page.waitForTimeout(50);
  await page.goto(BASE + '/', { waitUntil: 'load' });
  await page.locator('#inputLogin').waitFor(WAIT);
  await screenshot(who, 'login-form');
  await page.locator('#inputLogin').fill(creds.login);
  await page.locator('#login-form input[type=password]').fill(creds.password);
  await page.locator('#login-form button[type=submit]').click();
  await page.locator('#login-form').waitFor({ state: 'detached', ...WAIT });
  await page.locator('#side-caption-panel #self-avatar').waitFor(WAIT);
  await noErrorBox(who, 'after login');
  await screenshot(who, 'main-screen');
}

/// The app shows failures in an error box; none may be up.
async function noErrorBox(who, when) {
  const box = who.page.locator('.info-box.error');
  if (await box.count()) {
    const text = await box.first().innerText();
    throw new Error(`${who.label}: the app shows an error ${when}: ${text}`);
  }
}

/// Opens GROUP: from the chat list by its name once the `me` topic lists
/// it, else by the app's own address for a topic (#/contacts/<topic>).
async function openGroup(who) {
  const { page } = who;
  if (CHAT_LIST) {
    await page.locator('.contact-box li', { hasText: GROUP_NAME }).first().click();
  } else {
    await page.evaluate((t) => { window.location.hash = '#/contacts/' + t; }, GROUP);
  }
  await page.locator('#topic-caption-panel').waitFor(WAIT);
  await page.locator('#send-message-input').waitFor(WAIT);
  await noErrorBox(who, `opening ${GROUP}`);
}

/// Opens the menu of the message showing `text` (its ⌄ trigger) and picks
/// the item whose title matches `item`.
async function messageMenu(who, text, item) {
  const bubble = who.page.locator('#messages-panel li', { has: who.page.getByText(text, { exact: true }) }).last();
  await bubble.hover();
  await bubble.locator('.menuTrigger a').click();
  await who.page.locator('.menu li', { hasText: item }).click();
}

/// Opens the menu of a chat in the list (its ⌄ trigger, shown on hover)
/// and picks the item whose text matches `item`.
async function chatMenu(who, entry, item) {
  await entry.waitFor(WAIT);
  await entry.hover();
  await entry.locator('i.material-icons', { hasText: /^expand_more$/ }).click();
  await who.page.locator('.menu li', { hasText: item }).click();
}

/// Confirms the app's "Are you sure?" dialog.
async function confirm(who) {
  await who.page.locator('.alert-container button.primary').click();
}

function message(who, text) {
  return who.page.locator('#messages-panel').getByText(text, { exact: true });
}

async function main() {
  fs.mkdirSync(ARTIFACTS, { recursive: true });
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu'],
  });
  try {
    await steps(browser);
  } catch (e) {
    for (const who of everyone) {
      try {
        await screenshot(who, 'failed');
        const panel = who.page.locator('#messages-panel');
        if (await panel.count()) console.log(`--- ${who.label}: messages panel: ${(await panel.innerText()).slice(0, 500)}`);
      } catch (_) { /* the page may be gone */ }
    }
    throw e;
  } finally {
    // Every frame each person's app sent and got, for reading afterwards.
    for (const who of everyone) {
      fs.writeFileSync(path.join(ARTIFACTS, `frames-${who.label}.log`), who.log.join('\n'));
    }
    await browser.close();
  }
  if (problems.length) {
    for (const who of everyone) {
      console.log(`--- ${who.label}: last WebSocket frames`);
      for (const l of who.log.slice(-40)) console.log(l);
    }
    for (const p of problems) console.log('PROBLEM ' + p);
    process.exit(1);
  }
  console.log('ok');
}

async function steps(browser) {
  {
    const a = await person(browser, 'a');
    const b = await person(browser, 'b');
    const people = [a, b];
    await logIn(a, credentials('USER_A'));
    await logIn(b, credentials('USER_B'));

    if (CHAT_LIST) {
      for (const who of people) {
        await who.page.locator('.contact-box li', { hasText: GROUP_NAME }).first().waitFor(WAIT);
        await screenshot(who, 'chat-list');
      }
    }

    await openGroup(b);
    await screenshot(b, 'group-open');
    await openGroup(a);
    if (SEEDED > 0) {
      // The newest seeded message is on screen at once.
      await message(a, `seeded ${SEEDED}`).waitFor(WAIT);
    }
    if (CHAT_LIST && SEEDED > 24) {
      // Page back by scrolling up until the first seeded message is loaded.
      const first = message(a, 'seeded 1');
      while (!(await first.count())) {
        // The oldest message shown changes once the older page arrived.
        // Scrolled to the top on every poll: a scroll the app saw before
        // it was ready to load (or while loading) asks for nothing.
        const before = await a.page.evaluate(() => document.querySelector('#messages-panel').innerText.slice(0, 40));
        await a.page.waitForFunction((b) => {
          const el = document.querySelector('#messages-panel');
          if (el.innerText.slice(0, 40) !== b) return true;
          el.scrollTop = 1;
          el.scrollTop = 0;
          return false;
        }, before, { polling: 500, ...WAIT });
      }
      await screenshot(a, 'paged-back');
    }
    await screenshot(a, 'group-open');

    const text = `hello from the browser ${Date.now()}`;
    const input = a.page.locator('#send-message-input');
    await input.click();
    await input.pressSequentially(text.slice(0, 5));
    if (CHAT_LIST) {
      // B, who has the group open, sees A typing before the message arrives
      // (the app shows it in a topic its chat list marks online).
      await b.page.locator('#topic-caption-panel .typing, #messages-panel .typing').first().waitFor(WAIT);
      await screenshot(b, 'typing');
    }
    await input.pressSequentially(text.slice(5));
    await input.press('Enter');
    await message(a, text).waitFor(WAIT);
    await screenshot(a, 'sent');
    await message(b, text).waitFor(WAIT);
    await screenshot(b, 'received-live');
    if (process.env.NAME_A) {
      // Under A's messages B sees A's name (the app writes "Not found"
      // when it has no `public` for the author) and A's picture.
      const authors = b.page.locator('#messages-panel .author');
      await authors.filter({ hasText: process.env.NAME_A }).first().waitFor(WAIT);
      const unknown = await authors.filter({ hasText: 'Not found' }).count();
      if (unknown) throw new Error(`${unknown} message(s) show "Not found" as their author`);
      if (process.env.PHOTO_A) {
        const sources = await b.page.evaluate(() =>
          [...document.querySelectorAll('#messages-panel img')].map((i) => i.getAttribute('src')));
        if (!sources.includes(process.env.PHOTO_A)) {
          throw new Error(`A's picture is not shown under her messages: ${JSON.stringify(sources).slice(0, 300)}`);
        }
      }
    }
    if (CHAT_LIST) {
      // B has the group open and has read everything: no badge.
      await b.page.locator('.contact-box li', { hasText: GROUP_NAME }).first().locator('.unread').waitFor({ state: 'detached', ...WAIT });
      await screenshot(b, 'read-no-badge');
      // A's message shows the read tick (blue ✓✓) once B read it.
      await a.page.locator('#messages-panel li', { has: a.page.getByText(text, { exact: true }) }).last()
        .locator('i.material-icons.blue', { hasText: /^done_all$/ }).waitFor(WAIT);
      await screenshot(a, 'read-tick');

      // A edits her message in the app; B sees the new text in place.
      const edited = `${text} edited`;
      await messageMenu(a, text, /^Edit$/);
      await input.fill(edited);
      await input.press('Enter');
      await message(a, edited).waitFor(WAIT);
      await message(b, edited).waitFor(WAIT);
      await message(b, text).waitFor({ state: 'detached', ...WAIT });
      await screenshot(b, 'edited');

      // B (a member) deletes a message for himself: gone for B only.
      await messageMenu(b, 'seeded 29', /^Delete$/);
      await message(b, 'seeded 29').waitFor({ state: 'detached', ...WAIT });
      if (!(await message(a, 'seeded 29').count())) throw new Error('a delete for B removed the message for A');

      // A (the owner) deletes her message for all: gone for both.
      await messageMenu(a, edited, /^Delete for All$/);
      await message(a, edited).waitFor({ state: 'detached', ...WAIT });
      await message(b, edited).waitFor({ state: 'detached', ...WAIT });
      await screenshot(b, 'deleted-for-all');

      // A (the owner) pins a message (its menu → Pin): both see it in the
      // pinned bar; B, a member, after signing in again too. Unpin clears
      // it for both.
      const pinned = `seeded ${SEEDED}`;
      await messageMenu(a, pinned, /^Pin$/);
      await noErrorBox(a, 'pinning');
      for (const who of [a, b]) {
        await who.page.locator('#pinned-wrapper .pinned', { hasText: pinned }).waitFor(WAIT);
      }
      await screenshot(b, 'pinned');
      await logIn(b, credentials('USER_B'));
      await openGroup(b);
      await b.page.locator('#pinned-wrapper .pinned', { hasText: pinned }).waitFor(WAIT);
      await messageMenu(a, pinned, /^Unpin$/);
      for (const who of [a, b]) {
        await who.page.locator('#pinned-wrapper').waitFor({ state: 'detached', ...WAIT });
      }
      await screenshot(b, 'unpinned');
    }

    if (CHAT_LIST && process.env.USER_C) {
      const c = await person(browser, 'c');
      people.push(c);
      await logIn(c, credentials('USER_C'));
      const entry = c.page.locator('.contact-box li', { hasText: GROUP_NAME }).first();
      await entry.locator('.unread').waitFor(WAIT);
      await screenshot(c, 'unread-badge');
      await entry.click();
      await c.page.locator('#send-message-input').waitFor(WAIT);
      await c.page.locator('.contact-box li', { hasText: GROUP_NAME }).first().locator('.unread').waitFor({ state: 'detached', ...WAIT });
      await screenshot(c, 'badge-cleared');

      // C looks at who is in the group: names, Alice as the owner.
      await c.page.locator('#topic-caption-panel a', { has: c.page.locator('i.material-icons', { hasText: /^more_vert$/ }) }).click();
      await c.page.locator('.menu li', { hasText: /^Info$/ }).click();
      const info = c.page.locator('#info-view-content');
      for (const name of [process.env.NAME_A, process.env.NAME_B]) {
        await info.locator('.contact-box li', { hasText: name }).first().waitFor(WAIT);
      }
      await info.locator('.contact-box li', { hasText: process.env.NAME_A }).first().getByText('owner', { exact: true }).waitFor(WAIT);
      await screenshot(c, 'members');

      // C leaves the group (Info → Security → Leave): it goes from C's
      // chat list.
      await info.locator('a', { hasText: /^\s*\S*\s*Security$/i }).first().click();
      await c.page.locator('#info-view a.danger.flat-button', { hasText: 'Leave' }).click();
      await c.page.locator('.alert-container button.primary').click();
      await c.page.locator('.contact-box li', { hasText: GROUP_NAME }).first().waitFor({ state: 'detached', ...WAIT });
      await noErrorBox(c, 'leaving the group');
      await screenshot(c, 'left');

      if (process.env.INVITE_NAME) {
        // C was invited to another group (C lets nobody add them
        // directly): it is in C's list; opening it shows the invitation;
        // after Accept C reads the group.
        const invite = c.page.locator('.contact-box li', { hasText: process.env.INVITE_NAME }).first();
        await invite.waitFor(WAIT);
        await invite.click();
        const panel = c.page.locator('.accept-invite-panel');
        await panel.waitFor(WAIT);
        await screenshot(c, 'invitation');
        await panel.locator('button.primary').click();
        await panel.waitFor({ state: 'detached', ...WAIT });
        await message(c, process.env.INVITE_TEXT).waitFor(WAIT);
        await noErrorBox(c, 'accepting an invitation');
        await screenshot(c, 'invitation-accepted');
      }
    }

    if (CHAT_LIST) {
      // B starts a one-to-one chat with A the way people do: new chat,
      // search A by name, pick A, write. A sees it appear in the chat list
      // under B's name.
      const nameA = process.env.NAME_A;
      await b.page.locator('#side-caption-panel a', { has: b.page.locator('i.material-icons', { hasText: /^chat$/ }) }).click();
      const search = b.page.locator('input.search');
      await search.waitFor(WAIT);
      await search.fill(nameA.split(' ')[0]);
      await search.press('Enter');
      const found = b.page.locator('.contact-box li', { hasText: nameA }).first();
      await found.waitFor(WAIT);
      await screenshot(b, 'found-peer');
      await found.click();
      await b.page.locator('#send-message-input').waitFor(WAIT);
      await noErrorBox(b, 'opening a one-to-one chat');
      const hi = `one to one ${Date.now()}`;
      await b.page.locator('#send-message-input').fill(hi);
      await b.page.locator('#send-message-input').press('Enter');
      await message(b, hi).waitFor(WAIT);
      await screenshot(b, 'p2p-sent');
      const entry = a.page.locator('.contact-box li', { hasText: process.env.NAME_B });
      await entry.first().waitFor(WAIT);
      await screenshot(a, 'p2p-appeared');
      await entry.first().click();
      await message(a, hi).waitFor(WAIT);
      await entry.first().locator('.unread').waitFor({ state: 'detached', ...WAIT });
      // The chat is titled with B's name, not "Unnamed".
      await a.page.locator('#topic-caption-panel', { hasText: process.env.NAME_B }).waitFor(WAIT);
      if (await a.page.locator('#topic-caption-panel', { hasText: 'Unnamed' }).count()) {
        throw new Error('the one-to-one chat is titled "Unnamed"');
      }
      await screenshot(a, 'p2p-open');
      // B's first message shows read (blue ✓✓) once A has it open, without
      // B reloading (the app takes ticks from the chat's member list).
      await b.page.locator('#messages-panel li', { has: b.page.getByText(hi, { exact: true }) }).last()
        .locator('i.material-icons.blue', { hasText: /^done_all$/ }).waitFor(WAIT);
      await screenshot(b, 'p2p-read-tick');

      // A answers: from then on each sees the other online (a stranger's
      // first message alone shows nothing of A to B).
      const back = `back to you ${Date.now()}`;
      await a.page.locator('#send-message-input').fill(back);
      await a.page.locator('#send-message-input').press('Enter');
      await message(b, back).waitFor(WAIT);
      await screenshot(b, 'p2p-answered');

      // B types in the one-to-one chat: A, who has it open, sees it (the
      // app matches `{info kp}` by the chat's name as A knows it,
      // `usr<B>`).
      const typing = b.page.locator('#send-message-input');
      // The app tells typing at most every 3 s, counted from B's last
      // input (the message B sent moments ago).
      await b.page.waitForTimeout(3500);
      await typing.click();
      await typing.pressSequentially('are you th');
      await a.page.locator('#topic-caption-panel .typing, #messages-panel .typing').first().waitFor(WAIT);
      await screenshot(a, 'p2p-typing');

      // A sends a 2 MB photo (Attach image → caption → send): too large
      // to go inline, it is uploaded; B sees the picture itself load from
      // the server (not the thumbnail) under its caption.
      const photoCaption = `photo ${Date.now()}`;
      const photo = Buffer.from(await a.page.evaluate(async () => {
        const c = document.createElement('canvas');
        c.width = 900;
        c.height = 900;
        const ctx = c.getContext('2d');
        const pixels = ctx.createImageData(900, 900);
        for (let i = 0; i < pixels.data.length; i++) {
          pixels.data[i] = i % 4 == 3 ? 255 : (Math.random() * 256) | 0;
        }
        ctx.putImageData(pixels, 0, 0);
        const blob = await new Promise((r) => c.toBlob(r, 'image/png'));
        const bytes = new Uint8Array(await blob.arrayBuffer());
        let text = '';
        for (let i = 0; i < bytes.length; i += 0x8000) {
          text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
        }
        return btoa(text);
      }), 'base64');
      if (photo.length < 2_000_000) throw new Error(`the photo is only ${photo.length} bytes`);
      await a.page.locator('#send-message-panel input[type=file][accept^="image"]')
        .setInputFiles({ name: 'photo.png', mimeType: 'image/png', buffer: photo });
      await a.page.locator('img.image-preview').waitFor(WAIT);
      await a.page.locator('#send-message-input').fill(photoCaption);
      // (The preview sends by its button: Enter there makes a new line.)
      await a.page.locator('#send-message-panel a', { has: a.page.locator('i.material-icons', { hasText: /^send$/ }) }).first().click();
      await message(b, photoCaption).waitFor(WAIT);
      const photoBubble = b.page.locator('#messages-panel li', { has: b.page.getByText(photoCaption, { exact: true }) }).last();
      await b.page.waitForFunction((li) => {
        const img = li.querySelector('img.inline-image');
        return img && img.complete && img.naturalWidth > 0 && img.src.includes('/v0/file/s/');
      }, await photoBubble.elementHandle(), WAIT);
      await noErrorBox(a, 'sending a photo');
      await screenshot(b, 'photo-received');

      // A sends a 5 MB PDF (Attach file → send): B saves it, byte for byte.
      const pdf = Buffer.concat([Buffer.from('%PDF-1.7\n'), require('crypto').randomBytes(5_000_000)]);
      await a.page.locator('#send-message-panel input[type=file]:not([accept])')
        .setInputFiles({ name: 'report.pdf', mimeType: 'application/pdf', buffer: pdf });
      await a.page.locator('#send-message-panel a', { has: a.page.locator('i.material-icons', { hasText: /^send$/ }) }).first().click();
      const card = b.page.locator('#messages-panel .attachment', { hasText: 'report.pdf' }).last();
      await card.waitFor(WAIT);
      const saving = b.page.waitForEvent('download', WAIT);
      await card.locator('a', { has: b.page.locator('i.material-icons', { hasText: /^file_download$/ }) }).click();
      const saved = await (await saving).path();
      const got = require('fs').readFileSync(saved);
      if (!got.equals(pdf)) throw new Error(`B saved ${got.length} bytes, not the ${pdf.length} A sent`);
      await noErrorBox(b, 'saving a file');
      await screenshot(b, 'pdf-received');
      // Carol, in neither chat, is refused its address (the same 404 as
      // for no file at all).
      const pdfRef = b.refs.find((r) => r.name === 'report.pdf');
      if (!pdfRef) throw new Error('B: no {data} referring to report.pdf');
      const carol = people.find((p) => p.label === 'c');
      if (carol) {
        carol.expected.push('status of 404 (Not Found)');
        const status = await carol.page.evaluate(async ([url, token]) =>
          (await fetch(`${url}?auth=token&secret=${encodeURIComponent(token)}`)).status, [pdfRef.ref, carol.token]);
        if (status !== 404) throw new Error(`c: a chat she is not in gave her its file: ${status}`);
      }

      // A sends a file the scan flags (it holds the EICAR test string; over
      // the app's inline size, so it is uploaded): B sees it arrive, is told
      // live that it is no longer available, and its address answers 410 to
      // B and to A alike.
      const eicar = Buffer.concat([
        Buffer.from('X5O!P%@AP[4\\PZX54(P^)7CC)7}$EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*\n'),
        Buffer.from('notes '.repeat(50_000)),
      ]);
      await a.page.locator('#send-message-panel input[type=file]:not([accept])')
        .setInputFiles({ name: 'notes.txt', mimeType: 'text/plain', buffer: eicar });
      await a.page.locator('#send-message-panel a', { has: a.page.locator('i.material-icons', { hasText: /^send$/ }) }).first().click();
      await b.page.locator('#messages-panel .attachment', { hasText: 'notes.txt' }).last().waitFor(WAIT);
      const flagged = (who) => who.notices.find((p) => p.event === 'file.unavailable');
      const told = Date.now() + 20000;
      while (!(flagged(a) && flagged(b)) && Date.now() < told) await b.page.waitForTimeout(100);
      for (const who of [a, b]) {
        const notice = flagged(who);
        if (!notice) throw new Error(`${who.label}: no live file.unavailable within 20 s`);
        who.expected.push('status of 410 (Gone)');
        const status = await who.page.evaluate(async ([url, token]) =>
          (await fetch(`${url}?auth=token&secret=${encodeURIComponent(token)}`)).status, [notice.params.url, who.token]);
        if (status !== 410) throw new Error(`${who.label}: the flagged file answered ${status}, not 410`);
      }
      await noErrorBox(b, 'a flagged file');
      await screenshot(b, 'file-flagged');

      // A turns Incognito on (Settings → Security): B's list shows her
      // offline at once, and still after she signs in again, where the
      // box is still ticked; turned off, B sees her online again.
      const bsEntryOfA = () => b.page.locator('.contact-box li', { hasText: nameA }).first();
      await bsEntryOfA().locator('span.online').waitFor(WAIT);
      const incognitoBox = async (ticked) => {
        await a.page.locator('#side-caption-panel a', { has: a.page.locator('i.material-icons', { hasText: /^settings$/ }) }).click();
        await a.page.locator('a.flat-button', { hasText: /Security/ }).first().click();
        const box = a.page.locator('#incognito-mode', { hasText: ticked ? /^check_box$/ : /^check_box_outline_blank$/ });
        await box.waitFor(WAIT);
        return box;
      };
      await (await incognitoBox(false)).click();
      await a.page.locator('#incognito-mode', { hasText: /^check_box$/ }).waitFor(WAIT);
      await noErrorBox(a, 'turning incognito on');
      await bsEntryOfA().locator('span.offline').waitFor(WAIT);
      await screenshot(b, 'peer-incognito');
      await logIn(a, credentials('USER_A'));
      await a.page.waitForTimeout(1500);
      if (!(await bsEntryOfA().locator('span.offline').count())) {
        throw new Error('B: A shows online after signing in again in incognito');
      }
      await (await incognitoBox(true)).click();
      await a.page.locator('#incognito-mode', { hasText: /^check_box_outline_blank$/ }).waitFor(WAIT);
      await noErrorBox(a, 'turning incognito off');
      await bsEntryOfA().locator('span.online').waitFor(WAIT);

      // B mutes the chat with A from its menu in the chat list: it shows
      // muted, still after B signs in again; Unmute takes it back.
      const nameB = process.env.NAME_B;
      const bsChatWithA = () => b.page.locator('.contact-box li', { hasText: nameA }).first();
      const mutedIcon = (entry) => entry.locator('i.material-icons', { hasText: /^notifications_off$/ });
      await chatMenu(b, bsChatWithA(), /^Mute$/);
      await mutedIcon(bsChatWithA()).waitFor(WAIT);
      await noErrorBox(b, 'muting a chat');
      await screenshot(b, 'p2p-muted');
      await logIn(b, credentials('USER_B'));
      await mutedIcon(bsChatWithA()).waitFor(WAIT);
      // Signed in afresh, B's list shows the chat's last message (the app
      // draws it only from messages it holds: the server sends a fresh
      // client its recent chats' newest messages).
      // (The last one is A's PDF: "Attachment".)
      await bsChatWithA().locator('.contact-comment', { hasText: /Attachment/ }).waitFor(WAIT);
      await screenshot(b, 'preview-after-login');
      await chatMenu(b, bsChatWithA(), /^Unmute$/);
      await mutedIcon(bsChatWithA()).waitFor({ state: 'detached', ...WAIT });
      await noErrorBox(b, 'unmuting a chat');

      // B blocks A (menu → Block → confirm): the chat leaves B's list. A,
      // signing in again, finds the chat closed to her ("Messaging
      // disabled") instead of a bare "failed" on sending.
      await chatMenu(b, bsChatWithA(), /^Block$/);
      await confirm(b);
      await bsChatWithA().waitFor({ state: 'detached', ...WAIT });
      await noErrorBox(b, 'blocking');
      await screenshot(b, 'p2p-blocked');
      await logIn(a, credentials('USER_A'));
      await a.page.locator('.contact-box li', { hasText: nameB }).first().click();
      await a.page.locator('#writing-disabled', { hasText: /Messaging disabled/ }).waitFor(WAIT);
      await screenshot(a, 'blocked-by-peer');

      // B finds A under Settings → Security → "Blocked contacts (1)" and
      // unblocks her there; the chat is back in B's list, and A, signing
      // in again, writes to B, who gets it.
      await b.page.locator('#side-caption-panel a', { has: b.page.locator('i.material-icons', { hasText: /^settings$/ }) }).click();
      await b.page.locator('a.flat-button', { hasText: /Security/ }).first().click();
      await b.page.getByText(/Blocked contacts \(1\)/).click();
      const blocked = b.page.locator('.contact-box li', { hasText: nameA }).first();
      await blocked.waitFor(WAIT);
      await screenshot(b, 'blocked-contacts');
      await chatMenu(b, blocked, /^Unblock$/);
      await blocked.waitFor({ state: 'detached', ...WAIT });
      await noErrorBox(b, 'unblocking');
      await logIn(b, credentials('USER_B'));
      await bsChatWithA().waitFor(WAIT);
      await logIn(a, credentials('USER_A'));
      await a.page.locator('.contact-box li', { hasText: nameB }).first().click();
      const unblocked = `unblocked ${Date.now()}`;
      await a.page.locator('#send-message-input').fill(unblocked);
      await a.page.locator('#send-message-input').press('Enter');
      await bsChatWithA().click();
      await message(b, unblocked).waitFor(WAIT);
      await screenshot(b, 'after-unblock');

      // B archives the chat (menu → Archive): it leaves the main list for
      // "Archived", still after B signs in again; Restore brings it back.
      await chatMenu(b, bsChatWithA(), /^Archive$/);
      await bsChatWithA().waitFor({ state: 'detached', ...WAIT });
      await noErrorBox(b, 'archiving');
      await logIn(b, credentials('USER_B'));
      const archived = b.page.locator('.contact-box li', { hasText: /Archived/ }).first();
      await archived.waitFor(WAIT);
      if (await bsChatWithA().count()) throw new Error('an archived chat is in the main list after signing in again');
      await archived.click();
      await bsChatWithA().waitFor(WAIT);
      await screenshot(b, 'archived');
      await chatMenu(b, bsChatWithA(), /^Restore$/);
      // Answered: it leaves the archived chats.
      await bsChatWithA().waitFor({ state: 'detached', ...WAIT });
      await noErrorBox(b, 'restoring');
      await logIn(b, credentials('USER_B'));
      await bsChatWithA().waitFor(WAIT);
      await screenshot(b, 'restored');

      // B deletes the chat (menu → Delete → confirm): it leaves B's list,
      // also after signing in again, while A keeps her messages; A's next
      // message brings it back to B, without what was deleted.
      const before = `before the delete ${Date.now()}`;
      await a.page.locator('#send-message-input').fill(before);
      await a.page.locator('#send-message-input').press('Enter');
      await message(a, before).waitFor(WAIT);
      await chatMenu(b, bsChatWithA(), /^Delete$/);
      await confirm(b);
      await bsChatWithA().waitFor({ state: 'detached', ...WAIT });
      await noErrorBox(b, 'deleting a chat');
      await screenshot(b, 'p2p-deleted');
      await logIn(a, credentials('USER_A'));
      await logIn(b, credentials('USER_B'));
      await b.page.locator('.contact-box li', { hasText: GROUP_NAME }).first().waitFor(WAIT);
      if (await bsChatWithA().count()) throw new Error('a deleted chat is listed again after signing in');
      await a.page.locator('.contact-box li', { hasText: nameB }).first().click();
      await message(a, before).waitFor(WAIT);
      const after = `after the delete ${Date.now()}`;
      await a.page.locator('#send-message-input').fill(after);
      await a.page.locator('#send-message-input').press('Enter');
      await bsChatWithA().waitFor(WAIT);
      await bsChatWithA().click();
      await message(b, after).waitFor(WAIT);
      if (await message(b, before).count()) throw new Error('a deleted message is shown again');
      await screenshot(b, 'p2p-back-after-delete');
    }

    if (CHAT_LIST) {
      // A makes a group in the app: new chat → "new group" → its name →
      // Create; it opens, named, and is in A's chat list.
      const picnic = `Picnic ${Date.now() % 100000}`;
      await a.page.locator('#side-caption-panel a', { has: a.page.locator('i.material-icons', { hasText: /^chat$/ }) }).click();
      await a.page.getByText('new group', { exact: true }).click();
      await a.page.locator('#new-topic-fn').fill(picnic);
      await a.page.locator('button.primary', { hasText: 'Create' }).click();
      await a.page.locator('#topic-caption-panel', { hasText: picnic }).waitFor(WAIT);
      await noErrorBox(a, 'creating a group');
      await a.page.locator('.contact-box li', { hasText: picnic }).first().waitFor(WAIT);
      await screenshot(a, 'group-created');

      // A writes there; after a reload (and signing in again) the group is
      // still in A's list under its name, with the message.
      const first = `first in ${picnic}`;
      await a.page.locator('#send-message-input').fill(first);
      await a.page.locator('#send-message-input').press('Enter');
      await message(a, first).waitFor(WAIT);
      await logIn(a, credentials('USER_A'));
      const again = a.page.locator('.contact-box li', { hasText: picnic }).first();
      await again.waitFor(WAIT);
      await again.click();
      await message(a, first).waitFor(WAIT);
      await screenshot(a, 'group-after-reload');

      // A adds B from the group's Info → Add members: the group appears
      // in B's list (no sign-in again) and B reads it. Then A removes him
      // (his entry's menu → Remove): it leaves his list.
      const nameB = process.env.NAME_B;
      await a.page.locator('#topic-caption-panel a', { has: a.page.locator('i.material-icons', { hasText: /^more_vert$/ }) }).click();
      await a.page.locator('.menu li', { hasText: /^Info$/ }).click();
      await a.page.locator('#info-view a.flat-button', { hasText: /Add members/i }).click();
      await a.page.locator('#group-manager .contact-box li', { hasText: nameB }).first().click();
      await screenshot(a, 'adding-member');
      await a.page.locator('#group-manager button.primary').click();
      await noErrorBox(a, 'adding a member');
      const picnicAtB = b.page.locator('.contact-box li', { hasText: picnic }).first();
      await picnicAtB.waitFor(WAIT);
      await screenshot(b, 'added-to-group');
      await picnicAtB.click();
      await message(b, first).waitFor(WAIT);
      await noErrorBox(b, 'opening a group he was added to');
      await screenshot(b, 'reads-added-group');
      await a.page.locator('#topic-caption-panel a', { has: a.page.locator('i.material-icons', { hasText: /^more_vert$/ }) }).click();
      await a.page.locator('.menu li', { hasText: /^Info$/ }).click();
      const member = a.page.locator('#info-view .contact-box li', { hasText: nameB }).first();
      await chatMenu(a, member, /^Remove$/);
      await member.waitFor({ state: 'detached', ...WAIT });
      await noErrorBox(a, 'removing a member');
      await screenshot(a, 'member-removed');
      // B is told at once: the group leaves his list.
      await picnicAtB.waitFor({ state: 'detached', ...WAIT });
      await noErrorBox(b, 'being removed from a group');
      await screenshot(b, 'removed-from-group');
      // A changes her picture (settings → Edit → avatar → crop → OK): after
      // signing in again B sees it, kept by the server as a data: URI.
      const png = Buffer.from(
        'iVBORw0KGgoAAAANSUhEUgAAAEAAAABACAIAAAAlC+aJAAAAeklEQVR4nO3PUQkAIBTAwJfEYCY2liH8OITBAtzmrP11wwUNaEEDWtCAFjSgBQ1oQQNa0IAWNKAFDWhBA1rQgBY0oAUNaEEDWtCAFjSgBQ1oQQNa0IAWNKAFDWhBA1rQgBY0oAUNaEEDWtCAFjSgBQ1oQQNa0IAWPHYBV80BLRkIBEcAAAAASUVORK5CYII=',
        'base64');
      await a.page.locator('#side-caption-panel a', { has: a.page.locator('i.material-icons', { hasText: /^settings$/ }) }).click();
      await a.page.locator('#sidepanel a', { hasText: /edit/i }).first().click();
      await a.page.locator('input[type=file][id^="file-input-avatar"]').first().setInputFiles({ name: 'me.png', mimeType: 'image/png', buffer: png });
      await a.page.locator('.cropper').waitFor(WAIT);
      await screenshot(a, 'avatar-crop');
      await a.page.locator('button.primary', { hasText: /^OK$/ }).click();
      await noErrorBox(a, 'changing the avatar');
      await screenshot(a, 'avatar-set');
      await logIn(b, credentials('USER_B'));
      await b.page.waitForFunction((old) => [...document.querySelectorAll('img')]
        .some((i) => (i.getAttribute('src') || '').startsWith('data:image/') && i.getAttribute('src') !== old),
      process.env.PHOTO_A, { polling: 500, ...WAIT });
      await screenshot(b, 'new-avatar-seen');

      // Adding members from the app (Info → Add members) works against the
      // server (tests/node/tinode_groups.js), but the app throws on the
      // added user's side when `{pres me acs}` names a topic its SDK has
      // not cached yet (issue 40, open): not clicked here until it is
      // answered in a shape the app takes.
    }

    if (CHAT_LIST && process.env.USER_D) {
      // Dave, added by the operator, changes his password in the app
      // (Settings → Security → Password): the app is signed out, the old
      // password is refused at the login form and the new one lets him in.
      const d = await person(browser, 'd');
      people.push(d);
      const creds = credentials('USER_D');
      await logIn(d, creds);
      const fresh = `${creds.password} renewed`;
      await d.page.locator('#side-caption-panel a', { has: d.page.locator('i.material-icons', { hasText: /^settings$/ }) }).click();
      await d.page.locator('a.flat-button', { hasText: /Security/ }).first().click();
      // The password's in-place editor, under its label (shown as dots).
      await d.page.locator('#sidepanel .in-place-edit').first().click();
      const field = d.page.locator('#sidepanel input[type=password]').first();
      await field.fill(fresh);
      await field.press('Enter');
      await d.page.waitForFunction(() => true);
      const deadline = Date.now() + 10000;
      const answered = () => [...d.requests.values()].some((r) => r.kind === 'acc' && r.answeredAt);
      while (!answered() && Date.now() < deadline) await d.page.waitForTimeout(100);
      if (!answered()) throw new Error('the password change was not answered');
      if (!d.log.some((l) => l.startsWith('< {"ctrl":{"code":200') && l.includes('"text":"ok"') && !l.includes('"topic"'))) {
        throw new Error('the password change was not accepted');
      }
      await screenshot(d, 'password-changed');
      await d.page.goto(BASE + '/', { waitUntil: 'load' });
      await d.page.locator('#inputLogin').waitFor(WAIT);
      await d.page.locator('#inputLogin').fill(creds.login);
      await d.page.locator('#login-form input[type=password]').fill(creds.password);
      await d.page.locator('#login-form button[type=submit]').click();
      await d.page.locator('.info-box.error').waitFor(WAIT);
      await screenshot(d, 'old-password-refused');
      await logIn(d, { login: creds.login, password: fresh });
      await screenshot(d, 'new-password-in');
    }

    // Every request got its answer within 5 s: wait until each is
    // answered or 5 s old, then judge.
    for (const who of people) {
      await who.page.waitForFunction(() => true);
      const deadline = Date.now() + ANSWER_MS + 1000;
      while (Date.now() < deadline && [...who.requests.values()].some((r) => !r.answeredAt && Date.now() - r.sentAt < ANSWER_MS)) {
        await who.page.waitForTimeout(100);
      }
      for (const [id, r] of who.requests) {
        if (!r.answeredAt || r.answeredAt - r.sentAt > ANSWER_MS) {
          problems.push(`${who.label}: {${r.kind} id=${id}} not answered within 5 s: ${r.frame}`);
        }
      }
      for (const e of who.errors) problems.push(`${who.label}: console error: ${e}`);
      for (const u of who.offsite) problems.push(`${who.label}: request off the page's origin: ${u}`);
      console.log(`${who.label}: ${who.requests.size} requests with an id, all checked`);
    }
  }
}

main().catch((e) => {
  console.log('FAILED ' + (e && e.stack || e));
  for (const who of everyone) {
    console.log(`--- ${who.label}: last WebSocket frames`);
    for (const l of who.log.slice(-40)) console.log(l);
    for (const err of who.errors) console.log(`console error: ${err}`);
  }
  for (const p of problems) console.log('PROBLEM ' + p);
  process.exit(1);
});
