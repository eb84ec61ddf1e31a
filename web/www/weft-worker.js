// weft-worker.js — the Web Worker (ES module worker) that hosts the weft WebAssembly engine.
//
// Started by weft.js as `new Worker(new URL('./weft-worker.js', import.meta.url), {type: 'module'})`,
// so the page never freezes while the model downloads, uploads to the GPU or generates.
// It loads ./pkg/weft_web.js (wasm-bindgen output, `--target web`) lazily, fetches the model
// (Cache API first, cache name 'weft-models-v1', keyed by the absolute model URL; a model named
// hf:OWNER/REPO[:QUANT] is keyed by its sha256, and its listing is kept for offline loads),
// builds a WebEngine and relays requests and their streamed events.
//
// Messages in (from weft.js):
//   {type: 'load', modelUrl?, file?, hf?, options?}   modelUrl is absolute; file is a File/Blob;
//                                                      hf is {name, endpoint?, token?}
//   {type: 'create', rid, kind: 'chat'|'completion', body: JSON string}
//   {type: 'abort', rid}
//   {type: 'dispose'}
// Messages out (to weft.js):
//   {type: 'progress', stage: 'download'|'cache'|'read'|'upload', loaded, total}
//   {type: 'warning', message}
//   {type: 'ready', adapter, model, fromCache, cached, bytes, name, hub}   hub: {repo, file, commit, why} for hf:
//   {type: 'error', message}                      loading failed
//   {type: 'accepted', rid}                       create() did not throw
//   {type: 'rejected', rid, error: {message, type, param, code}}
//   {type: 'event', rid, data}                    data is JSON text or the string "[DONE]"
//   {type: 'fatal', message}                      an uncaught error after loading
//   {type: 'disposed'}

import { webgpuStatus } from './webgpu.js';

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

// ------------------------------------------------------------------------ models by name (hf:)
//
// The Hugging Face hub's model API lists a repository with each file's size and, for LFS files,
// sha256 (`?blobs=true`; in a browser the resolve URL's own headers are out of reach, on a
// redirect fetch() follows); the file comes from its resolve URL, resumed with a Range request
// when the connection breaks, and reaches the cache only once its sha256 is the listed one.

/** Where hf: names resolve unless `hfEndpoint` says otherwise. */
const HF_ENDPOINT = 'https://huggingface.co';
/** Taken when a name gives no quant, as llama.cpp's -hf does. */
const DEFAULT_QUANT = 'Q4_K_M';
/** Tries in a row that may end without a byte more before a download gives up. */
const TRIES = 5;

const HF_FORM = 'expected hf:OWNER/REPO or hf:OWNER/REPO:QUANT (e.g. hf:bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M)';

function parseHfName(name) {
  const rest = name.slice('hf:'.length);
  const colon = rest.indexOf(':');
  const repo = colon < 0 ? rest : rest.slice(0, colon);
  const quant = colon < 0 ? null : rest.slice(colon + 1);
  const part = /^[A-Za-z0-9._-]+$/;
  const [owner, model, extra] = repo.split('/');
  const ok = extra === undefined && [owner, model].every((p) => p && part.test(p) && p !== '.' && p !== '..');
  if (!ok || quant === '') throw new Error(`${name}: not a model name: ${HF_FORM}`);
  return { repo, quant };
}

/** `llama.cpp`'s split parts, `…-00001-of-00003.gguf`: [part, parts], or null. */
function splitPart(file) {
  const m = /-(\d{5})-of-(\d{5})\.gguf$/i.exec(file);
  return m ? [Number(m[1]), Number(m[2])] : null;
}

/**
 * The GGUF files whose names contain `quant` (ignoring case); of several, those where it is a
 * whole tag (Q4_0 matches x.Q4_0.gguf, not x.Q4_0_4_4.gguf) when there are any.
 */
function matching(ggufs, quant) {
  const q = quant.toLowerCase();
  const all = ggufs.filter((f) => f.toLowerCase().includes(q));
  const whole = (f) => {
    const lower = f.toLowerCase();
    for (let at = lower.indexOf(q); at >= 0; at = lower.indexOf(q, at + 1)) {
      const before = lower[at - 1] ?? '';
      const after = lower[at + q.length] ?? '';
      if (!/[a-z0-9]/.test(before) && !/[a-z0-9_]/.test(after)) return true;
    }
    return false;
  };
  const tags = all.filter(whole);
  return all.length > 1 && tags.length > 0 ? tags : all;
}

/** The GGUF file of `files` the name asks for and why that one; throws, listing the choices. */
function pickGguf(name, repo, quant, files) {
  const ggufs = files.filter((f) => /\.gguf$/i.test(f) && !/mmproj/i.test(f)).sort();
  if (ggufs.length === 0) {
    throw new Error(`${name}: ${repo} has no GGUF files (its files: ${files.join(', ')}); weft loads GGUF models by name`);
  }
  let file;
  let why;
  if (quant) {
    const found = matching(ggufs, quant);
    const oneSplit = found.length > 1 && found.every((f) => splitPart(f)) &&
      new Set(found.map((f) => f.replace(/-\d{5}-of-\d{5}\.gguf$/i, ''))).size === 1;
    if (found.length === 0) throw new Error(`${name}: no GGUF files match "${quant}"; the repository's GGUF files: ${ggufs.join(', ')}`);
    if (found.length > 1 && !oneSplit) {
      throw new Error(`${name}: "${quant}" matches several GGUF files: ${found.join(', ')}; name one more exactly (hf:${repo}:NAME, any part of the file name)`);
    }
    [file, why] = [found[0], `the GGUF file matching ${quant}`];
  } else {
    const defaults = matching(ggufs, DEFAULT_QUANT);
    if (defaults.length >= 1) [file, why] = [defaults[0], `${DEFAULT_QUANT}, the default; another with hf:${repo}:QUANT`];
    else if (ggufs.length === 1) [file, why] = [ggufs[0], 'the only GGUF file'];
    else [file, why] = [ggufs[0], `no ${DEFAULT_QUANT} among the GGUF files, so the first; another with hf:${repo}:QUANT, from: ${ggufs.join(', ')}`];
  }
  const split = splitPart(file);
  if (split) {
    throw new Error(`${name}: ${file} is one of ${split[1]} parts of a split GGUF, which weft does not read; join them with llama.cpp's llama-gguf-split --merge and load the joined file`);
  }
  return { file, why };
}

/** Thrown for an answer retrying will not change (not a network failure). */
class Refused extends Error {}

function refusal(name, base, repo, status, what, withToken) {
  const detail = {
    401: withToken
      ? 'no such repository, or the token (hfToken) may not read it'
      : 'no such repository, or it is private: check the name, or pass hfToken, a token that may read it',
    403: `access refused: the repository is gated; accept its terms at ${base}/${repo} and pass hfToken, a token of that account`,
    404: 'not found: check the name',
    429: 'too many requests: wait a minute and try again',
  }[status] ?? 'try again later';
  return new Refused(`${name}: the hub at ${base} answered HTTP ${status} for ${what}: ${detail}`);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * The bytes of `url` from the start, `size` in all, as chunks: when the connection breaks, asked
 * again from where it stopped (`Range: bytes=N-`), up to TRIES times in a row without progress.
 */
async function* resumingBody(url, headers, size, fail) {
  let done = 0;
  let failures = 0;
  while (done < size) {
    const before = done;
    let why;
    try {
      // Not through the HTTP cache: the Cache API keeps the one copy.
      const init = { headers: done > 0 ? { ...headers, Range: `bytes=${done}-` } : headers, cache: 'no-store' };
      const resp = await fetch(url, init);
      if (resp.status !== 200 && resp.status !== 206) throw fail(resp.status);
      // A server that ignores the range sends it all again: skip what is here already.
      let skip = resp.status === 200 ? done : 0;
      const reader = resp.body.getReader();
      try {
        for (;;) {
          const { done: end, value } = await reader.read();
          if (end) break;
          let chunk = value;
          if (skip > 0) {
            const dropped = Math.min(skip, chunk.byteLength);
            chunk = chunk.subarray(dropped);
            skip -= dropped;
            if (chunk.byteLength === 0) continue;
          }
          if (done + chunk.byteLength > size) throw new Refused(`the server sent more than the ${size} bytes the hub lists`);
          done += chunk.byteLength;
          yield chunk;
        }
      } finally {
        reader.releaseLock();
      }
      if (done < size) why = 'the connection closed early';
    } catch (e) {
      if (e instanceof Refused) throw e;
      why = messageOf(e);
    }
    if (done >= size) return;
    failures = done > before ? 1 : failures + 1;
    if (failures >= TRIES) throw new Error(`stopped at ${done} of ${size} bytes (${why}); load it again to retry`);
    post({ type: 'warning', message: `The download broke at ${done} of ${size} bytes (${why}); resuming.` });
    await sleep(500 * failures);
  }
}

/** A model named hf:OWNER/REPO[:QUANT]: from the cache by its sha256, else downloaded and checked. */
async function fetchHubModel(wasm, { name, endpoint, token }) {
  const { repo, quant } = parseHfName(name);
  const base = (endpoint || HF_ENDPOINT).replace(/\/+$/, '');
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const { cache, why: noCache } = await openCache();
  const listingUrl = `${base}/api/models/${repo}/revision/main?blobs=true`;
  let listing;
  try {
    const resp = await fetch(listingUrl, { headers, cache: 'no-cache' });
    if (!resp.ok) throw refusal(name, base, repo, resp.status, 'the repository', !!token);
    const text = await resp.text();
    try {
      listing = JSON.parse(text);
    } catch {
      throw new Refused(`${name}: the hub's listing is not JSON: is ${base} a Hugging Face hub?`);
    }
    if (cache) {
      cache.put(listingUrl, new Response(text, { headers: { 'content-type': 'application/json' } })).catch(() => {});
    }
  } catch (e) {
    if (e instanceof Refused) throw e;
    const kept = cache && await cache.match(listingUrl).catch(() => null);
    if (!kept) {
      throw new Error(`${name}: cannot reach ${base} (${messageOf(e)}), and the model is not in this browser's cache; check the network (or hfEndpoint) and try again`);
    }
    listing = await kept.json();
    post({ type: 'warning', message: `${name}: cannot reach ${base} (${messageOf(e)}); using the cached copy.` });
  }
  const siblings = Array.isArray(listing?.siblings) ? listing.siblings : null;
  if (!siblings || typeof listing.sha !== 'string') {
    throw new Error(`${name}: the hub's listing has no commit or file list: is ${base} a Hugging Face hub?`);
  }
  const { file, why } = pickGguf(name, repo, quant, siblings.map((s) => String(s.rfilename)));
  const entry = siblings.find((s) => s.rfilename === file);
  const sha256 = entry.lfs?.sha256 ?? null;
  const size = Number(entry.lfs?.size ?? entry.size);
  if (!(size > 0)) throw new Error(`${name}: the hub's listing gives no size for ${file}: is ${base} a Hugging Face hub?`);
  const hub = { repo, file, commit: listing.sha, why };
  // Keyed by content, so a new commit that leaves the file alone does not download it again.
  const key = `${base}/${repo}/blobs/${sha256 ?? `${listing.sha}/${file}`}`;

  if (cache) {
    const hit = await cache.match(key).catch(() => null);
    if (hit && hit.ok && hit.body) {
      const model = await readInto(wasm, hit.body, size, throttled((loaded, t) =>
        post({ type: 'progress', stage: 'cache', loaded, total: t })));
      if (model.length === size) return { model, fromCache: true, cached: true, name: file, hub };
      model.free();
      await cache.delete(key).catch(() => {});
    }
  }

  // The cache's copy is written as the bytes arrive, and is kept only if the stream closes,
  // which it does once the sha256 is checked: a corrupted download never becomes an entry.
  let toCache = null;
  let caching = Promise.resolve(noCache);
  if (cache) {
    const body = new ReadableStream({ start(controller) { toCache = controller; } });
    const entryHeaders = { 'content-type': 'application/octet-stream', 'content-length': String(size) };
    caching = cache.put(key, new Response(body, { headers: entryHeaders })).then(() => null, (e) => e);
  }
  const stopCaching = (e) => { try { toCache?.error(e); } catch { /* already closed */ } toCache = null; };

  const url = `${base}/${repo}/resolve/${listing.sha}/${file.split('/').map(encodeURIComponent).join('/')}`;
  const fail = (status) => refusal(name, base, repo, status, file, !!token);
  const model = new wasm.ModelBytes(size);
  const report = throttled((loaded, total) => post({ type: 'progress', stage: 'download', loaded, total }));
  report(true, 0, size);
  try {
    for await (const chunk of resumingBody(url, headers, size, fail)) {
      model.push(chunk);
      try { toCache?.enqueue(chunk); } catch { toCache = null; }
      report(false, model.length, size);
    }
  } catch (e) {
    stopCaching(e);
    model.free();
    throw new Error(e.message.startsWith(name) ? e.message : `${name}: downloading ${file}: ${messageOf(e)}`);
  }
  report(true, size, size);
  const got = sha256 ? model.sha256() : null;
  if (sha256 && got !== sha256.toLowerCase()) {
    stopCaching(new Error('corrupted'));
    await caching;
    model.free();
    throw new Error(`${name}: the downloaded ${file} has sha256 ${got}, but the hub lists ${sha256}: it was corrupted on the way and is discarded (nothing was cached); load it again to download it anew`);
  }
  try { toCache?.close(); } catch { /* the cache gave up already */ }
  const failure = await caching;
  if (failure) {
    if (cache) await cache.delete(key).catch(() => {});
    post({ type: 'warning', message: storageWarning(failure, size) });
  }
  return { model, fromCache: false, cached: !failure, name: file, hub };
}

async function readFile(wasm, file) {
  return readInto(wasm, file.stream(), file.size || 0, throttled((loaded, t) =>
    post({ type: 'progress', stage: 'read', loaded, total: t })));
}

async function load({ modelUrl, file, hf, options }) {
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
    } else if (hf) {
      src = await fetchHubModel(wasm, hf);
      name = src.name;
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
      hub: src.hub ?? null,
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

// A LoRA adapter's bytes: a GGUF file (one file, no config) or a PEFT adapter's config text
// and safetensors bytes.
async function loraBytes({ url, file, files }) {
  const bytes = async (blob) => new Uint8Array(await blob.arrayBuffer());
  const fetched = async (u) => {
    const r = await fetch(u);
    if (!r.ok) throw new Error(`fetching ${u} failed: HTTP ${r.status}`);
    return r;
  };
  if (file) return { config: undefined, bytes: await bytes(file) };
  if (files) return { config: await files.config.text(), bytes: await bytes(files.safetensors) };
  if (!url) throw new Error('loadLora needs a url, a file or files');
  if (/\.gguf$/i.test(url)) return { config: undefined, bytes: await bytes(await fetched(url)) };
  const dir = url.replace(/\/+$/, '');
  const config = await (await fetched(`${dir}/adapter_config.json`)).text();
  return { config, bytes: await bytes(await fetched(`${dir}/adapter_model.safetensors`)) };
}

async function lora(msg) {
  try {
    if (!engine) throw new Error('The model is not loaded yet.');
    if (msg.type === 'addLora') {
      const { config, bytes } = await loraBytes(msg);
      engine.addLora(String(msg.name), config, bytes);
    } else {
      engine.removeLora(String(msg.name));
    }
    post({ type: 'lora', lid: msg.lid, model: engine.modelInfo() });
  } catch (e) {
    post({ type: 'lora', lid: msg.lid, error: messageOf(e) });
  }
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
    case 'addLora':
    case 'removeLora':
      await lora(msg);
      break;
    case 'health':
      if (!engine) {
        post({ type: 'health', hid: msg.hid, report: { healthy: false, detail: 'the model is not loaded' } });
        break;
      }
      try {
        post({ type: 'health', hid: msg.hid, report: await engine.health() });
      } catch (e) {
        post({ type: 'health', hid: msg.hid, report: { healthy: false, detail: messageOf(e) } });
      }
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
