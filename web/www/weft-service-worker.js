// weft-service-worker.js — the Service Worker that hosts one weft engine for every tab of the
// origin: the model stays loaded across reloads, and the tabs' requests share its batches.
//
// Registered by weft.js's createServiceWorkerEngine (`type: 'module'`, with a scope of its own,
// './weft-engine/', that controls no page: the worker only answers messages). Each engine a page
// creates sends {type: 'connect', cid} with a MessagePort; the port then carries engine-host.js's
// protocol. Messages on a port do not keep a Service Worker alive, so each page also sends
// {type: 'ping', cid} to the worker itself every few seconds (a browser stops a worker idle for
// 30 s); the answer {type: 'pong'} or, after the worker was stopped and started again without
// the connection, {type: 'lost'} comes back on the port or, for a lost one, to the page.

import { connect } from './engine-host.js';

/** cid → {port, gone} of each connected engine. */
const ports = new Map();

self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (ev) => ev.waitUntil(self.clients.claim()));

self.addEventListener('message', (ev) => {
  const msg = ev.data || {};
  if (msg.type === 'connect' && ev.ports[0]) {
    const port = ev.ports[0];
    const { handle, gone } = connect((out) => port.postMessage(out));
    ports.set(msg.cid, { port, gone });
    port.onmessage = (inner) => {
      const m = inner.data || {};
      if (m.type === 'dispose') ports.delete(msg.cid);
      handle(m);
    };
    return;
  }
  if (msg.type === 'ping') {
    const known = ports.get(msg.cid);
    if (known) known.port.postMessage({ type: 'pong' });
    else ev.source?.postMessage({ type: 'lost', cid: msg.cid });
    // The page's engines whose tab is gone end their requests (a tab closed without dispose()).
    ev.waitUntil(self.clients.matchAll({ includeUncontrolled: true, type: 'window' }).then((open) => {
      const alive = new Set(open.map((c) => c.id));
      for (const [cid, conn] of ports) {
        if (conn.client && !alive.has(conn.client)) {
          ports.delete(cid);
          conn.gone();
        }
      }
    }));
    if (known && ev.source?.id) known.client = ev.source.id;
  }
});
