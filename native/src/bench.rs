//! `weft bench`: measure throughput and latency at several concurrency levels, either in-process
//! (the engine with its background loop) or against a running `weft serve` over HTTP.
//!
//! At each level, N clients each send one request at the same moment: a prompt of about
//! --prompt-len tokens, greedy, generating exactly --gen-len tokens (end-of-sequence ignored).
//! Every token's arrival time is recorded; from those come prefill, decode and aggregate
//! throughput and the time-to-first-token and inter-token latency percentiles.
//!
//! `--constrained F` puts a fraction F of each level's requests under a JSON schema (structured
//! output; a list of records that never completes within --gen-len, so every request still
//! generates exactly that many tokens): the cost of token masks next to unconstrained requests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use weft::constraint::{Constraint, Grammar};
use weft::engine::EngineConfig;
use weft::EngineBuilder;
use weft::engine::request::{GenerationParams, InferenceRequest, Prompt};
use weft::sampling::SamplingParams;
use weft::{Result, WeftError};

pub struct Options {
    pub model: Option<PathBuf>,
    pub url: Option<String>,
    pub api_key: Option<String>,
    pub concurrency: Vec<usize>,
    pub prompt_len: usize,
    pub gen_len: usize,
    pub kv_memory_bytes: usize,
    pub json: bool,
    /// Fraction of each level's requests generated under a JSON schema.
    pub constrained: f64,
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

/// One concurrency level's results.
struct Level {
    concurrency: usize,
    prompt_tokens: usize,
    generated_tokens: usize,
    wall_s: f64,
    prefill_tps: f64,
    decode_tps: f64,
    aggregate_tps: f64,
    ttft_ms: [f64; 3],
    itl_ms: [f64; 3],
}

fn bad(msg: impl Into<String>) -> WeftError {
    WeftError::Unsupported(msg.into())
}

pub fn run(opts: Options) -> Result<()> {
    if opts.concurrency.is_empty() || opts.concurrency.contains(&0) {
        return Err(bad("invalid --concurrency: give positive numbers, e.g. 1,4,16"));
    }
    if opts.prompt_len == 0 || opts.gen_len == 0 {
        return Err(bad("--prompt-len and --gen-len must be at least 1"));
    }
    if !(0.0..=1.0).contains(&opts.constrained) {
        return Err(bad(format!("invalid --constrained {}: a fraction between 0 and 1", opts.constrained)));
    }
    let levels = match &opts.url {
        Some(url) => {
            let target = HttpTarget::parse(url, opts.api_key.clone())?;
            let mut levels = Vec::new();
            for (i, &n) in opts.concurrency.iter().enumerate() {
                levels.push(summarize(n, &target.run_level(i, n, opts.prompt_len, opts.gen_len, opts.constrained)?));
            }
            levels
        }
        None => run_in_process(&opts)?,
    };
    if opts.json {
        let levels: Vec<Value> = levels
            .iter()
            .map(|l| {
                json!({
                    "concurrency": l.concurrency,
                    "prompt_tokens": l.prompt_tokens,
                    "generated_tokens": l.generated_tokens,
                    "wall_s": l.wall_s,
                    "prefill_tokens_per_s": l.prefill_tps,
                    "decode_tokens_per_s": l.decode_tps,
                    "aggregate_tokens_per_s": l.aggregate_tps,
                    "ttft_ms": {"p50": l.ttft_ms[0], "p90": l.ttft_ms[1], "p99": l.ttft_ms[2]},
                    "itl_ms": {"p50": l.itl_ms[0], "p90": l.itl_ms[1], "p99": l.itl_ms[2]},
                })
            })
            .collect();
        let target = match &opts.url {
            Some(u) => json!({"url": u}),
            None => json!({"model": crate::generate::model_path(opts.model.clone())?.display().to_string()}),
        };
        let doc = json!({
            "target": target, "prompt_len": opts.prompt_len, "gen_len": opts.gen_len,
            "constrained": opts.constrained, "levels": levels,
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print_table(&levels);
    }
    Ok(())
}

fn run_in_process(opts: &Options) -> Result<Vec<Level>> {
    let path = crate::generate::model_path(opts.model.clone())?;
    let max_c = *opts.concurrency.iter().max().unwrap_or(&1);
    let config = EngineConfig {
        max_num_seqs: max_c,
        max_model_len: EngineConfig::default().max_model_len.max(opts.prompt_len + opts.gen_len),
        // Every prompt differs anyway; keep the cache from making later levels look faster.
        enable_prefix_cache: false,
        ..EngineConfig::default()
    };
    let engine = weft::rt::block_on(EngineBuilder::from_model(&path)?.config(config).kv_memory_bytes(opts.kv_memory_bytes).build())?;
    engine.start_loop()?;
    let vocab = engine.tokenizer().vocab_size();
    let usable = vocab.saturating_sub(1000);
    if usable < opts.prompt_len {
        return Err(bad(format!("--prompt-len {} is more than the {usable} non-special token ids of this model", opts.prompt_len)));
    }
    let mut levels = Vec::new();
    let mut serial = 0usize;
    for &n in &opts.concurrency {
        let mut requests = Vec::new();
        for j in 0..n {
            // Distinct ids (avoiding the low, often special ones), different for every request.
            let offset = serial * 7919;
            serial += 1;
            let ids: Vec<u32> = (0..opts.prompt_len).map(|i| (1000 + (offset + i) % usable) as u32).collect();
            let constraint = is_constrained(opts.constrained, j, n)
                .then(|| Constraint::new("response_format", Grammar::JsonSchema(bench_schema(serial))));
            let params = GenerationParams {
                sampling: SamplingParams { temperature: 0.0, ..Default::default() },
                max_tokens: Some(opts.gen_len),
                ignore_eos: true,
                constraint,
                ..Default::default()
            };
            requests.push(InferenceRequest::new(Prompt::Tokens(ids), params));
        }
        let traces = weft::rt::block_on(async {
            let mut streams = Vec::new();
            for r in requests {
                streams.push((Instant::now(), engine.infer_stream(r)?));
            }
            let runs = streams.into_iter().map(|(start, stream)| async move {
                let mut stream = Box::pin(stream);
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
            });
            futures::future::join_all(runs).await.into_iter().collect::<Result<Vec<Trace>>>()
        })?;
        levels.push(summarize(n, &traces));
    }
    engine.shutdown();
    Ok(levels)
}

/// Nearest-rank percentile of sorted values (0 when there are none).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summarize(concurrency: usize, traces: &[Trace]) -> Level {
    let begin = traces.iter().map(|t| t.start).min().unwrap_or_else(Instant::now);
    let mut ttft = Vec::new();
    let mut itl = Vec::new();
    let mut prompt_tokens = 0;
    let mut generated = 0;
    let mut after_first = 0;
    let mut last_first: Option<Instant> = None;
    let mut first_first: Option<Instant> = None;
    let mut end = begin;
    for t in traces {
        prompt_tokens += t.prompt_tokens;
        let count: usize = t.arrivals.iter().map(|a| a.1).sum();
        let tokens = t.completion_tokens.max(count);
        generated += tokens;
        let Some(&(first, _)) = t.arrivals.first() else { continue };
        after_first += tokens.saturating_sub(1);
        ttft.push((first - t.start).as_secs_f64() * 1e3);
        last_first = Some(last_first.map_or(first, |x| x.max(first)));
        first_first = Some(first_first.map_or(first, |x| x.min(first)));
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
    let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    // Prefill: every prompt token over the time until the last request got its first token.
    let prefill_wall = last_first.map_or(0.0, |x| (x - begin).as_secs_f64());
    // Decode: tokens after each request's first over the span from the first first token to the end.
    let decode_wall = first_first.map_or(0.0, |x| (end - x).as_secs_f64());
    let pct = |v: &[f64]| [percentile(v, 50.0), percentile(v, 90.0), percentile(v, 99.0)];
    Level {
        concurrency,
        prompt_tokens,
        generated_tokens: generated,
        wall_s: wall,
        prefill_tps: rate(prompt_tokens, prefill_wall),
        decode_tps: rate(after_first, decode_wall),
        aggregate_tps: rate(generated, wall),
        ttft_ms: pct(&ttft),
        itl_ms: pct(&itl),
    }
}

fn print_table(levels: &[Level]) {
    let header = [
        "conc", "prompt tok", "gen tok", "wall s", "prefill tok/s", "decode tok/s", "total tok/s", "TTFT p50", "TTFT p90", "TTFT p99", "ITL p50",
        "ITL p90", "ITL p99",
    ];
    let rows: Vec<Vec<String>> = levels
        .iter()
        .map(|l| {
            vec![
                l.concurrency.to_string(),
                l.prompt_tokens.to_string(),
                l.generated_tokens.to_string(),
                format!("{:.2}", l.wall_s),
                format!("{:.1}", l.prefill_tps),
                format!("{:.2}", l.decode_tps),
                format!("{:.2}", l.aggregate_tps),
                format!("{:.1}", l.ttft_ms[0]),
                format!("{:.1}", l.ttft_ms[1]),
                format!("{:.1}", l.ttft_ms[2]),
                format!("{:.1}", l.itl_ms[0]),
                format!("{:.1}", l.itl_ms[1]),
                format!("{:.1}", l.itl_ms[2]),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len()).map(|i| rows.iter().map(|r| r[i].len()).chain([header[i].len()]).max().unwrap_or(0)).collect();
    let line = |cells: Vec<&str>| cells.iter().zip(&widths).map(|(c, w)| format!("{c:>w$}")).collect::<Vec<_>>().join("  ");
    println!("{}", line(header.to_vec()));
    for r in &rows {
        println!("{}", line(r.iter().map(String::as_str).collect()));
    }
    println!("(latencies in ms; TTFT = time to first token, ITL = inter-token latency)");
}

/// Common short words, most of them one token each in typical tokenizers.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "with", "as", "by", "at", "from", "his", "her", "they", "we", "you", "it", "this", "that",
    "be", "are", "have", "had", "not", "but", "or", "an", "one", "all", "were", "when", "there", "can", "more", "if", "out", "so", "up", "said", "what",
    "about", "time", "day", "year", "way", "man", "world", "life", "hand", "part", "child", "eye", "place", "work", "week", "case", "point", "house",
    "water", "room", "mother", "city", "home", "night", "light", "river", "tree", "road", "book", "game", "food", "music", "money", "story", "school",
    "green", "red", "blue", "small", "large", "old", "new", "good", "long", "great", "little", "high", "early", "young", "right", "open", "cold",
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
        let rest = url.strip_prefix("http://").ok_or_else(|| bad(format!("invalid --url {url}: only http:// URLs are supported")))?;
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

    fn run_level(&self, level: usize, n: usize, prompt_len: usize, gen_len: usize, constrained: f64) -> Result<Vec<Trace>> {
        let barrier = std::sync::Barrier::new(n);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    let barrier = &barrier;
                    let mut body = json!({
                        "prompt": word_prompt((level * 100_003 + i) as u64, prompt_len),
                        "max_tokens": gen_len,
                        "temperature": 0,
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
        let status: u16 = status_line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| bad(format!("not an HTTP answer: {status_line:?}")))?;
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
