//! The GPU Llama forward pass against the plain CPU one (`cpu::llama`) on tiny random models:
//! GGUF files (llama.cpp's permuted q/k, every weight format), chunked prefill starting at any
//! position, decode steps, several sequences in one step, and batch invariance.
//!
//! Tolerance: logits agree within 1e-4 · max|logit|. The CPU sums in f64; each GPU matmul errs by
//! at most k·u relative (k <= 96 here), attention and norms add a few ulp, and two layers
//! compound that to well under 1e-5 relative; 1e-4 leaves a margin without hiding a wrong
//! pairing or a wrong position (those move logits by whole percents).

use weft::DType;
use weft::gpu::{GpuOptions, GpuTensorFactory};
use weft::kv::KvCacheConfig;
use weft::model::arch;
use weft::model::config::{ModelConfig, RopeScaling, Routing};
use weft::model::executor::GpuExecutor;
use weft::model::gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};
use weft::model::load::GgufWeights;
use weft::model::tiny;
use weft::sampling::{RowDraw, SampleSpec, SamplingParams};
use weft::step::{ModelExecutor, SeqStep, StepBatch};

fn factory() -> Option<GpuTensorFactory> {
    weft::gpu::open_or_skip(GpuOptions::default()).unwrap().map(GpuTensorFactory::new)
}

const BLOCK: usize = 4;

fn executor(f: &GpuTensorFactory, config: &ModelConfig, gguf: &GgufFile) -> GpuExecutor {
    let loaded = ModelConfig::from_gguf(gguf).unwrap();
    assert_eq!(&loaded, config, "config read back from the GGUF metadata");
    let model = arch::load(loaded, &GgufWeights { gguf }, f, &mut |_, _| {}).unwrap();
    GpuExecutor::new(f.clone(), model, KvCacheConfig::new(BLOCK, 64)).unwrap()
}

/// A sequence's share of a step, sampling from its last `num_logits` tokens.
fn seq(tokens: &[u32], start_pos: usize, block_table: &[u32], num_logits: usize) -> SeqStep {
    SeqStep {
        id: 0,
        tokens: tokens.to_vec(),
        start_pos,
        block_table: block_table.to_vec(),
        num_logits,
        sampling: None,
        state_slot: None,
        state_restore: None,
        state_save: None,
        lora_slot: None,
        embed: false,
    }
}

fn batch(seqs: Vec<SeqStep>) -> StepBatch {
    StepBatch { seqs, ..Default::default() }
}

fn close(what: &str, got: &[f32], want: &[f32]) {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-4 * scale, "{what}: max error {worst} vs max |logit| {scale}");
}

/// Two sequences in one step: one prefilled in chunks (3, 5, 1 tokens), one decoding.
fn run_and_compare(f: &GpuTensorFactory, config: &ModelConfig, dtype: DType) {
    let w = tiny::random_weights(config, 7, dtype);
    let gguf = GgufFile::from_bytes("tiny.gguf", tiny::gguf_bytes(config, &w, dtype)).unwrap();
    let exec = executor(f, config, &gguf);
    let a: Vec<u32> = vec![5, 17, 250, 3, 3, 99, 0, 42, 7];
    let b: Vec<u32> = vec![1, 2, 3, 4, 5, 6];
    let want_a = weft::cpu::llama::forward(config, &w, &a);
    let want_b = weft::cpu::llama::forward(config, &w, &b);
    let table_a: Vec<u32> = vec![10, 3, 7];
    let table_b: Vec<u32> = vec![20, 21];
    // Step 1: a's first chunk with logits for all three of its tokens (as when verifying two
    // drafted tokens), and b's prompt.
    let step = batch(vec![seq(&a[..3], 0, &table_a, 3), seq(&b[..5], 0, &table_b, 1)]);
    let out = weft::rt::block_on(exec.logits(&step)).unwrap();
    for i in 0..3 {
        close(&format!("{dtype} a[..{}]", i + 1), &out[i], &want_a[i]);
    }
    close(&format!("{dtype} b[..5]"), &out[3], &want_b[4]);
    // Step 2: a's second chunk (starting at position 3, across a block boundary) and b's decode.
    let step = batch(vec![seq(&a[3..8], 3, &table_a, 1), seq(&b[5..], 5, &table_b, 1)]);
    let out = weft::rt::block_on(exec.logits(&step)).unwrap();
    close(&format!("{dtype} a[..8]"), &out[0], &want_a[7]);
    close(&format!("{dtype} b[..6]"), &out[1], &want_b[5]);
    // Step 3: a's last token alone.
    let out = weft::rt::block_on(exec.logits(&batch(vec![seq(&a[8..], 8, &table_a, 1)]))).unwrap();
    close(&format!("{dtype} a[..9]"), &out[0], &want_a[8]);
}

#[test]
fn tiny_gguf_matches_cpu_in_every_weight_format() {
    let Some(f) = factory() else { return };
    let c = tiny::tiny_config();
    // The super-block formats do not fit rows of 64; `super_block_formats_match_cpu` runs them.
    for dtype in DType::WEIGHTS.into_iter().filter(|&d| tiny::storage_dtype(d, c.hidden_size) == d) {
        run_and_compare(&f, &c, dtype);
    }
}

/// The super-block formats (K-quants, IQ4_XS) in a model whose hidden size is one super-block
/// wide: every matrix reading rows of 256 is stored in the format, the MLP's down projection
/// (rows of 320) in the fallback llama.cpp picks, so a layer mixes formats as real files do.
/// Each format's matmul is held to the CPU in the kernel tests; here the formats meet in one
/// model: CI runs a K-quant with mins, one without and an i-quant; `WEFT_FULL=1` all of them.
#[test]
fn super_block_formats_match_cpu() {
    let Some(f) = factory() else { return };
    let config = ModelConfig { hidden_size: 256, intermediate_size: 320, head_dim: 64, ..tiny::tiny_config() };
    let full = std::env::var("WEFT_FULL").as_deref() == Ok("1");
    let ci = [DType::Q4_K, DType::Q6_K, DType::IQ3_S];
    for dtype in DType::WEIGHTS.into_iter().filter(|d| d.block_elems() == 256 && (full || ci.contains(d))) {
        assert_ne!(tiny::storage_dtype(dtype, 320), dtype);
        run_and_compare(&f, &config, dtype);
    }
}

/// Gemma 3 against `cpu::gemma3` (scaled embeddings, (1 + w) norms before and after each
/// sub-layer, per-head q/k norms, GeGLU, sliding-window layers with their own RoPE base around
/// a global one), prefilled in chunks across the window and decoding, with another sequence in
/// the same steps; in F32, a 32-element format, and a K-quant at hidden 256.
#[test]
fn tiny_gemma3_matches_cpu() {
    let Some(f) = factory() else { return };
    let wide = ModelConfig { hidden_size: 256, intermediate_size: 320, ..tiny::gemma3_config() };
    for (config, dtype) in
        [(tiny::gemma3_config(), DType::F32), (tiny::gemma3_config(), DType::Q5_0), (wide, DType::Q4_K)]
    {
        let (bytes, w) = tiny::gemma3_gguf(&config, 5, dtype);
        let gguf = GgufFile::from_bytes("tiny-gemma3.gguf", bytes).unwrap();
        let exec = executor(&f, &config, &gguf);
        let a: Vec<u32> = vec![5, 17, 250, 3, 3, 99, 0, 42, 7];
        let b: Vec<u32> = vec![1, 2, 3, 4, 5, 6];
        let want_a = weft::cpu::gemma3::forward(&config, &w, &a);
        let want_b = weft::cpu::gemma3::forward(&config, &w, &b);
        let (table_a, table_b): (Vec<u32>, Vec<u32>) = (vec![10, 3, 7], vec![20, 21]);
        let step = batch(vec![seq(&a[..3], 0, &table_a, 3), seq(&b[..5], 0, &table_b, 1)]);
        let out = weft::rt::block_on(exec.logits(&step)).unwrap();
        for i in 0..3 {
            close(&format!("gemma3 {dtype} a[..{}]", i + 1), &out[i], &want_a[i]);
        }
        close(&format!("gemma3 {dtype} b[..5]"), &out[3], &want_b[4]);
        let step = batch(vec![seq(&a[3..8], 3, &table_a, 1), seq(&b[5..], 5, &table_b, 1)]);
        let out = weft::rt::block_on(exec.logits(&step)).unwrap();
        close(&format!("gemma3 {dtype} a[..8]"), &out[0], &want_a[7]);
        close(&format!("gemma3 {dtype} b[..6]"), &out[1], &want_b[5]);
        let out = weft::rt::block_on(exec.logits(&batch(vec![seq(&a[8..], 8, &table_a, 1)]))).unwrap();
        close(&format!("gemma3 {dtype} a[..9]"), &out[0], &want_a[8]);
    }
}

/// Qwen3: the Llama family with RMSNorm over each query and key head before RoPE, no bias.
#[test]
fn tiny_qwen3_matches_cpu() {
    let Some(f) = factory() else { return };
    let config = ModelConfig { architecture: "qwen3".into(), qk_norm: true, ..tiny::tiny_config() };
    run_and_compare(&f, &config, DType::Q8_0);
}

/// YaRN (blended frequencies, cos/sin scaled by its attention factor) and partial rotary (12
/// of 16 dimensions rotate), read back from the GGUF's keys, against the CPU oracle's own
/// table and rotation.
#[test]
fn tiny_yarn_with_partial_rotary_matches_cpu() {
    let Some(f) = factory() else { return };
    let config = ModelConfig {
        architecture: "qwen3".into(),
        qk_norm: true,
        rotary_dim: Some(12),
        rope_scaling: Some(RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 16,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: true,
            attention_factor: 1.0 + 0.1 * 4f32.ln(),
        }),
        ..tiny::tiny_config()
    };
    run_and_compare(&f, &config, DType::F32);
}

/// A GGUF's RoPE scaling type weft does not apply is refused, naming it, not run unscaled.
#[test]
fn unknown_gguf_rope_scaling_types_are_refused_by_name() {
    let config = tiny::tiny_config();
    let w = tiny::random_weights(&config, 3, DType::F32);
    let bytes = with_metadata(
        tiny::gguf_bytes(&config, &w, DType::F32),
        &[("llama.rope.scaling.type", MetaValue::String("dynamic".into()))],
        &[],
    );
    let err = ModelConfig::from_gguf(&GgufFile::from_bytes("tiny.gguf", bytes).unwrap()).unwrap_err().to_string();
    assert!(err.contains("llama.rope.scaling.type \"dynamic\" is not supported"), "{err}");
}

/// `gguf` rewritten with `metadata` added (replacing keys of the same name) and `tensors`
/// (name, dims) of F32 zeros appended.
fn with_metadata(gguf: Vec<u8>, metadata: &[(&str, MetaValue)], tensors: &[(&str, &[u64])]) -> Vec<u8> {
    let gguf = GgufFile::from_bytes("tiny.gguf", gguf).unwrap();
    let mut writer = GgufWriter::new();
    for (k, v) in &gguf.metadata {
        if !metadata.iter().any(|(name, _)| name == k) {
            writer.metadata(k, v.clone());
        }
    }
    for (k, v) in metadata {
        writer.metadata(k, v.clone());
    }
    for t in &gguf.tensors {
        writer.tensor(&t.name, &t.dims, t.ggml_type, &gguf.tensor_bytes(t).unwrap());
    }
    for (name, dims) in tensors {
        let bytes = vec![0u8; 4 * dims.iter().product::<u64>() as usize];
        writer.tensor(name, dims, GgmlType::F32, &bytes);
    }
    writer.to_bytes()
}

/// Mixture-of-experts models weft does not run (Qwen2-MoE, DeepSeek-V2, DBRX,
/// a Mixtral-style llama) are refused with one message naming the architecture and the expert count, by the
/// loader and by `weft info --model` alike, not with a missing-tensor error; so are their
/// Hugging Face configs.
#[test]
fn mixture_of_experts_models_are_refused_by_name() {
    let config = tiny::tiny_config();
    let w = tiny::random_weights(&config, 3, DType::F32);
    let base = tiny::gguf_bytes(&config, &w, DType::F32);
    for (arch, experts) in [("qwen2moe", 60), ("deepseek2", 64), ("dbrx", 16), ("llama", 8)] {
        // The tiny llama's metadata under `arch`, with an expert count and routed-expert tensors.
        let renamed = GgufFile::from_bytes("tiny.gguf", base.clone()).unwrap();
        let mut metadata: Vec<(String, MetaValue)> = renamed
            .metadata
            .iter()
            .map(|(k, v)| (k.strip_prefix("llama.").map_or(k.clone(), |rest| format!("{arch}.{rest}")), v.clone()))
            .collect();
        metadata.retain(|(k, _)| k != "general.architecture");
        metadata.push(("general.architecture".into(), MetaValue::String(arch.into())));
        metadata.push((format!("{arch}.expert_count"), MetaValue::U32(experts)));
        metadata.push((format!("{arch}.expert_used_count"), MetaValue::U32(2)));
        let metadata: Vec<(&str, MetaValue)> = metadata.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let e = u64::from(experts);
        let tensors: [(&str, &[u64]); 4] = [
            ("blk.0.ffn_gate_inp.weight", &[64, e]),
            ("blk.0.ffn_gate_exps.weight", &[64, 96, e]),
            ("blk.0.ffn_up_exps.weight", &[64, 96, e]),
            ("blk.0.ffn_down_exps.weight", &[96, 64, e]),
        ];
        let mut writer = GgufWriter::new();
        for (k, v) in &metadata {
            writer.metadata(k, v.clone());
        }
        for t in &renamed.tensors {
            if !t.name.contains("ffn_") {
                writer.tensor(&t.name, &t.dims, t.ggml_type, &renamed.tensor_bytes(t).unwrap());
            }
        }
        let bytes = with_metadata(writer.to_bytes(), &[], &tensors);
        let gguf = GgufFile::from_bytes("moe.gguf", bytes).unwrap();
        let want = format!("mixture-of-experts is not supported: {arch} has {experts} experts per layer");
        let err = ModelConfig::from_gguf(&gguf).unwrap_err().to_string();
        assert!(err.contains(&want), "{arch}: {err}");
        let report = weft::model::inspect::inspect_gguf(&gguf, 0).unwrap();
        let moe: Vec<&String> = report.problems.iter().filter(|p| p.contains("mixture-of-experts")).collect();
        assert_eq!(moe.len(), 1, "{arch}: {report}");
        assert!(moe[0].contains(&want), "{arch}: {report}");
        assert!(!report.problems.iter().any(|p| p.contains("missing")), "{arch}: {report}");
    }
    // Routed-expert tensors without an expert count are refused too, naming one.
    let bytes = with_metadata(base, &[], &[("blk.0.ffn_up_exps.weight", &[64, 96, 4])]);
    let err = ModelConfig::from_gguf(&GgufFile::from_bytes("moe.gguf", bytes).unwrap()).unwrap_err().to_string();
    assert!(
        err.contains("mixture-of-experts is not supported: llama has routed experts (blk.0.ffn_up_exps.weight)"),
        "{err}"
    );
    // Hugging Face configs: each family's own key.
    for (model_type, key, experts) in [
        ("qwen2_moe", "num_experts", 60),
        ("deepseek_v3", "n_routed_experts", 256),
        ("dbrx", "num_experts", 16),
        ("mixtral", "num_local_experts", 8),
    ] {
        let json = format!(
            r#"{{"model_type": "{model_type}", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96,
                "num_hidden_layers": 2, "vocab_size": 260, "{key}": {experts}}}"#
        );
        let err = ModelConfig::from_hf_json("config.json", &json).unwrap_err().to_string();
        let want = format!("mixture-of-experts is not supported: {model_type} has {experts} experts ({key}) per layer");
        assert!(err.contains(&want), "{model_type}: {err}");
    }
}

/// Granite MoE's configs: the routed experts' width is `intermediate_size`, the shared
/// expert's `shared_intermediate_size` (none when absent or 0), in the dense-attention models
/// and in Granite 4.0-H with experts, whose dense MLP then is the shared expert.
#[test]
fn granite_moe_configs_are_read() {
    let json = |model_type: &str, extra: &str| {
        format!(
            r#"{{"model_type": "{model_type}", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 32,
                "num_hidden_layers": 2, "vocab_size": 260, "num_local_experts": 8, "num_experts_per_tok": 2{extra}}}"#
        )
    };
    for (model_type, shared) in [("granitemoe", 0), ("granitemoeshared", 64)] {
        let extra = if shared > 0 { format!(r#", "shared_intermediate_size": {shared}"#) } else { String::new() };
        let c = ModelConfig::from_hf_json("config.json", &json(model_type, &extra)).unwrap();
        let moe = c.moe.unwrap();
        assert_eq!((moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size), (8, 2, 32), "{model_type}");
        assert_eq!(moe.shared_expert_size, shared, "{model_type}");
        assert!(moe.routing == Routing::TopKSoftmax && c.multipliers.is_some(), "{model_type}");
    }
    let hybrid = json(
        "granitemoehybrid",
        r#", "shared_intermediate_size": 64, "mamba_n_heads": 8, "mamba_d_conv": 4, "mamba_d_state": 16,
            "layer_types": ["mamba", "attention"]"#,
    );
    let c = ModelConfig::from_hf_json("config.json", &hybrid).unwrap();
    let moe = c.moe.unwrap();
    assert_eq!((moe.num_experts, moe.expert_intermediate_size, moe.shared_expert_size), (8, 32, 64));
    assert_eq!(c.intermediate_size, 64);
}

/// Qwen3-MoE's config.json is read (experts under either key transformers writes), and the
/// variants weft does not run are refused, naming the setting.
#[test]
fn qwen3_moe_configs_are_read_or_refused_by_setting() {
    let json = |extra: &str| {
        format!(
            r#"{{"model_type": "qwen3_moe", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96,
                "num_hidden_layers": 2, "vocab_size": 260, "num_local_experts": 8, "num_experts_per_tok": 2,
                "moe_intermediate_size": 32{extra}}}"#
        )
    };
    let c = ModelConfig::from_hf_json("config.json", &json(r#", "norm_topk_prob": true"#)).unwrap();
    let moe = c.moe.unwrap();
    assert_eq!((moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size), (8, 2, 32));
    assert!(moe.routing == Routing::Softmax { normalize: true } && c.qk_norm);
    // transformers' default: no renormalisation.
    let unnormalised = ModelConfig::from_hf_json("config.json", &json("")).unwrap().moe.unwrap().routing;
    assert_eq!(unnormalised, Routing::Softmax { normalize: false });
    for (extra, want) in [
        (r#", "mlp_only_layers": [1]"#, "mlp_only_layers lists dense layers"),
        (r#", "decoder_sparse_step": 2"#, "decoder_sparse_step is 2"),
        (r#", "shared_expert_intermediate_size": 64"#, "shared_expert_intermediate_size is set"),
        (r#", "num_experts_per_tok": 9"#, "each token goes to 9 of 8 experts"),
    ] {
        // A key given twice: serde_json keeps the last.
        let json = json(extra);
        let err = ModelConfig::from_hf_json("config.json", &json).unwrap_err().to_string();
        assert!(err.contains(want), "{extra}: {err}");
    }
}

/// gpt-oss's config.json is read (experts, top-k softmax routing, the clamped SwiGLU, the
/// alternating sliding window), and what weft does not run is refused, naming the setting.
#[test]
fn gpt_oss_configs_are_read_or_refused_by_setting() {
    use weft::model::config::ExpertGate;
    let json = |extra: &str| {
        format!(
            r#"{{"model_type": "gpt_oss", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "intermediate_size": 32, "num_hidden_layers": 4, "vocab_size": 260,
                "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 128{extra}}}"#
        )
    };
    let c = ModelConfig::from_hf_json("config.json", &json("")).unwrap();
    let moe = c.moe.unwrap();
    assert_eq!((moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size), (8, 2, 32));
    assert_eq!((moe.routing, moe.gate), (Routing::TopKSoftmax, ExpertGate::SwigluOai));
    assert!(c.attention_bias && !c.qk_norm);
    let sliding: Vec<bool> = (0..4).map(|i| c.is_sliding(i)).collect();
    assert_eq!((c.sliding_window, sliding), (Some(128), vec![true, false, true, false]));
    let alternating =
        r#", "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]"#;
    assert!(ModelConfig::from_hf_json("config.json", &json(alternating)).is_ok());
    for (extra, want) in [
        (r#", "swiglu_limit": 10.0"#, "swiglu_limit is 10"),
        (r#", "swiglu_alpha": 1.0"#, "swiglu_alpha is 1"),
        (
            r#", "layer_types": ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]"#,
            "layer_types does not alternate",
        ),
    ] {
        let err = ModelConfig::from_hf_json("config.json", &json(extra)).unwrap_err().to_string();
        assert!(err.contains(want), "{extra}: {err}");
    }
}

#[test]
fn untied_head_and_qkv_bias_match_cpu() {
    let Some(f) = factory() else { return };
    let config = ModelConfig {
        architecture: "qwen2".into(),
        tie_word_embeddings: false,
        attention_bias: true,
        ..tiny::tiny_config()
    };
    run_and_compare(&f, &config, DType::Q8_0);
}

#[test]
fn sliding_window_matches_cpu() {
    let Some(f) = factory() else { return };
    let mut config = ModelConfig { architecture: "mistral".into(), ..tiny::tiny_config() };
    config.sliding_window = Some(4);
    let w = tiny::random_weights(&config, 9, DType::F32);
    let mut bytes = tiny::gguf_bytes(&config, &w, DType::F32);
    // gguf_bytes writes no window; append the key through a fresh writer round trip.
    let gguf = GgufFile::from_bytes("tiny.gguf", std::mem::take(&mut bytes)).unwrap();
    let mut writer = weft::model::gguf::GgufWriter::new();
    for (k, v) in &gguf.metadata {
        writer.metadata(k, v.clone());
    }
    writer.metadata("mistral.attention.sliding_window", weft::model::gguf::MetaValue::U32(4));
    for t in &gguf.tensors {
        writer.tensor(&t.name, &t.dims, t.ggml_type, &gguf.tensor_bytes(t).unwrap());
    }
    let gguf = GgufFile::from_bytes("tiny.gguf", writer.to_bytes()).unwrap();
    let exec = executor(&f, &config, &gguf);
    let tokens: Vec<u32> = (0..11).map(|i| (i * 37 % 256) as u32).collect();
    let want = weft::cpu::llama::forward(&config, &w, &tokens);
    let out = weft::rt::block_on(exec.logits(&batch(vec![seq(&tokens, 0, &[0, 1, 2], 1)]))).unwrap();
    close("window 4", &out[0], &want[10]);
}

#[test]
fn a_sequence_alone_and_in_a_batch_gives_identical_bits_and_tokens() {
    let Some(f) = factory() else { return };
    alone_and_in_a_batch(&f);
}

/// The families a GPU or a browser runs (the device's own runs everywhere above), each forced
/// on this adapter: the forward pass against the CPU and batch invariance. The subgroup
/// family needs subgroups of 8 or more lanes (lavapipe has them); elsewhere it is skipped.
#[test]
fn every_kernel_family_matches_cpu_and_is_batch_invariant() {
    use weft::gpu::KernelFamily;
    for family in [KernelFamily::Baseline, KernelFamily::Subgroup] {
        let options = GpuOptions { kernels: Some(family), ..Default::default() };
        let Some(f) = weft::gpu::open_or_skip(options).unwrap().map(GpuTensorFactory::new) else { continue };
        assert_eq!(f.context().kernel_family(), family);
        for dtype in [DType::Q4_1, DType::Q8_0, DType::F16] {
            run_and_compare(&f, &tiny::tiny_config(), dtype);
        }
        alone_and_in_a_batch(&f);
    }
}

fn alone_and_in_a_batch(f: &GpuTensorFactory) {
    let config = tiny::tiny_config();
    let w = tiny::random_weights(&config, 3, DType::Q4_1);
    let gguf = GgufFile::from_bytes("tiny.gguf", tiny::gguf_bytes(&config, &w, DType::Q4_1)).unwrap();
    let exec = executor(f, &config, &gguf);
    let target = seq(&[9, 8, 7, 6, 5], 0, &[0, 1], 1);
    let alone = weft::rt::block_on(exec.logits(&batch(vec![target.clone()]))).unwrap();
    let others: Vec<SeqStep> = (0..6)
        .map(|i| seq(&(0..(i * 2 + 1)).collect::<Vec<_>>(), 0, &[10 + 3 * i, 11 + 3 * i, 12 + 3 * i], 1))
        .collect();
    let mut seqs = others.clone();
    seqs.insert(3, target.clone());
    let together = weft::rt::block_on(exec.logits(&batch(seqs))).unwrap();
    assert!(
        alone[0].iter().zip(&together[3]).all(|(a, b)| a.to_bits() == b.to_bits()),
        "logits differ alone vs in a batch"
    );

    // And the sampler: a seeded temperature draw and greedy pick the same token either way.
    let spec = SampleSpec {
        params: SamplingParams { temperature: 0.9, top_p: 0.9, ..Default::default() },
        rows: vec![RowDraw { uniform: 0.37, ..Default::default() }],
    };
    let with = |s: &SeqStep| SeqStep { sampling: Some(spec.clone()), ..s.clone() };
    let a = weft::rt::block_on(exec.execute(&batch(vec![with(&target)]))).unwrap();
    let mut seqs: Vec<SeqStep> = others.iter().map(with).collect();
    seqs.insert(3, with(&target));
    let b = weft::rt::block_on(exec.execute(&batch(seqs))).unwrap();
    assert_eq!(a.samples[0], b.samples[3]);
}

/// A Hugging Face directory holding `w` in `dtype`, in `shards` safetensors files.
fn write_hf_dir(
    dir: &std::path::Path,
    config: &ModelConfig,
    w: &weft::cpu::llama::HfWeights,
    dtype: safetensors::Dtype,
    shards: usize,
) {
    std::fs::create_dir_all(dir).unwrap();
    let json = serde_json::json!({
        "model_type": config.architecture, "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta,
        "max_position_embeddings": config.max_position_embeddings, "tie_word_embeddings": config.tie_word_embeddings,
    });
    std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
    let encode = |v: &[f32]| -> Vec<u8> {
        match dtype {
            safetensors::Dtype::F32 => bytemuck::cast_slice(v).to_vec(),
            safetensors::Dtype::F16 => v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
            safetensors::Dtype::BF16 => v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
            _ => unreachable!(),
        }
    };
    let mut names: Vec<&String> = w.keys().collect();
    names.sort();
    let mut weight_map = serde_json::Map::new();
    for (s, chunk) in names.chunks(names.len().div_ceil(shards)).enumerate() {
        let file = if shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{shards:05}.safetensors", s + 1)
        };
        let data: Vec<(String, Vec<u8>, Vec<usize>)> = chunk
            .iter()
            .map(|name| {
                let v = &w[*name];
                let shape = if name.ends_with("norm.weight") || name.ends_with("bias") {
                    vec![v.len()]
                } else {
                    let cols = if name.contains("down_proj") {
                        config.intermediate_size
                    } else if name.contains("o_proj") {
                        config.num_heads * config.head_dim
                    } else {
                        config.hidden_size
                    };
                    vec![v.len() / cols, cols]
                };
                ((*name).clone(), encode(v), shape)
            })
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = data
            .iter()
            .map(|(n, b, s)| (n.clone(), safetensors::tensor::TensorView::new(dtype, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(&file)).unwrap();
        for name in chunk {
            weight_map.insert((*name).clone(), serde_json::Value::String(file.clone()));
        }
    }
    if shards > 1 {
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            serde_json::json!({ "weight_map": weight_map }).to_string(),
        )
        .unwrap();
    }
}

#[test]
fn hugging_face_directories_match_cpu() {
    use weft::model::load::SafetensorsWeights;
    let Some(f) = factory() else { return };
    let config = tiny::tiny_config();
    for (dtype, shards) in [(safetensors::Dtype::F32, 1), (safetensors::Dtype::BF16, 3), (safetensors::Dtype::F16, 2)] {
        // Round the weights through the file's type so the CPU sees exactly what was stored.
        let mut w = tiny::random_weights(&config, 11, DType::F32);
        for v in w.values_mut() {
            for x in v.iter_mut() {
                *x = match dtype {
                    safetensors::Dtype::BF16 => half::bf16::from_f32(*x).to_f32(),
                    safetensors::Dtype::F16 => half::f16::from_f32(*x).to_f32(),
                    _ => *x,
                };
            }
        }
        let dir = std::env::temp_dir().join(format!("weft-hf-{}-{dtype:?}", std::process::id()));
        write_hf_dir(&dir, &config, &w, dtype, shards);
        let json = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let loaded = ModelConfig::from_hf_json("config.json", &json).unwrap();
        assert_eq!(loaded, config);
        let model = arch::load(loaded, &SafetensorsWeights::open(&dir).unwrap(), &f, &mut |_, _| {}).unwrap();
        let exec = GpuExecutor::new(f.clone(), model, KvCacheConfig::new(BLOCK, 8)).unwrap();
        let tokens: Vec<u32> = vec![4, 8, 15, 16, 23, 42];
        let want = weft::cpu::llama::forward(&config, &w, &tokens);
        let out = weft::rt::block_on(exec.logits(&batch(vec![seq(&tokens, 0, &[0, 1], 1)]))).unwrap();
        close(&format!("safetensors {dtype:?} in {shards} shards"), &out[0], &want[5]);
        // `weft info --model` reads the same directory from its headers alone.
        let report = weft::model::inspect::inspect(&dir).unwrap();
        assert_eq!(report.architecture.as_deref(), Some("llama"));
        assert_eq!(report.tensor_types.len(), 1, "{report}");
        assert_eq!(report.tensor_types[0].name, format!("{dtype:?}"));
        let params: u64 = w.values().map(|v| v.len() as u64).sum();
        assert_eq!(report.num_params, params);
        // No tokenizer.json was written: that is the one reason it cannot run.
        assert_eq!(report.problems, vec!["no tokenizer.json".to_string()], "{report}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn broken_hugging_face_directories_name_the_problem() {
    use weft::model::load::SafetensorsWeights;
    let dir = std::env::temp_dir().join(format!("weft-hf-broken-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let err = SafetensorsWeights::open(&dir).err().unwrap().to_string();
    assert!(err.contains("neither model.safetensors nor model.safetensors.index.json"), "{err}");
    let err = weft::model::inspect::inspect(&dir).unwrap_err().to_string();
    assert!(err.contains("config.json cannot be read"), "{err}");
    std::fs::write(dir.join("model.safetensors"), b"garbage").unwrap();
    let err = SafetensorsWeights::open(&dir).err().unwrap().to_string();
    assert!(err.contains("model.safetensors") && err.contains("not a safetensors file"), "{err}");
    let err = ModelConfig::from_hf_json("config.json", "{\"model_type\": \"gpt2\"}").unwrap_err().to_string();
    assert!(err.contains("architecture \"gpt2\" is not supported; weft runs llama"), "{err}");
    let err = ModelConfig::from_hf_json("config.json", "{").unwrap_err().to_string();
    assert!(err.contains("config.json: not valid JSON"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Split-K attention (the baseline family's, for GPUs) through the whole forward pass: a
/// 700-token prompt, whose attention takes 3 splits per head, then two decode steps, against
/// the CPU model. Same tolerance as above: joining 3 splits adds a few roundings.
#[test]
fn long_contexts_with_split_attention_match_cpu() {
    use weft::gpu::KernelFamily;
    let options = GpuOptions { kernels: Some(KernelFamily::Baseline), ..Default::default() };
    let Some(f) = weft::gpu::open_or_skip(options).unwrap().map(GpuTensorFactory::new) else { return };
    assert!(f.context().kernel_family().splits_attention());
    let config = tiny::tiny_config();
    let w = tiny::random_weights(&config, 13, DType::F32);
    let gguf = GgufFile::from_bytes("tiny.gguf", tiny::gguf_bytes(&config, &w, DType::F32)).unwrap();
    let model = arch::load(config.clone(), &GgufWeights { gguf: &gguf }, &f, &mut |_, _| {}).unwrap();
    let exec = GpuExecutor::new(f.clone(), model, KvCacheConfig::new(16, 48)).unwrap();
    let tokens: Vec<u32> = (0..702u32).map(|i| (i * 37 + i / 7) % 256).collect();
    let want = weft::cpu::llama::forward(&config, &w, &tokens);
    // Physical blocks in reverse, so logical and physical never line up.
    let table: Vec<u32> = (0..44u32).rev().collect();
    let out = weft::rt::block_on(exec.logits(&batch(vec![seq(&tokens[..700], 0, &table, 1)]))).unwrap();
    close("700-token prompt", &out[0], &want[699]);
    for p in 700..702 {
        let out = weft::rt::block_on(exec.logits(&batch(vec![seq(&tokens[p..=p], p, &table, 1)]))).unwrap();
        close(&format!("decode at {p}"), &out[0], &want[p]);
    }
}
