#!/usr/bin/env python3
"""Make the outside-truth fixture of weft's Gemma 4 tests: a tiny random-weight
``Gemma4ForCausalLM`` (text) saved as a Hugging Face directory and converted to GGUF by llama.cpp's
own ``convert_hf_to_gguf.py``, with transformers' logits and greedy tokens (``expected.json`` as
``tools/make_recurrent_fixtures.py`` writes it, whose prompts, tokenizer, weight randomizer and
conversion this reuses: 4 prompts, 32 greedy tokens; its tokenizer is Gemma's kind, below).

Writes ``tests/fixtures/gemma4/`` (``hf/``, ``model.gguf``, ``expected.json``),
``tests/fixtures/gemma4moe/`` (below) and ``tests/fixtures/gemma4_wide/``: the published checkpoints'
full-attention heads of 512 (``global_head_dim``) in an otherwise narrower model (hidden 32, MLPs of 64,
2 query heads, 4 layers: sliding, full, then the two sharing their KV: layer 2 reads layer 0's cache,
layer 3 layer 1's), so attention at head size 512 is held to transformers while the files stay near
1 MB; one prompt of 33 tokens (past the window) and 12 greedy tokens. ``--only NAME`` makes one.

The model has the small "E" models' features, each made to show if weft got it wrong:

- 6 layers: sliding, sliding, sliding, full, sliding, full (window 8, so the longer prompts
  pass it); sliding layers have 2 KV heads of 16, full layers 1 KV head of 32 (Gemma 4's
  ``global_head_dim`` and ``num_global_key_value_heads``), 4 query heads each;
- KV sharing: the last 2 layers (``num_kv_shared_layers``) have no k/v projections and attend
  over the cache of the last earlier layer of their kind (layer 4 reads layer 2's, layer 5
  layer 3's);
- per-layer embeddings of 32 per layer (``hidden_size_per_layer_input``): a second token table
  (304 × 6·32), the projection of the scaled embedding beside it, and in every layer a gate,
  GELU, product and projection back, added after the MLP;
- ``attention_k_eq_v``: the full layers' values are their keys' projection (v_proj absent);
- proportional RoPE on the full layers (a quarter of each head's angles rotate, base 1e6),
  plain RoPE of base 10000 on the sliding ones; the value heads RMS-normed without a weight;
  attention unscaled (q_norm does it);
- ``use_double_wide_mlp``: the KV-sharing layers' MLPs are twice as wide (192);
- ``layer_scalar`` random in [0.6, 1.4] (transformers' init leaves it 1);
- ``final_logit_softcapping`` 5 (logits of this random model reach past it, so it bends them).

Norm weights are random around 1, as Gemma 4 uses them (no 1 + w).

``tests/fixtures/gemma4moe/`` (``--only gemma4moe``)
    Gemma 4's mixture-of-experts layers (``enable_moe_block``, as the 26B A4B): the same
    attention layers without per-layer embeddings or KV sharing (the 26B A4B has neither), and
    in every layer the dense GeGLU MLP of 96 beside a router over 8 experts, top 2, each expert a
    GeGLU MLP of 32 (``moe_intermediate_size``). What Gemma 4 adds to a plain MoE, each drawn so
    that it shows: the router reads the residual stream RMS-normed without a weight, times its
    own ``router.scale`` (random around 1) and hidden^-0.5; its top-2 softmax weights are
    renormalised, then multiplied by ``router.per_expert_scale`` (random around 1; llama.cpp's
    ``ffn_down_exps.scale``); the experts read their own pre-norm (``pre_feedforward_layernorm_2``)
    and the MLP's and the experts' outputs have their own post-norms (``_1``, ``_2``) before they
    are summed and post-normed as the dense layer's MLP is. transformers stores each layer's
    experts stacked (``experts.gate_up_proj`` (8, 64, 64), each expert's gate rows then its up
    rows; ``experts.down_proj`` (8, 64, 32)); llama.cpp's converter writes them as it does (fused
    ``ffn_gate_up_exps`` or split). The routers are drawn wide (std 2: logits of std about 2 on
    their unit-length input) so that no token's 2nd and 3rd experts nearly tie; the script prints
    the smallest gap and the experts reached. Its four prompts add up to 64 tokens, so a batch of
    all of them runs the experts grouped by expert (weft's ``GROUPED_MIN_TOKENS``).

Usage::

    python tools/make_gemma4_fixtures.py --llama-cpp /path/to/llama-cpp-python-x.y.z/vendor/llama.cpp [--only NAME]
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_recurrent_fixtures as recurrent  # noqa: E402


def gemma_tokenizer(out: Path) -> int:
    """A SentencePiece-style BPE as Gemma's (spaces written ``▁``, unknown characters as
    ``<0xXX>`` byte tokens, ranked merges): what llama.cpp's Gemma 4 converter reads
    (``LlamaHfVocab``) and writes as a ``gemma4`` vocabulary. Trained here on a few sentences;
    the tests feed token ids."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    specials = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=recurrent.VOCAB, special_tokens=specials, initial_alphabet=[])
    text = [
        "per layer embeddings feed every layer a slice of a second table",
        "layers that share keys and values read an earlier layer's cache",
    ] * 8
    tok.train_from_iterator(text, trainer)
    tok.save(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() == recurrent.VOCAB, f"the tokenizer has {tok.get_vocab_size()} tokens"
    return recurrent.VOCAB


def gemma4(vocab: int):
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    config = Gemma4TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
        sliding_window=8, layer_types=["sliding_attention"] * 3 + ["full_attention", "sliding_attention", "full_attention"],
        num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=32, vocab_size_per_layer_input=vocab,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1e6}},
        final_logit_softcapping=5.0, max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
        pad_token_id=1, bos_token_id=0, eos_token_id=0,
    )
    model = Gemma4ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.layer_scalar.copy_(0.6 + 0.8 * torch.rand(1))
    return model


# The routers' spread (see the module's docstring).
ROUTER_STD = 2.0


def gemma4moe(vocab: int):
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    config = Gemma4TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
        sliding_window=8, layer_types=["sliding_attention"] * 3 + ["full_attention", "sliding_attention", "full_attention"],
        num_kv_shared_layers=0, hidden_size_per_layer_input=0,
        enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=32,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1e6}},
        final_logit_softcapping=5.0, max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
        pad_token_id=1, bos_token_id=0, eos_token_id=0,
    )
    model = Gemma4ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.layer_scalar.copy_(0.6 + 0.8 * torch.rand(1))
    MODELS.append(model)
    return model


def gemma4_wide(vocab: int):
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    config = Gemma4TextConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, global_head_dim=512, num_global_key_value_heads=1, attention_k_eq_v=True,
        sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2,
        num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=32, vocab_size_per_layer_input=vocab,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1e6}},
        final_logit_softcapping=5.0, max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
        pad_token_id=1, bos_token_id=0, eos_token_id=0,
    )
    model = Gemma4ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.layer_scalar.copy_(0.6 + 0.8 * torch.rand(1))
    return model


MODELS = []
DENSE_RANDOMIZE = recurrent.randomize


def randomize_moe(model) -> None:
    """``recurrent.randomize``, then the experts (3-D) drawn like matrices of their input width
    and the routers wide (see above)."""
    DENSE_RANDOMIZE(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 3:
                p.copy_(torch.randn_like(p) * 0.5 / p.shape[-1] ** 0.5)
            elif name.endswith("router.proj.weight"):
                p.copy_(torch.randn_like(p) * ROUTER_STD)


def routing_report(model, sequences) -> None:
    """Print the smallest gap between a token's k-th and (k+1)-th router probability at any
    layer over ``sequences`` (each prompt and its greedy tokens: what a decode reads), the
    experts chosen and the per-expert scales' range."""
    k = model.config.top_k_experts
    gaps, chosen = [], set()

    def hook(_module, _inputs, output):
        probs = output[0]
        top = probs.topk(k + 1, dim=-1)
        gaps.append(float((top.values[:, k - 1] - top.values[:, k]).min()))
        chosen.update(top.indices[:, :k].flatten().tolist())

    hooks = [layer.router.register_forward_hook(hook) for layer in model.model.layers]
    with torch.no_grad():
        for ids in sequences:
            model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    scales = torch.cat([layer.router.per_expert_scale for layer in model.model.layers])
    print(f"smallest top-{k} gap in router probabilities: {min(gaps):.3e}; experts reached: {sorted(chosen)}; "
          f"per-expert scales {float(scales.min()):.3f} to {float(scales.max()):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="vendor/llama.cpp of llama-cpp-python")
    parser.add_argument("--only", choices=["gemma4", "gemma4moe", "gemma4_wide"], help="make one fixture")
    args = parser.parse_args()
    sys.path.insert(0, str(args.llama_cpp))
    sys.path.insert(1, str(args.llama_cpp / "gguf-py"))
    # Gemma 4's converter reads a SentencePiece-style BPE, not the other fixtures' byte-level one.
    recurrent.tokenizer = gemma_tokenizer
    fixtures = [
        ("gemma4", gemma4, recurrent.PROMPTS_4, recurrent.NUM_GREEDY_32),
        ("gemma4moe", gemma4moe, recurrent.PROMPTS_4, recurrent.NUM_GREEDY_32),
        ("gemma4_wide", gemma4_wide, recurrent.PROMPTS[2:], recurrent.NUM_GREEDY),
    ]
    for name, build, prompts, greedy in fixtures:
        if args.only not in (None, name):
            continue
        recurrent.randomize = randomize_moe if name == "gemma4moe" else DENSE_RANDOMIZE
        recurrent.make(name, build, args.llama_cpp, prompts, greedy)
        expected = recurrent.FIXTURES / name / "expected.json"
        data = json.loads(expected.read_text())
        data["meta"]["generator"] = "tools/make_gemma4_fixtures.py"
        expected.write_text(json.dumps(data) + "\n")
        if name == "gemma4moe":
            sequences = [p["prompt_ids"] + p["greedy_ids"] for p in data["prompts"]]
            routing_report(MODELS[-1], sequences)


if __name__ == "__main__":
    main()
