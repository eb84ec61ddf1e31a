#!/usr/bin/env python3
"""Make the outside-truth fixture of weft's Gemma 3n tests: a tiny random-weight
``Gemma3nForCausalLM`` (the text model) saved as a Hugging Face directory and converted to GGUF
by llama.cpp's own ``convert_hf_to_gguf.py``, with transformers' logits and greedy tokens
(``expected.json`` as ``tools/make_recurrent_fixtures.py`` writes it, whose prompts, byte-level
tokenizer, weight randomizer and conversion this reuses: 4 prompts, 32 greedy tokens).

Writes ``tests/fixtures/gemma3n/`` (``hf/``, ``model.gguf``, ``expected.json``).

The model has what Gemma 3n adds to a Gemma, each made to show if weft got it wrong:

- AltUp with 4 streams (llama.cpp's converter takes no other count): the embedding projected
  into three more streams and rescaled to its magnitude, every layer's predict (router norm,
  modality router, tanh, 4x4 coefficients a token) and correct steps, the active stream's
  output scale before the per-layer branch, and the streams projected back and averaged at
  the end;
- Laurel of rank 32 beside each layer's attention;
- activation sparsity 0.95 in the first two layers (the gate's values below mean + 1.645 std
  of their row cut to 0 and the rest shifted down by it), none after;
- 6 layers: sliding, sliding, sliding, full, sliding, full (window 8, so the longer prompts
  pass it), 4 query heads and 2 KV heads of 16, RoPE bases 10000 (sliding) and 1e6 (full);
- KV sharing: the last 2 layers attend over the cache of the last earlier layer of their kind
  (layer 4 reads layer 2's, layer 5 layer 3's);
- per-layer embeddings of 32 a layer; MLP widths differing by layer (96 or 64);
- ``final_logit_softcapping`` 5 (logits of this random model reach past it).

Norm weights (and AltUp's output scale, which transformers initialises to 0) are random
around 1. The committed fixture was made with torch 2.15, transformers 5.25.0 and
llama-cpp-python 0.3.36's ``vendor/llama.cpp`` (``expected.json`` records the first two).

Usage::

    python tools/make_gemma3n_fixtures.py --llama-cpp /path/to/llama-cpp-python-x.y.z/vendor/llama.cpp
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_recurrent_fixtures as recurrent  # noqa: E402

recurrent_tokenizer = recurrent.tokenizer


def gemma3n(vocab: int):
    from transformers import Gemma3nForCausalLM, Gemma3nTextConfig

    config = Gemma3nTextConfig(
        vocab_size=vocab, vocab_size_per_layer_input=vocab, hidden_size=64, intermediate_size=[96, 64, 96, 96, 64, 96],
        num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
        layer_types=["sliding_attention"] * 3 + ["full_attention", "sliding_attention", "full_attention"],
        num_kv_shared_layers=2, hidden_size_per_layer_input=32, altup_num_inputs=4, altup_active_idx=0,
        laurel_rank=32, activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0, 0.0, 0.0],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1e6}},
        final_logit_softcapping=5.0, max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
        pad_token_id=1, bos_token_id=0, eos_token_id=0,
    )
    return Gemma3nForCausalLM(config)


def byte_level_tokenizer(out: Path) -> int:
    """The other fixtures' byte-level BPE, declared a plain fast tokenizer: transformers would
    load it for a ``gemma3n_text`` directory as a ``GemmaTokenizer``, which adds a token past
    the vocabulary, and llama.cpp's Gemma 3n converter (which reads a vocabulary without
    ``tokenizer.model`` as a GPT-2-style BPE) refuses a token id past ``vocab_size``."""
    vocab = recurrent_tokenizer(out)
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}) + "\n")
    return vocab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="vendor/llama.cpp of llama-cpp-python")
    args = parser.parse_args()
    sys.path.insert(0, str(args.llama_cpp))
    sys.path.insert(1, str(args.llama_cpp / "gguf-py"))
    recurrent.tokenizer = byte_level_tokenizer
    recurrent.make("gemma3n", gemma3n, args.llama_cpp, recurrent.PROMPTS_4, recurrent.NUM_GREEDY_32)
    expected = recurrent.FIXTURES / "gemma3n" / "expected.json"
    data = json.loads(expected.read_text())
    data["meta"]["generator"] = "tools/make_gemma3n_fixtures.py"
    expected.write_text(json.dumps(data) + "\n")


if __name__ == "__main__":
    main()
