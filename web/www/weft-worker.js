// weft-worker.js — the Web Worker (ES module worker) that hosts the weft WebAssembly engine.
//
// Started by weft.js as `new Worker(new URL('./weft-worker.js', import.meta.url), {type: 'module'})`,
// so the page never freezes while the model downloads, uploads to the GPU or generates.
// It loads ./pkg/weft_web.js (wasm-bindgen output, `--target web`) lazily, fetches the model
// (Cache API first, cache name 'weft-models-v1', keyed by the absolute model URL), builds a
// WebEngine and relays requests and their streamed events.
//
// Messages in (from weft.js):
//   {type: 'load', modelUrl?, file?, options?}   modelUrl is absolute; file is a File/Blob
//   {type: 'create', rid, kind: 'chat'|'completion', body: JSON string}
//   {type: 'abort', rid}
//   {type: 'dispose'}
// Messages out (to weft.js):
//   {type: 'progress', stage: 'download'|'cache'|'read'|'upload', loaded, total}
//   {type: 'warning', message}
//   {type: 'ready', adapter, model, fromCache, cached, bytes, name}
//   {type: 'error', message}                      loading failed
//   {type: 'accepted', rid}                       create() did not throw
//   {type: 'rejected', rid, error: {message, type, param, code}}
//   {type: 'event', rid, data}                    data is JSON text or the string "[DONE]"
//   {type: 'fatal', message}                      an uncaught error after loading
//   {type: 'disposed'}

import { webgpuStatus } from './weft.js';

const CACHE_NAME = 'weft-models-v1';

let engine = null;
let loading = false;

function post(msg) {
  self.postMessage(msg);
}

/** Human text of anything thrown (Error, string, wasm-bindgen JsValue). */
function messageOf(e) {
  if (e == null) return 'unknown error';
  if (typeof e === 'string') return e;
  if (typeof e.message === 'string' && e.message) return e.message;
  try {
    return String(e);
  } catch {
    return 'unknown error';
  }
}

/** Turns what the wasm side returns (object, Map from serde_wasm_bindgen, or JSON text) into plain data. */
function plain(v) {
  if (typeof v === 'string') {
    try {
      return JSON.parse(v);
    } catch {
      return v;
    }
  }
  if (v instanceof Map) {
    const o = {};
    for (const [k, x] of v) o[k] = plain(x);
    return o;
  }
  if (Array.isArray(v)) return v.map(plain);
  if (v && typeof v === 'object') {
    const o = {};
    for (const k of Object.keys(v)) o[k] = plain(v[k]);
    return o;
  }
  return typeof v === 'bigint' ? Number(v) : v;
}

/** Calls fn at most every `ms` milliseconds, always passing the last `force`d call through. */
function throttled(fn, ms = 100) {
  let last = 0;
  return (force, ...args) => {
    const now = performance.now();
    if (force || now - last >= ms) {
      last = now;
      fn(...args);
    }
  };
}

/**
 * Reads a ReadableStream of bytes chunk by chunk into `wasm`'s ModelBytes (WebAssembly memory),
 * reporting progress; the page never holds the whole model itself.
 */
async function readInto(wasm, stream, total, report) {
  const reader = stream.getReader();
  const model = new wasm.ModelBytes(total > 0 ? total : 0);
  let loaded = 0;
  report(true, 0, total);
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      model.push(value);
      loaded += value.byteLength;
      report(false, loaded, Math.max(total, loaded));
    }
  } catch (e) {
    model.free();
    reader.cancel().catch(() => {});
    throw e;
  }
  report(true, loaded, loaded);
  return model;
}

async function openCache() {
  if (typeof caches === 'undefined') return { cache: null, why: 'the Cache API is not available here (it needs a secure context: https or localhost)' };
  try {
    return { cache: await caches.open(CACHE_NAME), why: '' };
  } catch (e) {
    return { cache: null, why: `the browser refused storage (${e?.name || 'error'}: ${messageOf(e)})` };
  }
}

function storageWarning(e, bytes) {
  const mb = (bytes / 1e6).toFixed(1);
  const tail = 'The model works now, but it will download again on the next visit.';
  if (e && e.name === 'QuotaExceededError') {
    return `Model not cached: browser storage is full (the model needs ${mb} MB; free some space for this site or allow more storage). ${tail}`;
  }
  if (e && (e.name === 'SecurityError' || e.name === 'NotAllowedError')) {
    return `Model not cached: the browser refused storage for this page (private window, blocked site data or an insecure context). ${tail}`;
  }
  return `Model not cached: ${typeof e === 'string' ? e : messageOf(e)}. ${tail}`;
}

async function fetchModel(wasm, url) {
  const { cache, why } = await openCache();
  if (cache) {
    try {
      const hit = await cache.match(url);
      if (hit && hit.ok && hit.body) {
        const total = Number(hit.headers.get('content-length')) || 0;
        const model = await readInto(wasm, hit.body, total, throttled((loaded, t) =>
          post({ type: 'progress', stage: 'cache', loaded, total: t })));
        if (model.length > 0) return { model, fromCache: true, cached: true };
        model.free();
      }
    } catch (e) {
      // A broken cache entry: drop it and download again.
      try { await cache.delete(url); } catch { /* ignore */ }
    }
  }

  let resp;
  try {
    resp = await fetch(url);
  } catch (e) {
    throw new Error(`Could not download the model from ${url}: ${messageOf(e)} (network error, blocked by CORS, or the page is offline).`);
  }
  if (!resp.ok || !resp.body) {
    throw new Error(`Could not download the model from ${url}: HTTP ${resp.status} ${resp.statusText || ''}`.trim());
  }
  const total = Number(resp.headers.get('content-length')) || 0;
  // One branch of the body goes into WebAssembly memory, the other into the cache as it arrives.
  const [forEngine, forCache] = resp.body.tee();
  let caching;
  if (cache) {
    const headers = { 'content-type': 'application/octet-stream' };
    if (total > 0) headers['content-length'] = String(total);
    caching = cache.put(url, new Response(forCache, { headers })).then(() => null, (e) => e);
  } else {
    forCache.cancel().catch(() => {});
    caching = Promise.resolve(why);
  }
  const model = await readInto(wasm, forEngine, total, throttled((loaded, t) =>
    post({ type: 'progress', stage: 'download', loaded, total: t })));
  const failure = await caching;
  if (failure) {
    if (cache) { try { await cache.delete(url); } catch { /* ignore */ } }
    post({ type: 'warning', message: storageWarning(failure, model.length) });
  }
  return { model, fromCache: false, cached: !failure };
}

async function readFile(wasm, file) {
  return readInto(wasm, file.stream(), file.size || 0, throttled((loaded, t) =>
    post({ type: 'progress', stage: 'read', loaded, total: t })));
}

async function load({ modelUrl, file, options }) {
  if (engine || loading) throw new Error('This worker already has a model; create a new engine to load another.');
  loading = true;
  try {
    if (!self.navigator || !self.navigator.gpu) {
      throw new Error('WebGPU is not available in this browser (navigator.gpu is missing in the worker). ' +
        'Use a browser with WebGPU: Chrome or Edge 113+ on desktop, Chromium with --enable-unsafe-webgpu on Linux, ' +
        'Safari 26, or Firefox 141+ on Windows, and open the page over https or localhost.');
    }

    let wasm;
    try {
      wasm = await import('./pkg/weft_web.js');
      await wasm.default();
    } catch (e) {
      throw new Error(`Could not load the weft WebAssembly module (pkg/weft_web.js, pkg/weft_web_bg.wasm): ${messageOf(e)}`);
    }

    let src;
    let name;
    if (file) {
      name = file.name || 'model.gguf';
      src = { model: await readFile(wasm, file), fromCache: false, cached: false };
    } else if (modelUrl) {
      name = decodeURIComponent(new URL(modelUrl).pathname.split('/').pop() || 'model.gguf');
      src = await fetchModel(wasm, modelUrl);
    } else {
      throw new Error('No model given: pass a model URL or a .gguf file.');
    }

    const upload = throttled((done, total) =>
      post({ type: 'progress', stage: 'upload', loaded: Number(done), total: Number(total) }));
    const bytes = src.model.length;
    upload(true, 0, bytes);
    // load() takes the ModelBytes over (and frees it).
    const eng = await wasm.WebEngine.load(src.model, name, options ?? undefined,
      (stage, done, total) => upload(Number(done) >= Number(total), done, total));
    engine = eng;
    post({
      type: 'ready',
      adapter: describeAdapter(plain(eng.adapterInfo()), (await webgpuStatus()).adapter),
      model: plain(eng.modelInfo()),
      fromCache: src.fromCache,
      cached: src.cached,
      bytes,
      name,
    });
  } finally {
    loading = false;
  }
}

function errorFields(e) {
  return {
    message: messageOf(e),
    type: e?.type ?? 'invalid_request_error',
    param: e?.param ?? null,
    code: e?.code ?? null,
  };
}

function create({ rid, kind, body }) {
  if (!engine) {
    post({ type: 'rejected', rid, error: { message: 'The model is not loaded yet.', type: 'invalid_request_error', param: null, code: 'model_not_loaded' } });
    return;
  }
  const json = typeof body === 'string' ? body : JSON.stringify(body);
  try {
    engine.create(kind, json, rid, (data) => post({ type: 'event', rid, data: String(data) }));
  } catch (e) {
    post({ type: 'rejected', rid, error: errorFields(e) });
    return;
  }
  post({ type: 'accepted', rid });
}

self.addEventListener('message', async (ev) => {
  const msg = ev.data || {};
  switch (msg.type) {
    case 'load':
      try {
        await load(msg);
      } catch (e) {
        post({ type: 'error', message: messageOf(e) });
      }
      break;
    case 'create':
      create(msg);
      break;
    case 'abort':
      try {
        if (engine) engine.abort(msg.rid);
      } catch { /* already finished */ }
      break;
    case 'dispose':
      try {
        if (engine) engine.dispose();
      } catch { /* ignore */ }
      engine = null;
      post({ type: 'disposed' });
      self.close();
      break;
    default:
      break;
  }
});

// A wasm panic (or any other uncaught error) may leave requests without their "[DONE]":
// tell weft.js so it can end them, or fail the load that is in progress.
function uncaught(message) {
  if (engine) post({ type: 'fatal', message });
  else if (loading) post({ type: 'error', message });
}
self.addEventListener('error', (ev) => uncaught(ev?.message || 'uncaught error in the weft worker'));
self.addEventListener('unhandledrejection', (ev) => uncaught(messageOf(ev?.reason)));

// wgpu's adapter info, with what WebGPU itself reports (webgpuStatus) filled in where wgpu has
// nothing: in a browser it knows no vendor or description, and lists only the features weft
// requested. `offered` keeps WebGPU's view, for the features the engine does not use.
function describeAdapter(info, offered) {
  const o = offered || {};
  return {
    ...info,
    name: info.name || o.name || 'WebGPU adapter',
    vendor: info.vendor || o.vendor || '',
    architecture: o.architecture || '',
    description: o.description || '',
    offered,
  };
}
