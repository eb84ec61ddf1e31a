// run.mjs — weft's browser tests: the demo page and the JS API in headless Chromium, whose WebGPU
// runs on SwiftShader (the CPU), checked against `weft generate`'s output on the same prompts.
// `cargo xtask test-web` prepares everything and runs this; by hand:
//
//   WEFT_DIST=web/dist WEFT_EXPECTED=target/web-test/expected.json \
//   WEFT_TINY_MODEL=target/web-test/tiny.gguf CHROMIUM=/usr/bin/chromium \
//   WEFT_BIG_MODEL=target/web-test/big-llama-3.2-1b.q4_1.gguf \
//   WEFT_SHOTS=target/web-test node web/e2e/run.mjs [name-filter]
//
// Uses playwright-core only (it never downloads a browser): Debian's chromium is driven as is.
// Prints one "ok"/"FAIL" line per test with its time, then "N passed, N failed"; exits 1 on any
// failure. Browser console lines are echoed with a [browser] prefix.

import { chromium } from 'playwright-core';
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import crypto from 'node:crypto';

const here = path.dirname(fileURLToPath(import.meta.url));
const env = (name, fallback) => process.env[name] || fallback;
const DIST = path.resolve(env('WEFT_DIST', path.join(here, '..', 'dist')));
const E2E = path.resolve(env('WEFT_E2E', here));
const EXPECTED = JSON.parse(fs.readFileSync(path.resolve(env('WEFT_EXPECTED', 'target/web-test/expected.json')), 'utf8'));
const TINY = path.resolve(env('WEFT_TINY_MODEL', 'target/web-test/tiny.gguf'));
// A model larger than the bound on WebAssembly memory below (`cargo xtask test-web` writes it).
const BIG = process.env.WEFT_BIG_MODEL ? path.resolve(process.env.WEFT_BIG_MODEL) : null;
/** What the engine's WebAssembly memory may grow to while that model loads (issue 38). */
const WASM_HEAP_BOUND = 256 << 20;
/** What it grows to while weights go up 16 MiB at a time: about 53 MiB measured for the 741 MiB
 * model and 52 MiB for the 5 GB one; reading each tensor whole took 238 MiB, under the bound
 * above, so this is the check that fails if a whole tensor lands in WebAssembly memory again. */
const WASM_SLICED_BOUND = 128 << 20;
// The example apps of the packed package (`cargo xtask test-web` sets both): the directory the
// tarball was installed into, with example/plain.html, and web/npm/example/vite as Vite built it.
const NPM_APP = process.env.WEFT_NPM_APP ? path.resolve(process.env.WEFT_NPM_APP) : null;
const VITE_APP = process.env.WEFT_VITE_APP ? path.resolve(process.env.WEFT_VITE_APP) : null;
const CHROMIUM = env('CHROMIUM', '/usr/bin/chromium');
const SHOTS = path.resolve(env('WEFT_SHOTS', 'target/web-test'));
const FILTER = process.argv[2] || '';

// Headless Chromium on Linux offers WebGPU with --enable-unsafe-webgpu alone: its adapter is
// SwiftShader's Vulkan on the CPU (vendor google, architecture swiftshader, a fallback adapter).
// The rest keeps the browser quiet and off the network.
const QUIET = ['--no-sandbox', '--disable-dev-shm-usage', '--disable-background-networking', '--disable-component-update',
  '--disable-sync', '--disable-quic', '--no-first-run', '--disable-default-apps', '--disable-extensions'];
const WEBGPU = ['--enable-unsafe-webgpu', ...QUIET];
// Without the flag Chromium on Linux keeps navigator.gpu but finds no adapter; also switch the
// feature off outright.
const NO_WEBGPU = ['--disable-features=WebGPU', ...QUIET];

const MINUTE = 60_000;

// ------------------------------------------------------------------------------------ server

const MIME = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8', '.mjs': 'text/javascript; charset=utf-8',
  '.wasm': 'application/wasm', '.css': 'text/css; charset=utf-8', '.json': 'application/json', '.png': 'image/png',
  '.svg': 'image/svg+xml', '.ico': 'image/x-icon',
};
const requests = new Map(); // "GET /path" -> count
const count = (method, p) => requests.get(`${method} ${p}`) || 0;
const JUNK = Buffer.alloc(1024, 0).map((_, i) => (i * 37 + 11) & 0xff); // 1 KB that is not a GGUF

function fileFor(urlPath) {
  if (urlPath === '/test/tiny.gguf') return TINY;
  if (urlPath === '/test/big.gguf' && BIG) return BIG;
  for (const [prefix, dir] of [['/vite/', VITE_APP], ['/npm-app/', NPM_APP]]) {
    if (!urlPath.startsWith(prefix) || !dir) continue;
    const rel = decodeURIComponent(urlPath.slice(prefix.length) || 'index.html');
    return rel.split(/[\\/]/).includes('..') || rel.includes('\0') ? null : path.join(dir, rel);
  }
  const [root, rest] = urlPath.startsWith('/e2e/') ? [E2E, urlPath.slice(5)] : [DIST, urlPath.slice(1)];
  const rel = decodeURIComponent(rest || 'index.html');
  if (rel.split(/[\\/]/).includes('..') || rel.includes('\0')) return null;
  return path.join(root, rel);
}

function startServer() {
  const server = http.createServer((req, res) => {
    const urlPath = new URL(req.url, 'http://x').pathname;
    requests.set(`${req.method} ${urlPath}`, count(req.method, urlPath) + 1);
    const headers = {
      'Cache-Control': 'no-cache',
      'Cross-Origin-Opener-Policy': 'same-origin',
      'Cross-Origin-Embedder-Policy': 'require-corp',
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, headers).end();
      return;
    }
    if (urlPath === '/test/bad.gguf') {
      res.writeHead(200, { ...headers, 'Content-Type': 'application/octet-stream', 'Content-Length': JUNK.length });
      res.end(req.method === 'HEAD' ? undefined : JUNK);
      return;
    }
    if (urlPath === '/test/blank.html') {
      res.writeHead(200, { ...headers, 'Content-Type': 'text/html; charset=utf-8' }).end('<!doctype html><title>blank</title>');
      return;
    }
    let file = fileFor(urlPath);
    try {
      if (file && fs.statSync(file).isDirectory()) file = path.join(file, 'index.html');
      const stat = file && fs.statSync(file);
      if (!stat || !stat.isFile()) throw new Error('not a file');
      const type = MIME[path.extname(file).toLowerCase()] || 'application/octet-stream';
      res.writeHead(200, { ...headers, 'Content-Type': type, 'Content-Length': stat.size });
      if (req.method === 'HEAD') res.end();
      else fs.createReadStream(file).pipe(res);
    } catch {
      res.writeHead(404, { ...headers, 'Content-Type': 'text/plain' }).end('not found\n');
    }
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

// ------------------------------------------------------------------ a stand-in Hugging Face hub

const HUB_COMMIT = '0123456789abcdef0123456789abcdef01234567';
const HUB_TOKEN = 'hf_test_token';

/**
 * The hub's URLs as a page meets them, on two ports (the hub and its storage are two origins):
 * the model API's listing with each file's size and sha256 (`?blobs=true`), resolve URLs that
 * redirect to storage, storage that serves ranges; CORS on all, as the real ones answer. The
 * repository test/corrupted lists the tiny model's sha256 but serves it with a byte flipped.
 * Storage names the file's version in its ETag (`hub.etag`).
 * `hub.cutNext` cuts the next storage download off halfway (and with 'down' then refuses every
 * connection, as a dead network would); `hub.down` refuses every connection.
 */
async function startHub() {
  const tiny = fs.readFileSync(TINY);
  const corrupted = Buffer.from(tiny);
  corrupted[corrupted.length >> 1] ^= 0x40;
  const sha = crypto.createHash('sha256').update(tiny).digest('hex');
  const file = (name, served) => ({ name, served, sha256: sha, size: tiny.length });
  const repos = {
    'test/tiny-GGUF': [file('tiny-Q8_0.gguf', tiny), { name: 'README.md', served: Buffer.from('# tiny\n') }],
    'test/corrupted': [file('tiny-Q8_0.gguf', corrupted)],
  };
  const hub = { seen: [], cutNext: false, down: false, etag: 'v1', url: '', storage: '' };
  const cors = {
    'Access-Control-Allow-Origin': '*',
    'Access-Control-Allow-Headers': 'authorization, range',
    'Access-Control-Expose-Headers': 'content-range, content-length, etag, x-repo-commit, x-linked-etag, x-linked-size',
    'Cross-Origin-Resource-Policy': 'cross-origin',
  };
  const handler = (req, res) => {
    if (hub.down) return req.socket.destroy();
    const url = new URL(req.url, 'http://x');
    hub.seen.push({ method: req.method, path: url.pathname, range: req.headers.range ?? null, auth: req.headers.authorization ?? null });
    if (req.method === 'OPTIONS') return res.writeHead(204, { ...cors, 'Access-Control-Allow-Methods': 'GET, HEAD' }).end();
    const listing = /^\/api\/models\/([^/]+\/[^/]+)\/revision\/main$/.exec(url.pathname);
    if (listing) {
      const files = repos[listing[1]];
      if (!files) return res.writeHead(404, cors).end('{"error":"Repository not found"}');
      const siblings = files.map((f) => ({ rfilename: f.name, size: f.served.length, ...(f.sha256 ? { lfs: { sha256: f.sha256, size: f.size } } : {}) }));
      return res.writeHead(200, { ...cors, 'Content-Type': 'application/json' }).end(JSON.stringify({ id: listing[1], sha: HUB_COMMIT, siblings }));
    }
    const resolve = /^\/([^/]+\/[^/]+)\/resolve\/[^/]+\/(.+)$/.exec(url.pathname);
    const found = resolve && repos[resolve[1]]?.find((f) => f.name === decodeURIComponent(resolve[2]));
    if (found) {
      const where = `${hub.storage}/storage/${resolve[1].replace('/', '--')}/${found.name}`;
      return res.writeHead(302, { ...cors, Location: where, 'X-Repo-Commit': HUB_COMMIT, 'X-Linked-Etag': `"${found.sha256}"`, 'X-Linked-Size': found.size, 'Content-Length': 0 }).end();
    }
    const stored = /^\/storage\/([^/]+)--([^/]+)\/(.+)$/.exec(url.pathname);
    const blob = stored && repos[`${stored[1]}/${stored[2]}`]?.find((f) => f.name === stored[3]);
    if (!blob) return res.writeHead(404, cors).end();
    const from = Number(/^bytes=(\d+)-$/.exec(req.headers.range ?? '')?.[1] ?? 0);
    const body = blob.served.subarray(from);
    const headers = { ...cors, 'Content-Type': 'application/octet-stream', 'Content-Length': body.length, ETag: `"${hub.etag}"` };
    if (req.headers.range) headers['Content-Range'] = `bytes ${from}-${blob.served.length - 1}/${blob.served.length}`;
    res.writeHead(req.headers.range ? 206 : 200, headers);
    if (hub.cutNext) {
      // The whole length announced, half of it sent, the connection gone. The reset waits a
      // moment: one sent at once can discard bytes the browser has not read yet (then it has
      // nothing to resume from, and starts over).
      const thenDown = hub.cutNext === 'down';
      hub.cutNext = false;
      res.write(body.subarray(0, body.length >> 1), () => setTimeout(() => {
        if (thenDown) hub.down = true;
        res.socket.destroy();
      }, 300));
      return;
    }
    res.end(body);
  };
  const listen = () => new Promise((resolve) => {
    const server = http.createServer(handler);
    server.listen(0, '127.0.0.1', () => resolve(server));
  });
  const [api, storage] = [await listen(), await listen()];
  hub.url = `http://127.0.0.1:${api.address().port}`;
  hub.storage = `http://127.0.0.1:${storage.address().port}`;
  hub.close = () => { api.close(); storage.close(); };
  hub.storageGets = () => hub.seen.filter((s) => s.method === 'GET' && s.path.startsWith('/storage/'));
  return hub;
}

// ------------------------------------------------------------------------------------ harness

let passed = 0;
let failed = 0;
const notes = [];

async function test(name, fn) {
  if (FILTER && !name.includes(FILTER)) return;
  const t0 = Date.now();
  console.log(`---- ${name}`);
  try {
    const info = await fn();
    passed++;
    console.log(`ok   ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)${info ? `: ${info}` : ''}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s): ${e && e.stack ? e.stack : e}`);
  }
}

/** Run fn(); when it throws, first save a screenshot of the context's page as <name>-failed.png. */
async function shotOnFailure(context, name, fn) {
  try {
    return await fn();
  } catch (e) {
    const page = context.pages()[0];
    if (page) {
      const file = path.join(SHOTS, `${name}-failed.png`);
      await page.screenshot({ path: file, fullPage: true }).then(() => console.log(`     screenshot of the failure: ${file}`), () => {});
    }
    throw e;
  }
}

function check(cond, message) {
  if (!cond) throw new Error(message);
}

const show = (s) => JSON.stringify(s);

async function launch(args) {
  return chromium.launch({ executablePath: CHROMIUM, args, timeout: 2 * MINUTE });
}

/** A new page in `context` whose console and errors are echoed; `errors` collects page errors. */
async function newPage(context, label) {
  const page = await context.newPage();
  const errors = [];
  page.on('console', (m) => console.log(`[browser${label ? ' ' + label : ''}] ${m.type()}: ${m.text()}`));
  page.on('pageerror', (e) => {
    errors.push(e);
    console.log(`[browser${label ? ' ' + label : ''}] pageerror: ${e && e.stack ? e.stack : e}`);
  });
  page.on('crash', () => console.log(`[browser${label ? ' ' + label : ''}] the page crashed`));
  page.on('worker', (w) => console.log(`[browser${label ? ' ' + label : ''}] worker started: ${w.url()}`));
  return { page, errors };
}

/** Wait for body[data-state=<one of states>]; on a different end state, fail with #error's text. */
async function waitState(page, states, timeout) {
  const wanted = [].concat(states);
  const ends = ['error', 'no-webgpu', 'ready'].filter((s) => !wanted.includes(s));
  const selector = [...wanted, ...ends].map((s) => `body[data-state="${s}"]`).join(', ');
  await page.waitForSelector(selector, { timeout, state: 'attached' });
  const state = await page.evaluate(() => document.body.dataset.state);
  if (!wanted.includes(state)) {
    const error = await page.evaluate(() => document.querySelector('#error')?.textContent || '');
    throw new Error(`the page reached state ${show(state)} instead of ${show(wanted)}${error ? `; #error says: ${error}` : ''}`);
  }
}

function demoUrl(base, spec) {
  const q = new URLSearchParams({ model: spec.url, maxTokens: String(spec.maxTokens), temperature: '0', autoload: '1' });
  spec.prompts.forEach((p, i) => q.set(`p${i}`, p));
  return `${base}/index.html?${q}`;
}

// The demo's model panel: "Kernels compiled" is what most of a CPU adapter's load went to.
async function kernelsCompiled(page) {
  return page.$$eval('#model-info dt', (dts) => {
    const dt = dts.find((d) => d.textContent === 'Kernels compiled');
    return dt ? Number(dt.nextElementSibling.textContent.replace(/\D/g, '')) : NaN;
  });
}

/**
 * Load the demo with `spec`'s model and prompts, click "Generate all", compare every pane with the
 * native output, then time one request alone through window.weftDemo.engine. Throws when the page
 * never gets there; returns the page and the list of mismatches (`problems`) otherwise.
 */
async function demoRun(context, base, spec, { loadTimeout, runTimeout, label }) {
  const { page, errors } = await newPage(context, label);
  const tLoad = Date.now();
  await page.goto(demoUrl(base, spec));
  await waitState(page, 'ready', loadTimeout);
  const loadSeconds = (Date.now() - tLoad) / 1000;
  const cacheStatus = await page.textContent('#cache-status');
  const kernels = await kernelsCompiled(page);

  const tRun = Date.now();
  await page.click('#run-all');
  await page.waitForFunction(() => {
    const panes = [...document.querySelectorAll('.pane')];
    return panes.length > 0 && panes.every((p) => ['done', 'error', 'stopped'].includes(p.dataset.state));
  }, null, { timeout: runTimeout, polling: 250 });
  const runSeconds = (Date.now() - tRun) / 1000;
  const panes = await page.$$eval('.pane', (els) => els.map((el) => ({
    state: el.dataset.state,
    output: el.querySelector('.output').textContent,
    error: el.querySelector('.pane-error')?.textContent || '',
    tps: Number(el.querySelector('.speed').dataset.tokensPerSecond),
    tokens: Number(el.querySelector('.speed').dataset.tokens),
  })));
  const aggregate = await page.$eval('#aggregate', (el) => ({ tps: Number(el.dataset.tokensPerSecond), tokens: Number(el.dataset.tokens), text: el.textContent }));
  const problems = [];
  if (!(kernels > 0)) problems.push(`the model panel shows no "Kernels compiled" count (${kernels})`);
  panes.forEach((p, i) => {
    if (p.state !== 'done') problems.push(`pane ${i} ended ${show(p.state)}: ${p.error.slice(0, 2000)}`);
    else if (p.output !== spec.outputs[i]) problems.push(`pane ${i} (${show(spec.prompts[i])}): browser ${show(p.output)} != native ${show(spec.outputs[i])}`);
  });

  // One request alone, through the engine the page made: same text, and its speed.
  const solo = await page.evaluate(async ({ prompt, maxTokens }) => {
    const t0 = performance.now();
    const r = await window.weftDemo.engine.chat.completions.create({
      messages: [{ role: 'user', content: prompt }], max_tokens: maxTokens, temperature: 0,
    });
    const seconds = (performance.now() - t0) / 1000;
    return { text: r.choices[0].message.content, tokens: r.usage.completion_tokens, seconds };
  }, { prompt: spec.prompts[0], maxTokens: spec.maxTokens }).catch((e) => ({ error: e }));
  if (solo.error) problems.push(`alone, prompt 0: ${solo.error.message || solo.error}`);
  else if (solo.text !== spec.outputs[0]) problems.push(`alone, prompt 0: browser ${show(solo.text)} != native ${show(spec.outputs[0])}`);
  // The four prompts at once through the API, warm (the page's first run also compiled shaders).
  const batch = await page.evaluate(async ({ prompts, maxTokens }) => {
    const t0 = performance.now();
    const rs = await Promise.all(prompts.map((prompt) => window.weftDemo.engine.chat.completions.create({
      messages: [{ role: 'user', content: prompt }], max_tokens: maxTokens, temperature: 0,
    })));
    const seconds = (performance.now() - t0) / 1000;
    return { texts: rs.map((r) => r.choices[0].message.content), tokens: rs.reduce((n, r) => n + r.usage.completion_tokens, 0), seconds };
  }, { prompts: spec.prompts, maxTokens: spec.maxTokens }).catch((e) => ({ error: e }));
  if (batch.error) problems.push(`4 at once through the API: ${batch.error.message || batch.error}`);
  else batch.texts.forEach((t, i) => {
    if (t !== spec.outputs[i]) problems.push(`4 at once through the API, prompt ${i}: browser ${show(t)} != native ${show(spec.outputs[i])}`);
  });
  // Speed on prompts the engine has not seen (the runs above hit the prefix cache): one alone,
  // then four at once. Only the shared chat-template prefix can come from the cache here.
  const speed = await page.evaluate(async ({ maxTokens }) => {
    const ask = (prompt) => window.weftDemo.engine.chat.completions.create({
      messages: [{ role: 'user', content: prompt }], max_tokens: maxTokens, temperature: 0, ignore_eos: true,
    });
    const timed = async (prompts) => {
      const t0 = performance.now();
      const rs = await Promise.all(prompts.map(ask));
      return rs.reduce((n, r) => n + r.usage.completion_tokens, 0) / ((performance.now() - t0) / 1000);
    };
    const one = await timed(['Name a famous painter.']);
    const four = await timed(['Name a large river.', 'Name a kind of tree.', 'Name a planet.', 'Name a musical instrument.']);
    return { one, four };
  }, { maxTokens: spec.maxTokens }).catch((e) => ({ error: e }));
  if (speed.error) problems.push(`speed runs: ${speed.error.message || speed.error}`);
  if (errors.length) problems.push(`page errors: ${errors.map(String).join('; ')}`);

  const batchTps = batch.error ? NaN : batch.tokens / batch.seconds;
  const soloTps = solo.error ? NaN : solo.tokens / solo.seconds;
  const line = `load ${loadSeconds.toFixed(1)} s (${kernels} kernels compiled); page, 4 panes: ${aggregate.tps.toFixed(2)} tokens/s aggregate ` +
    `(${aggregate.tokens} tokens, run ${runSeconds.toFixed(1)} s; panes ${panes.map((p) => p.tps.toFixed(2)).join(', ')} tokens/s); ` +
    `then the same prompts through the API (prefix-cached): 1 alone ${soloTps.toFixed(2)} tokens/s (${solo.tokens} tokens in ${solo.seconds?.toFixed(1)} s), ` +
    `4 at once ${batchTps.toFixed(2)} tokens/s (${batch.tokens} tokens in ${batch.seconds?.toFixed(1)} s); ` +
    `unseen prompts: 1 alone ${speed.one?.toFixed(2)} tokens/s, 4 at once ${speed.four?.toFixed(2)} tokens/s`;
  notes.push(`${label}: ${line}`);
  console.log(`     ${label}: cache status ${show(cacheStatus)}`);
  panes.forEach((p, i) => console.log(`     ${label} pane ${i}: ${show(p.output)}`));
  return { page, errors, line, cacheStatus, problems };
}

// ------------------------------------------------------------------------------------ tests

async function main() {
  const server = await startServer();
  const base = `http://127.0.0.1:${server.address().port}`;
  console.log(`serving ${DIST} (and ${E2E} at /e2e/, the tiny model at /test/tiny.gguf) at ${base}`);
  fs.mkdirSync(SHOTS, { recursive: true });
  const shots = [];

  const browser = await launch(WEBGPU);
  console.log(`chromium ${browser.version()} (${CHROMIUM}), flags: ${WEBGPU.join(' ')}`);
  try {
    await test('WebGPU adapter in headless Chromium', async () => {
      const context = await browser.newContext();
      const { page } = await newPage(context);
      await page.goto(`${base}/test/blank.html`);
      const info = await page.evaluate(async () => {
        if (!navigator.gpu) return { error: 'navigator.gpu is missing' };
        const a = await navigator.gpu.requestAdapter();
        if (!a) return { error: 'requestAdapter() gave null' };
        const i = a.info || {};
        return {
          vendor: i.vendor, architecture: i.architecture, description: i.description, fallback: i.isFallbackAdapter,
          subgroupMinSize: i.subgroupMinSize, subgroupMaxSize: i.subgroupMaxSize, shaderF16: a.features.has('shader-f16'),
          subgroups: a.features.has('subgroups'), maxStorageBufferBindingSize: a.limits.maxStorageBufferBindingSize,
          maxComputeInvocationsPerWorkgroup: a.limits.maxComputeInvocationsPerWorkgroup,
        };
      });
      await context.close();
      check(!info.error, info.error);
      return show(info);
    });

    await test('demo page, tiny model: 4 panes equal weft generate', async () => {
      const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
      const { page, problems } = await shotOnFailure(context, 'demo-tiny', () =>
        demoRun(context, base, EXPECTED.tiny, { loadTimeout: 5 * MINUTE, runTimeout: 5 * MINUTE, label: 'tiny' }));
      const shot = path.join(SHOTS, 'demo-tiny.png');
      await page.screenshot({ path: shot, fullPage: true });
      shots.push(shot);
      await context.close();
      check(problems.length === 0, problems.join('\n'));
      return notes.at(-1);
    });

    // The default model, then a reload in the same context (the Cache API lives as long as it).
    const spec = EXPECTED.smollm2;
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    let loaded = null;
    await test('demo page, default model: 4 panes equal weft generate', async () => {
      loaded = await shotOnFailure(context, 'demo', () =>
        demoRun(context, base, spec, { loadTimeout: 10 * MINUTE, runTimeout: 20 * MINUTE, label: 'smollm2' }));
      const shot = path.join(SHOTS, 'demo.png');
      await loaded.page.screenshot({ path: shot, fullPage: true });
      shots.push(shot);
      check(loaded.problems.length === 0, loaded.problems.join('\n'));
      return notes.at(-1);
    });

    await test('demo page, default model: a reload loads the model from the browser cache', async () => {
      check(loaded, 'the default model never loaded (see the test before)');
      const { page, errors, cacheStatus } = loaded;
      const downloads = count('GET', spec.url);
      check(downloads >= 1, `the model was never requested from the server (${spec.url}); cache status: ${show(cacheStatus)}`);
      check(/downloaded/i.test(cacheStatus), `a fresh browser did not download the model: ${show(cacheStatus)}`);
      const t0 = Date.now();
      await page.reload();
      await waitState(page, 'ready', 10 * MINUTE);
      const reloadSeconds = (Date.now() - t0) / 1000;
      const status = await page.textContent('#cache-status');
      const fromCache = await page.evaluate(() => window.weftDemo?.engine?.fromCache);
      check(count('GET', spec.url) === downloads, `the reload downloaded the model again (${count('GET', spec.url)} GETs of ${spec.url}, ${downloads} before)`);
      check(/cache/i.test(status) && !/downloaded/i.test(status), `#cache-status after the reload: ${show(status)}`);
      check(fromCache === true, `engine.fromCache after the reload is ${show(fromCache)}`);
      // The page lists the stored model and deletes it.
      await page.waitForFunction(() => document.querySelector('#stored-list')?.dataset.count === '1', null, { timeout: MINUTE });
      const stored = await page.textContent('#stored-list li');
      check(stored.includes(spec.url.split('/').pop()), `#stored-list: ${show(stored)}`);
      await page.click('#stored summary');
      await page.click('#stored-list li button.delete');
      await page.waitForFunction(() => document.querySelector('#stored-list')?.dataset.count === '0', null, { timeout: MINUTE });
      const still = await page.evaluate(async (url) => (await import('/weft.js')).hasModelInCache(url), spec.url);
      check(still === false, 'the model is still cached after its Delete button');
      check(errors.length === 0, `page errors: ${errors.map(String).join('; ')}`);
      return `ready again in ${reloadSeconds.toFixed(1)} s, ${downloads} download(s) in all: ${show(status)}; listed as ${show(stored)}, then deleted`;
    });
    await context.close();

    await test('engine API from a script page (web/e2e/api.html)', async () => {
      const context = await browser.newContext();
      const { page, errors } = await newPage(context, 'api');
      const q = new URLSearchParams({
        model: EXPECTED.tiny.url, prompt: EXPECTED.tiny.prompts[0], expected: EXPECTED.tiny.outputs[0], maxTokens: String(EXPECTED.tiny.maxTokens),
      });
      await page.goto(`${base}/e2e/api.html?${q}`);
      await page.waitForFunction(() => window.apiResults !== undefined, null, { timeout: 5 * MINUTE, polling: 250 });
      const results = await page.evaluate(() => window.apiResults);
      for (const r of results) console.log(`     ${r.ok ? 'ok  ' : 'FAIL'} api: ${r.name}${r.detail ? `: ${r.detail}` : ''}`);
      const bad = results.filter((r) => !r.ok);
      check(results.length >= 6, `only ${results.length} API checks ran`);
      check(bad.length === 0, bad.map((r) => `${r.name}: ${r.detail}`).join('\n'));
      check(errors.length === 0, `page errors: ${errors.map(String).join('; ')}`);
      await context.close();
      return `${results.length} checks`;
    });

    await test('a model larger than the WebAssembly heap bound loads with the heap under it', async () => {
      if (!BIG) return 'skipped: WEFT_BIG_MODEL is not set (cargo xtask test-web writes it)';
      const context = await browser.newContext();
      const { page, errors } = await newPage(context, 'big');
      await page.goto(`${base}/test/blank.html`);
      // Downloaded and gathered into a Blob as it arrives, then read 16 MiB at a time as each
      // tensor is uploaded (the stores hand loading the same kind of Blob; a stored copy is not
      // made here: about 35 s a load on SwiftShader). Small engine limits: the weights are what
      // is measured. WebAssembly memory never shrinks, so its size after the load is the load's
      // peak. A model over 4 GiB (WEFT_FULL=1's) is picked as a file instead: this headless
      // context is off the record, where Chromium keeps every Blob in memory under a cap of
      // about a fifth of the machine's RAM, and a gathered 5 GB download fails to read there
      // ("The requested file could not be read"); a picked file is read from disk.
      const picked = fs.statSync(BIG).size > 2 ** 32;
      if (picked) {
        await page.evaluate(() => {
          const input = document.createElement('input');
          input.type = 'file';
          input.id = 'big';
          document.body.append(input);
        });
        await page.setInputFiles('#big', BIG);
      }
      const runs = await page.evaluate(async (picked) => {
        const { createEngine } = await import('/weft.js');
        // 8B's KV takes 256 KiB a token in F32: 32 MiB hold the 64 tokens.
        const options = { kvMemoryMiB: picked ? 32 : 8, maxModelLen: 64, maxNumSeqs: 1, maxNumBatchedTokens: 16 };
        const t0 = performance.now();
        const model = picked ? { modelFile: document.getElementById('big').files[0] } : { modelUrl: '/test/big.gguf' };
        const engine = await createEngine({ ...model, storage: 'none', options });
        const seconds = (performance.now() - t0) / 1000;
        const r = await engine.completions.create({ prompt: 'Hello', max_tokens: 1, temperature: 0 });
        const run = { modelBytes: engine.modelBytes, wasmMemoryBytes: engine.wasmMemoryBytes, seconds,
          layers: engine.modelInfo().layers, tokens: r.usage.completion_tokens };
        await engine.dispose();
        return [run];
      }, picked);
      await context.close();
      const mib = (b) => (b / (1 << 20)).toFixed(0);
      const lines = runs.map((r) => `a ${mib(r.modelBytes)} MiB model (${r.layers} layers) ` +
        `loaded in ${r.seconds.toFixed(1)} s with WebAssembly memory at ${mib(r.wasmMemoryBytes)} MiB`);
      for (const line of lines) console.log(`     ${line}`);
      for (const r of runs) {
        check(r.modelBytes > WASM_HEAP_BOUND, `the model (${r.modelBytes} bytes) is no larger than the bound`);
        check(r.tokens === 1, `generated ${r.tokens} tokens`);
        check(r.wasmMemoryBytes > 0 && r.wasmMemoryBytes < WASM_HEAP_BOUND,
          `WebAssembly memory grew to ${mib(r.wasmMemoryBytes)} MiB loading a ${mib(r.modelBytes)} MiB model (bound ${mib(WASM_HEAP_BOUND)} MiB)`);
        check(r.wasmMemoryBytes < WASM_SLICED_BOUND,
          `WebAssembly memory grew to ${mib(r.wasmMemoryBytes)} MiB, over ${mib(WASM_SLICED_BOUND)} MiB: is a whole tensor read into it again?`);
      }
      check(errors.length === 0, `page errors: ${errors.map(String).join('; ')}`);
      return lines.join('; ');
    });

    for (const [what, page, prefix] of [
      ['an app built by Vite from the packed npm package (web/npm/example/vite)', 'vite/index.html', '/vite/'],
      ['a plain script page importing the installed npm package (web/npm/example/plain.html)', 'npm-app/plain.html', '/npm-app/node_modules/weft-llm/'],
    ]) {
      await test(`${what} generates`, async () => {
        if (!VITE_APP || !NPM_APP) return 'skipped: WEFT_VITE_APP and WEFT_NPM_APP are not set (cargo xtask test-web builds the apps and sets them)';
        const context = await browser.newContext();
        const { page: tab, errors } = await newPage(context, prefix);
        const spec = EXPECTED.tiny;
        const q = new URLSearchParams({ model: spec.url, prompt: spec.prompts[0], maxTokens: String(spec.maxTokens) });
        await tab.goto(`${base}/${page}?${q}`);
        await tab.waitForSelector('body[data-state="done"], body[data-state="error"]', { timeout: 5 * MINUTE, state: 'attached' });
        const state = await tab.evaluate(() => document.body.dataset.state);
        const text = await tab.textContent('#out');
        check(state === 'done', `the app ended in ${show(state)}: ${text}`);
        check(text === spec.outputs[0], `the app ${show(text)} != native ${show(spec.outputs[0])}`);
        // weft's worker and wasm came from the app's files, not from web/dist.
        const fromApp = [...requests.keys()].filter((k) => k.startsWith(`GET ${prefix}`));
        check(fromApp.some((k) => k.endsWith('.wasm')), `no .wasm asked for under ${prefix}: ${show(fromApp)}`);
        check(errors.length === 0, `page errors: ${errors.map(String).join('; ')}`);
        await context.close();
        return `${fromApp.length} files from ${prefix}: ${fromApp.map((k) => k.slice(`GET ${prefix}`.length)).join(', ')}`;
      });
    }

    await test('a model by name (hf:): resumed download, sha256 checked, cached, offline', async () => {
      const hub = await startHub();
      const context = await browser.newContext();
      const { page, errors } = await newPage(context, 'hf');
      await page.goto(`${base}/test/blank.html`);
      const spec = EXPECTED.tiny;
      // Loads `model`, answers the first tiny prompt, disposes; {error} when loading rejects.
      const load = (model) => page.evaluate(async ({ model, hfEndpoint, hfToken, prompt, maxTokens }) => {
        const { createEngine } = await import('/weft.js');
        let engine;
        try {
          engine = await createEngine({ model, hfEndpoint, hfToken, onWarning: () => {} });
        } catch (e) {
          return { error: String(e.message) };
        }
        const reply = await engine.chat.completions.create({ messages: [{ role: 'user', content: prompt }], max_tokens: maxTokens, temperature: 0 });
        const out = { text: reply.choices[0].message.content, hub: engine.hub, fromCache: engine.fromCache, cached: engine.cached, warnings: engine.warnings };
        await engine.dispose();
        return out;
      }, { model, hfEndpoint: hub.url, hfToken: HUB_TOKEN, prompt: spec.prompts[0], maxTokens: spec.maxTokens });
      const tinyBytes = fs.statSync(TINY).size;
      try {
        hub.cutNext = true;
        const first = await load('hf:test/tiny-GGUF:q8_0');
        check(!first.error, `loading failed: ${first.error}`);
        check(first.text === spec.outputs[0], `browser ${show(first.text)} != native ${show(spec.outputs[0])}`);
        check(first.hub?.file === 'tiny-Q8_0.gguf' && first.hub?.commit === HUB_COMMIT, `engine.hub: ${show(first.hub)}`);
        check(!first.fromCache && first.cached, `fromCache ${first.fromCache}, cached ${first.cached}`);
        const gets = hub.storageGets();
        // The stand-in cuts the connection after half the file; the browser resumes from what it
        // had received by then, at most that half.
        const resumedAt = Number(/^bytes=(\d+)-$/.exec(gets[1]?.range ?? '')?.[1]);
        check(gets.length === 2 && gets[0].range === null && resumedAt > 0 && resumedAt <= tinyBytes >> 1,
          `cut off, then resumed from where the first transfer ended: ${show(gets)}`);
        check(first.warnings.some((w) => /resuming/.test(w)), `no warning about resuming: ${show(first.warnings)}`);
        for (const seen of hub.seen.filter((s) => s.method === 'GET')) {
          const onHub = !seen.path.startsWith('/storage/');
          check((seen.auth === `Bearer ${HUB_TOKEN}`) === onHub, `the token goes to the hub alone: ${show(seen)}`);
        }

        const again = await load('hf:test/tiny-GGUF');
        check(!again.error, `loading from the cache failed: ${again.error}`);
        check(again.fromCache && again.text === spec.outputs[0], `second load: ${show(again)}`);
        check(/the only GGUF file/.test(again.hub?.why), `engine.hub.why: ${show(again.hub)}`);
        check(hub.storageGets().length === 2, 'the second load downloaded the model again');

        hub.down = true;
        const offline = await load('hf:test/tiny-GGUF:Q8_0');
        hub.down = false;
        check(!offline.error && offline.fromCache, `offline: ${show(offline)}`);
        check(offline.warnings.some((w) => /cannot reach/.test(w)), `offline warnings: ${show(offline.warnings)}`);

        const before = hub.storageGets().length;
        for (let attempt = 1; attempt <= 2; attempt++) {
          const bad = await load('hf:test/corrupted');
          check(/has sha256 [0-9a-f]{64}, but the hub lists/.test(bad.error ?? '') && /discarded/.test(bad.error), `corrupted, attempt ${attempt}: ${show(bad)}`);
          check(hub.storageGets().length === before + attempt, `corrupted, attempt ${attempt}: not downloaded anew, so it was cached`);
        }
        const missing = await load('hf:test/tiny-GGUF:Q4_K_M');
        check(/no GGUF files match "Q4_K_M"; the repository's GGUF files: tiny-Q8_0\.gguf/.test(missing.error ?? ''), `a missing quant: ${show(missing)}`);
        check(errors.length === 0, `page errors: ${errors.map(String).join('; ')}`);
        return `${hub.seen.length} requests to the stand-in hub; ${show(first.hub.why)}`;
      } finally {
        await context.close();
        hub.close();
      }
    });

    await test('models kept in the browser: an interrupted download resumed by the next load (OPFS), listed, deleted', async () => {
      const hub = await startHub();
      const context = await browser.newContext();
      const { page, errors } = await newPage(context, 'kept');
      await page.goto(`${base}/test/blank.html`);
      const spec = EXPECTED.tiny;
      const load = (model, storage) => page.evaluate(async ({ model, storage, hfEndpoint, prompt, maxTokens }) => {
        const { createEngine } = await import('/weft.js');
        let engine;
        try {
          engine = await createEngine({ model, storage, hfEndpoint, onWarning: () => {} });
        } catch (e) {
          return { error: String(e.message) };
        }
        const reply = await engine.chat.completions.create({ messages: [{ role: 'user', content: prompt }], max_tokens: maxTokens, temperature: 0 });
        const out = { text: reply.choices[0].message.content, fromCache: engine.fromCache, cached: engine.cached, warnings: engine.warnings };
        await engine.dispose();
        return out;
      }, { model, storage, hfEndpoint: hub.url, prompt: spec.prompts[0], maxTokens: spec.maxTokens });
      // One of weft.js's cache functions, called on the page.
      const call = (fn, ...args) => page.evaluate(async ({ fn, args }) => (await import('/weft.js'))[fn](...args), { fn, args });
      const name = 'hf:test/tiny-GGUF:Q8_0';
      const hubOpts = { hfEndpoint: hub.url };
      const tinyBytes = fs.statSync(TINY).size;
      const newGets = (from) => hub.storageGets().slice(from);
      try {
        // The network dies halfway: the load gives up, and OPFS keeps what arrived.
        hub.cutNext = 'down';
        const broken = await load(name, 'opfs');
        hub.down = false;
        check(/the \d+ bytes received are kept, and loading it again resumes/.test(broken.error ?? ''), `the interrupted load: ${show(broken)}`);
        const [part, ...others] = await call('listCachedModels');
        check(others.length === 0 && part?.storage === 'opfs' && !part.complete && part.bytes > 0 && part.bytes < tinyBytes &&
          part.size === tinyBytes && part.hub?.file === 'tiny-Q8_0.gguf', `listed after the interruption: ${show([part, ...others])}`);
        check(!(await call('hasModelInCache', name, hubOpts)), 'a partial copy counts as cached');

        // The next load asks only for the rest.
        let seen = hub.storageGets().length;
        const resumed = await load(name, 'opfs');
        check(!resumed.error, `the resumed load failed: ${resumed.error}`);
        check(resumed.text === spec.outputs[0], `browser ${show(resumed.text)} != native ${show(spec.outputs[0])}`);
        check(!resumed.fromCache && resumed.cached, `fromCache ${resumed.fromCache}, cached ${resumed.cached}`);
        const rest = newGets(seen);
        check(rest.length === 1 && rest[0].range === `bytes=${part.bytes}-`, `resumed from the ${part.bytes} kept bytes: ${show(rest)}`);
        check(resumed.warnings.some((w) => /Resuming the download of tiny-Q8_0\.gguf at \d+ of \d+ bytes/.test(w)), `warnings: ${show(resumed.warnings)}`);
        const whole = await call('listCachedModels');
        check(whole.length === 1 && whole[0].complete && whole[0].bytes === tinyBytes && whole[0].key === part.key, `listed once whole: ${show(whole)}`);
        check(await call('hasModelInCache', name, hubOpts), 'hasModelInCache after the resumed load');
        check(await call('hasModelInCache', 'hf:test/tiny-GGUF', hubOpts), 'another spelling of the same file');

        // Kept by OPFS, it loads without a download whatever store a load writes to.
        seen = hub.storageGets().length;
        const again = await load(name, 'cache-api');
        check(!again.error && again.fromCache && newGets(seen).length === 0, `from OPFS: ${show(again)}`);

        // A plain URL into the Cache API (the default): listed beside it.
        check(!(await call('hasModelInCache', '/test/tiny.gguf')), 'the URL before its load');
        const plain = await load('/test/tiny.gguf');
        check(!plain.error && !plain.fromCache && plain.cached && plain.text === spec.outputs[0], `a URL into the Cache API: ${show(plain)}`);
        const both = await call('listCachedModels');
        const inCache = both.find((m) => m.storage === 'cache-api');
        check(both.length === 2 && inCache?.name === 'tiny.gguf' && inCache.bytes === tinyBytes && inCache.complete, `listed: ${show(both)}`);
        check(await call('hasModelInCache', '/test/tiny.gguf'), 'the URL after its load');
        const used = await call('cacheUsage');
        check(used.modelBytes === 2 * tinyBytes && used.quota > 0 && used.usage >= 0, `cacheUsage: ${show(used)}`);

        // Deleted by name, then by a listed entry; deleting again finds nothing.
        check(await call('deleteCachedModel', name, hubOpts), 'deleteCachedModel(name)');
        check(!(await call('hasModelInCache', name, hubOpts)), 'still cached after the delete');
        check(await call('deleteCachedModel', inCache), 'deleteCachedModel(entry)');
        const none = await call('listCachedModels');
        check(none.length === 0, `listed after deleting both: ${show(none)}`);
        check(!(await call('deleteCachedModel', name, hubOpts)), 'a second delete found something');

        // Deleted means downloaded again, from the start; 'none' keeps nothing.
        seen = hub.storageGets().length;
        const fresh = await load(name, 'none');
        check(!fresh.error && !fresh.fromCache && !fresh.cached, `after the delete: ${show(fresh)}`);
        check(newGets(seen).length === 1 && newGets(seen)[0].range === null, `downloaded from the start: ${show(newGets(seen))}`);
        check((await call('listCachedModels')).length === 0, "storage 'none' kept something");
        const wrong = await load(name, 'disk');
        check(/storage must be one of 'cache-api', 'opfs', 'none', not "disk"/.test(wrong.error ?? ''), `storage 'disk': ${show(wrong)}`);

        // A plain URL whose file changes on the server between the interruption and the next
        // load: the kept bytes are void, and it is downloaded from the start.
        const direct = `${hub.storage}/storage/test--tiny-GGUF/tiny-Q8_0.gguf`;
        hub.cutNext = 'down';
        const cut = await load(direct, 'opfs');
        hub.down = false;
        check(/bytes received are kept/.test(cut.error ?? ''), `the interrupted load of a URL: ${show(cut)}`);
        hub.etag = 'v2';
        seen = hub.storageGets().length;
        const changed = await load(direct, 'opfs');
        const asked = newGets(seen);
        check(!changed.error && changed.text === spec.outputs[0] && changed.cached, `the changed file: ${show(changed)}`);
        check(asked.length === 2 && /^bytes=\d+-$/.test(asked[0].range ?? '') && asked[1].range === null, `a ranged request, then the whole file: ${show(asked)}`);
        check(changed.warnings.some((w) => /changed on the server/.test(w)), `warnings: ${show(changed.warnings)}`);
        check(await call('deleteCachedModel', direct), 'deleteCachedModel(url)');
        check(errors.length === 0, `page errors: ${errors.map(String).join('; ')}`);
        return `resumed at ${part.bytes} of ${tinyBytes} bytes; ${hub.seen.length} requests to the stand-in hub`;
      } finally {
        await context.close();
        hub.close();
      }
    });

    await test('Service Worker engine: two tabs stream at once through one loaded model, a reload attaches to it', async () => {
      const context = await browser.newContext();
      const spec = EXPECTED.tiny;
      const tabs = [await newPage(context, 'sw tab 1'), await newPage(context, 'sw tab 2')];
      for (const { page } of tabs) await page.goto(`${base}/test/blank.html`);
      const start = (page) => page.evaluate(async (url) => {
        const { createServiceWorkerEngine } = await import('/weft.js');
        try {
          window.swEngine = await createServiceWorkerEngine({ modelUrl: url, storage: 'none', onWarning: () => {} });
        } catch (e) {
          return { error: String(e.message) };
        }
        return { shared: window.swEngine.shared, layers: window.swEngine.modelInfo().layers };
      }, spec.url);
      const ask = (page, prompt) => page.evaluate(async ({ prompt, maxTokens }) => {
        const stream = await window.swEngine.chat.completions.create({
          messages: [{ role: 'user', content: prompt }], max_tokens: maxTokens, temperature: 0, stream: true,
        });
        let text = '';
        const from = Date.now();
        for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
        return { text, from, to: Date.now() };
      }, { prompt, maxTokens: spec.maxTokens });
      const downloads = () => count('GET', spec.url);
      try {
        const before = downloads();
        const first = await start(tabs[0].page);
        check(!first.error && first.shared === false && first.layers > 0, `the first tab: ${show(first)}`);
        const second = await start(tabs[1].page);
        check(!second.error && second.shared === true, `the second tab attaches: ${show(second)}`);
        check(downloads() === before + 1, `the model was fetched ${downloads() - before} times for two tabs`);
        const [a, b] = await Promise.all([ask(tabs[0].page, spec.prompts[0]), ask(tabs[1].page, spec.prompts[1])]);
        check(a.text === spec.outputs[0], `tab 1 ${show(a.text)} != native ${show(spec.outputs[0])}`);
        check(b.text === spec.outputs[1], `tab 2 ${show(b.text)} != native ${show(spec.outputs[1])}`);

        await tabs[0].page.reload();
        const again = await start(tabs[0].page);
        check(!again.error && again.shared === true && downloads() === before + 1, `after a reload: ${show(again)}, ${downloads() - before} fetches`);
        const after = await ask(tabs[0].page, spec.prompts[2] ?? spec.prompts[0]);
        check(after.text === (spec.outputs[2] ?? spec.outputs[0]), `after the reload ${show(after.text)}`);
        const other = await tabs[1].page.evaluate(async () => {
          const { createServiceWorkerEngine } = await import('/weft.js');
          try {
            await createServiceWorkerEngine({ modelUrl: '/test/bad.gguf', storage: 'none' });
            return 'loaded';
          } catch (e) {
            return String(e.message);
          }
        });
        check(/serves .*; a shared engine serves one model/.test(other), `another model while one is served: ${show(other)}`);
        for (const { page } of tabs) await page.evaluate(() => window.swEngine.dispose());
        for (const { errors } of tabs) check(errors.length === 0, `page errors: ${errors.map(String).join('; ')}`);
        const overlap = Math.min(a.to, b.to) - Math.max(a.from, b.from);
        return `1 load for 2 tabs and a reload; the two streams overlapped ${overlap} ms`;
      } finally {
        await context.close();
      }
    });

    await test('malformed model: the page ends in an error naming GGUF', async () => {
      const context = await browser.newContext();
      const { page, errors } = await newPage(context, 'bad');
      await page.goto(`${base}/index.html?model=/test/bad.gguf&autoload=1`);
      await waitState(page, 'error', 3 * MINUTE);
      const visible = await page.isVisible('#error');
      const text = await page.textContent('#error');
      check(visible, '#error is not visible');
      check(/gguf/i.test(text), `#error does not mention GGUF: ${show(text)}`);
      check(errors.length === 0, `page errors: ${errors.map(String).join('; ')}`);
      await context.close();
      return show(text);
    });

    await test('storage full: the model still loads, and the page says it was not cached', async () => {
      const context = await browser.newContext();
      const { page, errors } = await newPage(context, 'quota');
      // A 10 KB storage quota for the site: the tiny model (90 KB) cannot be cached.
      const cdp = await context.newCDPSession(page);
      await cdp.send('Storage.overrideQuotaForOrigin', { origin: base, quotaSize: 10_000 });
      await page.goto(`${base}/index.html?model=${encodeURIComponent(EXPECTED.tiny.url)}&autoload=1`);
      await waitState(page, 'ready', 3 * MINUTE);
      const status = (await page.textContent('#cache-status')).trim();
      check(/not cached/i.test(status) && /full/i.test(status), `#cache-status does not say the storage is full: ${show(status)}`);
      check(errors.length === 0, `page errors: ${errors.map(String).join('; ')}`);
      await context.close();
      return show(status);
    });

    await test('local .gguf file, a pane\'s stop button, then stop all', async () => {
      const context = await browser.newContext();
      const { page, errors } = await newPage(context, 'file');
      const spec = EXPECTED.tiny;
      const fetched = count('GET', spec.url);
      const q = new URLSearchParams({ maxTokens: '400', temperature: '0' });
      spec.prompts.forEach((p, i) => q.set(`p${i}`, p));
      await page.goto(`${base}/index.html?${q}`);
      await waitState(page, 'idle', 2 * MINUTE);
      await page.setInputFiles('#model-file', TINY);
      await page.check('#src-file');
      await page.click('#load');
      await waitState(page, 'ready', 3 * MINUTE);
      check(count('GET', spec.url) === fetched, 'the picked file was fetched from the server instead of read locally');
      const info = await page.textContent('#model-info');
      check(info.includes('tiny.gguf'), `#model-info does not name the picked file: ${show(info)}`);
      await page.click('#run-all');
      const pane = (i) => `.pane[data-index="${i}"]`;
      await page.waitForFunction((sel) => document.querySelector(sel).querySelector('.output').textContent.length > 0, `${pane(0)}`, { timeout: 2 * MINUTE, polling: 20 });
      await page.click(`${pane(0)} button.stop`);
      await page.waitForSelector(`${pane(0)}[data-state="stopped"]`, { timeout: MINUTE });
      const othersRunning = await page.$$eval('.pane', (els) => els.slice(1).filter((el) => el.dataset.state === 'running').length);
      await page.click('#stop-all');
      await waitState(page, 'ready', MINUTE);
      const panes = await page.$$eval('.pane', (els) => els.map((el) => ({ state: el.dataset.state, output: el.querySelector('.output').textContent })));
      const problems = [];
      panes.forEach((p, i) => {
        if (p.state !== 'stopped' && p.state !== 'done') problems.push(`pane ${i} ended ${show(p.state)}`);
        const native = spec.outputs[i];
        if (!(native.startsWith(p.output) || p.output.startsWith(native))) problems.push(`pane ${i}: browser ${show(p.output)} is not a prefix or extension of native ${show(native)}`);
      });
      check(panes[0].state === 'stopped', `pane 0 ended ${show(panes[0].state)}, not stopped`);
      check(problems.length === 0, problems.join('\n'));
      const live = await page.evaluate(() => window.weftDemo.engine.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2, temperature: 0 }).then((r) => r.choices[0].finish_reason));
      check(live === 'length', `after stopping, a new request ended ${show(live)}`);
      check(errors.length === 0, `page errors: ${errors.map(String).join('; ')}`);
      await context.close();
      return `pane states ${panes.map((p) => p.state).join(', ')} (${othersRunning} others were running at the stop); ${panes.map((p) => p.output.length).join(', ')} characters`;
    });

    for (const spec of EXPECTED.files) {
      const file = path.basename(spec.model);
      await test(`a local ${file}: loads, and ${spec.chat ? 'answers chat prompts' : 'completes text'} as weft generate does`, async () => {
        const context = await browser.newContext();
        const { page, errors } = await newPage(context, file);
        await page.goto(`${base}/index.html`);
        await waitState(page, 'idle', 2 * MINUTE);
        await page.setInputFiles('#model-file', spec.model);
        await page.check('#src-file');
        const t0 = Date.now();
        await page.click('#load');
        await waitState(page, 'ready', 10 * MINUTE);
        const loadSeconds = (Date.now() - t0) / 1000;
        const info = await page.textContent('#model-info');
        check(info.includes(file), `#model-info does not name the picked file: ${show(info)}`);
        const kernels = await kernelsCompiled(page);
        check(kernels > 0, `the model panel shows no "Kernels compiled" count (${kernels})`);
        const t1 = Date.now();
        const texts = await page.evaluate(({ prompts, maxTokens, chat }) => Promise.all(prompts.map((prompt) => chat
          ? window.weftDemo.engine.chat.completions.create({ messages: [{ role: 'user', content: prompt }], max_tokens: maxTokens, temperature: 0 })
            .then((r) => r.choices[0].message.content)
          : window.weftDemo.engine.completions.create({ prompt, max_tokens: maxTokens, temperature: 0 })
            .then((r) => r.choices[0].text))), { prompts: spec.prompts, maxTokens: spec.maxTokens, chat: spec.chat });
        const runSeconds = (Date.now() - t1) / 1000;
        const problems = texts.flatMap((t, i) => t === spec.outputs[i] ? [] : [`${show(spec.prompts[i])}: browser ${show(t)} != native ${show(spec.outputs[i])}`]);
        check(problems.length === 0, problems.join('\n'));
        check(errors.length === 0, `page errors: ${errors.map(String).join('; ')}`);
        await context.close();
        return `load ${loadSeconds.toFixed(1)} s (${kernels} kernels compiled); ${texts.length} prompt(s) at once, ${spec.maxTokens} tokens each, in ${runSeconds.toFixed(1)} s: ${texts.map(show).join(', ')}`;
      });
    }
  } finally {
    await browser.close();
  }

  // In a browser of its own: crashing the GPU process takes WebGPU from every page there.
  const crashing = await launch(WEBGPU);
  try {
    await test('a lost device (the GPU process crashes) ends the running request, and health() says so', async () => {
      const context = await crashing.newContext();
      const { page } = await newPage(context, 'lost');
      // A page of the site that only loads weft.js (module imports need its origin).
      await page.goto(`${base}/e2e/blank.html`);
      await page.evaluate(async (modelUrl) => {
        const { createEngine } = await import('/weft.js');
        const engine = await createEngine({ modelUrl });
        window.lost = { chunks: 0, before: await engine.health() };
        const stream = await engine.completions.create({ prompt: 'a', max_tokens: 1500, temperature: 0, ignore_eos: true, stream: true });
        window.lost.done = (async () => {
          try {
            for await (const chunk of stream) window.lost.chunks += chunk.choices.length;
            window.lost.ended = 'without an error';
          } catch (e) {
            window.lost.ended = `${e.name}: ${e.message}`;
          }
          window.lost.after = await engine.health();
        })();
      }, EXPECTED.tiny.url);
      await page.waitForFunction(() => window.lost.chunks >= 3, null, { timeout: 2 * MINUTE, polling: 50 });
      // What a driver reset or a GPU process crash does to a page: its WebGPU device is lost.
      const cdp = await crashing.newBrowserCDPSession();
      await cdp.send('Browser.crashGpuProcess');
      await page.waitForFunction(() => window.lost.after !== undefined, null, { timeout: 2 * MINUTE, polling: 100 });
      const lost = await page.evaluate(() => window.lost);
      check(lost.before?.healthy === true, `health() before the crash: ${show(lost.before)}`);
      check(/lost/i.test(lost.ended ?? "") && /reload the page/.test(lost.ended), `the running request ended ${show(lost.ended)} after ${lost.chunks} chunks`);
      check(lost.after?.healthy === false && /lost/i.test(lost.after.detail), `health() after the crash: ${show(lost.after)}`);
      await context.close();
      return `after ${lost.chunks} chunks: ${lost.ended}; health: ${lost.after.detail}`;
    });
  } finally {
    await crashing.close();
  }

  const plain = await launch(NO_WEBGPU);
  try {
    for (const [name, init] of [
      ['no WebGPU adapter: the page explains, no errors', null],
      // Init scripts run in the page only (not in workers): the page must notice on its own.
      ['no navigator.gpu at all: the page explains, no errors', () => { delete Navigator.prototype.gpu; }],
    ]) {
      await test(name, async () => {
        const context = await plain.newContext({ viewport: { width: 1280, height: 900 } });
        if (init) await context.addInitScript(init);
        const { page, errors } = await newPage(context, 'no-webgpu');
        await page.goto(`${base}/index.html`);
        await waitState(page, 'no-webgpu', 2 * MINUTE);
        const visible = await page.isVisible('#no-webgpu');
        const text = (await page.textContent('#no-webgpu')).replace(/\s+/g, ' ').trim();
        const loadDisabled = await page.isDisabled('#load');
        check(visible, '#no-webgpu is not visible');
        check(loadDisabled, '#load is enabled without WebGPU');
        await page.waitForTimeout(500); // let late errors surface
        check(errors.length === 0, `page errors: ${errors.map(String).join('; ')}`);
        if (!init) {
          const sw = await page.evaluate(async () => {
            const { createServiceWorkerEngine } = await import('/weft.js');
            try {
              await createServiceWorkerEngine({ modelUrl: '/test/tiny.gguf', storage: 'none' });
              return 'loaded';
            } catch (e) {
              return String(e.message);
            }
          });
          // The browser still has navigator.gpu in its workers; it finds no adapter there.
          check(/no GPU adapter found by WebGPU|WebGPU is not available to weft's Service Worker/.test(sw), `createServiceWorkerEngine without WebGPU: ${show(sw)}`);
          const shot = path.join(SHOTS, 'no-webgpu.png');
          await page.screenshot({ path: shot, fullPage: true });
          shots.push(shot);
        }
        await context.close();
        return show(text.slice(0, 160));
      });
    }
  } finally {
    await plain.close();
  }
  server.close();

  console.log('');
  for (const n of notes) console.log(`speed: ${n}`);
  for (const s of shots) console.log(`screenshot: ${s}`);
  console.log(`${passed} passed, ${failed} failed`);
  return failed === 0 && passed > 0;
}

// A stuck browser must not hang CI: give up after 45 minutes.
const watchdog = setTimeout(() => {
  console.log('FAIL the browser tests took over 45 minutes; giving up');
  process.exit(1);
}, 45 * MINUTE);
watchdog.unref();

main().then(
  (ok) => process.exit(ok ? 0 : 1),
  (e) => {
    console.log(`FAIL the browser tests could not run: ${e && e.stack ? e.stack : e}`);
    process.exit(1);
  },
);
