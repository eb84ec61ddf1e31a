// Every function, option and method of weft-llm, type-checked by `cargo xtask test-web`
// (tsc --strict against the packed package): a type that drifts from weft.js breaks the build.

import {
  createEngine,
  createServiceWorkerEngine,
  webgpuStatus,
  listCachedModels,
  hasModelInCache,
  deleteCachedModel,
  cacheUsage,
  WeftError,
  DEFAULT_MODEL_URL,
  type CachedModel,
  type CacheUsage,
  type ChatCompletion,
  type ChatCompletionChunk,
  type Completion,
  type HealthReport,
  type LoadProgress,
  type WeftEngine,
  type WeftStream,
} from 'weft-llm';

async function main(file: Blob | undefined): Promise<void> {
  const gpu = await webgpuStatus();
  if (!gpu.available) throw new Error(gpu.reason);
  const f16: boolean = gpu.adapter.shaderF16;
  const binding: number = gpu.adapter.limits.maxStorageBufferBindingSize;

  const engine: WeftEngine = await createEngine({
    model: 'hf:bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M',
    modelUrl: new URL(DEFAULT_MODEL_URL, location.href),
    modelFile: file,
    hfEndpoint: 'http://localhost:8000',
    hfToken: 'hf_x',
    storage: 'opfs',
    onProgress: ({ stage, loaded, total, fraction }: LoadProgress) =>
      console.log(stage, loaded, total, fraction === null ? '?' : `${Math.round(fraction * 100)}%`),
    onWarning: (message: string) => console.warn(message),
    workerUrl: '/assets/weft-worker.js',
    options: {
      gpuMemoryUtilization: 0.9,
      kvMemoryMiB: 256,
      maxNumSeqs: 16,
      maxModelLen: 2048,
      maxNumBatchedTokens: 512,
      specNgram: true,
      specTokens: 4,
      kernels: 'baseline',
      kvCacheDtype: 'f16',
      maxLoras: 2,
      maxLoraRank: 16,
    },
  });

  const adapter = engine.adapterInfo();
  const model = engine.modelInfo();
  console.log(adapter.name, adapter.backend, adapter.kernels, adapter.limits.maxBufferSize, f16, binding);
  console.log(model.architecture, model.layers, model.maxModelLen, model.kvTokens, model.kvCacheDtype, model.reasoningParser, model.speculation?.specTokens);
  console.log(engine.fromCache, engine.cached, engine.modelBytes, engine.warnings.join('\n'), engine.hub?.why);

  // Streaming chat: a typed async iterable of chunks.
  const controller = new AbortController();
  const stream: WeftStream<ChatCompletionChunk> = await engine.chat.completions.create({
    messages: [
      { role: 'system', content: 'You are terse.' },
      { role: 'user', content: [{ type: 'text', text: 'What is 2 + 3?' }] },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'add', arguments: '{"a":2,"b":3}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '5' },
    ],
    tools: [{ type: 'function', function: { name: 'add', parameters: { type: 'object' } } }],
    tool_choice: 'auto',
    parallel_tool_calls: false,
    max_tokens: 64,
    temperature: 0.7,
    top_p: 0.9,
    top_k: 40,
    min_p: 0.05,
    repetition_penalty: 1.1,
    seed: 1,
    n: 2,
    stop: ['\n\n'],
    stop_token_ids: [2],
    logit_bias: { '42': -100 },
    logprobs: true,
    top_logprobs: 2,
    chat_template_kwargs: { enable_thinking: false },
    stream: true,
    stream_options: { include_usage: true },
    signal: controller.signal,
  });
  console.log(stream.id, stream.controller.signal.aborted);
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    const text: string = choice?.delta.content ?? choice?.delta.reasoning_content ?? '';
    const call = choice?.delta.tool_calls?.[0];
    console.log(choice?.index, text, call?.function.name, choice?.logprobs?.content[0]?.logprob, choice?.finish_reason);
    if (chunk.usage) console.log(chunk.usage.total_tokens);
  }

  // Whole chat response, constrained to a JSON Schema.
  const res: ChatCompletion = await engine.chat.completions.create({
    messages: [{ role: 'user', content: 'Name a color as JSON.' }],
    max_completion_tokens: 32,
    response_format: {
      type: 'json_schema',
      json_schema: { name: 'color', strict: true, schema: { type: 'object', properties: { color: { type: 'string' } } } },
    },
  });
  const message = res.choices[0].message;
  console.log(message.content, message.reasoning_content, message.tool_calls?.length, res.usage.prompt_tokens_details.cached_tokens);

  // Text completions: streamed, aborted by id, and whole.
  const textStream: WeftStream<Completion> = await engine.completions.create({
    prompt: 'Once upon a time',
    max_tokens: 32,
    stream: true,
    guided_choice: ['yes', 'no'],
  });
  console.log(engine.abort(textStream.id));
  const reader = textStream.toReadableStream().getReader();
  for (let r = await reader.read(); !r.done; r = await reader.read()) console.log(r.value.choices[0]?.text);

  const later = await engine.completions.create({ prompt: [1, 2, 3], max_tokens: 8, stream: true, grammar: 'root ::= "a"' });
  later.abort();

  const whole: Completion = await engine.completions.create({
    prompt: 'The capital of France is',
    max_tokens: 8,
    logprobs: 1,
    echo: false,
    best_of: 1,
    structured_outputs: { regex: '[A-Z][a-z]+' },
    ignore_eos: false,
    priority: 0,
    user: 'example',
  });
  console.log(whole.choices[0].text, whole.choices[0].logprobs?.token_logprobs[0], whole.usage?.completion_tokens);

  // Whether streaming is decided at run time: the union of both results.
  const either = await engine.completions.create({ prompt: 'Hi', stream: Math.random() < 0.5 });
  if (either instanceof Object && 'choices' in either) console.log(either.object);

  try {
    await engine.chat.completions.create({ messages: [{ role: 'user', content: 'x' }], n: 99 });
  } catch (e) {
    if (e instanceof WeftError) console.log(e.message, e.type, e.param, e.code, e.status, e.error.param);
  }

  // LoRA adapters: a GGUF file by URL, a PEFT folder by URL, a PEFT adapter's two files.
  await engine.loadLora({ name: 'sql', url: '/adapters/sql.gguf' });
  await engine.loadLora({ name: 'chat', url: '/adapters/chat' });
  const config = new Blob(['{}']);
  await engine.loadLora({ name: 'local', files: { config, safetensors: new Blob([]) } });
  console.log(engine.modelInfo().loras.join(', '));
  await engine.chat.completions.create({ model: 'sql', messages: [{ role: 'user', content: 'x' }] });
  await engine.unloadLora('local');

  const health: HealthReport = await engine.health();
  if (!health.healthy) console.error(health.detail);
  await engine.dispose();

  // One engine for every tab of the origin.
  const sharedEngine: WeftEngine = await createServiceWorkerEngine({ modelUrl: '/m.gguf', serviceWorkerUrl: '/weft/weft-service-worker.js', storage: 'cache-api' });
  console.log(sharedEngine.shared);
  await sharedEngine.dispose();

  // The models this site keeps.
  const kept: CachedModel[] = await listCachedModels();
  for (const m of kept) console.log(m.name, m.storage, m.complete ? 'whole' : `${m.bytes} of ${m.size}`, m.hub?.repo);
  const used: CacheUsage = await cacheUsage();
  console.log(used.modelBytes, used.usage, used.quota, used.persisted);
  const name = 'hf:bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M';
  if (await hasModelInCache(name, { hfEndpoint: 'http://localhost:8000' })) await deleteCachedModel(name);
  if (kept[0]) await deleteCachedModel(kept[0]);
  await deleteCachedModel(new URL('/m.gguf', location.href));
}

void main(undefined);
