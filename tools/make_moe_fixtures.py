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


FAMILIES = {"qwen3moe": qwen3moe, "granitemoe": granitemoe, "granite_hybrid_moe": granite_hybrid_moe}
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
            elif name.endswith("mlp.gate.weight") or name.endswith("router.layer.weight"):
                p.copy_(torch.randn_like(p) * ROUTER_STD)
    MODELS.append(model)


def routing_report(model) -> None:
    """Print the smallest gap between the k-th and (k+1)-th router probability of any token at
    any layer over the prompts, and the experts chosen."""
    k = model.config.num_experts_per_tok
    gaps, chosen = [], set()

    def hook(_module, _inputs, output):
        logits = output[0] if isinstance(output, tuple) else output
        top = torch.softmax(logits.float(), dim=-1).topk(k + 1, dim=-1)
        gaps.append(float((top.values[:, k - 1] - top.values[:, k]).min()))
        chosen.update(top.indices[:, :k].flatten().tolist())

    routers = [layer.block_sparse_moe.router if hasattr(layer, "block_sparse_moe") else layer.mlp.gate
               for layer in model.model.layers]
    hooks = [router.register_forward_hook(hook) for router in routers]
    with torch.no_grad():
        for ids in recurrent.PROMPTS:
            model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    print(f"smallest top-{k} gap in router probabilities: {min(gaps):.3e}; experts reached: {sorted(chosen)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="vendor/llama.cpp of llama-cpp-python")
    parser.add_argument("--only", choices=sorted(FAMILIES), help="make one fixture")
    args = parser.parse_args()
    sys.path.insert(0, str(args.llama_cpp))
    sys.path.insert(1, str(args.llama_cpp / "gguf-py"))
    for name, build in FAMILIES.items():
        if args.only in (None, name):
            make(name, build, args.llama_cpp)


def make(name: str, build, llama_cpp: Path) -> None:
    hf = recurrent.FIXTURES / name / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    # The converter reads a GPT-2 style vocabulary when the tokenizer class says so.
    (hf / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "add_bos_token": False}, indent=2) + "\n")
    recurrent.randomize = randomize
    recurrent.make(name, build, llama_cpp)
    routing_report(MODELS[-1])
    expected_path = recurrent.FIXTURES / name / "expected.json"
    expected = json.loads(expected_path.read_text())
    expected["meta"]["generator"] = "tools/make_moe_fixtures.py"
    expected_path.write_text(json.dumps(expected) + "\n")


if __name__ == "__main__":
    main()
