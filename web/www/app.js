// app.js — the logic of the weft demo page (index.html): load a model (the default one served
// next to the page, or a local .gguf), show the GPU adapter, and run four prompts concurrently
// with streaming output and tokens/s. Uses only the public API of weft.js.
//
// Test hooks (automated browser tests depend on these; keep them exactly):
//   document.body.dataset.state: "init" → "no-webgpu" | "idle" → "loading" → "ready" ⇄ "running";
//                                "error" when loading failed (#error then has the message).
//   URL query: model=<url>, maxTokens=<n>, temperature=<t>, autoload=1, p0..p3=<prompt text>.
//   Elements: #load, #model-file, #progress, #progress-text, #adapter, #model-info, #run-all,
//             #stop-all, #max-tokens, #temperature, #aggregate (data-tokens, data-tokens-per-second),
//             #error, #no-webgpu, #cache-status, #stored-list (li[data-key] per stored model,
//             each with button.delete; data-count on the list once it is drawn).
//   Panes: .pane[data-index=0..3][data-state=idle|running|done|stopped|error] containing
//          textarea.prompt, button.stop, button.run, .output (the streamed text, exactly),
//          .speed (data-tokens, data-tokens-per-second).
//   window.weftDemo = { engine, runAll, stopAll } once a model is loaded.

import { cacheUsage, createEngine, deleteCachedModel, listCachedModels, webgpuStatus, DEFAULT_MODEL_URL } from './weft.js';

window.weftBooted = true;

const $ = (sel, root = document) => root.querySelector(sel);
const query = new URLSearchParams(location.search);
const modelUrl = query.get('model') || DEFAULT_MODEL_URL;

const ui = {
  load: $('#load'),
  srcDefault: $('#src-default'),
  srcFile: $('#src-file'),
  file: $('#model-file'),
  modelUrlText: $('#model-url-text'),
  progress: $('#progress'),
  progressText: $('#progress-text'),
  cacheStatus: $('#cache-status'),
  engineBadge: $('#engine-badge'),
  modelInfo: $('#model-info'),
  adapterBadge: $('#adapter-badge'),
  adapterInfo: $('#adapter-info'),
  adapterNote: $('#adapter-note'),
  runAll: $('#run-all'),
  stopAll: $('#stop-all'),
  maxTokens: $('#max-tokens'),
  temperature: $('#temperature'),
  aggregate: $('#aggregate'),
  error: $('#error'),
  noWebgpu: $('#no-webgpu'),
  noWebgpuReason: $('#no-webgpu-reason'),
  storedList: $('#stored-list'),
  storedSummary: $('#stored-summary'),
};

const panes = [...document.querySelectorAll('.pane')].map((el) => ({
  el,
  index: Number(el.dataset.index),
  prompt: $('textarea.prompt', el),
  output: $('.output', el),
  speed: $('.speed', el),
  stop: $('button.stop', el),
  run: $('button.run', el),
  err: $('.pane-error', el),
  stateLabel: $('.pane-state', el),
  running: false,
  stopped: false,
  controller: null,
}));

const app = {
  engine: null,
  hasChat: true,
  loading: false,
  webgpu: false,
  session: null, // {t0, tLast, panes: Set, tokens}
};

// ---------------------------------------------------------------- helpers

function setState(s) {
  document.body.dataset.state = s;
}

function showError(message) {
  ui.error.textContent = message;
  ui.error.hidden = !message;
}

const mb = (bytes) => (bytes / 1e6).toFixed(1);
const mib = (bytes) => (bytes == null || Number.isNaN(Number(bytes)) ? '—' : `${Math.round(Number(bytes) / 1048576).toLocaleString('en-US')} MiB`);
const num = (n) => (n == null ? '—' : Number(n).toLocaleString('en-US'));
const yesNo = (b) => (b ? '<span class="yes">yes</span>' : '<span class="no">no</span>');

function escapeHtml(s) {
  return String(s ?? '').replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
}

function renderKv(dl, rows) {
  dl.innerHTML = rows
    .filter(([, v]) => v !== undefined)
    .map(([k, v, raw]) => `<dt>${escapeHtml(k)}</dt><dd>${raw ? v : escapeHtml(v)}</dd>`)
    .join('');
}

function setBadge(el, text, kind = '') {
  el.textContent = text;
  el.className = `badge${kind ? ` ${kind}` : ''}`;
}

function setProgress(fraction, text) {
  if (fraction == null) ui.progress.removeAttribute('value');
  else ui.progress.value = Math.max(0, Math.min(1, fraction));
  ui.progressText.textContent = text;
}

function anyRunning() {
  return panes.some((p) => p.running);
}

function refreshControls() {
  const loaded = Boolean(app.engine);
  const running = anyRunning();
  ui.load.disabled = !app.webgpu || app.loading || running;
  ui.runAll.disabled = !loaded || running;
  ui.stopAll.disabled = !running;
  for (const p of panes) {
    p.run.disabled = !loaded || p.running;
    p.stop.disabled = !p.running;
  }
  if (loaded && !app.loading) setState(running ? 'running' : 'ready');
}

// ---------------------------------------------------------------- adapter and model cards

// When the engine runs without a feature the adapter has, say so (wgpu cannot request
// subgroups on the web yet, and no kernel family uses shader-f16).
function offeredNote(used, offered, lo, hi) {
  if (used || !offered) return '';
  const sizes = lo ? ` (size ${lo === hi ? lo : `${lo}–${hi}`})` : '';
  return ` <span class="muted">— offered by the adapter${sizes}; weft's kernels here do without it</span>`;
}

// What each kernel family of weft is for (the engine picks one per adapter).
const KERNEL_NOTES = {
  baseline: 'core WebGPU, for GPUs',
  cpu: 'for a GPU emulated on the CPU',
  subgroup: 'GPUs with fixed-size subgroups',
};

function renderAdapter(a, fromEngine) {
  // What the adapter offers beyond what the engine uses (the worker fills this in).
  const o = a.offered || {};
  const name = a.name || a.description || [a.vendor, a.architecture, a.device].filter(Boolean).join(' ') || 'WebGPU adapter';
  const lim = a.limits || {};
  let subgroups = yesNo(a.subgroups);
  if (a.subgroups && (a.subgroupMinSize || a.subgroupMaxSize)) {
    const lo = a.subgroupMinSize;
    const hi = a.subgroupMaxSize;
    subgroups += ` <span class="muted">(size ${lo === hi ? lo : `${lo}–${hi}`})</span>`;
  }
  const rows = [
    ['Name', name],
    ['Vendor', a.vendor || undefined],
    ['Architecture', a.architecture || undefined],
    ['Backend', a.backend || (fromEngine ? '—' : 'WebGPU')],
    ['Driver', [a.driver, a.driverInfo].filter(Boolean).join(' ') || undefined],
    ['shader-f16', yesNo(a.shaderF16) + offeredNote(a.shaderF16, o.shaderF16), true],
    ['Subgroups', subgroups + offeredNote(a.subgroups, o.subgroups, o.subgroupMinSize, o.subgroupMaxSize), true],
    ['Timestamp queries', yesNo(a.timestampQuery), true],
    ['Kernels', a.kernels ? `${escapeHtml(a.kernels)} <span class="muted">(${escapeHtml(KERNEL_NOTES[a.kernels] || '')})</span>` : undefined, true],
    ['Max storage binding', mib(lim.maxStorageBufferBindingSize)],
    ['Max buffer', mib(lim.maxBufferSize)],
    ['Workgroup invocations', num(lim.maxComputeInvocationsPerWorkgroup)],
    ['Workgroup storage', lim.maxComputeWorkgroupStorageSize == null ? '—' : `${(lim.maxComputeWorkgroupStorageSize / 1024).toLocaleString('en-US')} KiB`],
    ['Storage buffers / stage', num(lim.maxStorageBuffersPerShaderStage)],
  ];
  renderKv(ui.adapterInfo, rows);
  if (fromEngine) {
    setBadge(ui.adapterBadge, 'in use by the engine', 'ok');
    ui.adapterNote.textContent = '';
  } else {
    setBadge(ui.adapterBadge, a.isFallbackAdapter ? 'software fallback' : 'available', a.isFallbackAdapter ? 'warn' : 'ok');
    ui.adapterNote.textContent = 'As seen by the page; the engine requests its own adapter in the worker when the model loads.';
  }
}

function renderModel(m, bytes) {
  renderKv(ui.modelInfo, [
    ['Name', m.name || '—'],
    ['Architecture', m.architecture || '—'],
    ['Layers', num(m.layers)],
    ['Hidden size', num(m.hidden)],
    ['Vocabulary', num(m.vocab)],
    ['Context length', num(m.contextLength)],
    ['File size', bytes ? `${mb(bytes)} MB` : undefined],
    ['Kernels compiled', num(m.kernels)],
    ['Chat template', m.hasChatTemplate ? '<span class="yes">yes</span> <span class="muted">— chat completions</span>' : '<span class="no">no</span> <span class="muted">— text completions</span>', true],
  ]);
}

// ---------------------------------------------------------------- loading

const STAGES = {
  download: 'Downloading the model',
  cache: 'Reading the part of the model downloaded before',
  upload: 'Uploading to the GPU',
};

function onProgress({ stage, loaded, total, fraction }) {
  const label = STAGES[stage] || stage;
  const step = stage === 'upload' ? '(2/2)' : '(1/2)';
  let text;
  if (stage === 'upload') {
    text = fraction == null ? `${label}… ${step}` : `${label}… ${Math.round(fraction * 100)}% ${step}`;
  } else if (total > 0) {
    text = `${label}… ${mb(loaded)} / ${mb(total)} MB (${Math.round((fraction ?? 0) * 100)}%) ${step}`;
  } else {
    text = `${label}… ${mb(loaded)} MB ${step}`;
  }
  setProgress(fraction, text);
}

function onWarning(message) {
  ui.cacheStatus.textContent = message;
  ui.cacheStatus.className = 'small warn';
}

async function load() {
  if (app.loading || !app.webgpu || anyRunning()) return;
  const useFile = ui.srcFile.checked;
  const file = ui.file.files && ui.file.files[0];
  if (useFile && !file) {
    showError('Choose a .gguf file first (or pick the default model).');
    return;
  }
  showError('');
  app.loading = true;
  setState('loading');
  refreshControls();
  setBadge(ui.engineBadge, 'loading…', 'busy');
  ui.cacheStatus.textContent = '';
  ui.cacheStatus.className = 'muted small';
  setProgress(0, useFile ? `Reading ${file.name}…` : 'Starting…');

  if (app.engine) {
    const old = app.engine;
    app.engine = null;
    window.weftDemo = undefined;
    try {
      await old.dispose();
    } catch { /* ignore */ }
  }

  try {
    const engine = await createEngine({
      modelUrl: useFile ? undefined : modelUrl,
      modelFile: useFile ? file : undefined,
      onProgress,
      onWarning,
    });
    const model = engine.modelInfo();
    app.engine = engine;
    app.hasChat = Boolean(model.hasChatTemplate);
    window.weftDemo = { engine, runAll, stopAll };

    renderAdapter(engine.adapterInfo(), true);
    renderModel(model, engine.modelBytes);
    setProgress(1, `Ready: ${model.name || 'model'} is on the GPU.`);
    setBadge(ui.engineBadge, 'ready', 'ok');

    const size = engine.modelBytes ? `${mb(engine.modelBytes)} MB` : '';
    if (useFile) {
      ui.cacheStatus.textContent = `Local file (${size}), read from disk; local files are not cached.`;
      ui.cacheStatus.className = 'muted small';
    } else if (engine.fromCache) {
      ui.cacheStatus.textContent = `Model loaded from the browser cache (${size}), no download needed.`;
      ui.cacheStatus.className = 'small ok';
    } else if (engine.cached) {
      ui.cacheStatus.textContent = `Model downloaded (${size}) and cached; the next visit loads it from the browser cache.`;
      ui.cacheStatus.className = 'small ok';
    } else {
      onWarning(engine.warnings[0] || `Model downloaded (${size}) but not cached; it will download again next time.`);
    }
    app.loading = false;
    refreshControls();
  } catch (e) {
    app.loading = false;
    app.engine = null;
    showError(`Loading the model failed: ${e?.message || e}`);
    setBadge(ui.engineBadge, 'failed', 'err');
    setProgress(0, 'Loading failed.');
    setState('error');
    refreshControls();
  }
  await renderStored();
}

// ---------------------------------------------------------------- stored models

/** Lists the models this browser keeps for the site, each with a button that deletes it. */
async function renderStored() {
  let models;
  let used;
  try {
    [models, used] = await Promise.all([listCachedModels(), cacheUsage()]);
  } catch (e) {
    ui.storedSummary.textContent = `(unavailable: ${e?.message || e})`;
    return;
  }
  const quota = used.quota ? ` of ${mb(used.quota)} MB allowed` : '';
  ui.storedSummary.textContent = `(${models.length}, ${mb(used.modelBytes)} MB${quota})`;
  ui.storedList.replaceChildren(...models.map((m) => {
    const li = document.createElement('li');
    li.dataset.key = m.key;
    const size = m.complete ? `${mb(m.bytes ?? 0)} MB` : `${mb(m.bytes ?? 0)} of ${mb(m.size ?? 0)} MB, resumes on the next load`;
    li.textContent = `${m.hub ? `${m.hub.repo}: ` : ''}${m.name} (${size}; ${m.storage === 'opfs' ? 'OPFS' : 'Cache API'}) `;
    const del = document.createElement('button');
    del.type = 'button';
    del.className = 'btn delete';
    del.textContent = 'Delete';
    del.addEventListener('click', async () => {
      del.disabled = true;
      try {
        await deleteCachedModel(m);
      } catch (e) {
        showError(`Deleting ${m.name} failed: ${e?.message || e}`);
      }
      await renderStored();
    });
    li.append(del);
    return li;
  }));
  ui.storedList.dataset.count = String(models.length);
}

// ---------------------------------------------------------------- generation

function readMaxTokens() {
  const n = Math.round(Number(ui.maxTokens.value));
  if (!Number.isFinite(n) || n < 1) return 128;
  return n;
}

function readTemperature() {
  const t = Number(ui.temperature.value);
  if (!Number.isFinite(t) || t < 0) return 0;
  return Math.min(t, 2);
}

function setPaneState(p, s) {
  p.el.dataset.state = s;
  p.stateLabel.textContent = s;
}

function setSpeed(p, tokens, seconds) {
  const tps = seconds > 0 ? tokens / seconds : 0;
  p.speed.dataset.tokens = String(tokens);
  p.speed.dataset.tokensPerSecond = tps.toFixed(2);
  p.speed.textContent = `${tokens} tokens · ${tps.toFixed(1)} tok/s · ${seconds.toFixed(2)} s`;
}

function renderAggregate(final) {
  const s = app.session;
  if (!s) return;
  let tokens = 0;
  for (const p of s.panes) tokens += p.liveTokens ?? 0;
  const end = final ? s.tLast : performance.now();
  const seconds = Math.max(0, (end - s.t0) / 1000);
  const tps = seconds > 0 ? tokens / seconds : 0;
  ui.aggregate.dataset.tokens = String(tokens);
  ui.aggregate.dataset.tokensPerSecond = tps.toFixed(2);
  ui.aggregate.textContent =
    `Aggregate: ${tokens} tokens in ${seconds.toFixed(2)} s · ${tps.toFixed(1)} tok/s (${s.panes.size} concurrent)`;
}

function isNearBottom(el) {
  return el.scrollHeight - el.scrollTop - el.clientHeight < 40;
}

async function runPane(p) {
  const engine = app.engine;
  if (!engine || p.running) return;

  if (!app.session || !anyRunning()) app.session = { t0: performance.now(), tLast: 0, panes: new Set() };
  const session = app.session;
  session.panes.add(p);

  p.running = true;
  p.stopped = false;
  p.controller = new AbortController();
  p.liveTokens = 0;
  p.output.textContent = '';
  const text = document.createTextNode('');
  p.output.append(text);
  p.err.hidden = true;
  p.err.textContent = '';
  setPaneState(p, 'running');
  setSpeed(p, 0, 0);
  refreshControls();

  const common = {
    max_tokens: readMaxTokens(),
    temperature: readTemperature(),
    seed: 1000 + p.index,
    stream: true,
    stream_options: { include_usage: true },
    signal: p.controller.signal,
  };
  const prompt = p.prompt.value;
  const t0 = performance.now();
  let chunks = 0;
  let usage = null;
  let finish = null;
  let final = 'done';

  try {
    const stream = app.hasChat
      ? await engine.chat.completions.create({ messages: [{ role: 'user', content: prompt }], ...common })
      : await engine.completions.create({ prompt, ...common });
    p.requestId = stream.id;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices ?? []) {
        const piece = app.hasChat ? c.delta?.content : c.text;
        if (piece) {
          const stick = isNearBottom(p.output);
          text.appendData(piece);
          chunks += 1;
          if (stick) p.output.scrollTop = p.output.scrollHeight;
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
      p.liveTokens = usage?.completion_tokens ?? chunks;
      setSpeed(p, p.liveTokens, (performance.now() - t0) / 1000);
      renderAggregate(false);
    }
    final = finish === 'abort' || p.stopped ? 'stopped' : 'done';
  } catch (e) {
    if (e?.name === 'AbortError') {
      final = 'stopped';
    } else {
      final = 'error';
      p.err.textContent = e?.message || String(e);
      p.err.hidden = false;
    }
  }

  const t1 = performance.now();
  const tokens = usage?.completion_tokens ?? chunks;
  p.liveTokens = tokens;
  setSpeed(p, tokens, (t1 - t0) / 1000);
  p.running = false;
  p.controller = null;
  session.tLast = Math.max(session.tLast, t1);
  setPaneState(p, final);
  if (!anyRunning()) renderAggregate(true);
  else renderAggregate(false);
  refreshControls();
}

function runAll() {
  if (!app.engine || anyRunning()) return Promise.resolve();
  // Start all four in the same task so the engine batches them from the first step.
  return Promise.all(panes.map((p) => runPane(p)));
}

function stopPane(p) {
  if (!p.running || !p.controller) return;
  p.stopped = true;
  p.controller.abort();
}

function stopAll() {
  for (const p of panes) stopPane(p);
}

// ---------------------------------------------------------------- start

function applyQuery() {
  ui.modelUrlText.textContent = modelUrl;
  if (query.has('model')) {
    ui.srcDefault.closest('.choice').querySelector('.choice-title').textContent = 'Model from the page address';
  }
  if (query.has('maxTokens')) ui.maxTokens.value = query.get('maxTokens');
  if (query.has('temperature')) ui.temperature.value = query.get('temperature');
  for (const p of panes) {
    const v = query.get(`p${p.index}`);
    if (v !== null) p.prompt.value = v;
  }
}

function wire() {
  ui.load.addEventListener('click', () => load());
  ui.file.addEventListener('change', () => {
    if (ui.file.files && ui.file.files.length) ui.srcFile.checked = true;
  });
  ui.file.addEventListener('click', () => { ui.srcFile.checked = true; });
  ui.runAll.addEventListener('click', () => runAll());
  ui.stopAll.addEventListener('click', () => stopAll());
  for (const p of panes) {
    p.stop.addEventListener('click', () => stopPane(p));
    p.run.addEventListener('click', () => runPane(p));
    p.prompt.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        runPane(p);
      }
    });
  }
  window.addEventListener('unhandledrejection', (e) => {
    console.error('weft demo:', e.reason);
  });
}

async function main() {
  setState('init');
  ui.aggregate.dataset.tokens = '0';
  ui.aggregate.dataset.tokensPerSecond = '0';
  applyQuery();
  wire();
  refreshControls();

  const gpu = await webgpuStatus();
  if (!gpu.available) {
    app.webgpu = false;
    ui.noWebgpuReason.textContent = gpu.reason;
    ui.noWebgpu.hidden = false;
    renderKv(ui.adapterInfo, [['Adapter', 'none: WebGPU is not available in this browser']]);
    setBadge(ui.adapterBadge, 'unavailable', 'err');
    setBadge(ui.engineBadge, 'needs WebGPU', 'err');
    ui.progressText.textContent = 'Loading is disabled: this browser has no usable WebGPU.';
    refreshControls();
    setState('no-webgpu');
    return;
  }
  app.webgpu = true;
  renderStored();
  renderAdapter(gpu.adapter, false);
  refreshControls();
  setState('idle');
  if (query.get('autoload') === '1') load();
}

main().catch((e) => {
  console.error(e);
  showError(`The demo failed to start: ${e?.message || e}`);
  setState('error');
});
