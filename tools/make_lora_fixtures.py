#!/usr/bin/env python3
"""Make the outside-truth fixtures of weft's multi-LoRA tests: a tiny random-weight
``LlamaForCausalLM`` and three LoRA adapters over it, randomly initialised by peft
(``init_lora_weights=False``, so B is not zero and every adapter changes the output), with
peft's logits and greedy tokens for each adapter and for the base model.

Writes ``tests/fixtures/lora/``:

``hf/``            the base model: config.json, model.safetensors (f32), tokenizer.json.
``<adapter>/``     adapter_config.json and adapter_model.safetensors, as peft saves them.
``expected.json``  per model (``base`` and each adapter), for a few prompts (token ids): the
                   last prompt position's logits and 10 greedy tokens with each step's top-1
                   margin.
``model.gguf``     the base model through llama.cpp's ``convert_hf_to_gguf.py --outtype f32``
                   (q and k rows permuted for interleaved RoPE, as llama.cpp does for Llama).
``alpha.gguf``, ``beta.gguf``
                   those adapters through llama.cpp's ``convert_lora_to_gguf.py --outtype f32``
                   (``general.type`` "adapter", ``adapter.lora.alpha``; B's q and k rows
                   permuted like the base's). gamma (rsLoRA) has no GGUF: llama.cpp scales by
                   alpha / r always.

The adapters target q, k, v, o, gate, up and down of both layers:

``alpha``   rank 4, lora_alpha 8 (scale 2).
``beta``    rank 8, lora_alpha 4 (scale 0.5).
``gamma``   rank 6, lora_alpha 12, use_rslora (scale 12 / sqrt 6), q, v and down only.

The model: hidden 64, 4 heads of 16 with 2 KV heads, MLP 96, 2 layers, vocabulary 304 (the toy
tokenizer of ``tools/make_recurrent_fixtures.py``), untied LM head.

``tests/fixtures/lora_phi3/`` holds the same for a tiny ``Phi3ForCausalLM`` of the same shape
(plain RoPE), whose checkpoints fuse q, k, v into ``qkv_proj`` and gate, up into
``gate_up_proj``: one adapter, ``delta`` (rank 4, lora_alpha 8) on qkv_proj, o_proj,
gate_up_proj and down_proj, also as ``delta.gguf`` (llama.cpp names them attn_qkv and ffn_up).
``tests/fixtures/lora_gemma3/`` holds the tiny Gemma 3 of ``tools/make_gemma3_fixtures.py``
(other weights) with one adapter, ``epsilon`` (rank 4, lora_alpha 8, all seven projections),
both as Hugging Face files only (the base has no GGUF fixture).

``tests/fixtures/lora_olmo2/`` (the tiny OLMo 2 of ``tools/make_dense_fixtures.py``, adapter
``zeta`` on all seven projections) and ``tests/fixtures/lora_granite_hybrid/`` (the tiny Granite
4.0-H of ``tools/make_recurrent_fixtures.py``, adapter ``eta`` on q, k, v, o of its attention
layer and on every layer's ``input_linear`` and ``output_linear``), each with GGUF files too.

``tests/fixtures/lora_smollm2/`` holds two adapters over the default model itself,
``models/SmolLM2-135M-Instruct.Q4_1.gguf``, which transformers loads dequantized to f32 (as
``tools/make_fixtures.py`` does for the base model's fixture): ``sql`` (rank 4, lora_alpha 8,
q_proj and v_proj) and ``chat`` (rank 2, lora_alpha 4, v_proj and o_proj), stored in f16 (peft
ran the same f16-rounded values in f32), and ``expected.json`` with the first two prompts of
``tests/fixtures/smollm2/model.json``: for the base model and each adapter, the last prompt
position's top-20 logits and 16 greedy tokens with their margins. Run with ``--family
lora_smollm2`` after ``cargo xtask fetch-model``.

Made with torch 2.15.0 (its default wheel, run on the CPU), transformers 5.25.0, peft 0.21.2,
and gguf-py and the converters of llama-cpp-python 0.3.36's ``vendor/llama.cpp`` (the version
``cargo xtask fetch-vocabs`` pins).

Usage::

    python tools/make_lora_fixtures.py --llama-cpp /path/to/llama-cpp-python-0.3.36/vendor/llama.cpp
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_recurrent_fixtures as recurrent  # noqa: E402

PROMPTS = [[5, 17, 42, 9, 100], list(range(3, 20)), [(7 * i + 3) % 250 + 1 for i in range(23)]]
NUM_GREEDY = 10
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FUSED = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
# Granite 4.0-H: attention in its attention layers, the dense MLP (gate and up fused) in all.
GRANITE = ["q_proj", "k_proj", "v_proj", "o_proj", "input_linear", "output_linear"]


def llama(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
    )
    return LlamaForCausalLM(config)


def phi3(vocab: int):
    from transformers import Phi3Config, Phi3ForCausalLM

    config = Phi3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
        sliding_window=None, pad_token_id=1, bos_token_id=0, eos_token_id=0,
    )
    return Phi3ForCausalLM(config)


def gemma3(vocab: int):
    import make_gemma3_fixtures

    return make_gemma3_fixtures.gemma3(vocab)


def olmo2(vocab: int):
    import make_dense_fixtures

    return make_dense_fixtures.olmo2(vocab)


# Per fixture directory: the base model, the seed of its weights, its adapters (name, peft
# options), which of them llama.cpp converts (None: not even the base model), and whether its
# norm weights are stored centred on 0 (Gemma's 1 + w).
FAMILIES = {
    "lora": (llama, 40, [
        ("alpha", dict(r=4, lora_alpha=8, target_modules=ALL)),
        ("beta", dict(r=8, lora_alpha=4, target_modules=ALL)),
        ("gamma", dict(r=6, lora_alpha=12, use_rslora=True, target_modules=["q_proj", "v_proj", "down_proj"])),
    ], ["alpha", "beta"], False),
    "lora_phi3": (phi3, 41, [("delta", dict(r=4, lora_alpha=8, target_modules=FUSED))], ["delta"], False),
    "lora_gemma3": (gemma3, 42, [("epsilon", dict(r=4, lora_alpha=8, target_modules=ALL))], None, True),
    "lora_olmo2": (olmo2, 43, [("zeta", dict(r=4, lora_alpha=8, target_modules=ALL))], ["zeta"], False),
    "lora_granite_hybrid": (recurrent.granite_hybrid, 44, [("eta", dict(r=4, lora_alpha=8, target_modules=GRANITE))],
                            ["eta"], False),
}


def run(model, name: str) -> dict:
    prompts = []
    with torch.no_grad():
        for ids in PROMPTS:
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=NUM_GREEDY, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True, eos_token_id=None,
                                 pad_token_id=0)
            greedy = out.sequences[0, len(ids):].tolist()
            margins = [float(v.topk(2).values[0] - v.topk(2).values[1]) for v in (s[0] for s in out.logits)]
            prompts.append({"prompt_ids": ids, "last_logits": [round(float(v), 6) for v in logits],
                            "greedy_ids": greedy, "greedy_margins": [round(m, 5) for m in margins]})
    print(name, [p["greedy_ids"] for p in prompts])
    return {"prompts": prompts}


def convert(llama_cpp: Path, family: str) -> None:
    """The base model and its adapters to GGUF by llama.cpp's own converters."""
    out = recurrent.FIXTURES / family
    if FAMILIES[family][3] is None:
        return
    sys.path.insert(0, str(llama_cpp))
    sys.path.insert(1, str(llama_cpp / "gguf-py"))
    import runpy

    import conversion.base
    import convert_hf_to_gguf

    # The toy tokenizer's pre-tokenizer is GPT-2's (see make_recurrent_fixtures.py).
    conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    sys.argv = ["convert_hf_to_gguf.py", str(out / "hf"), "--outtype", "f32", "--outfile", str(out / "model.gguf")]
    convert_hf_to_gguf.main()
    for name in FAMILIES[family][3]:
        sys.argv = ["convert_lora_to_gguf.py", "--base", str(out / "hf"), "--outtype", "f32",
                    "--outfile", str(out / f"{name}.gguf"), str(out / name)]
        # The script converts under `if __name__ == "__main__"`.
        runpy.run_path(str(llama_cpp / "convert_lora_to_gguf.py"), run_name="__main__")


def make_smollm2() -> None:
    """Two adapters over the real default model, read from its GGUF (see the module's text)."""
    import peft
    import transformers
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    root = recurrent.FIXTURES.parent.parent
    gguf = root / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    out = recurrent.FIXTURES / "lora_smollm2"
    out.mkdir(parents=True, exist_ok=True)
    load = lambda: AutoModelForCausalLM.from_pretrained(  # noqa: E731
        str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.float32).eval()
    base_prompts = json.loads((recurrent.FIXTURES / "smollm2" / "model.json").read_text())["prompts"][:2]
    prompts = [p["prompt_ids"] for p in base_prompts]

    def run_top(model, name):
        rows = []
        with torch.no_grad():
            for ids in prompts:
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
                top = logits.topk(20)
                gen = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=16, do_sample=False,
                                     output_logits=True, return_dict_in_generate=True, eos_token_id=None,
                                     pad_token_id=0)
                margins = [float(v.topk(2).values[0] - v.topk(2).values[1]) for v in (s[0] for s in gen.logits)]
                rows.append({"prompt_ids": ids, "top_ids": top.indices.tolist(),
                             "top_logits": [round(float(v), 6) for v in top.values],
                             "greedy_ids": gen.sequences[0, len(ids):].tolist(),
                             "greedy_margins": [round(m, 5) for m in margins]})
        print(name, [r["greedy_ids"] for r in rows])
        return {"prompts": rows}

    expected = {"meta": {"generator": "tools/make_lora_fixtures.py --family lora_smollm2", "base": gguf.name,
                         "transformers": transformers.__version__, "torch": torch.__version__,
                         "peft": peft.__version__},
                "models": {"base": run_top(load(), "base")}}
    adapters = [("sql", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])),
                ("chat", dict(r=2, lora_alpha=4, target_modules=["v_proj", "o_proj"]))]
    for i, (name, options) in enumerate(adapters):
        torch.manual_seed(200 + i)
        lora = get_peft_model(load(), LoraConfig(init_lora_weights=False, lora_dropout=0.0, **options)).eval()
        with torch.no_grad():
            for pname, p in lora.named_parameters():
                if "lora_B" in pname:
                    p.mul_(0.3)
                if "lora_" in pname:
                    # Stored in f16: peft runs the rounded values.
                    p.copy_(p.half().float())
        lora.save_pretrained(out / name)
        config = out / name / "adapter_config.json"
        saved = json.loads(config.read_text())
        saved["base_model_name_or_path"] = f"models/{gguf.name}"  # not this machine's path
        config.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
        weights = out / name / "adapter_model.safetensors"
        save_file({k: v.half() for k, v in load_file(weights).items()}, weights)
        (out / name / "README.md").unlink(missing_ok=True)
        expected["models"][name] = run_top(lora, name)
    (out / "expected.json").write_text(json.dumps(expected) + "\n")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="vendor/llama.cpp of llama-cpp-python")
    parser.add_argument("--gguf-only", action="store_true", help="convert what is there, without remaking it")
    parser.add_argument("--family", choices=sorted(FAMILIES) + ["lora_smollm2"], action="append", help="only these (default: all)")
    args = parser.parse_args()
    if args.family == ["lora_smollm2"]:
        return make_smollm2()
    for family in args.family or sorted(FAMILIES):
        if not args.gguf_only:
            make(family)
        convert(args.llama_cpp, family)


def make(family: str) -> None:
    import peft
    import transformers
    from peft import LoraConfig, get_peft_model

    base, seed, adapters, _, centre_norms = FAMILIES[family]
    out = recurrent.FIXTURES / family
    hf = out / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    (hf / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "add_bos_token": False}, indent=2) + "\n")
    vocab = recurrent.tokenizer(hf)
    torch.manual_seed(seed)
    model = base(vocab).float().eval()
    recurrent.randomize(model)
    if centre_norms:
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim == 1:
                    p.sub_(1.0)
    model.save_pretrained(hf, safe_serialization=True)
    if family == "lora_granite_hybrid":
        recurrent.respell_layer_types(hf)
    expected = {"meta": {"generator": "tools/make_lora_fixtures.py", "transformers": transformers.__version__,
                         "torch": torch.__version__, "peft": peft.__version__, "vocab_size": vocab},
                "models": {"base": run(model, "base")}}
    for i, (name, options) in enumerate(adapters):
        torch.manual_seed(100 + i)
        fresh = base(vocab).float().eval()
        fresh.load_state_dict(model.state_dict())
        lora = get_peft_model(fresh, LoraConfig(init_lora_weights=False, lora_dropout=0.0, **options)).eval()
        with torch.no_grad():
            # peft's random init gives B the spread of A; a smaller B keeps the adapter a
            # perturbation of the base model, as trained adapters are.
            for pname, p in lora.named_parameters():
                if "lora_B" in pname:
                    p.mul_(0.3)
        lora.save_pretrained(out / name)
        expected["models"][name] = run(lora, name)
    (out / "expected.json").write_text(json.dumps(expected) + "\n")


if __name__ == "__main__":
    main()
