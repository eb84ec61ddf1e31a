#!/usr/bin/env python3
"""Make the outside-truth fixtures of weft's dense Llama-variant tests: tiny random-weight models
in transformers, each saved as a Hugging Face directory and converted to GGUF by llama.cpp's own
``convert_hf_to_gguf.py``, with transformers' logits and greedy tokens (the layout
``tools/make_recurrent_fixtures.py`` writes, whose tokenizer, weight randomizer and converter run
this reuses, as ``tools/make_yarn_fixtures.py`` does).

``tests/fixtures/granite/``
    A ``GraniteForCausalLM`` (IBM Granite 3.x dense): Llama with four multipliers, set far from
    their defaults so that a forgotten one shows: embedding 12, residual 0.22, attention 0.75
    (neither 1/sqrt(16) nor transformers' default 1; with these random weights a smaller scale
    leaves attention nearly uniform, and so hardly visible), logits divided by 6. 2 layers,
    untied LM head. llama.cpp's converter writes
    them as ``granite.embedding_scale``, ``residual_scale``, ``attention.scale`` and
    ``logit_scale``, and permutes q/k rows as for Llama.
``tests/fixtures/smollm3/``
    A ``SmolLM3ForCausalLM``: Llama whose every fourth layer has no RoPE (transformers'
    ``no_rope_layers`` [1, 1, 1, 0], from ``no_rope_layer_interval`` 4; llama.cpp fixes the
    step at 4 and writes no key for it). 4 layers, MLP 32, tied embeddings.
``tests/fixtures/olmo2/``
    An ``Olmo2ForCausalLM``: no norm before attention or MLP; RMSNorms of their outputs before
    each residual add (``post_attention_layernorm``, ``post_feedforward_layernorm``), and
    ``q_norm`` / ``k_norm`` over the whole q and k projections (64 and 32 wide), not per head.
    2 layers, untied LM head (llama.cpp requires one).

The models: hidden 64, 4 heads of 16 with 2 KV heads, MLP 96 (SmolLM3: 32, which keeps its 4
layers under 1 MB), RoPE base 10000.

Made with torch 2.15.0 (its default wheel, run on the CPU), transformers 5.25.0, gguf-py and
``convert_hf_to_gguf.py`` of llama-cpp-python 0.3.36's ``vendor/llama.cpp`` (the version
``cargo xtask fetch-vocabs`` pins).

Usage::

    python tools/make_dense_fixtures.py --llama-cpp /path/to/llama-cpp-python-0.3.36/vendor/llama.cpp
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_recurrent_fixtures as recurrent  # noqa: E402

SHAPE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
             bos_token_id=0, eos_token_id=0)


def granite(vocab: int):
    from transformers import GraniteConfig, GraniteForCausalLM

    config = GraniteConfig(
        vocab_size=vocab, intermediate_size=96, num_hidden_layers=2, rope_parameters={"rope_type": "default",
        "rope_theta": 10000.0}, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.75,
        logits_scaling=6.0, rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=1, **SHAPE,
    )
    return GraniteForCausalLM(config)


def smollm3(vocab: int):
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    config = SmolLM3Config(
        vocab_size=vocab, intermediate_size=32, num_hidden_layers=4, no_rope_layer_interval=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-6,
        tie_word_embeddings=True, use_sliding_window=False, pad_token_id=1, **SHAPE,
    )
    assert config.no_rope_layers == [1, 1, 1, 0], config.no_rope_layers
    return SmolLM3ForCausalLM(config)


def olmo2(vocab: int):
    from transformers import Olmo2Config, Olmo2ForCausalLM

    config = Olmo2Config(
        vocab_size=vocab, intermediate_size=96, num_hidden_layers=2, rope_parameters={"rope_type": "default",
        "rope_theta": 10000.0}, rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=1, **SHAPE,
    )
    return Olmo2ForCausalLM(config)


BUILDERS = {"granite": granite, "smollm3": smollm3, "olmo2": olmo2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="vendor/llama.cpp of llama-cpp-python")
    parser.add_argument("--only", choices=list(BUILDERS), help="make one fixture")
    args = parser.parse_args()
    sys.path.insert(0, str(args.llama_cpp))
    sys.path.insert(1, str(args.llama_cpp / "gguf-py"))
    for name, build in BUILDERS.items():
        if args.only not in (None, name):
            continue
        hf = recurrent.FIXTURES / name / "hf"
        hf.mkdir(parents=True, exist_ok=True)
        # The converter reads a GPT-2 style vocabulary when the tokenizer class says so.
        (hf / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
            "add_bos_token": False}, indent=2) + "\n")
        recurrent.make(name, build, args.llama_cpp)
        expected_path = recurrent.FIXTURES / name / "expected.json"
        expected = json.loads(expected_path.read_text())
        expected["meta"]["generator"] = "tools/make_dense_fixtures.py"
        expected_path.write_text(json.dumps(expected) + "\n")


if __name__ == "__main__":
    main()
