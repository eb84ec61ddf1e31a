#!/usr/bin/env python3
"""Make the outside-truth fixture of weft's Gemma 3 Hugging Face directory test: a tiny
random-weight ``Gemma3ForCausalLM`` (text) saved as a Hugging Face directory, with
transformers' logits and greedy tokens (``expected.json`` as ``tools/make_recurrent_fixtures.py``
writes it, whose prompts, tokenizer and weight randomizer this reuses).

The model: hidden 64, 4 heads of 32 with 2 KV heads, MLP 96, 6 layers (five sliding-window
layers of window 8, then a global one, as Gemma 3 interleaves them), separate RoPE bases
(10000 local, 1e6 global), query_pre_attn_scalar 24 (not head_dim, so a wrong query scale
shows), tied embeddings. Norm weights are random around 0 as Gemma stores them (used as 1 + w).

Usage::

    python tools/make_gemma3_fixtures.py
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_recurrent_fixtures as recurrent  # noqa: E402


def gemma3(vocab: int):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24, sliding_window=8,
        layer_types=["sliding_attention"] * 5 + ["full_attention"], max_position_embeddings=128,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=1, bos_token_id=0, eos_token_id=0,
        final_logit_softcapping=None, attn_logit_softcapping=None,
    )
    return Gemma3ForCausalLM(config)


def main() -> None:
    out = recurrent.FIXTURES / "gemma3"
    hf = out / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    vocab = recurrent.tokenizer(hf)
    torch.manual_seed(14)
    model = gemma3(vocab).float().eval()
    recurrent.randomize(model)
    with torch.no_grad():
        # Gemma's norms are stored as w and used as 1 + w: centre them on 0.
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.sub_(1.0)
    model.save_pretrained(hf, safe_serialization=True)
    expected = {"meta": {"generator": "tools/make_gemma3_fixtures.py", "transformers": __import__("transformers").__version__,
                         "torch": torch.__version__, "vocab_size": vocab}, "prompts": []}
    with torch.no_grad():
        for ids in recurrent.PROMPTS:
            logits = model(torch.tensor([ids])).logits[0, -1]
            gen = model.generate(torch.tensor([ids]), max_new_tokens=recurrent.NUM_GREEDY, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True, eos_token_id=None)
            margins = [float(v.topk(2).values[0] - v.topk(2).values[1]) for v in (s[0] for s in gen.logits)]
            expected["prompts"].append({"prompt_ids": ids, "last_logits": [round(float(v), 6) for v in logits],
                                        "greedy_ids": gen.sequences[0, len(ids):].tolist(),
                                        "greedy_margins": [round(m, 5) for m in margins]})
    (out / "expected.json").write_text(json.dumps(expected) + "\n")


if __name__ == "__main__":
    main()
