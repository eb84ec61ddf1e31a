//! Random-weight models of real shapes (`weft::model::synthetic`, what `cargo xtask make-model`
//! writes) load and generate: a Llama shape with Llama 3 RoPE factors and a Qwen2 shape with
//! q/k/v biases, shrunk to test size, whose padded vocabulary ids can be prompted and produced.

use weft::DType;
use weft::EngineBuilder;
use weft::engine::request::{GenerationParams, InferenceRequest, Prompt};
use weft::gpu::GpuOptions;
use weft::model::gguf::Metadata;
use weft::model::synthetic::{Llama3Rope, Shape, write_gguf};
use weft::sampling::SamplingParams;

fn small(architecture: &'static str, vocab_size: usize) -> Shape {
    Shape {
        name: "small",
        architecture,
        vocab_size,
        hidden_size: 128,
        intermediate_size: 256,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 32,
        rms_norm_eps: 1e-5,
        rope_theta: 500_000.0,
        context_length: 2048,
        tie_word_embeddings: architecture == "qwen2",
        attention_bias: architecture == "qwen2",
        llama3_rope: (architecture == "llama").then_some(Llama3Rope {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_context_length: 8192,
        }),
    }
}

/// Five greedy tokens from a 24-token prompt of real and padding ids alike (as `weft bench`
/// prompts), all inside the vocabulary; the engine is shut down after.
fn generate_five(engine: &weft::engine::ContinuousBatchEngine, vocab_size: usize) {
    engine.start_loop().unwrap();
    let prompt: Vec<u32> = (0..24).map(|i| (i * 37 % vocab_size) as u32).collect();
    let params = GenerationParams {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(5),
        ignore_eos: true,
        ..Default::default()
    };
    let response = weft::rt::block_on(engine.infer(InferenceRequest::new(Prompt::Tokens(prompt), params))).unwrap();
    assert_eq!(response.usage.completion_tokens, 5);
    assert!(response.token_ids.iter().all(|&t| (t as usize) < vocab_size));
    engine.shutdown();
}

#[test]
fn synthetic_shapes_load_and_generate() {
    let Some(ctx) = weft::gpu::open_or_skip(GpuOptions::default()).unwrap() else { return };
    let tokenizer: Metadata =
        weft::model::tiny::tokenizer_metadata().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    for (shape, dtype) in [(small("llama", 1000), DType::Q4_1), (small("qwen2", 700), DType::Q8_0)] {
        let mut bytes = Vec::new();
        write_gguf(&shape, dtype, &tokenizer, 3, &mut bytes, &mut |_, _| {}).unwrap();
        let engine = EngineBuilder::from_gguf_bytes("synthetic.gguf", bytes)
            .unwrap()
            .kv_memory_bytes(4 << 20)
            .build_on(ctx.clone())
            .unwrap();
        assert_eq!(engine.tokenizer().vocab_size(), shape.vocab_size);
        generate_five(&engine, shape.vocab_size);
    }
}

/// The Granite 4.0-H writer of `cargo xtask make-model --shape granite-4.0-h-1b`, shrunk:
/// llama.cpp's `granitehybrid` layout loads (attention and Mamba2 layers where the shape says,
/// no RoPE), generates with its prefill scanned in chunks, and returns every state slot.
#[test]
fn a_synthetic_granite_hybrid_loads_and_generates() {
    use weft::model::synthetic_ssm::{GRANITE_4_0_H_1B, HybridShape, granite_hybrid_gguf};
    let Some(ctx) = weft::gpu::open_or_skip(GpuOptions::default()).unwrap() else { return };
    let shape = HybridShape {
        hidden: 128,
        num_layers: 4,
        attention_layers: &[1, 3],
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 32,
        ffn: 256,
        vocab: 600,
        ssm: weft::model::config::SsmConfig { num_heads: 4, ..GRANITE_4_0_H_1B.ssm },
    };
    let builder = EngineBuilder::from_gguf_bytes("granite.gguf", granite_hybrid_gguf(&shape, DType::Q8_0)).unwrap();
    let c = builder.model_config();
    let hybrid = c.hybrid.as_ref().unwrap();
    assert_eq!((c.architecture.as_str(), c.num_layers, c.vocab_size), ("granitehybrid", 4, 600));
    assert_eq!((hybrid.attention_layers.as_slice(), hybrid.use_rope), (&[1, 3][..], false));
    let engine =
        builder.kv_memory_bytes(4 << 20).state_memory_bytes(8 << 20).scan_chunk_rows(Some(8)).build_on(ctx).unwrap();
    generate_five(&engine, shape.vocab);
    assert_eq!(engine.state_usage().unwrap().used_slots, 0);
}
