// Types of weft-llm, written by hand from the API that weft.js documents in its header.
// Request fields weft refuses (audio, prediction, reasoning_effort, functions, …) are left out
// on purpose, so that the compiler flags them before the engine would.

// ---- createEngine ---------------------------------------------------------------------------

/** Where loading is: downloading (or reading what an interrupted download kept), or uploading to the GPU (the file read a tensor at a time). */
export interface LoadProgress {
  stage: 'download' | 'cache' | 'upload';
  /** Bytes for download/cache; the engine's own units for upload. */
  loaded: number;
  /** 0 when unknown. */
  total: number;
  /** loaded / total, or null when total is unknown. */
  fraction: number | null;
}

/** Engine options; every one may be left out. */
export interface EngineOptions {
  /**
   * Fraction of the device's memory weft may use in all, weights included (vLLM's meaning,
   * default 0.9). A browser reports no memory size, so it applies to the largest buffer the
   * device allows; on a CPU adapter (SwiftShader) the KV cache gets 256 MiB instead.
   */
  gpuMemoryUtilization?: number;
  /** GPU memory for the KV cache, in MiB, instead of sizing it from gpuMemoryUtilization. */
  kvMemoryMiB?: number;
  /** Most sequences in one batch. */
  maxNumSeqs?: number;
  /** Longest sequence (prompt and completion) in tokens. */
  maxModelLen?: number;
  /** Token budget of one engine step. */
  maxNumBatchedTokens?: number;
  /** Speculative decoding by prompt lookup; the output does not change. */
  specNgram?: boolean;
  /** Most tokens drafted per request and step with specNgram (default 4). */
  specTokens?: number;
  /** LoRA adapters resident at once, hence distinct adapters in one step (default 1 once maxLoraRank is set). */
  maxLoras?: number;
  /** The highest LoRA rank served (default 16 once maxLoras is set). */
  maxLoraRank?: number;
  /** Force a kernel family instead of the one weft picks for the adapter. */
  kernels?: KernelFamily;
  /**
   * 'f16' holds twice the tokens, moving logits by about 1e-3; 'f32' keeps the reference's values
   * (default: 'f16' where the adapter has shader-f16, else 'f32').
   */
  kvCacheDtype?: 'f32' | 'f16';
}

export type KernelFamily = 'baseline' | 'cpu' | 'subgroup';

export interface CreateEngineOptions {
  /** 'hf:OWNER/REPO[:QUANT]' (a GGUF file of a Hugging Face hub repository); any other string is a modelUrl. */
  model?: string;
  /**
   * URL of a .gguf file, relative to the page. Give model, modelUrl or modelFile: the package
   * ships no model, and the default (models/SmolLM2-135M-Instruct.Q4_1.gguf next to weft.js)
   * exists only on weft's demo page.
   */
  modelUrl?: string | URL;
  /** A .gguf file picked by the user; wins over model and modelUrl. */
  modelFile?: Blob;
  /** The hub to ask for hf: names (a mirror); default the Hugging Face hub. */
  hfEndpoint?: string;
  /** Sent to the hub (never to its storage) for private or gated repositories. */
  hfToken?: string;
  /** Where a downloaded model is kept (default 'cache-api'); see StorageKind. */
  storage?: StorageKind;
  onProgress?: (progress: LoadProgress) => void;
  /** Non-fatal problems, such as a model the browser would not cache (default: console.warn). */
  onWarning?: (message: string) => void;
  options?: EngineOptions;
  /** Where weft-worker.js lives, when a bundler did not place it next to weft.js. */
  workerUrl?: string | URL;
}

/** Starts the engine in a Web Worker and loads a model. Rejects with an Error saying what failed. */
export function createEngine(options?: CreateEngineOptions): Promise<WeftEngine>;

export interface CreateServiceWorkerEngineOptions extends Omit<CreateEngineOptions, 'workerUrl'> {
  /** Where weft-service-worker.js is served, when not next to weft.js (bundlers do not bundle it). */
  serviceWorkerUrl?: string | URL;
}

/**
 * Starts (or attaches to) the engine in a Service Worker shared by every tab of the origin: the
 * model stays loaded across reloads, and all tabs' requests share its batches (engine.shared
 * says whether it was loaded already). Needs WebGPU in service workers (Chrome and Edge 124+).
 */
export function createServiceWorkerEngine(options?: CreateServiceWorkerEngineOptions): Promise<WeftEngine>;

/** The model the demo page loads when none is given, relative to weft.js (not in the package). */
export const DEFAULT_MODEL_URL: string;

// ---- Models kept in the browser ---------------------------------------------------------------

/**
 * 'cache-api': the Cache API, which keeps only whole files (a cut transfer resumes within the
 * load). 'opfs': the origin private file system, written as the bytes arrive, so a download a
 * closed tab or a dead network interrupted resumes on the next load. 'none': nothing kept.
 */
export type StorageKind = 'cache-api' | 'opfs' | 'none';

/** A model this site keeps. */
export interface CachedModel {
  /** The store's key: the model's URL, or for an hf: model `<hub>/<repo>/blobs/<sha256>`. */
  key: string;
  /** The file's name. */
  name: string;
  storage: Exclude<StorageKind, 'none'>;
  /** Bytes kept; null while a load is writing them. */
  bytes: number | null;
  /** The whole file's size, where known. */
  size: number | null;
  /** False for a download that stopped partway (OPFS): the next load resumes it. */
  complete: boolean;
  /** Which hub file it is, for a model named hf:. */
  hub: { repo: string; file: string; commit: string; why: string } | null;
  /** When it was stored (ISO 8601), where known. */
  savedAt: string | null;
}

/**
 * A model as createEngine takes it: a URL (relative to the page) or an hf: name (resolved
 * through the hub listing kept with it, offline), or an entry of listCachedModels().
 */
export type ModelRef = string | URL | CachedModel;

export interface CacheLookupOptions {
  /** The hub an hf: name was loaded from, when not the default. */
  hfEndpoint?: string;
}

export interface CacheUsage {
  /** What the kept models take. */
  modelBytes: number;
  /** The browser's estimate of all this site stores, and of what it may; null where unknown. */
  usage: number | null;
  quota: number | null;
  /** Whether the browser promised not to evict this site's storage (navigator.storage.persist()). */
  persisted: boolean;
}

/** Every model this site keeps, whole or partly downloaded. */
export function listCachedModels(): Promise<CachedModel[]>;
/** Whether a whole copy is kept, so that loading it needs no download. Left out: the default model. */
export function hasModelInCache(model?: ModelRef, options?: CacheLookupOptions): Promise<boolean>;
/** Deletes every copy, whole or partial; false when there was none. Rejects while an engine downloads it into OPFS. */
export function deleteCachedModel(model?: ModelRef, options?: CacheLookupOptions): Promise<boolean>;
export function cacheUsage(): Promise<CacheUsage>;

// ---- WebGPU ---------------------------------------------------------------------------------

export interface AdapterLimits {
  maxStorageBufferBindingSize: number;
  maxBufferSize: number;
  maxComputeInvocationsPerWorkgroup: number;
  maxComputeWorkgroupStorageSize: number;
  maxStorageBuffersPerShaderStage: number;
}

/** The adapter as the browser describes it, before any engine exists. */
export interface WebGpuAdapterSummary {
  name: string;
  vendor: string;
  architecture: string;
  device: string;
  description: string;
  isFallbackAdapter: boolean;
  shaderF16: boolean;
  subgroups: boolean;
  subgroupMinSize: number | null;
  subgroupMaxSize: number | null;
  timestampQuery: boolean;
  limits: AdapterLimits;
}

export type WebGpuStatus =
  | { available: true; reason: ''; adapter: WebGpuAdapterSummary }
  | { available: false; reason: string; adapter: null };

/** Whether this browser can run weft, and if not, why and what to do. Never rejects. */
export function webgpuStatus(): Promise<WebGpuStatus>;

// ---- the engine -----------------------------------------------------------------------------

/** The adapter the engine runs on: wgpu's view, filled in from WebGPU's where wgpu knows nothing. */
export interface AdapterInfo {
  name: string;
  /** wgpu's vendor id, or WebGPU's vendor name when wgpu has none. */
  vendor: number | string;
  device: number;
  architecture: string;
  description: string;
  backend: string;
  driver: string;
  driverInfo: string;
  shaderF16: boolean;
  subgroups: boolean;
  subgroupMinSize: number;
  subgroupMaxSize: number;
  timestampQuery: boolean;
  /** The kernel family in use. */
  kernels: KernelFamily;
  limits: AdapterLimits;
  /** What WebGPU itself offers, including features the engine does not use. */
  offered: WebGpuAdapterSummary | null;
}

export interface ModelInfo {
  name: string;
  architecture: string;
  layers: number;
  hidden: number;
  vocab: number;
  /** The context length the model was trained for. */
  contextLength: number;
  hasChatTemplate: boolean;
  /** The longest sequence this engine serves. */
  maxModelLen: number;
  /** How many tokens the KV cache holds, over all sequences. */
  kvTokens: number;
  /** What the KV cache holds. */
  kvCacheDtype: 'f32' | 'f16';
  /** GPU kernels compiled while loading (seconds each on a CPU adapter such as SwiftShader). */
  kernels: number;
  /** The thinking model family whose reasoning is split off, or null. */
  reasoningParser: string | null;
  /** Present when specNgram is on. */
  speculation?: { drafter: 'promptLookup'; specTokens: number };
  /** The LoRA adapters served, by name (a request's model selects one). */
  loras: string[];
}

/** Where a LoRA adapter comes from: one of url, file or files. */
export interface LoraSource {
  /** The name requests give as their model. */
  name: string;
  /** A llama.cpp GGUF LoRA file (ending .gguf), or a PEFT adapter folder. */
  url?: string;
  /** A GGUF LoRA file. */
  file?: Blob;
  /** A PEFT adapter's adapter_config.json and adapter_model.safetensors. */
  files?: { config: Blob; safetensors: Blob };
}

export interface HubChoice {
  repo: string;
  file: string;
  commit: string;
  /** Why this file of the repository. */
  why: string;
}

export interface HealthReport {
  healthy: boolean;
  /** What is wrong and what to do (reload the page for a new device), or what was checked. */
  detail: string;
}

export declare class WeftEngine {
  private constructor();
  readonly chat: {
    readonly completions: {
      create(params: ChatCompletionCreateParamsStreaming): Promise<WeftStream<ChatCompletionChunk>>;
      create(params: ChatCompletionCreateParamsNonStreaming): Promise<ChatCompletion>;
      create(params: ChatCompletionCreateParams): Promise<WeftStream<ChatCompletionChunk> | ChatCompletion>;
    };
  };
  readonly completions: {
    create(params: CompletionCreateParamsStreaming): Promise<WeftStream<Completion>>;
    create(params: CompletionCreateParamsNonStreaming): Promise<Completion>;
    create(params: CompletionCreateParams): Promise<WeftStream<Completion> | Completion>;
  };
  /** True if the model came from the browser cache. */
  readonly fromCache: boolean;
  /** True if the model is in the browser cache now. */
  readonly cached: boolean;
  /** Size of the model file in bytes. */
  readonly modelBytes: number;
  /** The engine's WebAssembly memory in bytes after the load (its peak; the model is never whole in it). */
  readonly wasmMemoryBytes: number | null;
  /** Every warning so far. */
  readonly warnings: string[];
  /** For a model named hf:…, which file was loaded and why; otherwise null. */
  readonly hub: HubChoice | null;
  /** A Service Worker engine attached to a model another engine had loaded already. */
  readonly shared: boolean;
  adapterInfo(): AdapterInfo;
  modelInfo(): ModelInfo;
  /** Aborts a running request by id; true if it was running. */
  abort(id: string): boolean;
  /** Serve a LoRA adapter (needs the maxLoras option); rejects with a WeftError saying why it does not fit. */
  loadLora(source: LoraSource): Promise<void>;
  /** Stop serving a LoRA adapter. */
  unloadLora(name: string): Promise<void>;
  /** A small round trip to the GPU. */
  health(): Promise<HealthReport>;
  /** Ends the worker and frees the GPU; pending requests end with a WeftError. */
  dispose(): Promise<void>;
}

/**
 * A streamed request: iterate it once with `for await`. Leaving the loop early aborts the
 * request; an aborted request ends with a chunk whose finish_reason is 'abort'.
 */
export declare class WeftStream<Chunk> implements AsyncIterable<Chunk> {
  private constructor();
  /** The request id, also every chunk's id. */
  readonly id: string;
  /** Aborting it aborts the request. */
  readonly controller: AbortController;
  abort(): void;
  [Symbol.asyncIterator](): AsyncIterator<Chunk>;
  toReadableStream(): ReadableStream<Chunk>;
}

/** A rejected request (status 400) or a failure during generation. */
export declare class WeftError extends Error {
  constructor(message: string, fields?: { type?: string | null; param?: string | null; code?: string | null; status?: number });
  readonly name: 'WeftError';
  /** OpenAI's error type: 'invalid_request_error', 'server_error', … */
  readonly type: string | null;
  /** The request field at fault. */
  readonly param: string | null;
  readonly code: string | null;
  /** 400 for a refused request; absent for failures during generation. */
  readonly status?: number;
  /** The same fields as an OpenAI error object. */
  readonly error: { message: string; type: string | null; param: string | null; code: string | null };
}

// ---- requests -------------------------------------------------------------------------------

/** A JSON Schema object, passed through to the constraint compiler. */
export type JsonSchema = { [key: string]: unknown } | boolean;

/** Fields both endpoints read: OpenAI's, then vLLM's extensions. */
export interface CommonCreateParams {
  /** Ignored apart from its type: the engine serves one model. */
  model?: string;
  max_tokens?: number | null;
  max_completion_tokens?: number | null;
  temperature?: number | null;
  top_p?: number | null;
  /** 1 to 16 choices; choice i is seeded seed + i. */
  n?: number | null;
  seed?: number | null;
  stop?: string | string[] | null;
  frequency_penalty?: number | null;
  presence_penalty?: number | null;
  /** Up to 300 token ids (as strings) to biases from -100 to 100. */
  logit_bias?: { [tokenId: string]: number } | null;
  stream_options?: { include_usage?: boolean } | null;
  /** The prefix cache lives in memory only. */
  prompt_cache_retention?: 'in_memory' | null;
  top_k?: number;
  min_p?: number;
  repetition_penalty?: number;
  ignore_eos?: boolean;
  stop_token_ids?: number[];
  priority?: number;
  /** Force the output to match: json_object or a JSON Schema. */
  response_format?:
    | { type: 'text' }
    | { type: 'json_object' }
    | { type: 'json_schema'; json_schema: { name?: string; description?: string; schema: JsonSchema; strict?: boolean | null } };
  /** vLLM's form of structured output. */
  structured_outputs?: {
    json?: JsonSchema;
    regex?: string;
    choice?: string[];
    grammar?: string;
    json_object?: boolean;
    disable_fallback?: boolean;
    disable_any_whitespace?: boolean;
    disable_additional_properties?: boolean;
    whitespace_pattern?: string;
  };
  guided_json?: JsonSchema;
  guided_regex?: string;
  guided_choice?: string[];
  guided_grammar?: string;
  /** llama.cpp's GBNF grammar. */
  grammar?: string;
  json_schema?: JsonSchema;
  /** Aborts the request. */
  signal?: AbortSignal;
  // Accepted and ignored: they change nothing about the answer.
  user?: string;
  metadata?: { [key: string]: string } | null;
  store?: boolean | null;
  service_tier?: string | null;
  prompt_cache_key?: string;
  safety_identifier?: string;
}

export interface TextContentPart {
  type: 'text';
  text: string;
}

export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

export type ChatMessage =
  | { role: 'system' | 'developer'; content: string | TextContentPart[]; name?: string }
  | { role: 'user'; content: string | TextContentPart[]; name?: string }
  | { role: 'assistant'; content?: string | TextContentPart[] | null; name?: string; tool_calls?: ToolCall[]; reasoning_content?: string | null }
  | { role: 'tool'; content: string | TextContentPart[]; tool_call_id: string };

export interface FunctionTool {
  type: 'function';
  function: { name: string; description?: string; parameters?: JsonSchema; strict?: boolean | null };
}

export type ToolChoice = 'auto' | 'none' | 'required' | { type: 'function'; function: { name: string } };

export interface ChatCompletionCreateParamsBase extends CommonCreateParams {
  messages: ChatMessage[];
  /** Log-probabilities of the chosen tokens, with top_logprobs alternatives each. */
  logprobs?: boolean | null;
  top_logprobs?: number | null;
  tools?: FunctionTool[];
  tool_choice?: ToolChoice;
  parallel_tool_calls?: boolean;
  /** Variables for the model's chat template (vLLM), e.g. {enable_thinking: false}. */
  chat_template_kwargs?: { [key: string]: unknown };
  modalities?: ['text'];
}

export interface ChatCompletionCreateParamsStreaming extends ChatCompletionCreateParamsBase {
  stream: true;
}

export interface ChatCompletionCreateParamsNonStreaming extends ChatCompletionCreateParamsBase {
  stream?: false | null;
}

export type ChatCompletionCreateParams = ChatCompletionCreateParamsStreaming | ChatCompletionCreateParamsNonStreaming;

export interface CompletionCreateParamsBase extends CommonCreateParams {
  /** Text, or token ids. */
  prompt: string | number[];
  /** Log-probabilities with this many alternatives each. */
  logprobs?: number | null;
  echo?: false | null;
  best_of?: 1 | null;
}

export interface CompletionCreateParamsStreaming extends CompletionCreateParamsBase {
  stream: true;
}

export interface CompletionCreateParamsNonStreaming extends CompletionCreateParamsBase {
  stream?: false | null;
}

export type CompletionCreateParams = CompletionCreateParamsStreaming | CompletionCreateParamsNonStreaming;

// ---- responses (OpenAI's shapes) ------------------------------------------------------------

/** 'abort' when the request was aborted; 'tool_calls' when the answer is tool calls. */
export type FinishReason = 'stop' | 'length' | 'tool_calls' | 'abort';

export interface CompletionUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}

export interface ChatTokenLogprob {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

export interface ChatLogprobs {
  content: ChatTokenLogprob[];
}

export interface CompletionLogprobs {
  tokens: string[];
  token_logprobs: number[];
  top_logprobs: { [token: string]: number }[];
  text_offset: number[];
}

export interface ChatCompletionMessage {
  role: 'assistant';
  content: string | null;
  /** A thinking model's reasoning, apart from content. */
  reasoning_content?: string | null;
  tool_calls?: ToolCall[];
}

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: {
    index: number;
    message: ChatCompletionMessage;
    logprobs: ChatLogprobs | null;
    finish_reason: FinishReason;
  }[];
  usage: CompletionUsage;
}

export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  /** Empty in the last chunk of a stream with include_usage. */
  choices: {
    index: number;
    delta: {
      role?: 'assistant';
      content?: string | null;
      reasoning_content?: string | null;
      /** Each call whole, at its index among the choice's calls. */
      tool_calls?: (ToolCall & { index: number })[];
    };
    logprobs: ChatLogprobs | null;
    finish_reason: FinishReason | null;
  }[];
  /** Only in the last chunk, with stream_options.include_usage. */
  usage?: CompletionUsage | null;
}

/** A text completion; streamed, each chunk has this shape too. */
export interface Completion {
  id: string;
  object: 'text_completion';
  created: number;
  model: string;
  choices: {
    index: number;
    text: string;
    logprobs: CompletionLogprobs | null;
    finish_reason: FinishReason | null;
  }[];
  usage?: CompletionUsage | null;
}
