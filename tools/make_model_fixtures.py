#!/usr/bin/env python3
"""Writes tests/fixtures/<model>/model.json for the real models `cargo xtask fetch-model` knows
besides the default one (tools/make_fixtures.py covers that): per prompt, the prompt ids, the
last position's top-20 logits and greedy tokens with their top-1/top-2 margins, from Hugging
Face transformers running the GGUF dequantized exactly (gguf-py) in f32, for tests/real_models.rs.

Outside truth: transformers' own model code (`AutoModelForCausalLM.from_pretrained(gguf_file=...)`
dequantizes every tensor with gguf-py) and its tokenizer and chat template built from the same
GGUF. torch is ~5 GB: install it in a venv outside the repository, never in CI.

    python3 -m venv /work/scratch/venv
    /work/scratch/venv/bin/pip install torch transformers accelerate gguf sentencepiece protobuf
    cargo xtask fetch-model qwen2.5-coder-0.5b-instruct
    /work/scratch/venv/bin/python tools/make_model_fixtures.py qwen2.5-coder-0.5b-instruct
    cargo xtask fetch-model gemma-3-270m
    /work/scratch/venv/bin/python tools/make_model_fixtures.py gemma-3-270m
"""

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 16

MODELS = {
    "qwen2.5-coder-0.5b-instruct": {
        "file": "qwen2.5-coder-0.5b-instruct.gguf",
        # The first prompt is the one CI runs; the rest run with `cargo xtask test --full`.
        "prompts": [
            ("chat_code", "chat", "Write a Python function that returns the square of a number."),
            ("raw_code", "raw", "def fibonacci(n):\n    "),
            ("chat_fr", "chat", "Quelle est la capitale de la France ?"),
            ("raw_zh", "raw", "机器学习是"),
        ],
    },
    "gemma-3-270m": {
        "file": "gemma-3-270m-q4_k_m.gguf",
        # A base model: its GGUF has no chat template, so every prompt is raw text.
        "prompts": [
            ("raw_story", "raw", "Once upon a time, in a small village by the sea,"),
            ("raw_capital", "raw", "The capital of France is"),
            ("raw_code", "raw", "def add(a, b):\n    return"),
            ("raw_de", "raw", "Die Hauptstadt von Deutschland ist"),
        ],
    },
}


def main():
    name = sys.argv[1]
    spec = MODELS[name]
    model_dir = os.path.join(ROOT, "models")
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=spec["file"])
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, gguf_file=spec["file"], dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    prompts = []
    for pname, kind, text in spec["prompts"]:
        messages = None
        if kind == "chat":
            messages = [{"role": "user", "content": text}]
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        seq = list(ids)
        greedy, margins = [], []
        last_top = None
        with torch.no_grad():
            past = None
            inp = torch.tensor([seq])
            for step in range(STEPS):
                out = model(input_ids=inp, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1].float()
                top = torch.topk(logits, 20)
                if step == 0:
                    last_top = [[int(i), float(v)] for v, i in zip(top.values, top.indices)]
                greedy.append(int(top.indices[0]))
                margins.append(float(top.values[0] - top.values[1]))
                inp = torch.tensor([[greedy[-1]]])
        entry = {
            "name": pname,
            "kind": kind,
            "text": text,
            "add_special_tokens": False,
            "prompt_ids": ids,
            "last_logits_top": last_top,
            "greedy_ids": greedy,
            "greedy_margins": margins,
            "greedy_text": tok.decode(greedy),
        }
        if messages:
            entry["messages"] = messages
        prompts.append(entry)
        print(pname, repr(entry["greedy_text"]), file=sys.stderr)
    import transformers

    meta = {
        "model": name,
        "file": spec["file"],
        "reference": "transformers AutoModelForCausalLM.from_pretrained(gguf_file=..., dtype=float32, "
        "attn_implementation='eager'): gguf-py's exact dequantization, f32 compute, KV cache",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "steps": STEPS,
    }
    out_dir = os.path.join(ROOT, "tests", "fixtures", name)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "model.json"), "w") as f:
        json.dump({"meta": meta, "prompts": prompts}, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
