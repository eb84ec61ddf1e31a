//! `weft bench`: measure throughput and latency at several concurrency levels, either in-process
//! (the engine with its background loop) or against a running `weft serve` over HTTP.
//!
//! For each prompt length and concurrency N, each repeat first times a lone prompt's first
//! token (prefill tokens/s), then sends N requests at the same moment: prompts of
//! --prompt-len tokens, greedy, generating exactly --gen-len tokens (end-of-sequence ignored).
//! Every token's arrival time is recorded; from those come the per-sequence decode rate (the
//! median inter-token latency), the aggregate rate, and latency percentiles. In-process, the
//! engine's step records add the host and GPU time per step, and the device's allocations and
//! the process's peak memory are reported. Every figure is the median over --repeats.
//! `--profile` then times every kernel of some decode steps on the GPU and splits the host's
//! time per step.
//!
//! In-process, `--task` picks the prompts (random token ids, a copy task, ordinary chat) and the
//! speculation flags turn on speculative decoding; each run then also reports the drafted and
//! accepted tokens, the acceptance rate and the tokens gained per verifying step.
//!
//! `--constrained F` puts a fraction F of each run's requests under a JSON schema (structured
//! output; a list of records that never completes within --gen-len, so every request still
//! generates exactly that many tokens): the cost of token masks next to unconstrained requests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use weft::EngineBuilder;
use weft::constraint::{Constraint, Grammar};
use weft::engine::metrics::{EngineMetrics, StepRecord};
use weft::engine::request::{GenerationParams, InferenceRequest, Prompt};
use weft::engine::{ContinuousBatchEngine, EngineConfig};
use weft::gpu::{FakeAdapter, GpuContext, GpuOptions};
use weft::sampling::SamplingParams;
use weft::tokenizer::ChatMessage;
use weft::{Result, WeftError};

pub struct Options {
    pub model: Option<PathBuf>,
    pub url: Option<String>,
    pub api_key: Option<String>,
    pub concurrency: Vec<usize>,
    pub prompt_len: Vec<usize>,
    pub gen_len: usize,
    pub repeats: usize,
    /// None: room for every request of the largest level at once.
    pub kv_memory_bytes: Option<usize>,
    /// `None`: f16 where the GPU has shader-f16, else f32 (as `weft serve`).
    pub kv_cache_dtype: Option<weft::DType>,
    pub json: bool,
    pub profile: bool,
    /// Fraction of each run's requests generated under a JSON schema.
    pub constrained: f64,
    pub task: Task,
    /// Tokens every request of a run begins with (random task; 0: none, prefix cache off).
    pub shared_prefix: usize,
    /// Requests sent per second in a run (in-process); `None`: all at once.
    pub request_rate: Option<f64>,
    pub speculation: crate::generate::Speculation,
    /// Every request's temperature, top-k and top-p (greedy by default); each request gets its
    /// own seed, the same from run to run.
    pub sampling: SamplingParams,
    /// Run on a fake discrete GPU (wgpu's no-op backend): GPU time is zero, so the figures are
    /// the host's alone, with each step's phases.
    pub host_only: bool,
    /// Measure the adapter's copy bandwidth and the weight bytes a decode step reads.
    pub bandwidth: bool,
}

/// The prompts of an in-process run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Task {
    /// Random token ids, --prompt-len of them.
    Random,
    /// "Repeat this list": a chat request to copy a numbered list of about --prompt-len tokens.
    Copy,
    /// Ordinary chat questions.
    Chat,
}

/// The schema of `--constrained` requests: records with strings, bounded integers and enums,
/// and more of them than fit in any --gen-len (request `i` asks for `1000 + i`, so every
/// request compiles its own grammar).
fn bench_schema(i: usize) -> Value {
    json!({
        "type": "array",
        "minItems": 1000 + i,
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 12},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
            },
            "required": ["name", "age", "tags"],
            "additionalProperties": false,
        },
    })
}

/// Whether request `i` of `n` is constrained: the first `round(fraction × n)`.
fn is_constrained(fraction: f64, i: usize, n: usize) -> bool {
    (i as f64) < (fraction * n as f64).round()
}

/// One request's timeline.
struct Trace {
    /// When it was sent.
    start: Instant,
    prompt_tokens: usize,
    completion_tokens: usize,
    /// Arrival of each piece of output with the number of tokens in it.
    arrivals: Vec<(Instant, usize)>,
}

/// One (concurrency, prompt length) run: medians over the repeats. Fields the target cannot
/// report (GPU figures against a server) are `None`.
#[derive(Clone, Debug, Default)]
struct Run {
    concurrency: usize,
    prompt_len: usize,
    gen_len: usize,
    prefill_tok_s: f64,
    decode_tok_s_per_seq: f64,
    aggregate_tok_s: f64,
    ttft_ms: [f64; 2],
    itl_ms: [f64; 2],
    host_ms_per_step: Option<f64>,
    gpu_ms_per_step: Option<f64>,
    gpu_mem_mib: Option<f64>,
    host_rss_mib: Option<f64>,
    /// Speculative decoding during the run, summed over the repeats (in-process with
    /// speculation only).
    speculation: Option<SpecCounts>,
    /// Mean host time computing token masks per step that had constrained rows (in-process
    /// with --constrained only).
    token_mask_ms_per_step: Option<f64>,
    /// Where a decode step's time goes (in-process only).
    phases: Option<Phases>,
}

/// Medians over a run's widest decode steps (steps in which every sequence decodes one token,
/// as many sequences as any such step of the run had: all of the level's where they decoded
/// together) of where a step's time went, in ms, and the command submissions per step of the
/// whole run.
#[derive(Clone, Copy, Debug, Default)]
struct Phases {
    /// Sequences in the steps measured. On a fake GPU a level's requests can finish their
    /// prefills steps apart, and a step takes microseconds: its widest decodes may hold fewer
    /// than all of them.
    seqs: usize,
    schedule: f64,
    record: f64,
    encode: f64,
    submit: f64,
    /// Waiting for the GPU and the readback, `ahead` included.
    wait: f64,
    /// Encoding the next step's commands while the GPU runs this one (inside `wait`).
    ahead: f64,
    output: f64,
    /// A whole step, end to end.
    step: f64,
    submissions_per_step: f64,
}

impl Phases {
    /// From the widest decode steps of `steps` and the submissions made during the run; `None`
    /// when the run had no decode step.
    fn of(steps: &[StepRecord], submissions: u64) -> Option<Phases> {
        let is_decode = |s: &&StepRecord| s.num_tokens == s.num_seqs;
        let seqs = steps.iter().filter(is_decode).map(|s| s.num_seqs).max()?;
        let decodes: Vec<&StepRecord> = steps.iter().filter(is_decode).filter(|s| s.num_seqs == seqs).collect();
        let med = |f: &dyn Fn(&StepRecord) -> f64| median(decodes.iter().map(|s| f(s) * 1e3).collect());
        Some(Phases {
            seqs,
            schedule: med(&|s| s.timings.schedule_s),
            record: med(&|s| s.timings.record_s),
            encode: med(&|s| s.timings.encode_s),
            submit: med(&|s| s.timings.submit_s),
            wait: med(&|s| s.timings.wait_s),
            ahead: med(&|s| s.timings.ahead_s),
            output: med(&|s| s.timings.output_s),
            step: med(&|s| s.timings.host_s() + s.timings.wait_s),
            submissions_per_step: submissions as f64 / steps.len() as f64,
        })
    }

    fn json(&self) -> Value {
        json!({
            "seqs": self.seqs, "schedule_ms": self.schedule, "record_ms": self.record, "encode_ms": self.encode,
            "submit_ms": self.submit, "wait_ms": self.wait, "ahead_ms": self.ahead, "output_ms": self.output,
            "step_ms": self.step, "steps_per_s": 1e3 / self.step.max(1e-9),
            "submissions_per_step": self.submissions_per_step,
        })
    }
}

/// Speculative decoding's counts over some steps.
#[derive(Clone, Copy, Debug, Default)]
struct SpecCounts {
    drafted: u64,
    accepted: u64,
    verify_steps: u64,
}

impl SpecCounts {
    fn between(before: &EngineMetrics, after: &EngineMetrics) -> SpecCounts {
        SpecCounts {
            drafted: after.spec_drafted_tokens - before.spec_drafted_tokens,
            accepted: after.spec_accepted_tokens - before.spec_accepted_tokens,
            verify_steps: after.spec_verify_steps - before.spec_verify_steps,
        }
    }

    fn add(self, other: SpecCounts) -> SpecCounts {
        SpecCounts {
            drafted: self.drafted + other.drafted,
            accepted: self.accepted + other.accepted,
            verify_steps: self.verify_steps + other.verify_steps,
        }
    }

    fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 { 0.0 } else { self.accepted as f64 / self.drafted as f64 }
    }

    /// Tokens a verifying sequence-step gained: its accepted drafts plus the token it samples.
    fn mean_accepted_len(&self) -> f64 {
        if self.verify_steps == 0 { 0.0 } else { (self.accepted + self.verify_steps) as f64 / self.verify_steps as f64 }
    }

    fn json(&self) -> Value {
        json!({
            "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            "acceptance_rate": self.acceptance_rate(),
            "mean_accepted_len": self.mean_accepted_len(),
        })
    }
}

fn bad(msg: impl Into<String>) -> WeftError {
    WeftError::Unsupported(msg.into())
}

pub fn run(opts: Options) -> Result<()> {
    if opts.concurrency.is_empty() || opts.concurrency.contains(&0) {
        return Err(bad("invalid --concurrency: give positive numbers, e.g. 1,4,16"));
    }
    if opts.prompt_len.is_empty() || opts.prompt_len.contains(&0) || opts.gen_len == 0 {
        return Err(bad("--prompt-len and --gen-len must be at least 1"));
    }
    if opts.repeats == 0 {
        return Err(bad("--repeats must be at least 1"));
    }
    if opts.request_rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return Err(bad("--request-rate must be a positive number of requests per second, e.g. 2 or 0.5"));
    }
    if opts.shared_prefix > 0 && opts.task != Task::Random {
        return Err(bad("--shared-prefix takes --task random (chat prompts share their template's system prompt)"));
    }
    if opts.prompt_len.iter().any(|&p| p <= opts.shared_prefix) {
        return Err(bad(format!(
            "--shared-prefix {} leaves nothing of its own to a --prompt-len of at most that: give a longer prompt",
            opts.shared_prefix
        )));
    }
    if !(0.0..=1.0).contains(&opts.constrained) {
        return Err(bad(format!("invalid --constrained {}: a fraction between 0 and 1", opts.constrained)));
    }
    opts.sampling.validate().map_err(|e| bad(format!("invalid sampling flags: {e}")))?;
    let (adapter, model, runs) = match &opts.url {
        Some(url) => {
            let target = HttpTarget::parse(url, opts.api_key.clone())?;
            let mut runs = Vec::new();
            for &prompt_len in &opts.prompt_len {
                for (i, &n) in opts.concurrency.iter().enumerate() {
                    let mut repeats = Vec::new();
                    for r in 0..opts.repeats {
                        let level = i * 1000 + r;
                        // Prefill: a lone prompt's time to its first (and only) token.
                        let lone = target.run_level(level + 500, 1, prompt_len, 1, 0.0, &opts.sampling)?;
                        let traces =
                            target.run_level(level, n, prompt_len, opts.gen_len, opts.constrained, &opts.sampling)?;
                        let mut run = summarize(n, prompt_len, opts.gen_len, &traces, None);
                        run.prefill_tok_s = prefill_rate(&lone, prompt_len);
                        repeats.push(run);
                    }
                    runs.push(median_run(&repeats));
                }
            }
            (Value::Null, url.clone(), runs)
        }
        None => run_in_process(&opts)?,
    };
    if opts.json {
        let runs: Vec<Value> = runs.iter().map(run_json).collect();
        let mut doc = json!({"adapter": adapter, "model": model, "repeats": opts.repeats, "runs": runs});
        // Only with speculation or another task: the default document is exactly the issue's.
        if let Some(c) = &opts.speculation.config {
            doc["speculation"] = json!({
                "drafter": match &opts.speculation.draft_model {
                    Some(path) => json!({"draft_model": path.display().to_string()}),
                    None => json!("prompt_lookup"),
                },
                "num_speculative_tokens": c.num_speculative_tokens,
                "max_batch_size": c.max_batch_size,
            });
        }
        if opts.bandwidth {
            doc["decode_read_bytes"] = json!(decode_read_bytes(&opts)?);
        }
        if opts.task != Task::Random && opts.url.is_none() {
            doc["task"] = json!(task_name(opts.task));
        }
        if opts.constrained > 0.0 {
            doc["constrained"] = json!(opts.constrained);
        }
        let SamplingParams { temperature, top_k, top_p, .. } = opts.sampling;
        if temperature > 0.0 {
            doc["sampling"] = json!({"temperature": temperature, "top_k": top_k, "top_p": top_p});
        }
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        if let Some(name) = adapter["name"].as_str() {
            println!(
                "adapter: {name} ({}), model: {model}, medians of {} repeats",
                adapter["backend"].as_str().unwrap_or(""),
                opts.repeats
            );
        }
        print_table(&runs);
        if let Some(rate) = adapter["copy_gb_s"].as_f64() {
            let read = decode_read_bytes(&opts)?.map_or("–".into(), |b| format!("{:.3} GB", b as f64 / 1e9));
            println!("copy bandwidth {rate:.1} GB/s (reads and writes); a decode step reads {read} of weights");
        }
        if opts.host_only {
            print_phases(&runs);
        }
    }
    Ok(())
}

/// The weight bytes one decode step reads from a GGUF model: every tensor once but the token
/// embeddings, of which it reads one row per sequence (unless they are the output matrix too).
/// None for a Hugging Face directory.
fn decode_read_bytes(opts: &Options) -> Result<Option<u64>> {
    let path = crate::generate::model_path(opts.model.clone())?;
    if path.is_dir() {
        return Ok(None);
    }
    let gguf = weft::model::gguf::GgufFile::open(&path)?;
    let tied = gguf.tensor("output.weight").is_none();
    Ok(Some(gguf.tensors.iter().filter(|t| tied || t.name != "token_embd.weight").map(|t| t.size_bytes()).sum()))
}

fn run_json(r: &Run) -> Value {
    let mut v = json!({
        "concurrency": r.concurrency,
        "prompt_len": r.prompt_len,
        "gen_len": r.gen_len,
        "prefill_tok_s": r.prefill_tok_s,
        "decode_tok_s_per_seq": r.decode_tok_s_per_seq,
        "aggregate_tok_s": r.aggregate_tok_s,
        "ttft_ms_p50": r.ttft_ms[0],
        "ttft_ms_p99": r.ttft_ms[1],
        "itl_ms_p50": r.itl_ms[0],
        "itl_ms_p99": r.itl_ms[1],
        "host_ms_per_step_p50": r.host_ms_per_step,
        "gpu_ms_per_step_p50": r.gpu_ms_per_step,
        "gpu_mem_mib": r.gpu_mem_mib,
        "host_rss_mib": r.host_rss_mib,
    });
    if let Some(s) = &r.speculation {
        v["speculation"] = s.json();
    }
    if let Some(ms) = r.token_mask_ms_per_step {
        v["token_mask_ms_per_step"] = json!(ms);
    }
    if let Some(p) = &r.phases {
        v["decode_step"] = p.json();
    }
    v
}

/// What a run's requests ask: the task, and its prompt and output lengths.
#[derive(Clone, Copy)]
struct Shape {
    task: Task,
    prompt_len: usize,
    gen_len: usize,
    /// The fraction of the requests under a JSON schema.
    constrained: f64,
    /// Tokens the requests of one call to [`requests`] begin with (random task).
    shared_prefix: usize,
}

/// `n` requests of `shape` with `sampling` (each its own seed), different for every request (so
/// nothing hits a cache; random token ids avoid the low, often special ones) but for the
/// shape's shared prefix, new to each call, generating exactly `gen_len` tokens.
fn requests(
    n: usize,
    shape: Shape,
    sampling: &SamplingParams,
    vocab: usize,
    serial: &mut usize,
) -> Vec<InferenceRequest> {
    // Ids above the low ones (often special tokens), or above the first eighth of a small
    // vocabulary.
    let low = (vocab / 8).min(1000);
    let usable = (vocab - low).max(1);
    let Shape { task, prompt_len, gen_len, constrained, shared_prefix } = shape;
    let prefix_offset = *serial * 7919 + 104_729;
    let prefix: Vec<u32> = (0..shared_prefix).map(|i| (low + (prefix_offset + 3 * i) % usable) as u32).collect();
    (0..n)
        .map(|j| {
            let offset = *serial * 7919;
            *serial += 1;
            let prompt = match task {
                Task::Random => Prompt::Tokens(
                    prefix
                        .iter()
                        .copied()
                        .chain((shared_prefix..prompt_len).map(|i| (low + (offset + i) % usable) as u32))
                        .collect(),
                ),
                Task::Copy => Prompt::Chat(vec![ChatMessage::user(copy_prompt(*serial as u64, prompt_len))]),
                Task::Chat => Prompt::Chat(vec![ChatMessage::user(chat_prompt(*serial))]),
            };
            let constraint = is_constrained(constrained, j, n)
                .then(|| Constraint::new("response_format", Grammar::JsonSchema(bench_schema(*serial))));
            let params = GenerationParams {
                sampling: SamplingParams { seed: Some(*serial as u64), ..sampling.clone() },
                max_tokens: Some(gen_len),
                ignore_eos: true,
                constraint,
                ..Default::default()
            };
            InferenceRequest::new(prompt, params)
        })
        .collect()
}

/// Run `requests` on the engine and time every token's arrival: all sent at once, or with
/// `rate`, request i sent i / rate seconds after the first (arrivals at a busy engine).
fn traces(engine: &ContinuousBatchEngine, requests: Vec<InferenceRequest>, rate: Option<f64>) -> Result<Vec<Trace>> {
    let n = requests.len();
    // A thread ticks when each request is due, so that the streams already sent keep being read
    // (and their tokens timed) while the next one waits.
    let (tick, mut ticks) = futures::channel::mpsc::unbounded::<()>();
    let ticker = std::thread::spawn(move || {
        let first = Instant::now();
        for i in 0..n {
            if let Some(rate) = rate {
                std::thread::sleep(
                    (first + Duration::from_secs_f64(i as f64 / rate)).saturating_duration_since(Instant::now()),
                );
            }
            if tick.unbounded_send(()).is_err() {
                break;
            }
        }
    });
    let out = weft::rt::block_on(async {
        let (sent, streams) = futures::channel::mpsc::unbounded();
        let send = async move {
            for r in requests {
                ticks.next().await;
                if sent.unbounded_send((Instant::now(), engine.infer_stream(r))).is_err() {
                    break;
                }
            }
        };
        let read = streams
            .map(|(start, stream): (Instant, Result<_>)| async move {
                let mut stream = Box::pin(stream?);
                let mut trace = Trace { start, prompt_tokens: 0, completion_tokens: 0, arrivals: Vec::new() };
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk?;
                    if !chunk.token_ids.is_empty() {
                        trace.arrivals.push((Instant::now(), chunk.token_ids.len()));
                    }
                    if let Some(u) = chunk.usage {
                        trace.prompt_tokens = u.prompt_tokens;
                        trace.completion_tokens = u.completion_tokens;
                    }
                }
                Ok::<Trace, WeftError>(trace)
            })
            .buffer_unordered(n.max(1))
            .collect::<Vec<_>>();
        let ((), traces) = futures::join!(send, read);
        traces.into_iter().collect::<Result<Vec<Trace>>>()
    });
    let _ = ticker.join();
    out
}

fn run_in_process(opts: &Options) -> Result<(Value, String, Vec<Run>)> {
    let path = crate::generate::model_path(opts.model.clone())?;
    let max_c = *opts.concurrency.iter().max().unwrap_or(&1);
    let max_p = *opts.prompt_len.iter().max().unwrap_or(&1);
    let config = EngineConfig {
        max_num_seqs: max_c,
        max_model_len: EngineConfig::default().max_model_len.max(max_p + opts.gen_len),
        // Every prompt differs but for a --shared-prefix, new to each run: only then can the
        // cache help, and it cannot make a later run look faster.
        enable_prefix_cache: opts.shared_prefix > 0,
        ..EngineConfig::default()
    };
    let fake_adapter = opts.host_only.then(FakeAdapter::discrete_gpu);
    let ctx = weft::rt::block_on(GpuContext::new(GpuOptions { fake_adapter, ..Default::default() }))?;
    // Before the model loads: the probe's buffers come and go while nothing else is resident.
    let copy_bytes_per_s = if opts.bandwidth { Some(weft::rt::block_on(ctx.copy_bandwidth())?) } else { None };
    let builder = opts.speculation.apply(EngineBuilder::from_model(&path)?)?;
    // By default the pool holds every request of the largest level at once (as the peer's
    // context does): no preemption, and memory figures comparable with other engines. Chat
    // and copy prompts are only about --prompt-len long; a block more covers drafted tokens.
    let tokens = match opts.task {
        Task::Random => max_p + opts.gen_len,
        _ => (max_p + opts.gen_len) * 5 / 4,
    } + 16;
    let dtype = opts.kv_cache_dtype.unwrap_or_else(|| builder.kv_dtype_on(&ctx));
    let builder = builder.kv_cache_dtype(dtype);
    // And at least one sequence of max_model_len, which the builder checks.
    let max_model_len = config.max_model_len.min(builder.model_config().max_position_embeddings);
    let kv_bytes = opts
        .kv_memory_bytes
        .unwrap_or_else(|| builder.kv_memory_for(max_c, tokens).max(builder.kv_memory_for(1, max_model_len)));
    let builder = builder.config(config).kv_memory_bytes(kv_bytes);
    let engine = builder.build_on(ctx.clone())?;
    engine.start_loop()?;
    let vocab = engine.tokenizer().vocab_size();
    if opts.task == Task::Random && vocab - (vocab / 8).min(1000) < max_p {
        return Err(bad(format!("--prompt-len {max_p} is more than the non-special token ids of this model")));
    }
    let mut serial = 0usize;
    // One short request first: pipelines compile, the workspace grows.
    let warm = Shape { task: Task::Random, prompt_len: 8, gen_len: 2, constrained: 0.0, shared_prefix: 0 };
    traces(&engine, requests(1, warm, &opts.sampling, vocab, &mut serial), None)?;
    let mut runs = Vec::new();
    for &prompt_len in &opts.prompt_len {
        for &n in &opts.concurrency {
            let mut repeats = Vec::new();
            let shape = Shape {
                task: opts.task,
                prompt_len,
                gen_len: opts.gen_len,
                constrained: opts.constrained,
                shared_prefix: opts.shared_prefix,
            };
            for _ in 0..opts.repeats {
                let lone = traces(
                    &engine,
                    requests(1, Shape { gen_len: 1, constrained: 0.0, ..shape }, &opts.sampling, vocab, &mut serial),
                    None,
                )?;
                engine.take_step_records();
                let before = engine.metrics();
                let submitted = ctx.submissions();
                let t = traces(&engine, requests(n, shape, &opts.sampling, vocab, &mut serial), opts.request_rate)?;
                let steps = engine.take_step_records();
                let mut run = summarize(n, prompt_len, opts.gen_len, &t, Some(&steps));
                run.phases = Phases::of(&steps, ctx.submissions() - submitted);
                run.prefill_tok_s = prefill_rate(&lone, prompt_len);
                run.gpu_mem_mib = Some(ctx.creations().bytes as f64 / (1 << 20) as f64);
                run.host_rss_mib = peak_rss_mib();
                let after = engine.metrics();
                if opts.speculation.config.is_some() {
                    run.speculation = Some(SpecCounts::between(&before, &after));
                }
                let (masks, mask_s) = (
                    after.token_mask_time.count - before.token_mask_time.count,
                    after.token_mask_time.sum - before.token_mask_time.sum,
                );
                if opts.constrained > 0.0 && masks > 0 {
                    run.token_mask_ms_per_step = Some(mask_s * 1e3 / masks as f64);
                }
                repeats.push(run);
            }
            runs.push(median_run(&repeats));
        }
    }
    if opts.profile {
        let gen_len = opts.gen_len.min(16);
        let shape = Shape {
            task: opts.task,
            prompt_len: opts.prompt_len[0],
            gen_len,
            constrained: opts.constrained,
            shared_prefix: opts.shared_prefix,
        };
        profile(&engine, &opts.concurrency, shape, &opts.sampling, vocab, &mut serial)?;
    }
    engine.shutdown();
    let info = ctx.adapter_info();
    let f = ctx.features();
    let features: Vec<&str> =
        [("shader-f16", f.shader_f16), ("subgroups", f.subgroups), ("timestamp-query", f.timestamp_query)]
            .into_iter()
            .filter_map(|(name, on)| on.then_some(name))
            .collect();
    let mut adapter = json!({
        "name": info.name,
        "backend": format!("{:?}", info.backend).to_lowercase(),
        "driver": format!("{} {}", info.driver, info.driver_info).trim().to_string(),
        "device_type": format!("{:?}", info.device_type),
        "features": features,
        "kernels": ctx.kernel_family().name(),
    });
    if let Some(rate) = copy_bytes_per_s {
        adapter["copy_gb_s"] = json!(rate / 1e9);
    }
    let model = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    Ok((adapter, model, runs))
}

/// Per-step GPU time by kernel (timestamps around every dispatch) and host time by phase, for
/// decode steps at each concurrency.
fn profile(
    engine: &ContinuousBatchEngine,
    levels: &[usize],
    shape: Shape,
    sampling: &SamplingParams,
    vocab: usize,
    serial: &mut usize,
) -> Result<()> {
    for &n in levels {
        // Decode steps of n sequences: first as served (host phases), then profiled (the GPU's
        // time by kernel: one pass per dispatch, so the host phases of those steps differ).
        let decodes = |steps: Vec<StepRecord>| -> Vec<StepRecord> {
            steps.into_iter().filter(|s| s.num_tokens == s.num_seqs && s.num_seqs == n).collect()
        };
        engine.take_step_records();
        traces(engine, requests(n, shape, sampling, vocab, serial), None)?;
        let served = decodes(engine.take_step_records());
        engine.set_profiling(true);
        traces(engine, requests(n, shape, sampling, vocab, serial), None)?;
        let all_profiled = engine.take_step_records();
        engine.set_profiling(false);
        let prefills: Vec<StepRecord> =
            all_profiled.iter().filter(|s| s.num_tokens > s.num_seqs && s.num_logits > 0).cloned().collect();
        let profiled = decodes(all_profiled);
        if served.is_empty() || profiled.is_empty() {
            continue;
        }
        let med = |f: &dyn Fn(&StepRecord) -> f64| median(served.iter().map(f).collect()) * 1e3;
        println!("\nprofile: decode steps of {n} sequences ({} dispatches each)", served[0].timings.dispatches);
        println!(
            "  host per step (median of {}): schedule {:.3} ms, record {:.3} ms, encode {:.3} ms, submit {:.3} ms = {:.3} ms; GPU {:.2} ms, wait {:.2} ms (of which {:.3} ms encoding the next step ahead)",
            served.len(),
            med(&|s| s.timings.schedule_s),
            med(&|s| s.timings.record_s),
            med(&|s| s.timings.encode_s),
            med(&|s| s.timings.submit_s),
            med(&|s| s.timings.host_s()),
            med(&|s| s.timings.gpu_s.unwrap_or(0.0)),
            med(&|s| s.timings.wait_s),
            med(&|s| s.timings.ahead_s),
        );
        print_kernels(&profiled);
        // The prompts' last chunks (the ones that sample): where prefill time goes.
        if let Some(first) = prefills.first() {
            println!(
                "profile: prefill steps ending {n} prompts of {} tokens ({} tokens, {} dispatches in the first)",
                shape.prompt_len, first.num_tokens, first.timings.dispatches
            );
            print_kernels(&prefills);
        }
    }
    Ok(())
}

/// GPU time per step by kernel, over profiled `steps`, largest first.
fn print_kernels(steps: &[StepRecord]) {
    let mut kernels: Vec<(String, f64)> = Vec::new();
    for s in steps {
        for (name, t) in &s.timings.kernels {
            match kernels.iter_mut().find(|(k, _)| k == name) {
                Some((_, total)) => *total += t,
                None => kernels.push((name.clone(), *t)),
            }
        }
    }
    kernels.sort_by(|a, b| b.1.total_cmp(&a.1));
    let count = steps.len() as f64;
    let gpu: f64 = kernels.iter().map(|(_, t)| t).sum::<f64>() / count * 1e3;
    println!("  GPU {gpu:.2} ms per step with every dispatch timed ({} steps), by kernel:", steps.len());
    for (name, t) in &kernels {
        let ms = t / count * 1e3;
        println!("    {ms:9.3} ms  {:5.1}%  {name}", 100.0 * ms / gpu.max(1e-12));
    }
}

/// Prompt tokens per second of a lone request: its prompt over its time to first token.
fn prefill_rate(lone: &[Trace], prompt_len: usize) -> f64 {
    let ttft = lone.first().and_then(|t| Some((t.arrivals.first()?.0 - t.start).as_secs_f64()));
    ttft.filter(|&s| s > 0.0).map_or(0.0, |s| prompt_len as f64 / s)
}

/// The process's peak resident memory (Linux), in MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

/// Field by field, the median of the repeats.
fn median_run(repeats: &[Run]) -> Run {
    let m = |f: &dyn Fn(&Run) -> f64| median(repeats.iter().map(f).collect());
    let opt = |f: &dyn Fn(&Run) -> Option<f64>| {
        let v: Vec<f64> = repeats.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median(v))
    };
    Run {
        concurrency: repeats[0].concurrency,
        prompt_len: repeats[0].prompt_len,
        gen_len: repeats[0].gen_len,
        prefill_tok_s: m(&|r| r.prefill_tok_s),
        decode_tok_s_per_seq: m(&|r| r.decode_tok_s_per_seq),
        aggregate_tok_s: m(&|r| r.aggregate_tok_s),
        ttft_ms: [m(&|r| r.ttft_ms[0]), m(&|r| r.ttft_ms[1])],
        itl_ms: [m(&|r| r.itl_ms[0]), m(&|r| r.itl_ms[1])],
        host_ms_per_step: opt(&|r| r.host_ms_per_step),
        gpu_ms_per_step: opt(&|r| r.gpu_ms_per_step),
        gpu_mem_mib: opt(&|r| r.gpu_mem_mib),
        host_rss_mib: opt(&|r| r.host_rss_mib),
        speculation: repeats.iter().filter_map(|r| r.speculation).reduce(SpecCounts::add),
        token_mask_ms_per_step: opt(&|r| r.token_mask_ms_per_step),
        phases: median_phases(repeats),
    }
}

/// Each phase's median over the repeats that measured one.
fn median_phases(repeats: &[Run]) -> Option<Phases> {
    let all: Vec<Phases> = repeats.iter().filter_map(|r| r.phases).collect();
    let m = |f: &dyn Fn(&Phases) -> f64| median(all.iter().map(f).collect());
    (!all.is_empty()).then(|| Phases {
        seqs: all.iter().map(|p| p.seqs).min().unwrap_or(0),
        schedule: m(&|p| p.schedule),
        record: m(&|p| p.record),
        encode: m(&|p| p.encode),
        submit: m(&|p| p.submit),
        wait: m(&|p| p.wait),
        ahead: m(&|p| p.ahead),
        output: m(&|p| p.output),
        step: m(&|p| p.step),
        submissions_per_step: m(&|p| p.submissions_per_step),
    })
}

/// Nearest-rank percentile of sorted values (0 when there are none).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summarize(
    concurrency: usize,
    prompt_len: usize,
    gen_len: usize,
    traces: &[Trace],
    steps: Option<&[StepRecord]>,
) -> Run {
    let begin = traces.iter().map(|t| t.start).min().unwrap_or_else(Instant::now);
    let mut ttft = Vec::new();
    let mut itl = Vec::new();
    let mut generated = 0;
    let mut end = begin;
    for t in traces {
        let count: usize = t.arrivals.iter().map(|a| a.1).sum();
        generated += t.completion_tokens.max(count);
        let Some(&(first, _)) = t.arrivals.first() else { continue };
        ttft.push((first - t.start).as_secs_f64() * 1e3);
        for w in t.arrivals.windows(2) {
            let gap = (w[1].0 - w[0].0).as_secs_f64() * 1e3;
            // A piece holding several tokens spreads its gap over them.
            for _ in 0..w[1].1.max(1) {
                itl.push(gap / w[1].1.max(1) as f64);
            }
        }
        if let Some(&(last, _)) = t.arrivals.last() {
            end = end.max(last);
        }
    }
    ttft.sort_by(f64::total_cmp);
    itl.sort_by(f64::total_cmp);
    let wall = (end - begin).as_secs_f64();
    let itl_p50 = percentile(&itl, 50.0);
    let host = steps.map(|s| median(s.iter().map(|r| r.timings.host_s() * 1e3).collect()));
    let gpu = steps.and_then(|s| {
        let v: Vec<f64> = s.iter().filter_map(|r| r.timings.gpu_s).map(|g| g * 1e3).collect();
        (!v.is_empty()).then(|| median(v))
    });
    Run {
        concurrency,
        prompt_len,
        gen_len,
        prefill_tok_s: 0.0,
        decode_tok_s_per_seq: if itl_p50 > 0.0 { 1e3 / itl_p50 } else { 0.0 },
        aggregate_tok_s: if wall > 0.0 { generated as f64 / wall } else { 0.0 },
        ttft_ms: [percentile(&ttft, 50.0), percentile(&ttft, 99.0)],
        itl_ms: [itl_p50, percentile(&itl, 99.0)],
        host_ms_per_step: host,
        gpu_ms_per_step: gpu,
        ..Default::default()
    }
}

fn print_table(runs: &[Run]) {
    let header = [
        "conc",
        "prompt",
        "gen",
        "prefill tok/s",
        "decode tok/s/seq",
        "total tok/s",
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "ITL p99",
        "host ms/step",
        "GPU ms/step",
        "GPU MiB",
        "RSS MiB",
    ];
    let opt = |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |x| format!("{x:.digits$}"));
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.concurrency.to_string(),
                r.prompt_len.to_string(),
                r.gen_len.to_string(),
                format!("{:.1}", r.prefill_tok_s),
                format!("{:.2}", r.decode_tok_s_per_seq),
                format!("{:.2}", r.aggregate_tok_s),
                format!("{:.1}", r.ttft_ms[0]),
                format!("{:.1}", r.ttft_ms[1]),
                format!("{:.1}", r.itl_ms[0]),
                format!("{:.1}", r.itl_ms[1]),
                opt(r.host_ms_per_step, 3),
                opt(r.gpu_ms_per_step, 1),
                opt(r.gpu_mem_mib, 0),
                opt(r.host_rss_mib, 0),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].len()).chain([header[i].len()]).max().unwrap_or(0))
        .collect();
    let line =
        |cells: Vec<&str>| cells.iter().zip(&widths).map(|(c, w)| format!("{c:>w$}")).collect::<Vec<_>>().join("  ");
    println!("{}", line(header.to_vec()));
    for r in &rows {
        println!("{}", line(r.iter().map(String::as_str).collect()));
    }
    println!(
        "(latencies in ms; prefill from a lone prompt's time to first token; decode per sequence from the median inter-token latency)"
    );
    for r in runs {
        if let Some(ms) = r.token_mask_ms_per_step {
            println!(
                "concurrency {}, prompt {}: token masks took {ms:.2} ms of host time per step",
                r.concurrency, r.prompt_len
            );
        }
        if let Some(s) = &r.speculation {
            println!(
                "concurrency {}, prompt {}: speculation drafted {}, accepted {} ({:.0}%), {:.2} tokens per verifying step",
                r.concurrency,
                r.prompt_len,
                s.drafted,
                s.accepted,
                100.0 * s.acceptance_rate(),
                s.mean_accepted_len()
            );
        }
    }
}

/// A decode step's phases per run, in microseconds: what the host costs a step when the GPU
/// takes no time (`--host-only`).
fn print_phases(runs: &[Run]) {
    println!("\nhost per decode step (median µs; a fake GPU, so the host is all a step costs):");
    println!(
        "{:>5} {:>6} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11}",
        "conc",
        "prompt",
        "seqs",
        "steps/s",
        "step",
        "schedule",
        "record",
        "encode",
        "submit",
        "wait",
        "(ahead)",
        "output",
        "submits/step"
    );
    for r in runs {
        let Some(p) = r.phases else { continue };
        println!(
            "{:>5} {:>6} {:>5} {:>9.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>11.2}",
            r.concurrency,
            r.prompt_len,
            p.seqs,
            1e3 / p.step.max(1e-9),
            p.step * 1e3,
            p.schedule * 1e3,
            p.record * 1e3,
            p.encode * 1e3,
            p.submit * 1e3,
            p.wait * 1e3,
            p.ahead * 1e3,
            p.output * 1e3,
            p.submissions_per_step
        );
    }
}

fn task_name(task: Task) -> &'static str {
    match task {
        Task::Random => "random",
        Task::Copy => "copy",
        Task::Chat => "chat",
    }
}

/// A copy task of about `len` tokens: repeat a numbered list of words (fixed per seed).
fn copy_prompt(seed: u64, len: usize) -> String {
    let items: Vec<String> =
        word_prompt(seed, len / 3 + 1).split(' ').enumerate().map(|(i, w)| format!("{}. {w}", i + 1)).collect();
    format!("Repeat this list exactly, one item per line:\n{}", items.join("\n"))
}

/// An ordinary chat question, one of a few.
fn chat_prompt(serial: usize) -> String {
    const QUESTIONS: &[&str] = &[
        "What are the main causes of the seasons on Earth?",
        "Give me three tips for writing clear emails.",
        "Why is the sky blue?",
        "How do plants make their food?",
        "What should I pack for a weekend hiking trip?",
        "Explain what a computer program is to a child.",
        "What is the difference between weather and climate?",
        "Suggest a simple recipe for dinner tonight.",
    ];
    QUESTIONS[serial % QUESTIONS.len()].to_string()
}

/// Common short words, most of them one token each in typical tokenizers.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "with", "as", "by", "at", "from", "his", "her", "they",
    "we", "you", "it", "this", "that", "be", "are", "have", "had", "not", "but", "or", "an", "one", "all", "were",
    "when", "there", "can", "more", "if", "out", "so", "up", "said", "what", "about", "time", "day", "year", "way",
    "man", "world", "life", "hand", "part", "child", "eye", "place", "work", "week", "case", "point", "house", "water",
    "room", "mother", "city", "home", "night", "light", "river", "tree", "road", "book", "game", "food", "music",
    "money", "story", "school", "green", "red", "blue", "small", "large", "old", "new", "good", "long", "great",
    "little", "high", "early", "young", "right", "open", "cold",
];

/// A prompt of about `len` tokens: `len` words drawn pseudo-randomly (fixed per seed).
fn word_prompt(seed: u64, len: usize) -> String {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut words = Vec::with_capacity(len);
    for _ in 0..len {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        words.push(WORDS[((state >> 33) % WORDS.len() as u64) as usize]);
    }
    words.join(" ")
}

/// A `weft serve` (or any OpenAI-compatible server) at an http:// URL.
struct HttpTarget {
    host: String,
    port: u16,
    base_path: String,
    api_key: Option<String>,
}

impl HttpTarget {
    fn parse(url: &str, api_key: Option<String>) -> Result<HttpTarget> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| bad(format!("invalid --url {url}: only http:// URLs are supported")))?;
        let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().map_err(|_| bad(format!("invalid --url {url}: bad port {p}")))?),
            None => (authority, 80),
        };
        if host.is_empty() {
            return Err(bad(format!("invalid --url {url}: no host")));
        }
        let mut base_path = format!("/{}", path.trim_end_matches('/'));
        // Accept both http://host:port and http://host:port/v1.
        if base_path.ends_with("/v1") {
            base_path.truncate(base_path.len() - 3);
        }
        Ok(HttpTarget { host: host.to_string(), port, base_path: base_path.trim_end_matches('/').to_string(), api_key })
    }

    fn run_level(
        &self,
        level: usize,
        n: usize,
        prompt_len: usize,
        gen_len: usize,
        constrained: f64,
        sampling: &SamplingParams,
    ) -> Result<Vec<Trace>> {
        let barrier = std::sync::Barrier::new(n);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    let barrier = &barrier;
                    let mut body = json!({
                        "prompt": word_prompt((level * 100_003 + i) as u64, prompt_len),
                        "max_tokens": gen_len,
                        "temperature": sampling.temperature,
                        "top_k": sampling.top_k,
                        "top_p": sampling.top_p,
                        "seed": level * n + i,
                        "ignore_eos": true,
                        "stream": true,
                        "stream_options": {"include_usage": true},
                    });
                    if is_constrained(constrained, i, n) {
                        body["guided_json"] = bench_schema(level * n + i);
                    }
                    let body = body.to_string();
                    s.spawn(move || {
                        barrier.wait();
                        self.completion(&body)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(bad("a client thread panicked")))).collect()
        })
    }

    /// POST one streaming completion and time its events.
    fn completion(&self, body: &str) -> Result<Trace> {
        let io = |e: std::io::Error| bad(format!("{}:{}: {e}", self.host, self.port));
        let start = Instant::now();
        let mut stream = TcpStream::connect((self.host.as_str(), self.port)).map_err(io)?;
        stream.set_read_timeout(Some(Duration::from_secs(600))).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        let mut head = format!(
            "POST {}/v1/completions HTTP/1.1\r\nHost: {}:{}\r\nConnection: close\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {}\r\n",
            self.base_path,
            self.host,
            self.port,
            body.len()
        );
        if let Some(key) = &self.api_key {
            head.push_str(&format!("Authorization: Bearer {key}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).map_err(io)?;
        stream.write_all(body.as_bytes()).map_err(io)?;
        let mut reader = BufReader::new(stream);

        let mut status_line = String::new();
        reader.read_line(&mut status_line).map_err(io)?;
        let status: u16 = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(format!("not an HTTP answer: {status_line:?}")))?;
        let mut chunked = false;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).map_err(io)? == 0 || line.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.to_ascii_lowercase().contains("chunked")
            {
                chunked = true;
            }
        }
        if status != 200 {
            let mut rest = Vec::new();
            let _ = reader.read_to_end(&mut rest);
            return Err(bad(format!("the server answered {status}: {}", String::from_utf8_lossy(&rest).trim())));
        }

        let mut trace = Trace { start, prompt_tokens: 0, completion_tokens: 0, arrivals: Vec::new() };
        let mut events = String::new();
        let mut on_bytes = |bytes: &[u8], trace: &mut Trace| -> Result<bool> {
            let now = Instant::now();
            events.push_str(&String::from_utf8_lossy(bytes));
            while let Some(end) = events.find("\n\n") {
                let event: String = events.drain(..end + 2).collect();
                for data in event.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim) {
                    if data == "[DONE]" {
                        return Ok(true);
                    }
                    let v: Value = serde_json::from_str(data).map_err(|e| bad(format!("a bad event ({e}): {data}")))?;
                    if let Some(err) = v.get("error") {
                        return Err(bad(format!("the server failed the request: {err}")));
                    }
                    if v["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()) {
                        trace.arrivals.push((now, 1));
                    }
                    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                        trace.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0) as usize;
                        trace.completion_tokens = u["completion_tokens"].as_u64().unwrap_or(0) as usize;
                    }
                }
            }
            Ok(false)
        };
        if chunked {
            loop {
                let mut size_line = String::new();
                if reader.read_line(&mut size_line).map_err(io)? == 0 {
                    break;
                }
                let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                    .map_err(|_| bad(format!("a bad chunk size: {size_line:?}")))?;
                if size == 0 {
                    break;
                }
                let mut data = vec![0u8; size + 2];
                reader.read_exact(&mut data).map_err(io)?;
                if on_bytes(&data[..size], &mut trace)? {
                    break;
                }
            }
        } else {
            let mut buf = [0u8; 8192];
            loop {
                let n = reader.read(&mut buf).map_err(io)?;
                if n == 0 || on_bytes(&buf[..n], &mut trace)? {
                    break;
                }
            }
        }
        // An event without text (a split multi-byte character) is not an arrival; throughput
        // still counts the server's completion_tokens.
        Ok(trace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn urls_parse() {
        let t = HttpTarget::parse("http://127.0.0.1:8000/v1/", None).unwrap();
        assert_eq!((t.host.as_str(), t.port, t.base_path.as_str()), ("127.0.0.1", 8000, ""));
        assert!(HttpTarget::parse("https://x", None).is_err());
    }
}
