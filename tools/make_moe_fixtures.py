#!/usr/bin/env python3
"""Make the outside-truth fixture of weft's mixture-of-experts tests: a tiny random-weight
``Qwen3MoeForCausalLM`` saved as a Hugging Face directory and converted to GGUF by llama.cpp's own
``convert_hf_to_gguf.py``, with transformers' logits and greedy tokens (the layout
``tools/make_recurrent_fixtures.py`` writes, whose tokenizer, prompts and converter run this
reuses, as ``tools/make_dense_fixtures.py`` does).

``tests/fixtures/granitemoe/`` (``--only granitemoe``)
    IBM Granite MoE with shared experts (``GraniteMoeSharedForCausalLM``, llama.cpp's
    ``granitemoe``): Granite's four multipliers, and in every layer a router over 8 experts
    whose top-2 logits are softmaxed (the same weights as a softmax over all 8 renormalised
    over the two), each a SwiGLU MLP of 32, plus a shared SwiGLU MLP of 64 that every token
    runs, added to the experts' sum. The converter writes the shared expert as
    ``ffn_{gate,up,down}_shexp``.

``tests/fixtures/granite_hybrid_moe/`` (``--only granite_hybrid_moe``)
    Granite 4.0-H with experts (``GraniteMoeHybridForCausalLM``, ``num_local_experts`` 8, as
    Granite 4.0-H Tiny and Small): Mamba2 layers around an attention layer, each layer's MLP
    the same routed experts plus shared expert.

``tests/fixtures/qwen35moe/`` (``--only qwen35moe``)
    Qwen3.5-MoE (``Qwen3_5MoeForCausalLM``, llama.cpp's ``qwen35moe``): the tiny dense
    Qwen3.5's layers (``tools/make_recurrent_fixtures.py``'s ``QWEN35_LAYERS``; attention third
    here, untied LM head), each MLP a router over 8 experts, softmax, top 2, always renormalised,
    each expert a SwiGLU MLP of 32, beside a shared SwiGLU MLP of 64 whose output is scaled by
    sigmoid(x · ``shared_expert_gate``) (a one-output Linear, drawn like the other matrices: its
    sigmoids span about 0.05 to 0.98 over the prompts). The routers are drawn half as wide as
    the others' (Qwen3.5's (1 + w) norms double their inputs), so that the second expert keeps a
    real weight. Four prompts and 32 greedy tokens, as the dense Qwen3.5's; the converter runs
    with ``--no-mtp``. The router report covers the greedy tokens too (what a decode routes).

``tests/fixtures/qwen3moe/``
    Qwen3 attention (q_norm / k_norm per head) and, in every layer, a sparse MoE block: a
    router over 8 experts, the top 2 per token, their softmax weights renormalised to sum to 1
    (``norm_topk_prob``), each expert a SwiGLU MLP of 32. transformers 5 stores a layer's
    experts fused (``mlp.experts.gate_up_proj`` (8, 64, 64), gate rows then up rows per expert,
    and ``mlp.experts.down_proj`` (8, 64, 32)); llama.cpp's converter splits them into
    ``blk.N.ffn_gate_exps`` / ``ffn_up_exps`` / ``ffn_down_exps`` and writes the router as
    ``ffn_gate_inp``.

The model: hidden 64, 2 layers, 4 heads of 16 with 2 KV heads, RoPE base 10000, untied LM
head. The router's weights are drawn wider than the other matrices' (std 0.25, router logits
of std about 2) so that each token's second and third experts are far apart: a near-tie there
would let f32 summation order pick a different expert. The script prints the smallest gap
between a token's k-th and (k+1)-th router probabilities over the prompts, and the experts the
prompts reach.

``tests/fixtures/gpt_oss/`` (``--only gpt_oss``)
    OpenAI's gpt-oss: biased q/k/v/o projections, a learned attention sink per head (a logit
    that joins each softmax's denominator), layers alternating a sliding window of 8 with full
    attention, YaRN RoPE (factor 4 over 32 original positions, ``truncate`` false as gpt-oss
    sets it), and in every layer a router with bias over 8 experts whose top-2 logits are
    softmaxed, each expert ``(clamp(up) + 1) · glu(clamp(gate))`` with gate and up biased and
    interleaved in ``gate_up_proj`` (8, 64, 64) (hidden, 2 · 32 columns gate, up, gate, …),
    and a biased down. The experts' gate/up weights are drawn wide (activations of std about
    4) so that the SwiGLU limit of 7 clips some of them. llama.cpp's converter writes MXFP4
    only from checkpoints already in MXFP4 (``*_blocks``/``*_scales``), so this f32 model's
    experts stay f32 in the GGUF.

``tests/fixtures/gpt_oss_mxfp4/`` (``--only gpt_oss_mxfp4``)
    The same gpt-oss with its experts in MXFP4, as OpenAI ships them: each expert weight
    rounded to the nearest E2M1 value under a power-of-two (E8M0) scale per 32 inputs, saved
    as transformers' ``*_blocks`` / ``*_scales`` with ``quantization_config`` mxfp4 (the layout
    of OpenAI's own checkpoints), read back by transformers
    (``Mxfp4Config(dequantize=True)``: its own decoder gives the reference logits), and
    converted by llama.cpp, which repacks the blocks into GGUF MXFP4 ``ffn_*_exps``.

Made with torch 2.15.0 (its default wheel, run on the CPU), transformers 5.25.0, gguf-py and
``convert_hf_to_gguf.py`` of llama-cpp-python 0.3.36's ``vendor/llama.cpp``.

Usage::

    python tools/make_moe_fixtures.py --llama-cpp /path/to/llama-cpp-python-0.3.36/vendor/llama.cpp [--only NAME]
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_recurrent_fixtures as recurrent  # noqa: E402

NAME = "qwen3moe"
GPT_OSS = "gpt_oss"
GPT_OSS_MXFP4 = "gpt_oss_mxfp4"
GRANITEMOE = "granitemoe"
GRANITE_HYBRID_MOE = "granite_hybrid_moe"
LFM2MOE = "lfm2moe"
QWEN35MOE = "qwen35moe"
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
ROUTER_STD = 0.25


def qwen3moe(vocab: int):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=128,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-6,
        tie_word_embeddings=False, pad_token_id=1, bos_token_id=0, eos_token_id=0,
    )
    return Qwen3MoeForCausalLM(config)


def qwen35moe(vocab: int):
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    config = Qwen3_5MoeTextConfig(
        vocab_size=vocab, moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=8,
        num_experts_per_tok=2, layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        tie_word_embeddings=False, **recurrent.QWEN35_LAYERS,
    )
    return Qwen3_5MoeForCausalLM(config)


def granitemoe(vocab: int):
    from transformers import GraniteMoeSharedConfig, GraniteMoeSharedForCausalLM

    config = GraniteMoeSharedConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=32, shared_intermediate_size=64, num_local_experts=8, num_experts_per_tok=2,
        max_position_embeddings=128, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=1 / 16, logits_scaling=6.0,
        rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=1, bos_token_id=0, eos_token_id=0,
    )
    return GraniteMoeSharedForCausalLM(config)


def granite_hybrid_moe(vocab: int):
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    config = GraniteMoeHybridConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=32, shared_intermediate_size=64, num_local_experts=8, num_experts_per_tok=2,
        layer_types=["linear_attention", "attention", "linear_attention"], position_embedding_type=None,
        mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=8, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=1 / 16,
        logits_scaling=6.0, rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=4096,
        pad_token_id=1, bos_token_id=0, eos_token_id=0,
    )
    return GraniteMoeHybridForCausalLM(config)


def gpt_oss(vocab: int):
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=128, attention_bias=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "original_max_position_embeddings": 32, "truncate": False},
        rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=1, bos_token_id=0, eos_token_id=0,
    )
    model = GptOssForCausalLM(config)
    model.config._attn_implementation = "eager"
    return model


def lfm2moe(vocab: int):
    from transformers import Lfm2MoeConfig, Lfm2MoeForCausalLM

    config = Lfm2MoeConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, num_dense_layers=1,
        use_expert_bias=True, norm_topk_prob=True, routed_scaling_factor=1.0,
        layer_types=["conv", "full_attention", "conv", "full_attention"], conv_L_cache=3, conv_bias=False,
        norm_eps=1e-5, max_position_embeddings=4096, tie_word_embeddings=True, pad_token_id=1, bos_token_id=0,
        eos_token_id=0,
    )
    return Lfm2MoeForCausalLM(config)


# Qwen3.5-MoE as the dense Qwen3.5 fixture: four prompts, and no multi-token-prediction layer
# for the converter to expect.
MAKE_EXTRAS = {QWEN35MOE: {"prompts": recurrent.PROMPTS_4, "converter_args": ["--no-mtp"]}}

DENSE_RANDOMIZE = recurrent.randomize
MODELS = []


def randomize(model) -> None:
    """``recurrent.randomize``, but the experts (3-D) drawn like matrices of their input width
    and the routers wider (see above)."""
    DENSE_RANDOMIZE(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 3:
                p.copy_(torch.randn_like(p) * 0.5 / p.shape[-1] ** 0.5)
            elif name.endswith(("mlp.gate.weight", "router.layer.weight", "feed_forward.gate.weight")):
                p.copy_(torch.randn_like(p) * ROUTER_STD)
        # LFM2-MoE's choice bias is a buffer (zeros until trained): spread it so it decides.
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.copy_(torch.randn_like(b) * 0.1)
    MODELS.append(model)


def randomize_qwen35moe(model) -> None:
    """``randomize``, with the routers half as wide: Qwen3.5's (1 + w) norms, w about 1 here,
    feed them inputs twice the others' scale, so this keeps their logits' spread at about 2."""
    randomize(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn_like(p) * ROUTER_STD / 2)


def randomize_gpt_oss(model) -> None:
    """``recurrent.randomize``, then gpt-oss's own parameters: biases small, sinks of std 1,
    experts (stored input-major: (experts, in, out)) drawn by their input width, gate/up wide
    enough to reach the SwiGLU limit, routers wide (see ``randomize``)."""
    DENSE_RANDOMIZE(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.copy_(torch.randn_like(p))
            elif name.endswith("experts.gate_up_proj"):
                p.copy_(torch.randn_like(p) * 4.0 / p.shape[-2] ** 0.5)
            elif name.endswith("experts.down_proj"):
                p.copy_(torch.randn_like(p) * 0.5 / p.shape[-2] ** 0.5)
            elif name.endswith("router.weight"):
                p.copy_(torch.randn_like(p) * ROUTER_STD)
            elif "bias" in name:
                p.copy_(torch.randn_like(p) * 0.1)
    MODELS.append(model)


def gpt_oss_report(model, sequences=recurrent.PROMPTS) -> None:
    """Print the smallest gap between a token's k-th and (k+1)-th router logit (top-k picks on
    logits) over ``sequences``, the experts reached, and how often the SwiGLU limit clips gate
    or up."""
    k = model.config.num_experts_per_tok
    limit = model.config.swiglu_limit
    gaps, chosen, clipped = [], set(), [0, 0]

    def router_hook(_module, inputs, _output):
        logits = torch.nn.functional.linear(inputs[0], _module.weight, _module.bias)
        top = logits.topk(k + 1, dim=-1)
        gaps.append(float((top.values[:, k - 1] - top.values[:, k]).min()))
        chosen.update(top.indices[:, :k].flatten().tolist())

    def experts_hook(module, inputs, _output):
        x = inputs[0]
        gate_up = torch.einsum("th,ehf->etf", x, module.gate_up_proj) + module.gate_up_proj_bias[:, None]
        clipped[0] += int((gate_up[..., ::2] > limit).sum() + (gate_up[..., 1::2].abs() > limit).sum())
        clipped[1] += gate_up.numel()

    hooks = [layer.mlp.router.register_forward_hook(router_hook) for layer in model.model.layers]
    hooks += [layer.mlp.experts.register_forward_hook(experts_hook) for layer in model.model.layers]
    with torch.no_grad():
        for ids in sequences:
            model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    print(f"smallest top-{k} gap in router logits: {min(gaps):.3e}; experts reached: {sorted(chosen)}; "
          f"clipped by the SwiGLU limit: {clipped[0]} of {clipped[1]} gate/up values (all experts)")


def routing_report(model, sequences=recurrent.PROMPTS) -> None:
    """Print the smallest gap between the k-th and (k+1)-th router probability of any token at
    any layer over ``sequences`` (each prompt and its greedy tokens: what a decode reads), and
    the experts chosen."""
    k = model.config.num_experts_per_tok
    gaps, chosen = [], set()

    def hook(_module, inputs, output):
        logits = output[0] if isinstance(output, tuple) else output
        if len(inputs) > 1 and inputs[1] is not None:
            # LFM2-MoE: the choice is by sigmoid(logit) + the expert bias.
            scores = torch.sigmoid(logits.float()) + inputs[1]
        else:
            scores = torch.softmax(logits.float(), dim=-1)
        top = scores.topk(k + 1, dim=-1)
        gaps.append(float((top.values[:, k - 1] - top.values[:, k]).min()))
        chosen.update(top.indices[:, :k].flatten().tolist())

    def router(layer):
        if hasattr(layer, "block_sparse_moe"):
            return layer.block_sparse_moe.router
        if hasattr(layer, "feed_forward"):
            return getattr(layer.feed_forward, "gate", None)
        return layer.mlp.gate

    # Qwen3.5-MoE's shared expert is scaled by sigmoid(shared_expert_gate(x)) per token.
    shared_gates = []

    def gate_hook(_module, _inputs, output):
        shared_gates.append(torch.sigmoid(output.float()).flatten())

    routers = [r for r in map(router, model.model.layers) if r is not None]
    hooks = [router.register_forward_hook(hook) for router in routers]
    hooks += [layer.mlp.shared_expert_gate.register_forward_hook(gate_hook) for layer in model.model.layers
              if hasattr(getattr(layer, "mlp", None), "shared_expert_gate")]
    with torch.no_grad():
        for ids in sequences:
            model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    print(f"smallest top-{k} gap in router probabilities: {min(gaps):.3e}; experts reached: {sorted(chosen)}")
    if shared_gates:
        gates = torch.cat(shared_gates)
        print(f"shared expert gates (sigmoid): {float(gates.min()):.3f} to {float(gates.max()):.3f}")


def mxfp4_blocks(w):
    """transformers' MXFP4 layout of an expert weight ``w`` (experts, in, out): blocks (experts,
    out, in / 32, 16) uint8, element 2i of a block in byte i's low nibble and 2i + 1 in its high
    one, and scales (experts, out, in / 32) uint8, the E8M0 exponent + 127. Each block's scale is
    the smallest power of two that puts its largest magnitude within E2M1's 6; each value the
    nearest E2M1 code (ties to the lower code)."""
    rows = w.transpose(1, 2).contiguous()  # (experts, out, in)
    e, o, i = rows.shape
    blocks = rows.reshape(e, o, i // 32, 32)
    amax = blocks.abs().amax(dim=-1, keepdim=True).clamp(min=2.0 ** -100)
    exponent = torch.ceil(torch.log2(amax / 6.0))
    lut = torch.tensor(FP4_VALUES)
    codes = ((blocks / 2.0 ** exponent)[..., None] - lut).abs().argmin(dim=-1).to(torch.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, (exponent[..., 0] + 127).to(torch.uint8)


def make_gpt_oss_mxfp4(llama_cpp: Path) -> None:
    """The gpt-oss fixture's model with MXFP4 experts (see the module's docstring)."""
    from safetensors.torch import load_file, save_file
    from transformers import GptOssForCausalLM, Mxfp4Config

    out = recurrent.FIXTURES / GPT_OSS_MXFP4
    out.mkdir(parents=True, exist_ok=True)
    if True:  # one block, as the HF directory's life spans the conversion
        hf = out / "hf"
        hf.mkdir(exist_ok=True)
        vocab = recurrent.tokenizer(hf)
        (hf / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
            "add_bos_token": False}, indent=2) + "\n")
        torch.manual_seed(14)
        model = gpt_oss(vocab).float().eval()
        randomize_gpt_oss(model)
        model.save_pretrained(hf, safe_serialization=True)
        tensors = load_file(hf / "model.safetensors")
        for name in list(tensors):
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                blocks, scales = mxfp4_blocks(tensors.pop(name))
                tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        save_file(tensors, hf / "model.safetensors", metadata={"format": "pt"})
        config = json.loads((hf / "config.json").read_text())
        config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
        (hf / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        # transformers' own MXFP4 decoder gives the model the reference runs.
        quantized = GptOssForCausalLM.from_pretrained(
            hf, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.float32).eval()
        quantized.config._attn_implementation = "eager"
        expected = {"meta": {"generator": "tools/make_moe_fixtures.py", "transformers": __import__("transformers").__version__,
                             "torch": torch.__version__, "vocab_size": vocab}, "prompts": []}
        with torch.no_grad():
            for ids in recurrent.PROMPTS:
                logits = quantized(torch.tensor([ids])).logits[0, -1]
                gen = quantized.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                         max_new_tokens=recurrent.NUM_GREEDY_32, do_sample=False, output_logits=True,
                                         return_dict_in_generate=True, eos_token_id=None)
                steps = [s[0] for s in gen.logits]
                margins = [float(v.topk(2).values[0] - v.topk(2).values[1]) for v in steps]
                expected["prompts"].append({"prompt_ids": ids, "last_logits": [round(float(v), 6) for v in logits],
                                            "greedy_ids": gen.sequences[0, len(ids):].tolist(),
                                            "greedy_margins": [round(m, 5) for m in margins]})
        (out / "expected.json").write_text(json.dumps(expected) + "\n")
        gpt_oss_report(quantized)

        import conversion.base
        import convert_hf_to_gguf

        conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
        sys.argv = ["convert_hf_to_gguf.py", str(hf), "--outtype", "f32", "--outfile", str(out / "model.gguf")]
        convert_hf_to_gguf.main()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="vendor/llama.cpp of llama-cpp-python")
    parser.add_argument("--only", choices=[NAME, GPT_OSS, GPT_OSS_MXFP4, GRANITEMOE, GRANITE_HYBRID_MOE, LFM2MOE, QWEN35MOE], help="make one fixture")
    args = parser.parse_args()
    sys.path.insert(0, str(args.llama_cpp))
    sys.path.insert(1, str(args.llama_cpp / "gguf-py"))
    for name, build, rand, report, greedy in [
        (NAME, qwen3moe, randomize, routing_report, recurrent.NUM_GREEDY),
        (GPT_OSS, gpt_oss, randomize_gpt_oss, gpt_oss_report, recurrent.NUM_GREEDY_32),
        (GRANITEMOE, granitemoe, randomize, routing_report, recurrent.NUM_GREEDY),
        (GRANITE_HYBRID_MOE, granite_hybrid_moe, randomize, routing_report, recurrent.NUM_GREEDY),
        (LFM2MOE, lfm2moe, randomize, routing_report, recurrent.NUM_GREEDY),
        (QWEN35MOE, qwen35moe, randomize_qwen35moe, routing_report, recurrent.NUM_GREEDY_32),
    ]:
        if args.only not in (None, name):
            continue
        hf = recurrent.FIXTURES / name / "hf"
        hf.mkdir(parents=True, exist_ok=True)
        # The converter reads a GPT-2 style vocabulary when the tokenizer class says so.
        (hf / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
            "add_bos_token": False}, indent=2) + "\n")
        recurrent.randomize = rand
        MODELS.clear()
        recurrent.make(name, build, args.llama_cpp, num_greedy=greedy, **MAKE_EXTRAS.get(name, {}))
        expected_path = recurrent.FIXTURES / name / "expected.json"
        expected = json.loads(expected_path.read_text())
        report(MODELS[0], [p["prompt_ids"] + p["greedy_ids"] for p in expected["prompts"]])
        expected["meta"]["generator"] = "tools/make_moe_fixtures.py"
        expected_path.write_text(json.dumps(expected) + "\n")
    if args.only in (None, GPT_OSS_MXFP4):
        make_gpt_oss_mxfp4(args.llama_cpp)


if __name__ == "__main__":
    main()
