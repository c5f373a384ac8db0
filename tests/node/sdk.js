// The tinode-sdk set-up every test client shares (shared/design/
// TINODE-PROTOCOL.md §3: transport 'ws', the ws package as network
// provider, fake-indexeddb's `.indexedDB`), a client whose log (every
// frame in and out) goes to `trace`, and connect().
'use strict';
const { Tinode } = require('tinode-sdk');

Tinode.setNetworkProviders(require('ws'), null);
Tinode.setDatabaseProvider(require('fake-indexeddb').indexedDB);

// Everything the SDK logs, printed on failure only.
const trace = [];

// An exception thrown inside the SDK (a frame it cannot take) is printed
// with its stack and the trace: left to node, it prints the minified
// source line first, which fills the pipe before the message is written.
process.on('uncaughtException', (e) => {
  console.error(`uncaught: ${e && e.stack || e}`);
  console.error(trace.slice(-60).join('\n'));
  process.exit(1);
});

function client(label, host) {
  const t = new Tinode({
    appName: 'imstream-test/1.0',
    host,
    apiKey: 'imstream-test',
    secure: false,
    transport: 'ws',
    persist: false,
  });
  t.logger = (str, ...args) => trace.push(`[${label}] ${str} ${args.join(' ')}`.trimEnd());
  return t;
}

// Connects; the SDK sends {hi} itself and calls onConnect on its ctrl.
function connect(t) {
  return new Promise((resolve, reject) => {
    t.onConnect = resolve;
    t.onDisconnect = (err) => reject(new Error(`disconnected: ${err && err.message}`));
    t.connect().catch(reject);
  });
}

// Whether a request was refused: the SDK rejects most refusals and, for a
// message on a topic the server has just evicted it from, logs a warning
// and resolves without an accepting ctrl.
async function refused(promise) {
  try {
    const ctrl = await promise;
    return !ctrl || ctrl.code >= 400;
  } catch (_) {
    return true;
  }
}

module.exports = { Tinode, trace, client, connect, refused };
