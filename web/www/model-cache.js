// model-cache.js — where the browser keeps downloaded models, for the worker that writes them and
// the page that lists and deletes them (both import this file).
//
// Two stores; createEngine's `storage` option picks the one a download goes to, and a model kept
// by either loads without a download:
//   - 'cache-api' (the default): the Cache API, cache 'weft-models-v1', one entry per model keyed
//     by its URL (a model named hf: by `<hub>/<repo>/blobs/<sha256>`). The entry is written as
//     the bytes arrive and kept only once it is whole, so a transfer cut off resumes within the
//     same load but not after the tab closes.
//   - 'opfs': the origin private file system, folder 'weft-models': per model `<id>.gguf`, its
//     bytes, and `<id>.json`, {key, name, size, validator, hub, complete, savedAt}, where id is
//     the sha256 of the key. The bytes are written in place as they arrive (a worker's sync
//     access handle), so a download that a closed tab or a dead network interrupted resumes
//     where it stopped on the next load.
// The hub's listings (JSON, for hf: names) are kept in the Cache API beside the models, so a
// named model resolves and loads offline. Every function fails soft where storage is missing or
// refused: nothing is cached, and the caller says why.

import { hubBase, isHfName, listingUrl, parseHfName, resolveHubFile } from './hub.js';

export const CACHE_NAME = 'weft-models-v1';
const OPFS_DIR = 'weft-models';
export const STORAGE_KINDS = ['cache-api', 'opfs', 'none'];
/** Bytes written between two flushes of an OPFS file: what a crash can cost at most. */
const FLUSH_EVERY = 8 << 20;

function messageOf(e) {
  return e?.message || String(e);
}

// ------------------------------------------------------------------------------- the Cache API

async function openCache() {
  if (typeof caches === 'undefined') {
    return { cache: null, why: 'the Cache API is not available here (it needs a secure context: https or localhost)' };
  }
  try {
    return { cache: await caches.open(CACHE_NAME), why: '' };
  } catch (e) {
    return { cache: null, why: `the browser refused storage (${e?.name || 'error'}: ${messageOf(e)})` };
  }
}

/** The hub's listing for `repo`, as kept in the cache; null when it is not there. */
export async function cachedListing(base, repo) {
  const { cache } = await openCache();
  const kept = cache && await cache.match(listingUrl(base, repo)).catch(() => null);
  return kept ? kept.json().catch(() => null) : null;
}

export async function keepListing(base, repo, text) {
  const { cache } = await openCache();
  if (cache) await cache.put(listingUrl(base, repo), new Response(text, { headers: { 'content-type': 'application/json' } })).catch(() => {});
}

class CacheApiStore {
  kind = 'cache-api';

  constructor(cache) {
    this.cache = cache;
  }

  async read(key) {
    const hit = await this.cache.match(key);
    if (!hit || !hit.ok || !hit.body) return null;
    // The entry's body as a Blob: the browser hands over its stored bytes, read in slices later.
    return { blob: await hit.blob(), size: Number(hit.headers.get('content-length')) || null };
  }

  async remove(key) {
    return this.cache.delete(key);
  }

  /**
   * A writer that keeps nothing until it is whole: the Cache API cannot append to an entry, so
   * there is never a partial copy to take.
   */
  async writer(key, about) {
    const cache = this.cache;
    let controller = null;
    let putting = Promise.resolve(null);
    const stop = (e) => {
      try { controller?.error(e); } catch { /* closed already */ }
      controller = null;
    };
    return {
      validator: null,
      begin({ size }) {
        stop(new Error('restarted'));
        const body = new ReadableStream({ start(c) { controller = c; } });
        const headers = {
          'content-type': 'application/octet-stream',
          'x-weft-name': encodeURIComponent(about.name),
          'x-weft-saved': new Date().toISOString(),
        };
        if (size) headers['content-length'] = String(size);
        if (about.hub) headers['x-weft-hub'] = encodeURIComponent(JSON.stringify(about.hub));
        putting = cache.put(key, new Response(body, { headers })).then(() => null, (e) => e);
      },
      append(chunk) {
        try { controller?.enqueue(chunk); } catch { controller = null; }
      },
      /** null when the entry is kept, else why not. */
      async finish() {
        try { controller?.close(); } catch { /* the cache gave up already */ }
        const failure = await putting;
        if (failure) await cache.delete(key).catch(() => {});
        return failure;
      },
      async discard() {
        stop(new Error('discarded'));
        await putting;
        await cache.delete(key).catch(() => {});
      },
      /** Kept bytes of an interrupted download: none here. */
      async keep() {
        await this.discard();
        return 0;
      },
    };
  }
}

// ------------------------------------------------------------------- the origin private file system

async function opfsDir(create) {
  if (typeof navigator === 'undefined' || !navigator.storage?.getDirectory) return null;
  const root = await navigator.storage.getDirectory();
  try {
    return await root.getDirectoryHandle(OPFS_DIR, { create });
  } catch (e) {
    if (e?.name === 'NotFoundError') return null;
    throw e;
  }
}

async function idOf(key) {
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(key));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, '0')).join('');
}

async function readMeta(dir, id) {
  try {
    const file = await (await dir.getFileHandle(`${id}.json`)).getFile();
    return JSON.parse(await file.text());
  } catch {
    return null;
  }
}

/** Replaces `<id>.json` (worker only: sync access handles exist in workers alone). */
async function writeMeta(dir, id, meta) {
  const handle = await (await dir.getFileHandle(`${id}.json`, { create: true })).createSyncAccessHandle();
  try {
    const bytes = new TextEncoder().encode(JSON.stringify(meta));
    handle.truncate(0);
    handle.write(bytes, { at: 0 });
    handle.flush();
  } finally {
    handle.close();
  }
}

async function removeOpfs(dir, id) {
  let removed = false;
  for (const name of [`${id}.gguf`, `${id}.json`]) {
    try {
      await dir.removeEntry(name);
      removed = true;
    } catch (e) {
      if (e?.name === 'NotFoundError') continue;
      if (e?.name === 'NoModificationAllowedError' || e?.name === 'InvalidModificationError') {
        throw new Error(`the model is being downloaded by an engine on this site right now; delete it once that load ends (${messageOf(e)})`);
      }
      throw e;
    }
  }
  return removed;
}

class OpfsStore {
  kind = 'opfs';

  constructor(dir) {
    this.dir = dir;
  }

  async read(key) {
    const id = await idOf(key);
    const meta = await readMeta(this.dir, id);
    if (!meta?.complete) return null;
    const file = await (await this.dir.getFileHandle(`${id}.gguf`)).getFile();
    if (file.size !== meta.size) return null;
    return { blob: file, size: file.size };
  }

  async remove(key) {
    return removeOpfs(this.dir, await idOf(key));
  }

  /**
   * A writer into `<id>.gguf`, from where an earlier, interrupted download of the same file
   * stopped when there is one: `takePartial(stream, bytes)` reads those bytes first (before the
   * file is opened for writing, which would void the snapshot), and the caller asks the server
   * for the rest. `about.size` is null where only the server knows it.
   */
  async writer(key, about, takePartial) {
    const dir = this.dir;
    const id = await idOf(key);
    const before = await readMeta(dir, id);
    const fileHandle = await dir.getFileHandle(`${id}.gguf`, { create: true });
    const file = await fileHandle.getFile();
    const resumable = before && !before.complete && before.key === key && file.size > 0 &&
      (about.size == null || before.size == null || before.size === about.size) && (before.size == null || file.size < before.size);
    let from = 0;
    if (resumable) {
      try {
        await takePartial(file.stream(), file.size);
        from = file.size;
      } catch { /* unreadable: downloaded anew */ }
    }
    // Exclusive: a second engine downloading the same model gets an error here, and caches nothing.
    const access = await fileHandle.createSyncAccessHandle();
    access.truncate(from);
    let at = from;
    let unflushed = 0;
    let meta = { key, name: about.name, hub: about.hub ?? null, size: from > 0 ? before.size : about.size ?? null,
      validator: from > 0 ? before.validator ?? null : null, complete: false, savedAt: new Date().toISOString() };
    let open = true;
    const close = () => {
      if (!open) return;
      open = false;
      try { access.flush(); } catch { /* nothing to keep */ }
      access.close();
    };
    let failure = null;
    return {
      validator: meta.validator,
      /** The server's answer: the file's size, its validator (ETag or Last-Modified) and whether it starts over. */
      async begin({ size, validator, restart }) {
        if (restart) {
          access.truncate(0);
          at = 0;
        }
        meta = { ...meta, size: size ?? meta.size, validator: validator ?? null };
        try {
          await writeMeta(dir, id, meta);
        } catch (e) {
          failure = e;
        }
      },
      append(chunk) {
        if (!open || failure) return;
        try {
          const wrote = access.write(chunk, { at });
          if (wrote !== chunk.byteLength) throw new DOMException('storage is full', 'QuotaExceededError');
          at += wrote;
          unflushed += wrote;
          if (unflushed >= FLUSH_EVERY) {
            access.flush();
            unflushed = 0;
          }
        } catch (e) {
          failure = e;
        }
      },
      async finish() {
        close();
        if (!failure) {
          meta = { ...meta, size: at, complete: true, savedAt: new Date().toISOString() };
          try {
            await writeMeta(dir, id, meta);
          } catch (e) {
            failure = e;
          }
        }
        if (failure) await removeOpfs(dir, id).catch(() => {});
        return failure;
      },
      async discard() {
        close();
        await removeOpfs(dir, id).catch(() => {});
      },
      /** Keeps what arrived for the next load to resume from; how many bytes that is. */
      async keep() {
        close();
        if (failure || at === 0) {
          await removeOpfs(dir, id).catch(() => {});
          return 0;
        }
        return at;
      },
    };
  }
}

/**
 * The stores a load reads from, the one it writes to first, and why none could be had when
 * `kind` asked for one. Worker side.
 */
export async function openStores(kind) {
  const wanted = STORAGE_KINDS.includes(kind ?? 'cache-api') ? kind ?? 'cache-api' : null;
  if (!wanted) throw new Error(`storage must be one of ${STORAGE_KINDS.map((k) => `'${k}'`).join(', ')}, not ${JSON.stringify(kind)}`);
  const { cache, why: noCache } = await openCache();
  let opfs = null;
  let noOpfs = '';
  try {
    const dir = await opfsDir(wanted === 'opfs');
    if (dir && typeof FileSystemFileHandle !== 'undefined' && 'createSyncAccessHandle' in FileSystemFileHandle.prototype) {
      opfs = new OpfsStore(dir);
    } else if (wanted === 'opfs') {
      noOpfs = 'this browser offers no origin private file system with sync access handles in workers';
    }
  } catch (e) {
    noOpfs = `the browser refused the origin private file system (${e?.name || 'error'}: ${messageOf(e)})`;
  }
  const cacheApi = cache ? new CacheApiStore(cache) : null;
  // OPFS asked for where it cannot be written (a Service Worker has no sync access handles):
  // the Cache API instead, said in `note`.
  const fallback = wanted === 'opfs' && !opfs && cacheApi;
  const chosen = fallback ? cacheApi : { 'cache-api': cacheApi, opfs, none: null }[wanted];
  const why = wanted === 'none' ? 'storage is \'none\'' : wanted === 'opfs' ? noOpfs : noCache;
  const note = fallback ? `storage 'opfs' is not available here (${noOpfs}); the model is kept in the Cache API instead` : '';
  return { write: chosen, read: [chosen, cacheApi, opfs].filter((s, i, all) => s && all.indexOf(s) === i), why, note };
}

// ------------------------------------------------------------------------------- the page's view

/**
 * The store keys `model` may be kept under: its URL (resolved against `base`), or for an hf:
 * name the file its cached listing resolves to (none when the listing was never cached).
 */
export async function keysFor(model, { hfEndpoint, base }) {
  if (model instanceof URL) return [model.href];
  if (typeof model === 'object' && model?.key) return [model.key];
  if (typeof model !== 'string' || model === '') throw new Error('expected a model URL, an hf: name or an entry of listCachedModels()');
  if (!isHfName(model)) return [new URL(model, base).href];
  const endpoint = hubBase(hfEndpoint);
  const listing = await cachedListing(endpoint, parseHfName(model).repo);
  return listing ? [resolveHubFile(model, endpoint, listing).key] : [];
}

function header(resp, name) {
  const v = resp.headers.get(name);
  try {
    return v == null ? null : decodeURIComponent(v);
  } catch {
    return v;
  }
}

/** Every model kept by either store, whole or (OPFS) partly downloaded. */
export async function listCached() {
  const out = [];
  const { cache } = await openCache();
  if (cache) {
    for (const req of await cache.keys()) {
      const resp = await cache.match(req);
      if (!resp || /json/.test(resp.headers.get('content-type') ?? '')) continue;
      const size = Number(resp.headers.get('content-length')) || null;
      const hub = header(resp, 'x-weft-hub');
      out.push({
        key: req.url,
        name: header(resp, 'x-weft-name') ?? decodeURIComponent(new URL(req.url).pathname.split('/').pop()),
        storage: 'cache-api',
        bytes: size,
        size,
        complete: true,
        hub: hub ? JSON.parse(hub) : null,
        savedAt: header(resp, 'x-weft-saved'),
      });
    }
  }
  const dir = await opfsDir(false).catch(() => null);
  if (dir) {
    for await (const [name] of dir.entries()) {
      if (!name.endsWith('.json')) continue;
      const id = name.slice(0, -'.json'.length);
      const meta = await readMeta(dir, id);
      if (!meta?.key) continue;
      let bytes = null;
      try {
        bytes = (await (await dir.getFileHandle(`${id}.gguf`)).getFile()).size;
      } catch { /* being written: unknown until that load ends */ }
      out.push({ key: meta.key, name: meta.name, storage: 'opfs', bytes, size: meta.size, complete: Boolean(meta.complete),
        hub: meta.hub ?? null, savedAt: meta.savedAt ?? null });
    }
  }
  return out;
}

/** Whether a whole copy of one of `keys` is kept. */
export async function hasCached(keys) {
  const listed = await listCached();
  return listed.some((m) => m.complete && keys.includes(m.key));
}

/** Deletes every copy (whole or partial) of `keys` from both stores; whether there was one. */
export async function deleteCached(keys) {
  let deleted = false;
  const { cache } = await openCache();
  const dir = await opfsDir(false).catch(() => null);
  for (const key of keys) {
    if (cache && await cache.delete(key)) deleted = true;
    if (dir && await removeOpfs(dir, await idOf(key))) deleted = true;
  }
  return deleted;
}

/** What this origin stores, as the browser estimates it, and how much of that is models. */
export async function usage() {
  const models = await listCached();
  const estimate = navigator.storage?.estimate ? await navigator.storage.estimate().catch(() => ({})) : {};
  const persisted = navigator.storage?.persisted ? await navigator.storage.persisted().catch(() => false) : false;
  return {
    modelBytes: models.reduce((sum, m) => sum + (m.bytes ?? 0), 0),
    usage: estimate.usage ?? null,
    quota: estimate.quota ?? null,
    persisted,
  };
}
