/**
 * weft.js — the public ES module of weft in the browser: batched LLM inference on WebGPU,
 * with an OpenAI-like API. The engine (Rust compiled to WebAssembly) runs in a Web Worker
 * (weft-worker.js, next to this file), so the page never freezes. The npm package weft-llm has
 * this module as its entry (`import { createEngine } from 'weft-llm'`) and TypeScript types for
 * this API in its index.d.ts (web/npm/); a change here belongs there too.
 *
 * @example
 *   import { createEngine, webgpuStatus } from './weft.js';
 *
 *   const gpu = await webgpuStatus();              // {available, reason}
 *   if (!gpu.available) throw new Error(gpu.reason);
 *
 *   const engine = await createEngine({
 *     modelUrl: 'models/SmolLM2-135M-Instruct.Q4_1.gguf',   // or modelFile: aFile
 *     onProgress: ({ stage, loaded, total, fraction }) => console.log(stage, fraction),
 *   });
 *
 *   // Streaming: an async iterator of OpenAI chat.completion.chunk objects.
 *   const stream = await engine.chat.completions.create({
 *     messages: [{ role: 'user', content: 'Write a haiku about the ocean.' }],
 *     max_tokens: 64, temperature: 0.7, seed: 1, stream: true,
 *     stream_options: { include_usage: true },
 *   });
 *   for await (const chunk of stream) console.log(chunk.choices[0]?.delta?.content ?? '');
 *
 *   // Not streaming: the full chat.completion object.
 *   const res = await engine.completions.create({ prompt: 'Once upon a time', max_tokens: 32 });
 *   console.log(res.choices[0].text, res.usage);
 *
 * API
 *
 * `createEngine({ model, modelUrl, modelFile, hfEndpoint, hfToken, storage, onProgress, onWarning, options, workerUrl } = {})`
 *   → Promise<WeftEngine>
 *   - modelUrl: URL of a .gguf (relative URLs resolve against the page). Default: the model served
 *     next to this file, `models/SmolLM2-135M-Instruct.Q4_1.gguf`. Downloaded models are kept
 *     in the browser (`storage`), so a second visit does not download again; a download cut off
 *     resumes where it stopped (a Range request; when the answer's ETag or Last-Modified says
 *     the file changed on the server, it starts over).
 *   - storage: where a downloaded model is kept: 'cache-api' (the default; the Cache API, cache
 *     'weft-models-v1', which keeps only whole files), 'opfs' (the origin private file system,
 *     written as the bytes arrive: a download that a closed tab or a dead network interrupted
 *     resumes on the next load) or 'none'. A model kept by either store loads from it.
 *   - model: 'hf:OWNER/REPO[:QUANT]', a GGUF file of a Hugging Face hub repository: the one whose
 *     name contains QUANT (ignoring case), without QUANT its Q4_K_M file, or else its first
 *     (`engine.hub` says which and why); a quant that matches none or several rejects, listing
 *     the repository's GGUF files. The download resumes where a broken connection left it, is
 *     checked against the sha256 the hub lists (a mismatch rejects and caches nothing), and is
 *     kept in the Cache API by its sha256; the hub's listing is kept too, so the model loads
 *     offline. Any other string is taken as modelUrl (and a modelUrl starting hf: as a name).
 *   - hfEndpoint: the hub to ask for hf: names (a mirror; default the Hugging Face hub);
 *     hfToken: a token sent to it (not to its storage) for private or gated repositories.
 *   - modelFile: a File/Blob of a .gguf (e.g. from <input type=file>); takes precedence over model
 *     and modelUrl.
 *   - onProgress({stage, loaded, total, fraction}): stage is 'download', 'cache' (the part of an
 *     interrupted download an earlier load kept) or 'upload' (read from the file, the browser's
 *     store or the download, a tensor at a time, to the GPU); loaded/total in bytes for the first
 *     two, in the engine's own units for 'upload'; total may be 0 (unknown) and then fraction is
 *     null.
 *   - onWarning(message): non-fatal problems, e.g. the model could not be cached because storage is
 *     full or refused (default: console.warn). They are also kept in `engine.warnings`.
 *   - options: engine options {gpuMemoryUtilization, kvMemoryMiB, maxNumSeqs, maxModelLen,
 *     maxNumBatchedTokens, specNgram, specTokens, kernels, kvCacheDtype} (all optional). The KV
 *     cache gets gpuMemoryUtilization (default 0.9, vLLM's meaning) of the largest buffer the
 *     device allows (a browser reports no memory size) less the weights, holding at most
 *     maxNumSeqs (16) sequences of maxModelLen (2048) tokens; on a CPU adapter (SwiftShader)
 *     256 MiB; kvMemoryMiB sets it instead. modelInfo().kvTokens says how many tokens it holds;
 *     a cache that cannot hold one sequence of maxModelLen fails the load, saying what fits.
 *     kernels forces a kernel family ('baseline',
 *     'cpu' or 'subgroup') instead of the one weft picks for the adapter (adapterInfo().kernels
 *     says which). kvCacheDtype 'f16' holds the KV cache in halves: twice the tokens, logits
 *     moved by about 1e-3; 'f32' the reference's values (default: 'f16' where the adapter has
 *     shader-f16, else 'f32'). specNgram: true turns on
 *     speculative decoding by prompt lookup
 *     (drafts are the tokens that followed an earlier occurrence of the last few tokens; outputs
 *     are unchanged, faster when the reply copies the prompt); specTokens (default 4) is the most
 *     tokens drafted per request and step. modelInfo().speculation then describes it.
 *   - workerUrl: where weft-worker.js lives (default: next to this module).
 *   Rejects with an Error whose message says what went wrong (no WebGPU, not a usable model,
 *   download failed, …).
 *
 * WeftEngine
 *   - `chat.completions.create(params)` / `completions.create(params)`: OpenAI request bodies
 *     (`messages` / `prompt` (a string or token ids), max_tokens or max_completion_tokens,
 *     temperature, top_p, seed, stop, stream, stream_options.include_usage, logit_bias (up to
 *     300 token ids, as strings, to biases from -100 to 100), …, and vLLM's top_k,
 *     min_p, repetition_penalty, ignore_eos, stop_token_ids, priority, chat_template_kwargs).
 *     Concurrent calls are batched by the engine in each GPU step. `n` (1 to 16) answers that
 *     many choices (choice i seeded seed + i; streamed chunks carry their choice's `index`).
 *     A thinking model (Qwen3, DeepSeek-R1: modelInfo().reasoningParser) answers with its
 *     reasoning in `message.reasoning_content` / `delta.reasoning_content`, apart from
 *     `content`. A field weft cannot honour (`n` above 16, `audio`, `reasoning_effort`, …), a
 *     value it refuses (a `logit_bias` id outside the vocabulary) or a field it does not know
 *     rejects with a WeftError whose `.param` names it; user, metadata, store, service_tier,
 *     prompt_cache_key and safety_identifier are accepted and ignored.
 *     - Structured output: `response_format` ({type: 'json_object'} or {type: 'json_schema',
 *       json_schema: {name, schema, strict}}), vLLM's `structured_outputs` / `guided_json`,
 *       `guided_regex`, `guided_choice`, `guided_grammar`, and llama.cpp's `grammar` (GBNF): the
 *       output is forced to match. An invalid schema, regex or grammar rejects with a WeftError
 *       whose `.param` names the field.
 *     - Tools (chat): `tools`, `tool_choice` ('auto', 'none', 'required' or
 *       {type: 'function', function: {name}}), `parallel_tool_calls`; calls come back as
 *       `message.tool_calls` (streamed: `delta.tool_calls`, each call whole), results go back as
 *       {role: 'tool', tool_call_id, content} messages.
 *     - `stream: true` → Promise<WeftStream>: an async iterator of chunk objects
 *       (`for await (const chunk of stream)`), with `.id`, `.controller` (an AbortController)
 *       and `.abort()`. Leaving the loop early (break) aborts the request. An aborted request
 *       ends normally with a last chunk whose finish_reason is "abort". An error during
 *       generation makes the iterator throw a WeftError.
 *     - otherwise → Promise of the full response object (chat.completion / text_completion).
 *     - `params.signal` (an AbortSignal) aborts the request too.
 *     - An invalid request rejects with a WeftError carrying `.type`, `.param`, `.code` (as in
 *       OpenAI error objects) and `.status` (400).
 *     - Request ids are 'chatcmpl-<random>' / 'cmpl-<random>', generated here.
 *   - `abort(id)` → boolean: aborts a running request by id (true if it was running).
 *   - `adapterInfo()`: {name, vendor, device, backend, driver, driverInfo, shaderF16, subgroups,
 *     subgroupMinSize, subgroupMaxSize, timestampQuery, limits: {…}}.
 *   - `modelInfo()`: {name, architecture, layers, hidden, vocab, contextLength, hasChatTemplate,
 *     maxModelLen, kernels}: `kernels` counts the GPU kernels loading compiled (on a CPU adapter
 *     such as SwiftShader each takes seconds, most of the load).
 *   - `fromCache`: true if the model came from the browser cache; `cached`: true if it is in the
 *     cache now; `modelBytes`: size of the model file; `wasmMemoryBytes`: the engine's
 *     WebAssembly memory after the load (its peak: the model is read a tensor at a time, never
 *     whole, so this stays far below a large model's size); `warnings`: array of warning messages;
 *     `hub`: for a model named hf:…, {repo, file, commit, why} (why that file), else null.
 *   - `loadLora({name, url | file | files})` → Promise: serve a LoRA adapter as `name` (needs the
 *     `maxLoras` option, and `maxLoraRank` above 16); a request whose `model` is `name` then runs
 *     with it, in the same steps as the base model's and other adapters' requests. `url`: a
 *     llama.cpp GGUF LoRA file (ending .gguf) or a PEFT adapter folder (its
 *     adapter_config.json and adapter_model.safetensors are fetched); `file`: a GGUF LoRA File
 *     or Blob; `files`: {config, safetensors}, a PEFT adapter's two Files. Rejects with a
 *     WeftError saying why when the adapter does not fit the model. `unloadLora(name)` →
 *     Promise: stop serving it. `modelInfo().loras` lists the adapters.
 *   - `health()` → Promise<{healthy, detail}>: a small round trip to the GPU. Unhealthy with the
 *     reason once the device is lost (the browser's GPU process crashed or reset it: every
 *     request then running ended with a WeftError saying so), after dispose(), or when the last
 *     step failed; `detail` says what to do (reload the page to get a new device).
 *   - `dispose()` → Promise: terminates the worker and frees the GPU; pending requests end with an error.
 *
 * `createServiceWorkerEngine({ serviceWorkerUrl, ...createEngine's options })` → Promise<WeftEngine>
 *   The same engine, hosted by a Service Worker (weft-service-worker.js, next to this file, or
 *   serviceWorkerUrl; registered with a scope of its own that controls no page) instead of a
 *   Web Worker of this page: one model for every tab of the origin. The first engine loads it;
 *   later ones, in other tabs or this one after a reload, attach at once (`engine.shared` is
 *   then true; a different model is refused while one is served), and every tab's requests
 *   share its batches. dispose() ends this page's requests; the last engine to dispose frees the
 *   model, and the browser frees it too once no page has pinged the worker for 30 s (a tab pings
 *   every 10 s). It needs WebGPU in service workers (Chrome and Edge 124+); storage 'opfs' is
 *   not offered there (no sync access handles), so models go to the Cache API. A bundler must
 *   serve weft-service-worker.js with the files it imports as they are (it does not bundle
 *   service workers): copy the package's files and point serviceWorkerUrl at them.
 *
 * `webgpuStatus()` → Promise<{available, reason, adapter}>: whether this browser can run weft,
 *   and if not, why and what to do.
 *
 * The models this site keeps (`model` below is what createEngine takes: a URL, relative to the
 * page, or an hf: name, resolved offline through the hub listing kept with it; or an entry of
 * listCachedModels(); left out, the default model):
 *   - `listCachedModels()` → Promise<[{key, name, storage, bytes, size, complete, hub, savedAt}]>:
 *     every kept model, whole or (OPFS) partly downloaded (`bytes` of `size` so far; null
 *     while a load is writing it); `hub` is {repo, file, commit, why} for a model named hf:.
 *   - `hasModelInCache(model, {hfEndpoint})` → Promise<boolean>: whether a whole copy is kept.
 *   - `deleteCachedModel(model, {hfEndpoint})` → Promise<boolean>: deletes every copy, whole or
 *     partial, from both stores; false when there was none. Rejects while an engine is
 *     downloading that model into OPFS.
 *   - `cacheUsage()` → Promise<{modelBytes, usage, quota, persisted}>: the browser's estimate of
 *     what this site stores and may store (navigator.storage.estimate()), and the models' share.
 *
 * `WeftError`: the Error subclass used for request and generation errors.
 */

import { STORAGE_KINDS, deleteCached, hasCached, keysFor, listCached, usage } from './model-cache.js';

export const DEFAULT_MODEL_URL = 'models/SmolLM2-135M-Instruct.Q4_1.gguf';

export { webgpuStatus } from './webgpu.js';

/** Where `model` (a string as createEngine takes it, or a listed entry) is kept: store keys. */
function cacheKeys(model, hfEndpoint) {
  const base = globalThis.document?.baseURI ?? globalThis.location?.href;
  if (model === undefined) return keysFor(new URL(DEFAULT_MODEL_URL, import.meta.url).href, { hfEndpoint, base });
  return keysFor(model, { hfEndpoint, base });
}

/** Every model this site keeps, whole or partly downloaded. See the header of this file. */
export async function listCachedModels() {
  return listCached();
}

/** Whether a whole copy of `model` is kept, so that loading it needs no download. */
export async function hasModelInCache(model, { hfEndpoint } = {}) {
  return hasCached(await cacheKeys(model, hfEndpoint));
}

/** Deletes every copy of `model`, whole or partial; whether there was one. */
export async function deleteCachedModel(model, { hfEndpoint } = {}) {
  return deleteCached(await cacheKeys(model, hfEndpoint));
}

/** How much this site stores (the browser's estimate), and how much of that is models. */
export async function cacheUsage() {
  return usage();
}

/** An error from a request: invalid request (status 400) or a failure during generation. */
export class WeftError extends Error {
  constructor(message, { type = null, param = null, code = null, status = undefined } = {}) {
    super(message);
    this.name = 'WeftError';
    this.type = type;
    this.param = param;
    this.code = code;
    if (status !== undefined) this.status = status;
    this.error = { message, type, param, code };
  }
}

function randomId(prefix) {
  const bytes = new Uint8Array(12);
  crypto.getRandomValues(bytes);
  return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

function abortError() {
  try {
    return new DOMException('The request was aborted.', 'AbortError');
  } catch {
    const e = new Error('The request was aborted.');
    e.name = 'AbortError';
    return e;
  }
}

/**
 * The stream of a `stream: true` request: an async iterator of chunk objects.
 * Also a ReadableStream source via `toReadableStream()`.
 */
export class WeftStream {
  #req;
  constructor(req) {
    this.#req = req;
    /** The request id (also the `id` of every chunk). */
    this.id = req.rid;
    /** Aborting this controller aborts the request (as in the openai package). */
    this.controller = req.controller;
  }

  /** Aborts the request; the iterator then ends after a final chunk with finish_reason "abort". */
  abort() {
    this.controller.abort();
  }

  [Symbol.asyncIterator]() {
    const req = this.#req;
    if (req.iterated) throw new Error('A WeftStream can be iterated only once.');
    req.iterated = true;
    return {
      next: () => req.next(),
      return: async () => {
        if (!req.finished) this.controller.abort();
        req.queue.length = 0;
        req.detached = true;
        return { value: undefined, done: true };
      },
      [Symbol.asyncIterator]() {
        return this;
      },
    };
  }

  /** A ReadableStream of the chunk objects. */
  toReadableStream() {
    const it = this[Symbol.asyncIterator]();
    return new ReadableStream({
      async pull(ctrl) {
        try {
          const { value, done } = await it.next();
          if (done) ctrl.close();
          else ctrl.enqueue(value);
        } catch (e) {
          ctrl.error(e);
        }
      },
      cancel: () => it.return(),
    });
  }
}

/** One request's state on the page side. */
class PendingRequest {
  constructor(rid, stream) {
    this.rid = rid;
    this.stream = stream;
    this.controller = new AbortController();
    this.queue = [];        // chunks not yet taken by the iterator
    this.waiter = null;     // {resolve, reject} of a pending next()
    this.finished = false;  // "[DONE]" seen (or failed)
    this.error = null;      // error to throw after the queued chunks
    this.accepted = false;
    this.iterated = false;
    this.detached = false;
    this.response = null;   // for stream: false
    this.settle = null;     // {resolve, reject} of the create() promise
  }

  next() {
    if (this.queue.length) return Promise.resolve({ value: this.queue.shift(), done: false });
    if (this.error) {
      const e = this.error;
      this.error = null;
      this.finished = true;
      return Promise.reject(e);
    }
    if (this.finished) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
  }

  wake() {
    const w = this.waiter;
    if (!w) return;
    this.waiter = null;
    this.next().then(w.resolve, w.reject);
  }
}

/** A loaded engine; made by createEngine(). */
export class WeftEngine {
  #worker;
  #pending = new Map();
  #health = new Map();
  #nextHealth = 0;
  #loras = new Map();
  #nextLora = 0;
  #adapter;
  #model;
  #disposed = false;
  #disposing = null;

  /** @private */
  constructor(worker, ready, warnings) {
    this.#worker = worker;
    this.#adapter = ready.adapter;
    this.#model = ready.model;
    this.fromCache = Boolean(ready.fromCache);
    this.cached = Boolean(ready.cached);
    this.modelBytes = ready.bytes ?? 0;
    this.wasmMemoryBytes = ready.wasmMemoryBytes ?? null;
    this.hub = ready.hub ?? null;
    this.shared = Boolean(ready.shared);
    this.warnings = warnings;
    this.chat = { completions: { create: (params) => this.#create('chat', params) } };
    this.completions = { create: (params) => this.#create('completion', params) };
    worker.onmessage = (ev) => this.#onMessage(ev.data);
    worker.onerror = (ev) => {
      ev.preventDefault?.();
      this.#failAll(new WeftError(`weft worker error: ${ev.message || 'unknown error'}`, { type: 'server_error' }));
    };
  }

  /** The WebGPU adapter the engine runs on. */
  adapterInfo() {
    return structuredClone(this.#adapter);
  }

  /** What model is loaded. */
  modelInfo() {
    return structuredClone(this.#model);
  }

  /** Aborts a running request by id; true if it was running. */
  abort(id) {
    const req = this.#pending.get(id);
    if (!req || req.finished) return false;
    req.controller.abort();
    return true;
  }

  /** Serve a LoRA adapter (see the header). */
  loadLora({ name, url, file, files } = {}) {
    return this.#lora({ type: 'addLora', name, url, file, files });
  }

  /** Stop serving a LoRA adapter. */
  unloadLora(name) {
    return this.#lora({ type: 'removeLora', name });
  }

  #lora(msg) {
    if (this.#disposed) return Promise.reject(new WeftError('The engine was disposed.', { type: 'server_error' }));
    const lid = ++this.#nextLora;
    return new Promise((resolve, reject) => {
      this.#loras.set(lid, { resolve, reject });
      this.#worker.postMessage({ ...msg, lid });
    }).then((model) => {
      this.#model = { ...this.#model, loras: model.loras };
    });
  }

  /** Whether the engine can still serve: {healthy, detail} (see the header). */
  health() {
    if (this.#disposed) return Promise.resolve({ healthy: false, detail: 'the engine was disposed' });
    const hid = ++this.#nextHealth;
    return new Promise((resolve) => {
      this.#health.set(hid, resolve);
      this.#worker.postMessage({ type: 'health', hid });
    });
  }

  /** Terminates the worker and frees the GPU; pending requests end with an error. */
  dispose() {
    if (this.#disposing) return this.#disposing;
    this.#disposed = true;
    this.#failAll(new WeftError('The engine was disposed.', { type: 'server_error', code: 'engine_disposed' }));
    this.#disposing = new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.#worker.terminate();
        resolve();
      };
      const timer = setTimeout(done, 1000);
      this.#worker.onmessage = (ev) => {
        if (ev.data?.type === 'disposed') done();
      };
      try {
        this.#worker.postMessage({ type: 'dispose' });
      } catch {
        done();
      }
    });
    return this.#disposing;
  }

  #create(kind, params) {
    if (this.#disposed) {
      return Promise.reject(new WeftError('The engine was disposed.', { type: 'invalid_request_error', code: 'engine_disposed' }));
    }
    if (!params || typeof params !== 'object') {
      return Promise.reject(new WeftError('The request must be an object.', { type: 'invalid_request_error', status: 400 }));
    }
    const { signal, ...rest } = params;
    if (signal?.aborted) return Promise.reject(abortError());
    let body;
    try {
      body = JSON.stringify(rest);
    } catch (e) {
      return Promise.reject(new WeftError(`The request cannot be sent as JSON: ${e.message}`, { type: 'invalid_request_error', status: 400 }));
    }
    const rid = randomId(kind === 'chat' ? 'chatcmpl-' : 'cmpl-');
    const req = new PendingRequest(rid, rest.stream === true);
    this.#pending.set(rid, req);

    req.controller.signal.addEventListener('abort', () => {
      if (!req.finished && !this.#disposed) this.#worker.postMessage({ type: 'abort', rid });
    }, { once: true });
    signal?.addEventListener('abort', () => req.controller.abort(), { once: true });

    const promise = new Promise((resolve, reject) => {
      req.settle = { resolve, reject };
    });
    this.#worker.postMessage({ type: 'create', rid, kind, body });
    return promise;
  }

  #accept(req) {
    if (req.accepted) return;
    req.accepted = true;
    if (req.stream) req.settle.resolve(new WeftStream(req));
  }

  #finish(req) {
    req.finished = true;
    this.#pending.delete(req.rid);
  }

  #onMessage(msg) {
    if (!msg) return;
    if (msg.type === 'fatal') {
      this.#failAll(new WeftError(`The engine failed: ${msg.message}`, { type: 'server_error' }));
      return;
    }
    if (msg.type === 'warning') {
      this.warnings.push(msg.message);
      return;
    }
    if (msg.type === 'health') {
      this.#health.get(msg.hid)?.(msg.report);
      this.#health.delete(msg.hid);
      return;
    }
    if (msg.type === 'lora') {
      const settle = this.#loras.get(msg.lid);
      this.#loras.delete(msg.lid);
      if (msg.error) settle?.reject(new WeftError(msg.error, { type: 'invalid_request_error', param: 'lora' }));
      else settle?.resolve(msg.model);
      return;
    }
    const req = this.#pending.get(msg.rid);
    if (!req) return;
    switch (msg.type) {
      case 'accepted':
        this.#accept(req);
        break;
      case 'rejected': {
        const e = msg.error || {};
        this.#finish(req);
        req.settle.reject(new WeftError(e.message || 'invalid request', {
          type: e.type ?? 'invalid_request_error', param: e.param ?? null, code: e.code ?? null, status: 400,
        }));
        break;
      }
      case 'event':
        this.#onEvent(req, msg.data);
        break;
      default:
        break;
    }
  }

  #onEvent(req, data) {
    if (data === '[DONE]') {
      this.#accept(req);
      this.#finish(req);
      if (!req.stream && !req.response && !req.error) {
        req.settle.reject(new WeftError('The engine ended the request without a response.', { type: 'server_error' }));
      }
      req.wake();
      return;
    }
    let obj;
    try {
      obj = JSON.parse(data);
    } catch {
      obj = { error: { message: `malformed event from the engine: ${String(data).slice(0, 200)}`, type: 'server_error' } };
    }
    if (obj && obj.error && !obj.choices) {
      const e = obj.error;
      const err = new WeftError(e.message || 'generation failed', {
        type: e.type ?? 'server_error', param: e.param ?? null, code: e.code ?? null,
      });
      if (!req.stream || !req.accepted) {
        // Not yet handed out (or not streaming): the create() promise rejects.
        req.error = err;
        req.accepted = true;
        this.#finish(req);
        req.settle.reject(err);
        return;
      }
      req.error = err;
      req.wake();
      return;
    }
    this.#accept(req);
    if (req.stream) {
      if (!req.detached) req.queue.push(obj);
      req.wake();
    } else {
      req.response = obj;
      req.settle.resolve(obj);
    }
  }

  #failAll(err) {
    for (const req of this.#pending.values()) {
      req.finished = true;
      if (!req.accepted) {
        req.accepted = true;
        req.settle.reject(err);
      } else if (req.stream) {
        req.error = err;
        req.finished = false; // let next() throw the error once the queue is drained
        req.wake();
      } else {
        req.settle.reject(err);
      }
    }
    this.#pending.clear();
    for (const resolve of this.#health.values()) resolve({ healthy: false, detail: err.message });
    this.#health.clear();
    for (const settle of this.#loras.values()) settle.reject(err);
    this.#loras.clear();
  }
}

/** The load message for the options createEngine takes; throws on a bad `storage`. */
function loadMessage({ model, modelUrl, modelFile, hfEndpoint, hfToken, storage, options }) {
  if (storage !== undefined && !STORAGE_KINDS.includes(storage)) {
    throw new Error(`storage must be one of ${STORAGE_KINDS.map((k) => `'${k}'`).join(', ')}, not ${JSON.stringify(storage)}`);
  }
  const base = globalThis.document?.baseURI ?? globalThis.location?.href;
  // A name may come as modelUrl too (the demo page's ?model=hf:…).
  const given = model ?? modelUrl;
  const named = !modelFile && typeof given === 'string' && given.startsWith('hf:');
  const hf = named ? { name: given, endpoint: hfEndpoint, token: hfToken } : undefined;
  const url = modelFile || named ? undefined
    : new URL(given ?? DEFAULT_MODEL_URL, given ? base : import.meta.url).href;
  return { type: 'load', modelUrl: url, file: modelFile, hf, storage, options };
}

/**
 * Sends `load` to the engine behind `worker` (a Worker, or a port with the same four members)
 * and waits for it: the WeftEngine, or a rejection saying what failed.
 */
async function startEngine(worker, load, { onProgress, onWarning }, startFailure) {
  const warn = onWarning ?? ((m) => console.warn(`weft: ${m}`));
  const warnings = [];
  const ready = await new Promise((resolve, reject) => {
    worker.onmessage = (ev) => {
      const msg = ev.data || {};
      switch (msg.type) {
        case 'progress': {
          const loaded = Number(msg.loaded) || 0;
          const total = Number(msg.total) || 0;
          try {
            onProgress?.({ stage: msg.stage, loaded, total, fraction: total > 0 ? Math.min(1, loaded / total) : null });
          } catch (e) {
            console.error(e);
          }
          break;
        }
        case 'warning':
          warnings.push(msg.message);
          try { warn(msg.message); } catch (e) { console.error(e); }
          break;
        case 'ready':
          resolve(msg);
          break;
        case 'error':
          reject(new Error(msg.message || 'loading the model failed'));
          break;
        default:
          break;
      }
    };
    worker.onerror = (ev) => {
      ev.preventDefault?.();
      reject(new Error(ev.message ? `The weft worker failed: ${ev.message}` : startFailure));
    };
    worker.postMessage(load);
  }).catch((e) => {
    worker.terminate();
    throw e;
  });
  return new WeftEngine(worker, ready, warnings);
}

/**
 * Starts the engine in a Web Worker of this page and loads a model. See the header of this file.
 * @returns {Promise<WeftEngine>}
 */
export async function createEngine({ workerUrl, ...params } = {}) {
  const load = loadMessage(params);
  let worker;
  try {
    // Written out in full, with the options inline, so that Vite and webpack 5 recognize the
    // pattern and bundle the worker (and the wasm module it imports) without configuration.
    worker = workerUrl
      ? new Worker(workerUrl, { type: 'module', name: 'weft' })
      : new Worker(new URL('./weft-worker.js', import.meta.url), { type: 'module', name: 'weft' });
  } catch (e) {
    throw new Error(`Could not start the weft worker (weft-worker.js): ${e?.message || e}`);
  }
  return startEngine(worker, load, params, 'Could not start the weft worker (weft-worker.js or pkg/weft_web.js could not be loaded; ' +
    'the page must be served over http(s), not opened as a file).');
}

/** How often a page tells the Service Worker it is still there (a browser stops one idle for 30 s). */
const PING_MS = 10_000;

/** The registration's active worker, once it has one. */
async function activeWorker(registration) {
  for (;;) {
    if (registration.active) return registration.active;
    const next = registration.installing ?? registration.waiting;
    if (!next) throw new Error('the Service Worker registered, but none is installing or active');
    await new Promise((resolve) => next.addEventListener('statechange', resolve, { once: true }));
    if (next.state === 'redundant' && !registration.active) throw new Error('the Service Worker failed to install (see the console)');
  }
}

/**
 * Like createEngine, but the engine runs in a Service Worker shared by every tab of this origin:
 * the first tab loads the model, later tabs (and this one after a reload) attach to it at once
 * (`engine.shared`), and all their requests share its batches. See the header of this file.
 * @returns {Promise<WeftEngine>}
 */
export async function createServiceWorkerEngine({ serviceWorkerUrl, ...params } = {}) {
  const load = loadMessage(params);
  if (typeof navigator === 'undefined' || !navigator.serviceWorker) {
    throw new Error('Service Workers are not available here (they need a secure context: https or localhost, and no private ' +
      'window in Firefox); createEngine runs the engine in a Web Worker of this page instead.');
  }
  const script = serviceWorkerUrl ? new URL(serviceWorkerUrl, globalThis.document?.baseURI) : new URL('./weft-service-worker.js', import.meta.url);
  let sw;
  try {
    // A scope of its own, which no page lives under: the worker serves messages, never fetches.
    const registration = await navigator.serviceWorker.register(script, { type: 'module', scope: new URL('./weft-engine/', script).href });
    sw = await activeWorker(registration);
  } catch (e) {
    throw new Error(`Could not start weft's Service Worker (${script.href}): ${e?.message || e}`);
  }
  const cid = randomId('engine-');
  const channel = new MessageChannel();
  let onerror = null;
  const onLost = (ev) => {
    if (ev.data?.type !== 'lost' || ev.data.cid !== cid) return;
    onerror?.({ message: "the browser stopped weft's Service Worker, and the model with it; create the engine again" });
  };
  navigator.serviceWorker.addEventListener('message', onLost);
  navigator.serviceWorker.startMessages();
  const ping = () => sw.postMessage({ type: 'ping', cid });
  const heartbeat = setInterval(ping, PING_MS);
  const port = {
    postMessage: (msg) => channel.port1.postMessage(msg),
    set onmessage(fn) {
      channel.port1.onmessage = fn && ((ev) => { if (ev.data?.type !== 'pong') fn(ev); });
    },
    set onerror(fn) {
      onerror = fn;
    },
    terminate() {
      clearInterval(heartbeat);
      navigator.serviceWorker.removeEventListener('message', onLost);
      channel.port1.close();
    },
  };
  sw.postMessage({ type: 'connect', cid }, [channel.port2]);
  ping();
  return startEngine(port, load, params, "weft's Service Worker failed");
}
