// engine-host.js — the weft WebAssembly engine, hosted for the pages that talk to it: loaded
// once, shared by every connection. weft-worker.js (a Web Worker: one page, one connection) and
// weft-service-worker.js (a Service Worker: every tab of the origin that connects) run it.
//
// It starts ./pkg/weft_web.js (wasm-bindgen output, `--target web`) on the first load, fetches the model
// (from the browser's stores first, model-cache.js, keyed by the absolute model URL; a model
// named hf:OWNER/REPO[:QUANT] is keyed by its sha256, hub.js, and its listing is kept for offline
// loads), builds a WebEngine and relays requests and their streamed events. The model is never
// whole in WebAssembly memory: a download is gathered into a Blob, and loading reads the Blob (or
// the stored file, or the picked one) in slices as each tensor is uploaded (modelFile).
//
// Messages in (from weft.js, on a connection):
//   {type: 'load', modelUrl?, file?, hf?, storage?, options?}
//                                    modelUrl is absolute; file is a File/Blob; hf is
//                                    {name, endpoint?, token?}; storage 'cache-api'|'opfs'|'none'.
//                                    With the model loaded (or loading) already, the same model
//                                    attaches to it and another one is refused.
//   {type: 'create', rid, kind: 'chat'|'completion', body: JSON string}
//   {type: 'abort', rid}              only the connection's own requests
//   {type: 'addLora', lid, name, url?|file?|files?}, {type: 'removeLora', lid, name}
//   {type: 'health', hid}
//   {type: 'dispose'}                 ends the connection's requests; the last one frees the engine
// Messages out (to that connection):
//   {type: 'progress', stage: 'download'|'cache'|'upload', loaded, total}
//                                    'cache': the part of a download an earlier load kept
//   {type: 'warning', message}
//   {type: 'ready', adapter, model, fromCache, cached, bytes, wasmMemoryBytes, name, hub, shared}
//                                    hub: {repo, file, commit, why} for hf:; shared: the model was
//                                    loaded for another connection already
//   {type: 'error', message}                      loading failed
//   {type: 'accepted', rid}                       create() did not throw
//   {type: 'rejected', rid, error: {message, type, param, code}}
//   {type: 'event', rid, data}                    data is JSON text or the string "[DONE]"
//   {type: 'health', hid, report}
//   {type: 'lora', lid, model?, error?}           an adapter added or removed (modelInfo), or why not
//   {type: 'fatal', message}                      an uncaught error after loading
//   {type: 'disposed'}
//
// Invariant: a request's events go to the connection that created it, and only there.

// Imported statically: a Service Worker may not import() (the HTML standard forbids it there).
import * as weftWasm from './pkg/weft_web.js';
import { webgpuStatus } from './webgpu.js';
import { hubBase, listingUrl, parseHfName, resolveHubFile } from './hub.js';
import { cachedListing, keepListing, openStores } from './model-cache.js';

let engine = null;
/** The ready message of the loaded engine, and what identifies its model (modelIdentity). */
let ready = null;
/** The load in progress: {identity, waiters: Set of connections}. */
let loading = null;
/** Every attached connection, and which one created each running request. */
const connections = new Set();
const owners = new Map();

/** Sends a loading message to every connection waiting on the load. */
function post(msg) {
  for (const conn of loading?.waiters ?? []) conn.send(msg);
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

/** Bytes a Gathered holds in JavaScript before it moves them into its Blob. */
const GATHER_BYTES = 16 << 20;

/**
 * A download (or the part of one an earlier load kept) gathered as it arrives into a Blob, which
 * the browser keeps outside WebAssembly memory (on disk when it is large), hashed on the way
 * when `hash` (a wasm Sha256, fed chunk by chunk). Loading then reads the Blob in slices.
 */
class Gathered {
  constructor(wasm, hash) {
    this.blob = new Blob([]);
    this.parts = [];
    this.pending = 0;
    this.length = 0;
    this.hasher = hash ? new wasm.Sha256() : null;
  }

  push(chunk) {
    this.parts.push(chunk);
    this.pending += chunk.byteLength;
    this.length += chunk.byteLength;
    this.hasher?.update(chunk);
    if (this.pending >= GATHER_BYTES) this.#seal();
  }

  #seal() {
    if (this.parts.length === 0) return;
    this.blob = new Blob([this.blob, ...this.parts]);
    this.parts = [];
    this.pending = 0;
  }

  /** The bytes so far, as one Blob. */
  file() {
    this.#seal();
    return this.blob;
  }

  /** The sha256 of the bytes so far, lowercase hex. */
  sha256() {
    return this.hasher.hex();
  }

  free() {
    this.hasher?.free();
    this.hasher = null;
  }
}

/** Reads a ReadableStream of bytes into a new Gathered, reporting progress. */
async function gather(wasm, stream, total, hash, report) {
  const reader = stream.getReader();
  const model = new Gathered(wasm, hash);
  report(true, 0, total);
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      model.push(value);
      report(false, model.length, Math.max(total, model.length));
    }
  } catch (e) {
    model.free();
    reader.cancel().catch(() => {});
    throw e;
  }
  report(true, model.length, model.length);
  return model;
}

/**
 * The wasm ModelFile that loading reads `blob` through, a slice at a time, so the model is never
 * whole in WebAssembly memory. A worker reads slices synchronously (FileReaderSync); a Service
 * Worker has no synchronous reads, so there the file is first read whole into a JavaScript
 * ArrayBuffer (outside WebAssembly memory still, but in the worker's).
 */
async function modelFile(wasm, blob) {
  if (typeof FileReaderSync !== 'undefined') {
    const reader = new FileReaderSync();
    return new wasm.ModelFile(blob.size, (offset, length) =>
      new Uint8Array(reader.readAsArrayBuffer(blob.slice(offset, offset + length))));
  }
  const whole = new Uint8Array(await blob.arrayBuffer());
  return new wasm.ModelFile(whole.byteLength, (offset, length) => whole.subarray(offset, offset + length));
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
  if (e && e.name === 'NoModificationAllowedError') {
    return `Model not cached: another engine of this site is downloading it into the same storage. ${tail}`;
  }
  return `Model not cached: ${typeof e === 'string' ? e : messageOf(e)}. ${tail}`;
}

/** Tries in a row that may end without a byte more before a download gives up. */
const TRIES = 5;

/** Thrown for an answer retrying will not change (not a network failure). */
class Refused extends Error {}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** What identifies a version of the file: a strong ETag, else Last-Modified; null when neither is readable. */
function validatorOf(resp) {
  const etag = resp.headers.get('etag');
  if (etag && !etag.startsWith('W/')) return etag;
  return resp.headers.get('last-modified');
}

/**
 * The bytes of `url` from byte `from`, as events: {start: {size, validator, restart}} for each
 * answer taken (size null when the server gives none), then {chunk}s. A broken connection is
 * asked again from where it stopped (`Range: bytes=N-`), up to TRIES times in a row without
 * progress. The bytes so far belong to the version `validator` names: an answer naming another
 * (the file changed on the server) voids them, and the file is asked for from the start
 * (`restart`). Not If-Range, which is no CORS-safelisted header: a server on another origin
 * would have to allow it. A server that ignores ranges sends all of it, and what is here
 * already is skipped.
 */
async function* resumingBody(url, headers, { from, size, validator }, fail) {
  let done = from;
  let failures = 0;
  let known = size;
  let version = validator;
  let restart = false;
  while (known == null || done < known) {
    const before = done;
    let why;
    try {
      // Not through the HTTP cache: the store keeps the one copy.
      const resp = await fetch(url, { headers: done > 0 ? { ...headers, Range: `bytes=${done}-` } : headers, cache: 'no-store' });
      if (resp.status !== 200 && resp.status !== 206) throw fail(resp.status);
      const now = validatorOf(resp);
      if (done > 0 && version && now && now !== version) {
        resp.body?.cancel().catch(() => {});
        [done, known, version, restart] = [0, size, null, true];
        continue;
      }
      let skip = resp.status === 200 ? done : 0;
      const length = Number(resp.headers.get('content-length'));
      const total = Number(/\/(\d+)$/.exec(resp.headers.get('content-range') ?? '')?.[1]) ||
        (length > 0 ? (resp.status === 206 ? done + length : length) : null);
      if (known != null && total != null && total !== known) {
        throw new Refused(`the server's file has ${total} bytes, not the ${known} ${size != null ? 'listed' : 'it announced before'}`);
      }
      known ??= total;
      version = now ?? version;
      yield { start: { size: known, validator: version, restart } };
      restart = false;
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
          if (known != null && done + chunk.byteLength > known) throw new Refused(`the server sent more than the ${known} bytes it announced`);
          done += chunk.byteLength;
          yield { chunk };
        }
      } finally {
        reader.releaseLock();
      }
      // Without a length, the end of the body is the end of the file.
      if (known == null) return;
      if (done < known) why = 'the connection closed early';
    } catch (e) {
      if (e instanceof Refused) throw e;
      why = messageOf(e);
    }
    if (known != null && done >= known) return;
    failures = done > before ? 1 : failures + 1;
    if (failures >= TRIES) {
      throw new Error(done === 0
        ? `no answer (${why}): a network error, blocked by CORS, or the page is offline`
        : `stopped at ${done} of ${known ?? '?'} bytes (${why})`);
    }
    post({ type: 'warning', message: `The download broke at ${done} of ${known ?? '?'} bytes (${why}); resuming.` });
    await sleep(500 * failures);
  }
}

/**
 * The model kept under `key`: whole from a store that has it, else from `url`, written to the
 * store as it arrives (continuing a partial copy an earlier load left in OPFS). `src`: {url,
 * headers, size (null: the server says), sha256 (null: unchecked), name, hub, fail(status)}.
 */
async function obtain(wasm, stores, key, src) {
  for (const store of stores.read) {
    const hit = await store.read(key).catch(() => null);
    if (!hit || (src.size != null && hit.blob.size !== src.size)) continue;
    if (hit.blob.size > 0 && (hit.size == null || hit.blob.size === hit.size)) return { blob: hit.blob, fromCache: true, cached: true };
    // A broken entry: dropped, then downloaded again.
    await store.remove(key).catch(() => {});
  }

  if (stores.note) post({ type: 'warning', message: `${stores.note}.` });
  const hash = Boolean(src.sha256);
  let model = new Gathered(wasm, hash);
  let writer = null;
  let noStore = stores.why;
  if (stores.write) {
    const takePartial = async (stream, bytes) => {
      const kept = await gather(wasm, stream, src.size ?? bytes, hash, throttled((loaded, t) =>
        post({ type: 'progress', stage: 'cache', loaded, total: t })));
      model.free();
      model = kept;
    };
    try {
      writer = await stores.write.writer(key, { name: src.name, hub: src.hub, size: src.size }, takePartial);
    } catch (e) {
      noStore = e;
      if (model.length > 0) {
        model.free();
        model = new Gathered(wasm, hash);
      }
    }
  }
  const from = model.length;
  if (from > 0) {
    post({ type: 'warning', message: `Resuming the download of ${src.name} at ${from} of ${src.size ?? '?'} bytes, kept from an earlier load that was interrupted.` });
  }
  const report = throttled((loaded, total) => post({ type: 'progress', stage: 'download', loaded, total }));
  try {
    report(true, from, src.size ?? 0);
    let size = src.size;
    let begun = false;
    for await (const { start, chunk } of resumingBody(src.url, src.headers, { from, size: src.size, validator: writer?.validator ?? null }, src.fail)) {
      if (start) {
        size = start.size;
        if (start.restart) {
          post({ type: 'warning', message: `${src.name} changed on the server since the interrupted download; downloading it from the start.` });
          model.free();
          model = new Gathered(wasm, hash);
        }
        // A resumed answer continues what the writer has; only the first or a restart begins it.
        if (!begun || start.restart) await writer?.begin(start);
        begun = true;
        continue;
      }
      model.push(chunk);
      writer?.append(chunk);
      report(false, model.length, Math.max(size ?? 0, model.length));
    }
    report(true, model.length, model.length);
  } catch (e) {
    // A refusal (an HTTP error, a size that disagrees) will not go away: nothing to resume.
    const kept = !writer ? 0 : e instanceof Refused ? (await writer.discard().catch(() => {}), 0) : await writer.keep().catch(() => 0);
    model.free();
    const where = kept > 0 ? `; the ${kept} bytes received are kept, and loading it again resumes from there` : '; load it again to retry';
    throw new Error(`${src.name}: downloading from ${src.url}: ${messageOf(e)}${e instanceof Refused ? '' : where}`);
  }
  if (src.sha256) {
    const got = model.sha256();
    if (got !== src.sha256.toLowerCase()) {
      await writer?.discard();
      model.free();
      throw new Refused(`the downloaded ${src.name} has sha256 ${got}, but the hub lists ${src.sha256}: it was corrupted on the way and is discarded (nothing was cached); load it again to download it anew`);
    }
  }
  model.free();
  const failure = writer ? await writer.finish() : noStore;
  if (failure) post({ type: 'warning', message: storageWarning(failure, model.length) });
  return { blob: model.file(), fromCache: false, cached: !failure };
}

/** A model by URL. */
async function fetchModel(wasm, url, stores) {
  const name = decodeURIComponent(new URL(url).pathname.split('/').pop() || 'model.gguf');
  const fail = (status) => new Refused(`HTTP ${status}${status === 404 ? ': no model at that URL' : ''}`);
  return obtain(wasm, stores, url, { url, headers: {}, size: null, sha256: null, name, hub: null, fail });
}

// ------------------------------------------------------------------------ models by name (hf:)
//
// The hub's model API lists a repository with each file's size and, for LFS files, sha256
// (hub.js says which file a name means); in a browser the resolve URL's own headers are out of
// reach (fetch() follows its redirect). The file is checked against the listed sha256 before a
// store keeps it whole.

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

/** A model named hf:OWNER/REPO[:QUANT]: from a store by its sha256, else downloaded and checked. */
async function fetchHubModel(wasm, { name, endpoint, token }, stores) {
  const { repo } = parseHfName(name);
  const base = hubBase(endpoint);
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  let listing;
  try {
    const resp = await fetch(listingUrl(base, repo), { headers, cache: 'no-cache' });
    if (!resp.ok) throw refusal(name, base, repo, resp.status, 'the repository', !!token);
    const text = await resp.text();
    try {
      listing = JSON.parse(text);
    } catch {
      throw new Refused(`${name}: the hub's listing is not JSON: is ${base} a Hugging Face hub?`);
    }
    if (stores.write) keepListing(base, repo, text);
  } catch (e) {
    if (e instanceof Refused) throw e;
    listing = await cachedListing(base, repo);
    if (!listing) {
      throw new Error(`${name}: cannot reach ${base} (${messageOf(e)}), and the model is not in this browser's cache; check the network (or hfEndpoint) and try again`);
    }
    post({ type: 'warning', message: `${name}: cannot reach ${base} (${messageOf(e)}); using the cached copy.` });
  }
  const found = resolveHubFile(name, base, listing);
  const hub = { repo, file: found.file, commit: found.commit, why: found.why };
  const fail = (status) => refusal(name, base, repo, status, found.file, !!token);
  try {
    const got = await obtain(wasm, stores, found.key, { url: found.url, headers, size: found.size, sha256: found.sha256, name: found.file, hub, fail });
    return { ...got, name: found.file, hub };
  } catch (e) {
    throw new Error(messageOf(e).startsWith(name) ? messageOf(e) : `${name}: ${messageOf(e)}`);
  }
}

/** Loads the model; the ready message. */
async function load({ modelUrl, file, hf, storage, options }) {
  if (!self.navigator || !self.navigator.gpu) {
    throw new Error(`WebGPU is not available to weft's ${self.registration ? 'Service Worker' : 'worker'} in this browser (navigator.gpu is missing there). ` +
      (self.registration ? 'Chrome and Edge offer WebGPU in service workers from version 124; elsewhere use createEngine, which runs the engine in a Web Worker. ' : '') +
      'Use a browser with WebGPU: Chrome or Edge 113+ on desktop, Chromium with --enable-unsafe-webgpu on Linux, ' +
      'Safari 26, or Firefox 141+ on Windows, and open the page over https or localhost.');
  }

  // Before the module loads, so that a misspelled storage fails at once.
  const stores = file ? null : await openStores(storage);
  const wasm = weftWasm;
  try {
    await wasm.default();
  } catch (e) {
    throw new Error(`Could not load the weft WebAssembly module (pkg/weft_web.js, pkg/weft_web_bg.wasm): ${messageOf(e)}`);
  }

  let src;
  let name;
  if (file) {
    name = file.name || 'model.gguf';
    src = { blob: file, fromCache: false, cached: false };
  } else if (hf) {
    src = await fetchHubModel(wasm, hf, stores);
    name = src.name;
  } else if (modelUrl) {
    name = decodeURIComponent(new URL(modelUrl).pathname.split('/').pop() || 'model.gguf');
    src = await fetchModel(wasm, modelUrl, stores);
  } else {
    throw new Error('No model given: pass a model URL or a .gguf file.');
  }

  const upload = throttled((done, total) =>
    post({ type: 'progress', stage: 'upload', loaded: Number(done), total: Number(total) }));
  const model = await modelFile(wasm, src.blob);
  const bytes = model.length;
  upload(true, 0, bytes);
  // load() takes the ModelFile over (and frees it).
  const eng = await wasm.WebEngine.load(model, name, options ?? undefined,
    (stage, done, total) => upload(Number(done) >= Number(total), done, total));
  engine = eng;
  return {
    type: 'ready',
    adapter: describeAdapter(plain(eng.adapterInfo()), (await webgpuStatus()).adapter),
    model: plain(eng.modelInfo()),
    fromCache: src.fromCache,
    cached: src.cached,
    bytes,
    // WebAssembly memory never shrinks: after the load this is the load's peak.
    wasmMemoryBytes: wasm.wasmMemoryBytes(),
    name,
    hub: src.hub ?? null,
  };
}

function errorFields(e) {
  return {
    message: messageOf(e),
    type: e?.type ?? 'invalid_request_error',
    param: e?.param ?? null,
    code: e?.code ?? null,
  };
}

function create(conn, { rid, kind, body }) {
  if (!engine) {
    conn.send({ type: 'rejected', rid, error: { message: 'The model is not loaded yet.', type: 'invalid_request_error', param: null, code: 'model_not_loaded' } });
    return;
  }
  const json = typeof body === 'string' ? body : JSON.stringify(body);
  owners.set(rid, conn);
  try {
    engine.create(kind, json, rid, (data) => {
      const text = String(data);
      if (text === '[DONE]') owners.delete(rid);
      conn.send({ type: 'event', rid, data: text });
    });
  } catch (e) {
    owners.delete(rid);
    conn.send({ type: 'rejected', rid, error: errorFields(e) });
    return;
  }
  conn.send({ type: 'accepted', rid });
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

/** Adds or removes an adapter of the engine (every connection's, in a shared one). */
async function lora(conn, msg) {
  try {
    if (!engine) throw new Error('The model is not loaded yet.');
    if (msg.type === 'addLora') {
      const { config, bytes } = await loraBytes(msg);
      engine.addLora(String(msg.name), config, bytes);
    } else {
      engine.removeLora(String(msg.name));
    }
    conn.send({ type: 'lora', lid: msg.lid, model: engine.modelInfo() });
  } catch (e) {
    conn.send({ type: 'lora', lid: msg.lid, error: messageOf(e) });
  }
}

/** What makes two loads the same model: the same URL, hub name, or picked file. */
function modelIdentity({ modelUrl, file, hf }) {
  if (file) return `file ${file.name} ${file.size} ${file.lastModified ?? ''}`;
  if (hf) return `hf ${hf.endpoint ?? ''} ${hf.name}`;
  return `url ${modelUrl}`;
}

async function attachLoad(conn, msg) {
  const identity = modelIdentity(msg);
  const serving = ready?.identity ?? loading?.identity;
  if (serving && serving !== identity) {
    const what = ready ? `serves ${ready.message.name}` : 'is loading another model';
    conn.send({ type: 'error', message: `This engine ${what}; a shared engine serves one model (dispose of it in every tab that uses it first, or use createEngine for an engine of this page's own).` });
    return;
  }
  if (ready) {
    conn.send({ ...ready.message, shared: true });
    return;
  }
  if (loading) {
    loading.waiters.add(conn);
    return;
  }
  loading = { identity, waiters: new Set([conn]) };
  try {
    const message = await load(msg);
    ready = { identity, message };
    const [first, ...others] = loading.waiters;
    first.send({ ...message, shared: false });
    for (const other of others) other.send({ ...message, shared: true });
  } catch (e) {
    post({ type: 'error', message: messageOf(e) });
  } finally {
    loading = null;
  }
}

/** Ends `conn`'s requests and forgets it; the last connection frees the engine. */
function detach(conn) {
  for (const [rid, owner] of owners) {
    if (owner !== conn) continue;
    owners.delete(rid);
    try { engine?.abort(rid); } catch { /* already finished */ }
  }
  connections.delete(conn);
  loading?.waiters.delete(conn);
  if (connections.size === 0 && engine) {
    try { engine.dispose(); } catch { /* ignore */ }
    engine = null;
    ready = null;
  }
}

/**
 * A new connection; `send(msg)` reaches its page. Returns what to call with each message from
 * it (a promise, settled once the message is handled) and when it is gone.
 */
export function connect(send) {
  const conn = { send };
  connections.add(conn);
  const handle = async (msg = {}) => {
    switch (msg.type) {
      case 'load':
        await attachLoad(conn, msg);
        break;
      case 'create':
        create(conn, msg);
        break;
      case 'addLora':
      case 'removeLora':
        await lora(conn, msg);
        break;
      case 'health':
        if (!engine) {
          send({ type: 'health', hid: msg.hid, report: { healthy: false, detail: 'the model is not loaded' } });
          break;
        }
        try {
          send({ type: 'health', hid: msg.hid, report: await engine.health() });
        } catch (e) {
          send({ type: 'health', hid: msg.hid, report: { healthy: false, detail: messageOf(e) } });
        }
        break;
      case 'abort':
        if (owners.get(msg.rid) !== conn) break;
        try {
          engine?.abort(msg.rid);
        } catch { /* already finished */ }
        break;
      case 'dispose':
        detach(conn);
        send({ type: 'disposed' });
        break;
      default:
        break;
    }
  };
  return { handle, gone: () => detach(conn) };
}

// A wasm panic (or any other uncaught error) may leave requests without their "[DONE]": tell
// the pages so they can end them, or fail the load that is in progress.
function uncaught(message) {
  if (engine) for (const conn of connections) conn.send({ type: 'fatal', message });
  else post({ type: 'error', message });
}
self.addEventListener('error', (ev) => uncaught(ev?.message || 'uncaught error in the weft engine'));
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
