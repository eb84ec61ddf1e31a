//! `/metrics` of `weft serve`: weft's own families (`weft_*`) and, beside them, the names vLLM
//! exports (`vllm:*`), so that a Grafana dashboard made for vLLM and the Gateway API Inference
//! Extension's endpoint picker (which picks the replica with the shortest queue and the most
//! free KV cache from `vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc`) read a weft
//! replica as they read a vLLM one.
//!
//! Written in the classic Prometheus text format (version 0.0.4), the one vLLM serves and every
//! Prometheus parser reads (the endpoint picker's is Go's parser of it; OpenMetrics-only types
//! such as `info` are not in it, so the `_info` families are gauges). vLLM's semantics, kept
//! here: counters end in `_total`; histograms are in seconds; `vllm:kv_cache_usage_perc` is the
//! fraction (0–1) of KV blocks held by live requests (blocks kept only by the prefix cache are
//! free to take); prefix-cache queries and hits count tokens; `vllm:request_success_total`
//! counts every finished request by `finished_reason` (`stop`, `length`, `abort`, `error`,
//! OpenAI's names for weft's reasons); the labels of the two `_info` families carry their
//! information. Histogram buckets are weft's (one set for all four); quantiles computed from
//! them read the same.

use std::fmt::Write;

use weft::engine::api::LoraMetrics;
use weft::engine::metrics::{EngineMetrics, Histogram};
use weft::kv::{KvUsage, PrefixCacheStats};

/// What the engine looks like right now, read at scrape time (the gauges of `EngineMetrics`
/// are refreshed only when a step ends, so a request queued since is not in them yet).
pub struct Live {
    /// The served model name: the `model_name` label, as vLLM sets it from its served name.
    pub model_name: String,
    pub running: usize,
    pub waiting: usize,
    pub preemptions: u64,
    pub kv: KvUsage,
    pub prefix_cache: PrefixCacheStats,
    /// Tokens per KV block.
    pub block_size: usize,
    /// What the KV cache holds (`--kv-cache-dtype`).
    pub kv_dtype: weft::DType,
    pub enable_prefix_cache: bool,
    /// Seconds since the Unix epoch: the value of `vllm:lora_requests_info` (the endpoint picker
    /// takes the newest sample).
    pub now_seconds: f64,
    /// The LoRA adapters, where the engine serves them.
    pub lora: Option<LoraMetrics>,
}

/// The whole `/metrics` body. `live` is None until the model is loaded; vLLM's families appear
/// then (vLLM serves nothing before its engine exists).
pub fn render(m: &EngineMetrics, live: Option<&Live>, draining: bool) -> String {
    let mut t = Text::default();
    weft_families(&mut t, m, live.is_some(), draining);
    if let Some(live) = live {
        vllm_families(&mut t, m, live);
    }
    t.out
}

/// The `Content-Type` of [`render`]'s body.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

fn weft_families(t: &mut Text, m: &EngineMetrics, loaded: bool, draining: bool) {
    t.gauge(
        "weft_model_loaded",
        "1 once the model is loaded and requests are served",
        &[],
        f64::from(u8::from(loaded)),
    );
    let draining_help = "1 after SIGTERM or SIGINT: new requests are refused while the last ones finish";
    t.gauge("weft_draining", draining_help, &[], f64::from(u8::from(draining)));
    t.family("weft_requests_finished_total", "counter", "Requests finished, by finish reason");
    for reason in ["stop", "length", "eos", "cancelled", "error"] {
        let v = m.requests_finished.get(reason).copied().unwrap_or(0);
        t.sample("weft_requests_finished_total", &[("finished_reason", reason)], v as f64);
    }
    t.counter("weft_requests_submitted_total", "Requests accepted by the engine", &[], m.requests_submitted);
    t.counter("weft_requests_rejected_total", "Requests the engine refused at submission", &[], m.requests_rejected);
    t.counter("weft_prompt_tokens_total", "Prompt tokens of accepted requests", &[], m.prompt_tokens);
    t.counter("weft_generation_tokens_total", "Tokens generated", &[], m.generation_tokens);
    t.counter("weft_engine_steps_total", "Engine steps run", &[], m.steps);
    t.counter("weft_preemptions_total", "Sequences preempted for lack of KV blocks", &[], m.preemptions);
    let histograms = [
        (
            "weft_time_to_first_token_seconds",
            "Time from submission to the first generated token",
            &m.time_to_first_token,
        ),
        ("weft_inter_token_latency_seconds", "Time between consecutive generated tokens", &m.inter_token_latency),
        ("weft_e2e_request_latency_seconds", "Time from submission to the end of a request", &m.end_to_end_latency),
        ("weft_request_queue_time_seconds", "Time from submission to the first step", &m.queue_time),
        (
            "weft_token_mask_seconds",
            "Host time computing structured output's token masks, per step that had any",
            &m.token_mask_time,
        ),
    ];
    for (name, help, h) in histograms {
        t.histogram(name, help, &[], h);
    }
    t.gauge("weft_num_requests_running", "Requests being stepped", &[], m.running as f64);
    t.gauge("weft_num_requests_waiting", "Requests waiting for a slot", &[], m.waiting as f64);
    t.gauge("weft_kv_blocks_total", "KV cache blocks in the pool", &[], m.kv.total_blocks as f64);
    t.gauge("weft_kv_blocks_used", "KV cache blocks held by live sequences", &[], m.kv.used_blocks as f64);
    t.gauge("weft_kv_blocks_free", "KV cache blocks never used or released", &[], m.kv.free_blocks as f64);
    t.gauge("weft_kv_blocks_cached", "KV cache blocks held only by the prefix cache", &[], m.kv.cached_blocks as f64);
    t.counter(
        "weft_prefix_cache_hits_total",
        "Blocks found in the prefix cache at admission",
        &[],
        m.prefix_cache.hits,
    );
    let misses_help = "Blocks looked up in the prefix cache and not found";
    t.counter("weft_prefix_cache_misses_total", misses_help, &[], m.prefix_cache.misses);
    t.counter("weft_prefix_cache_evictions_total", "Cached blocks evicted", &[], m.prefix_cache.evictions);
    let drafted_help = "Speculative decoding: drafted tokens verified";
    t.counter("weft_spec_drafted_tokens_total", drafted_help, &[], m.spec_drafted_tokens);
    let accepted_help = "Speculative decoding: drafted tokens accepted";
    t.counter("weft_spec_accepted_tokens_total", accepted_help, &[], m.spec_accepted_tokens);
    let steps_help = "Speculative decoding: sequence-steps that verified drafts";
    t.counter("weft_spec_verify_steps_total", steps_help, &[], m.spec_verify_steps);
    let rate_help = "Speculative decoding: accepted over drafted tokens";
    t.gauge("weft_spec_acceptance_rate", rate_help, &[], m.spec_acceptance_rate());
    let len_help = "Speculative decoding: tokens gained per verifying sequence-step";
    t.gauge("weft_spec_mean_accepted_length", len_help, &[], m.spec_mean_accepted_len());
}

fn vllm_families(t: &mut Text, m: &EngineMetrics, live: &Live) {
    // vLLM labels every per-engine family with the served model and the engine's index; one
    // weft process is one engine.
    let labels = [("model_name", live.model_name.as_str()), ("engine", "0")];
    t.gauge("vllm:num_requests_running", "Requests in the batch the engine steps", &labels, live.running as f64);
    t.gauge("vllm:num_requests_waiting", "Requests queued for a place in the batch", &labels, live.waiting as f64);
    let usage = if live.kv.total_blocks == 0 { 0.0 } else { live.kv.used_blocks as f64 / live.kv.total_blocks as f64 };
    t.gauge("vllm:kv_cache_usage_perc", "Fraction of KV cache blocks held by live requests (0 to 1)", &labels, usage);
    let block_size = live.block_size.to_string();
    let num_blocks = live.kv.total_blocks.to_string();
    // Python's spelling of a bool, as vLLM's labels carry it.
    let prefix_caching = if live.enable_prefix_cache { "True" } else { "False" };
    let cache_dtype = live.kv_dtype.name().to_ascii_lowercase();
    let cache_labels = [
        ("block_size", block_size.as_str()),
        ("cache_dtype", cache_dtype.as_str()),
        ("enable_prefix_caching", prefix_caching),
        ("engine", "0"),
        ("num_gpu_blocks", num_blocks.as_str()),
    ];
    t.gauge("vllm:cache_config_info", "The KV cache's shape, in the labels (the value is 1)", &cache_labels, 1.0);
    // vLLM's labels: the slots, and the adapters of running and of waiting requests, each list
    // comma-separated; an engine without adapters has 0 slots and empty lists.
    let lora = live.lora.clone().unwrap_or_default();
    let (max_lora, running, waiting) = (lora.max_loras.to_string(), lora.running.join(","), lora.waiting.join(","));
    let lora_labels = [
        ("max_lora", max_lora.as_str()),
        ("running_lora_adapters", running.as_str()),
        ("waiting_lora_adapters", waiting.as_str()),
    ];
    let lora_help = "LoRA adapters, in the labels; the value is the time of the scrape (Unix seconds)";
    t.gauge("vllm:lora_requests_info", lora_help, &lora_labels, live.now_seconds);

    t.counter("vllm:prompt_tokens_total", "Prompt tokens of accepted requests", &labels, m.prompt_tokens);
    t.counter("vllm:generation_tokens_total", "Tokens generated", &labels, m.generation_tokens);
    t.family("vllm:request_success_total", "counter", "Requests finished, by OpenAI's finish reason");
    let finished = |key: &str| m.requests_finished.get(key).copied().unwrap_or(0);
    let by_reason = [
        ("stop", finished("stop") + finished("eos")),
        ("length", finished("length")),
        ("abort", finished("cancelled")),
        ("error", finished("error")),
    ];
    for (reason, count) in by_reason {
        t.sample("vllm:request_success_total", &[labels[0], labels[1], ("finished_reason", reason)], count as f64);
    }
    let histograms = [
        ("vllm:time_to_first_token_seconds", "Seconds from arrival to the first token", &m.time_to_first_token),
        ("vllm:inter_token_latency_seconds", "Seconds between consecutive tokens of a request", &m.inter_token_latency),
        ("vllm:e2e_request_latency_seconds", "Seconds from arrival to the end of a request", &m.end_to_end_latency),
        ("vllm:request_queue_time_seconds", "Seconds from arrival to the first engine step", &m.queue_time),
    ];
    for (name, help, h) in histograms {
        t.histogram(name, help, &labels, h);
    }
    t.counter("vllm:num_preemptions_total", "Sequences preempted for lack of KV blocks", &labels, live.preemptions);
    let queried = live.prefix_cache.queried_tokens;
    t.counter("vllm:prefix_cache_queries_total", "Tokens looked up in the prefix cache", &labels, queried);
    let hit_tokens = live.prefix_cache.hits * live.block_size as u64;
    t.counter("vllm:prefix_cache_hits_total", "Tokens found in the prefix cache", &labels, hit_tokens);
    // vLLM's speculative-decoding counters: a "draft" is one sequence-step that verified drafts.
    t.counter(
        "vllm:spec_decode_num_drafts_total",
        "Sequence-steps that verified drafted tokens",
        &labels,
        m.spec_verify_steps,
    );
    let drafted_help = "Drafted tokens verified by the target model";
    t.counter("vllm:spec_decode_num_draft_tokens_total", drafted_help, &labels, m.spec_drafted_tokens);
    let accepted_help = "Drafted tokens the target model accepted";
    t.counter("vllm:spec_decode_num_accepted_tokens_total", accepted_help, &labels, m.spec_accepted_tokens);
}

/// A Prometheus text (0.0.4) writer.
#[derive(Default)]
struct Text {
    out: String,
}

impl Text {
    /// The `# HELP` and `# TYPE` lines of a family.
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        // Writing to a String cannot fail.
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (key, value)) in labels.iter().enumerate() {
                let value = value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                let comma = if i == 0 { "" } else { "," };
                let _ = write!(self.out, "{comma}{key}=\"{value}\"");
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", number(value));
    }

    fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.family(name, "gauge", help);
        self.sample(name, labels, value);
    }

    fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: u64) {
        self.family(name, "counter", help);
        self.sample(name, labels, value as f64);
    }

    /// `_bucket` lines with cumulative counts (`le` last, `+Inf` equal to the count), `_sum`
    /// and `_count`.
    fn histogram(&mut self, name: &str, help: &str, labels: &[(&str, &str)], h: &Histogram) {
        self.family(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        let bounds = h.bounds.iter().map(|b| number(*b)).chain(std::iter::once(number(f64::INFINITY)));
        let counts = h.cumulative_counts.iter().copied().chain(std::iter::once(h.count));
        for (le, count) in bounds.zip(counts) {
            let with_le: Vec<(&str, &str)> =
                labels.iter().copied().chain(std::iter::once(("le", le.as_str()))).collect();
            self.sample(&bucket, &with_le, count as f64);
        }
        self.sample(&format!("{name}_sum"), labels, h.sum);
        self.sample(&format!("{name}_count"), labels, h.count as f64);
    }
}

/// A sample value as the format spells it (`+Inf`, `-Inf`, `NaN`; integers without a point).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live() -> Live {
        Live {
            model_name: "tiny \"q\"".into(),
            running: 3,
            waiting: 2,
            preemptions: 1,
            kv: KvUsage { total_blocks: 10, used_blocks: 4, cached_blocks: 1, free_blocks: 5 },
            prefix_cache: PrefixCacheStats {
                hits: 2,
                misses: 1,
                cached_blocks: 1,
                queried_tokens: 50,
                ..Default::default()
            },
            block_size: 16,
            kv_dtype: weft::DType::F16,
            enable_prefix_cache: true,
            now_seconds: 1.5e9,
            lora: None,
        }
    }

    /// The value of the one line that starts with `prefix` followed by a space.
    fn value(text: &str, prefix: &str) -> String {
        let lines: Vec<&str> =
            text.lines().filter(|l| l.strip_prefix(prefix).is_some_and(|r| r.starts_with(' '))).collect();
        assert_eq!(lines.len(), 1, "{prefix}:\n{text}");
        lines[0].rsplit(' ').next().unwrap().to_string()
    }

    #[test]
    fn vllm_families_follow_vllm() {
        let mut m = EngineMetrics::default();
        m.requests_finished.insert("stop", 2);
        m.requests_finished.insert("eos", 1);
        m.requests_finished.insert("cancelled", 4);
        m.prompt_tokens = 70;
        m.time_to_first_token.observe(0.02);
        m.time_to_first_token.observe(7.0);
        let text = render(&m, Some(&live()), false);
        let labels = r#"{model_name="tiny \"q\"",engine="0"}"#;
        assert_eq!(value(&text, &format!("vllm:num_requests_running{labels}")), "3");
        assert_eq!(value(&text, &format!("vllm:num_requests_waiting{labels}")), "2");
        assert_eq!(value(&text, &format!("vllm:kv_cache_usage_perc{labels}")), "0.4");
        assert_eq!(value(&text, &format!("vllm:prompt_tokens_total{labels}")), "70");
        assert_eq!(
            value(&text, r#"vllm:request_success_total{model_name="tiny \"q\"",engine="0",finished_reason="stop"}"#),
            "3"
        );
        assert_eq!(
            value(&text, r#"vllm:request_success_total{model_name="tiny \"q\"",engine="0",finished_reason="abort"}"#),
            "4"
        );
        assert_eq!(value(&text, &format!("vllm:prefix_cache_queries_total{labels}")), "50");
        assert_eq!(value(&text, &format!("vllm:prefix_cache_hits_total{labels}")), "32");
        assert_eq!(value(&text, &format!("vllm:num_preemptions_total{labels}")), "1");
        assert_eq!(
            value(
                &text,
                r#"vllm:cache_config_info{block_size="16",cache_dtype="f16",enable_prefix_caching="True",engine="0",num_gpu_blocks="10"}"#
            ),
            "1"
        );
        assert_eq!(
            value(&text, r#"vllm:lora_requests_info{max_lora="0",running_lora_adapters="",waiting_lora_adapters=""}"#),
            "1500000000"
        );
        let ttft = "vllm:time_to_first_token_seconds";
        assert_eq!(value(&text, &format!(r#"{ttft}_bucket{{model_name="tiny \"q\"",engine="0",le="0.025"}}"#)), "1");
        assert_eq!(value(&text, &format!(r#"{ttft}_bucket{{model_name="tiny \"q\"",engine="0",le="+Inf"}}"#)), "2");
        assert_eq!(value(&text, &format!("{ttft}_count{labels}")), "2");
        assert_eq!(value(&text, &format!("{ttft}_sum{labels}")), "7.02");
        assert!(text.contains("# TYPE vllm:prompt_tokens_total counter\n"), "{text}");
        assert!(text.contains("# TYPE vllm:e2e_request_latency_seconds histogram\n"), "{text}");
    }

    #[test]
    fn before_the_model_loads_only_weft_families_appear() {
        let text = render(&EngineMetrics::default(), None, true);
        assert!(!text.contains("vllm:"), "{text}");
        assert_eq!(value(&text, "weft_model_loaded"), "0");
        assert_eq!(value(&text, "weft_draining"), "1");
        assert_eq!(value(&text, r#"weft_requests_finished_total{finished_reason="cancelled"}"#), "0");
        // Every sample line belongs to the family of the TYPE line before it.
        let mut family = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap().to_string();
            } else if !line.starts_with('#') {
                assert!(line.starts_with(&family), "{line} after TYPE {family}");
            }
        }
    }

    #[test]
    fn numbers_are_spelled_as_the_format_wants() {
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NEG_INFINITY), "-Inf");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.005), "0.005");
    }
}
