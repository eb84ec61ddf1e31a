#!/usr/bin/env python3
"""Make the outside-truth fixtures of weft's RoPE-variant tests: tiny random-weight models in
transformers, each saved as a Hugging Face directory and converted to GGUF by llama.cpp's own
``convert_hf_to_gguf.py``, with transformers' logits and greedy tokens (the layout
``tools/make_recurrent_fixtures.py`` writes, whose tokenizer, weight randomizer and converter run
this reuses).

``tests/fixtures/qwen3_yarn/``
    A ``Qwen3ForCausalLM`` with YaRN, as the 128K Qwen3 files set it: ``rope_type`` "yarn",
    factor 4, original context 32 (context 128), beta_fast and beta_slow at their defaults (32
    and 1). At head size 16 and base 10000 the ramp ends at dimensions 0 and 2: one frequency
    kept, one blended half and half, six divided by 4, and cos/sin scaled by 0.1 · ln 4 + 1.
    transformers applies YaRN at every position (the prompts are 5, 17 and 33 tokens), as
    llama.cpp does.
``tests/fixtures/phi3_partial/``
    Phi-4-mini's shape in miniature: a ``Phi3ForCausalLM`` with ``partial_rotary_factor`` 0.75
    (RoPE rotates 12 of each head's 16 dimensions; llama.cpp's ``rope.dimension_count`` 12),
    LongRoPE with 6 short and 6 long factors (original context 32, context 128) and tied
    embeddings, as Phi-4-mini has. transformers picks LongRoPE's factors per forward pass, so
    the two short prompts use the short factors and the 33-token one the long factors, as in
    ``tools/make_phi3_fixtures.py``.

The models: hidden 64, 4 heads of 16 with 2 KV heads, MLP 96, 2 layers.

Made with torch 2.15.0 (its default wheel, run on the CPU), transformers 5.25.0, gguf-py and ``convert_hf_to_gguf.py`` of
llama-cpp-python 0.3.36's ``vendor/llama.cpp`` (the version ``cargo xtask fetch-vocabs`` pins).

Usage::

    python tools/make_yarn_fixtures.py --llama-cpp /path/to/llama-cpp-python-0.3.36/vendor/llama.cpp
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_recurrent_fixtures as recurrent  # noqa: E402

HEAD_DIM = 16


def qwen3_yarn(vocab: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=HEAD_DIM, max_position_embeddings=128,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 32},
        rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False, bos_token_id=0, eos_token_id=0,
    )
    return Qwen3ForCausalLM(config)


def phi3_partial(vocab: int):
    from transformers import Phi3Config, Phi3ForCausalLM

    half = int(HEAD_DIM * 0.75) // 2
    config = Phi3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, original_max_position_embeddings=32,
        partial_rotary_factor=0.75,
        rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "short_factor": [1.0 + 0.5 * i for i in range(half)],
            "long_factor": [2.0 + 3.0 * i for i in range(half)],
        },
        rms_norm_eps=1e-5, tie_word_embeddings=True, sliding_window=None, pad_token_id=1, bos_token_id=0,
        eos_token_id=0,
    )
    return Phi3ForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="vendor/llama.cpp of llama-cpp-python")
    parser.add_argument("--only", choices=["qwen3_yarn", "phi3_partial"], help="make one fixture")
    args = parser.parse_args()
    sys.path.insert(0, str(args.llama_cpp))
    sys.path.insert(1, str(args.llama_cpp / "gguf-py"))
    for name, build in [("qwen3_yarn", qwen3_yarn), ("phi3_partial", phi3_partial)]:
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
        expected["meta"]["generator"] = "tools/make_yarn_fixtures.py"
        if name == "qwen3_yarn":
            # transformers' own YaRN frequencies and cos/sin scale, to hold weft's to.
            from transformers import AutoModelForCausalLM

            rotary = AutoModelForCausalLM.from_pretrained(hf).model.rotary_emb
            expected["rope"] = {"inv_freq": [float(v) for v in rotary.inv_freq],
                                "attention_scaling": float(rotary.attention_scaling)}
        expected_path.write_text(json.dumps(expected) + "\n")


if __name__ == "__main__":
    main()
