#!/usr/bin/env python3
"""Make the outside-truth fixture of weft's Gemma 4 tests: a tiny random-weight
``Gemma4ForCausalLM`` (text) saved as a Hugging Face directory and converted to GGUF by llama.cpp's
own ``convert_hf_to_gguf.py``, with transformers' logits and greedy tokens (``expected.json`` as
``tools/make_recurrent_fixtures.py`` writes it, whose prompts, tokenizer, weight randomizer and
conversion this reuses: 4 prompts, 32 greedy tokens; its tokenizer is Gemma's kind, below).

Writes ``tests/fixtures/gemma4/`` (``hf/``, ``model.gguf``, ``expected.json``); with ``--wide``,
``tests/fixtures/gemma4_wide/`` instead: the published checkpoints' full-attention heads of 512
(``global_head_dim``) in an otherwise narrower model (hidden 32, MLPs of 64, 2 query heads, 4 layers:
sliding, full, then the two sharing their KV: layer 2 reads layer 0's cache, layer 3 layer 1's),
so attention at head size 512 is held to transformers while the files stay near 1 MB; one
prompt of 33 tokens (past the window) and 12 greedy tokens.

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

Usage::

    python tools/make_gemma4_fixtures.py --llama-cpp /path/to/llama-cpp-python-x.y.z/vendor/llama.cpp
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="vendor/llama.cpp of llama-cpp-python")
    parser.add_argument("--wide", action="store_true", help="write gemma4_wide/: full-attention heads of 512")
    args = parser.parse_args()
    sys.path.insert(0, str(args.llama_cpp))
    sys.path.insert(1, str(args.llama_cpp / "gguf-py"))
    # Gemma 4's converter reads a SentencePiece-style BPE, not the other fixtures' byte-level one.
    recurrent.tokenizer = gemma_tokenizer
    if args.wide:
        name = "gemma4_wide"
        recurrent.make(name, gemma4_wide, args.llama_cpp, recurrent.PROMPTS[2:], recurrent.NUM_GREEDY)
    else:
        name = "gemma4"
        recurrent.make(name, gemma4, args.llama_cpp, recurrent.PROMPTS_4, recurrent.NUM_GREEDY_32)
    expected = recurrent.FIXTURES / name / "expected.json"
    data = json.loads(expected.read_text())
    data["meta"]["generator"] = "tools/make_gemma4_fixtures.py"
    expected.write_text(json.dumps(data) + "\n")


if __name__ == "__main__":
    main()
