// weft-worker.js — the Web Worker (ES module worker) that hosts weft's engine for one page.
//
// Started by weft.js's createEngine as
// `new Worker(new URL('./weft-worker.js', import.meta.url), {type: 'module'})`, so the page
// never freezes while the model downloads, uploads to the GPU or generates. One connection:
// the worker's own messages, in engine-host.js's protocol; it closes once that is disposed.

import { connect } from './engine-host.js';

const { handle } = connect((msg) => {
  self.postMessage(msg);
  if (msg.type === 'disposed') self.close();
});
self.addEventListener('message', (ev) => handle(ev.data));
