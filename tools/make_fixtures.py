#!/usr/bin/env python3
"""Make the "outside truth" fixtures for weft's SmolLM2 model and tokenizer tests.

What it does
------------
Reads ``models/SmolLM2-135M-Instruct.Q4_1.gguf`` (fetch it with ``cargo xtask fetch-model``) and
writes two compact JSON files that weft's Rust tests compare against:

``tests/fixtures/smollm2/model.json``
    For a dozen prompts (raw text and chat-templated): the prompt ids, the top-20 logits of the
    last prompt position with full-vocab stats (max |logit| and friends) for a tolerance, 32
    greedy tokens (argmax at every step, f32, no sampling, no penalties, NOT stopping at EOS) and,
    at every step, the top-1 minus top-2 logit margin, so a test can tell a real mismatch from a
    near-tie. One prompt also carries the full last-position logit vector and per-layer
    residual-stream stats (to locate where an implementation first diverges).

``tests/fixtures/smollm2/tokenizer_hf.json``
    Several hundred deterministic strings (prose, numbers, contractions, code, whitespace runs,
    CRLF, many scripts, emoji with ZWJ and skin tones, special tokens written as text, the empty
    string) with their reference ids (no special tokens added) and whether decode(ids) gives the
    string back. (``tests/fixtures/smollm2/tokenizer.json`` belongs to
    tools/make_tokenizer_fixtures.py, whose ids come from llama.cpp and which tests/tokenizer.rs
    reads; this script never writes it, but checks its reference tokenizer against that file's ids.)

The reference model is Hugging Face transformers' ``LlamaForCausalLM`` loaded from the same GGUF
and dequantized to f32 (transformers also undoes llama.cpp's Q/K row permutation). Before using
it the script checks every weight against its own dequantization of the GGUF blocks (gguf-py's
``gguf.quants.dequantize`` plus an independent numpy decoder for Q4_1/Q8_0, with the Q/K rows
un-permuted here) and fails if any differs. It also builds a second model by hand from a
``LlamaConfig`` read from the GGUF metadata and those tensors and checks both give the same
logits; if transformers cannot load the GGUF at all, the hand-built one is the reference.

The reference tokenizer is transformers' tokenizer loaded from the GGUF, WITH ONE FIX:
transformers' GGUF conversion does not know the ``tokenizer.ggml.pre = "smollm"`` pre-tokenizer
and falls back to plain GPT-2 byte-level splitting, which loses SmolLM2's individual-digit split
(SmolLM2's own tokenizer.json is ``Sequence[Digits(individual_digits=true), ByteLevel(
add_prefix_space=false, use_regex=true)]``; llama.cpp's "smollm" is the regex ``\\p{N}`` followed
by the GPT-2 regex). Most digit runs still come out one digit per token because the vocabulary
has no multi-digit tokens, but the result differs when whitespace comes right before a digit:
"a  1" is a,ĠĠ,1 = [81, 256, 33] for SmolLM2/llama.cpp but a,Ġ,Ġ,1 = [81, 216, 216, 33] with the
plain GPT-2 regex (which splits "  1" into " " + " 1"); likewise "x\r\n42" is x,čĊ,4,2 versus
x,č,Ċ,4,2. Prompt ids, and so logits, change with it. The script puts the SmolLM2
pre-tokenizer back, records in tokenizer_hf.json the strings where the unfixed tokenizer differs,
and, when ``llama_cpp`` (llama-cpp-python) is importable, checks the fixed tokenizer against
llama.cpp's on every fixture string and prompt.

With llama-cpp-python present it also runs llama.cpp itself on every prompt, twice: on the Q4_1
file as is, and on a temporary copy with every tensor dequantized to F32. The F32 copy must give
the same greedy tokens (it checks the reference means what llama.cpp means by this GGUF: rope
layout, norms, tied head). The Q4_1 run is recorded for information only: llama.cpp quantizes
activations to Q8_1 for its Q4_1 dot products, so its logits sit a few tenths away from an f32
reference and greedy paths can part at near-ties. Results go to model.json meta.checks.

Set up (outside the repo; nothing here is needed by CI)
-------------------------------------------------------
    python3 -m venv /opt/weft-ref
    /opt/weft-ref/bin/pip install torch transformers gguf accelerate sentencepiece protobuf numpy
    # optional cross-check (compiles llama.cpp, 10+ minutes on 2 cores):
    /opt/weft-ref/bin/pip install llama-cpp-python

Run (from anywhere; paths default to this checkout)
----------------------------------------------------
    /opt/weft-ref/bin/python tools/make_fixtures.py
    /opt/weft-ref/bin/python tools/make_fixtures.py --model path/to.gguf --out tests/fixtures/smollm2

Everything is deterministic: same GGUF + same library versions give byte-identical files.
"""

import argparse
import hashlib
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = REPO / "tests" / "fixtures" / "smollm2"

N_GREEDY = 32
TOP_K = 20


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# GGUF: metadata, own dequantization, Q/K un-permutation
# --------------------------------------------------------------------------------------------


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def gguf_meta(reader):
    out = {}
    for k, f in reader.fields.items():
        if k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            continue
        try:
            out[k] = f.contents()
        except Exception:  # noqa: BLE001 - unusual field types are not needed
            pass
    return out


def unpermute_rows(w, n_head):
    """Inverse of llama.cpp convert_hf_to_gguf.py's LlamaModel.permute for Q/K weights.

    The converter does ``w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2)``, turning
    HF's "rotate half" rope layout into GGML's interleaved-pair one; undo it.
    """
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def own_block_decode(raw, type_name):
    """Independent numpy decoder for the two block formats this file uses (ggml-common.h)."""
    rows = raw.shape[0]
    if type_name == "Q8_0":  # 34 bytes: f16 d, 32 x i8
        b = raw.reshape(rows, -1, 34)
        d = b[..., 0:2].copy().view(np.float16).astype(np.float32)
        q = b[..., 2:].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(rows, -1)
    if type_name == "Q4_1":  # 20 bytes: f16 d, f16 m, 16 bytes of nibbles (low nibbles = 0..15)
        b = raw.reshape(rows, -1, 20)
        d = b[..., 0:2].copy().view(np.float16).astype(np.float32)
        m = b[..., 2:4].copy().view(np.float16).astype(np.float32)
        qs = b[..., 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float32)
        return (q * d + m).reshape(rows, -1)
    raise ValueError(type_name)


def gguf_tensors_as_hf(reader, n_head, n_kv):
    """{hf_param_name: (f32 array in HF layout, ggml type, own-decoder array or None)}"""
    import gguf

    names = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    }
    per_layer = {
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
    }
    out = {}
    for t in reader.tensors:
        if t.name in names:
            hf = names[t.name]
        else:
            _, layer, kind, _w = t.name.split(".")
            hf = f"model.layers.{layer}.{per_layer[kind]}.weight"
        tname = t.tensor_type.name
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        own = own_block_decode(np.asarray(t.data), tname) if tname in ("Q8_0", "Q4_1") else None
        # GGUF dims are listed innermost-first; numpy shape is (rows=out_features, cols=in_features).
        w = w.reshape([int(x) for x in reversed(t.shape)]) if w.ndim > 1 else w.reshape(-1)
        if own is not None:
            own = own.reshape(w.shape)
        if ".attn_q." in t.name:
            w, own = unpermute_rows(w, n_head), unpermute_rows(own, n_head)
        elif ".attn_k." in t.name:
            w, own = unpermute_rows(w, n_kv), unpermute_rows(own, n_kv)
        out[hf] = (w, tname, own, t.name)
    return out


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def llama_config_from_meta(meta):
    from transformers import LlamaConfig

    arch = meta["general.architecture"]
    kw = dict(
        vocab_size=int(meta.get(f"{arch}.vocab_size", 49152)),
        hidden_size=int(meta[f"{arch}.embedding_length"]),
        intermediate_size=int(meta[f"{arch}.feed_forward_length"]),
        num_hidden_layers=int(meta[f"{arch}.block_count"]),
        num_attention_heads=int(meta[f"{arch}.attention.head_count"]),
        num_key_value_heads=int(meta[f"{arch}.attention.head_count_kv"]),
        max_position_embeddings=int(meta[f"{arch}.context_length"]),
        rms_norm_eps=float(meta[f"{arch}.attention.layer_norm_rms_epsilon"]),
        tie_word_embeddings=True,
        bos_token_id=int(meta["tokenizer.ggml.bos_token_id"]),
        eos_token_id=int(meta["tokenizer.ggml.eos_token_id"]),
        pad_token_id=int(meta.get("tokenizer.ggml.padding_token_id", meta["tokenizer.ggml.eos_token_id"])),
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
    )
    theta = float(meta[f"{arch}.rope.freq_base"])
    try:  # transformers >= 5
        cfg = LlamaConfig(**kw, rope_parameters={"rope_type": "default", "rope_theta": theta})
    except TypeError:
        cfg = LlamaConfig(**kw, rope_theta=theta)
    if getattr(cfg, "rope_theta", theta) != theta and getattr(cfg, "rope_parameters", {}).get("rope_theta") != theta:
        cfg = LlamaConfig(**kw, rope_theta=theta)
    return cfg


def build_own_model(meta, tensors):
    import torch
    from transformers import LlamaForCausalLM

    cfg = llama_config_from_meta(meta)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    sd = {k: torch.from_numpy(np.array(v[0], dtype=np.float32, copy=True)) for k, v in tensors.items()}
    if "lm_head.weight" not in sd:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if "rotary_emb" not in m]
    if missing or unexpected:
        raise RuntimeError(f"own model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model


def load_hf_model(model_dir, model_name):
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = dict(gguf_file=model_name, attn_implementation="eager")
    try:
        from transformers import GgufConfig  # transformers >= 5: ask for a plain dense f32 model

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kwargs)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, **kwargs)
    return model.eval()


def verify_weights(hf_model, tensors):
    """Compare every HF parameter with our own dequantization. Returns a report dict."""
    import torch

    params = dict(hf_model.named_parameters())
    params.setdefault("lm_head.weight", hf_model.get_output_embeddings().weight)
    report = {"tensors_compared": 0, "max_abs_diff": 0.0, "by_type": {}, "own_decoder_max_abs_diff": 0.0}
    for hf_name, (w, tname, own, gname) in tensors.items():
        p = params.get(hf_name)
        if p is None:
            raise RuntimeError(f"transformers model has no parameter {hf_name} (for {gname})")
        hw = p.detach().to(torch.float32).cpu().numpy()
        if hw.shape != w.shape:
            raise RuntimeError(f"{hf_name}: shape {hw.shape} vs GGUF {w.shape}")
        d = float(np.max(np.abs(hw - w))) if w.size else 0.0
        report["tensors_compared"] += 1
        report["max_abs_diff"] = max(report["max_abs_diff"], d)
        bt = report["by_type"].setdefault(tname, {"count": 0, "max_abs_diff": 0.0})
        bt["count"] += 1
        bt["max_abs_diff"] = max(bt["max_abs_diff"], d)
        if own is not None:
            report["own_decoder_max_abs_diff"] = max(report["own_decoder_max_abs_diff"], float(np.max(np.abs(own - w))))
    tied = params["lm_head.weight"].data_ptr() == params["model.embed_tokens.weight"].data_ptr()
    report["lm_head_tied_to_embed_tokens"] = bool(tied)
    return report


def verify_qk_permutation_matters(hf_model, reader, n_head):
    """Max |HF q_proj - raw GGUF rows| for layer 0: must be > 0, proving un-permuting was needed."""
    import gguf

    t = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    raw = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
    hw = hf_model.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    return float(np.max(np.abs(hw - raw)))


# --------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------


def smollm_pre_tokenizer():
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )


def load_tokenizers(model_dir, model_name):
    from transformers import AutoTokenizer

    raw = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_name)
    fixed = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_name)
    fixed.backend_tokenizer.pre_tokenizer = smollm_pre_tokenizer()
    return raw, fixed


def pre_tokenizer_json(tok):
    return json.loads(tok.backend_tokenizer.to_str()).get("pre_tokenizer")


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


def decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


class LlamaCpp:
    """llama.cpp's own tokenizer via llama-cpp-python, if installed."""

    def __init__(self, model_path):
        self.llm = None
        self.error = None
        self.version = None
        try:
            import llama_cpp

            self.version = getattr(llama_cpp, "__version__", "?")
            self.llm = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
        except Exception as e:  # noqa: BLE001 - optional cross-check
            self.error = f"{type(e).__name__}: {e}"

    def tokenize(self, text):
        if text == "":
            return []
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def detokenize(self, ids):
        return self.llm.detokenize(ids, special=True).decode("utf-8", errors="replace")


def write_f32_gguf(reader, path):
    """Copy the GGUF with every tensor dequantized to F32 (llama.cpp's own row layout kept)."""
    import gguf

    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(path), arch)
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        val = f.contents()
        if key == "general.file_type":
            val = int(gguf.LlamaFileType.ALL_F32)
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, val, f.types[0], sub_type=sub)
    for t in reader.tensors:
        a = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        w.add_tensor(t.name, a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim > 1 else a.reshape(-1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_cpp_model_check(reader, model_path, prompts):
    """Independent check that the reference means what llama.cpp means by this GGUF.

    llama.cpp on the Q4_1 file quantizes activations to Q8_1 for its dot products, so its logits
    differ from an f32 reference by a few tenths. Run it on an all-F32 copy instead: then both sides
    compute in f32 on identical weights and must agree to rounding. Also record the Q4_1 numbers.
    Returns a dict, or {"skipped": reason}.
    """
    import tempfile

    try:
        import llama_cpp
    except ImportError as e:
        return {"skipped": f"{e}"}

    def run(path):
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, logits_all=True, verbose=False, n_threads=os.cpu_count() or 1)
        res = {"last_logits_top20_max_abs_diff": 0.0, "argmax_equal": 0, "greedy_tokens_equal_prefix": []}
        for p in prompts:
            llm.reset()
            llm.eval(p["prompt_ids"])
            last = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            ids = [i for i, _ in p["last_logits_top"]]
            ref = np.asarray([v for _, v in p["last_logits_top"]], dtype=np.float32)
            res["last_logits_top20_max_abs_diff"] = max(res["last_logits_top20_max_abs_diff"], float(np.max(np.abs(last[ids] - ref))))
            res["argmax_equal"] += int(int(np.argmax(last)) == p["last_logits_stats"]["argmax"])
            gen = []
            for _ in range(N_GREEDY):
                t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
                gen.append(t)
                llm.eval([t])
            same = next((i for i, (a, b) in enumerate(zip(gen, p["greedy_ids"])) if a != b), N_GREEDY)
            res["greedy_tokens_equal_prefix"].append(same)
            if "last_logits_full" in p:
                full = np.asarray(p["last_logits_full"], dtype=np.float32)
                res["first_prompt_full_vocab_max_abs_diff"] = float(np.max(np.abs(last - full)))
        res["last_logits_top20_max_abs_diff"] = round(res["last_logits_top20_max_abs_diff"], 6)
        del llm
        return res

    out = {"prompts": len(prompts), "llama_cpp_python": getattr(llama_cpp, "__version__", "?")}
    out["q4_1_file"] = run(model_path)
    with tempfile.TemporaryDirectory() as d:
        f32 = Path(d) / "f32.gguf"
        write_f32_gguf(reader, f32)
        out["f32_copy"] = run(f32)
    return out


# --------------------------------------------------------------------------------------------
# Prompts for model.json
# --------------------------------------------------------------------------------------------

LONG_PARAGRAPH = (
    "The history of computing is a story of layers. At the bottom sit transistors, switching "
    "billions of times per second; above them, logic gates, adders and registers; then an "
    "instruction set, an operating system, compilers, libraries and finally the programs people "
    "use every day. Each layer hides the one below it, and each was invented because the one "
    "below had become too hard to think about directly. Graphics processors followed the same "
    "path: first fixed-function pipelines for drawing triangles, then programmable shaders, and "
    "now general compute kernels that run matrix multiplications for neural networks. A small "
    "language model with 135 million parameters, quantized to four bits, fits in less than a "
    "hundred megabytes and can run inside a web browser. In summary, the most important idea in"
)

TEXT_PROMPTS = [
    ("capital_france", "The capital of France is"),
    ("single_token", "Hello"),
    ("digits_arith", "Question: What is 1234 + 5678?\nAnswer: 1234 + 5678 = 6912. Question: What is 99 * 101?\nAnswer:"),
    (
        "python_code",
        'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n',
    ),
    ("multilingual", "Bonjour, je m'appelle Marie. 我喜欢学习中文。 Привет, как дела? Hola,"),
    ("emoji_whitespace", "I love pizza 🍕🍕 and tacos 🌮!\n\n\nWhat   about    you?\t👍🏽 👨‍👩‍👧\n  "),
    ("long_paragraph", LONG_PARAGRAPH),
]

CHAT_PROMPTS = [
    ("chat_capital", [{"role": "user", "content": "What is the capital of France?"}]),
    (
        "chat_system_code",
        [
            {"role": "system", "content": "You are a concise coding assistant."},
            {"role": "user", "content": "Write a Python function that reverses a string."},
        ],
    ),
    (
        "chat_multiturn_translate",
        [
            {"role": "user", "content": "Translate 'good morning' into French."},
            {"role": "assistant", "content": "Bonjour."},
            {"role": "user", "content": "And into Chinese and Russian?"},
        ],
    ),
    ("chat_digits_emoji", [{"role": "user", "content": "How many legs do 3 spiders and 2 ants have? 🕷️🐜 Show 12 + 34 = ?"}]),
]


def logit_stats(logits):
    x = logits.double()
    m = float(x.max())
    return {
        "max_abs": float(x.abs().max()),
        "max": m,
        "min": float(x.min()),
        "mean": float(x.mean()),
        "std": float(x.std()),
        "logsumexp": float(m + math.log(float((x - m).exp().sum()))),
        "argmax": int(x.argmax()),
    }


def r5(x):
    return float(f"{float(x):.5g}") if abs(float(x)) < 1e-3 else round(float(x), 5)


def _vec_stats(v):
    v = v.double()
    return {"rms": r5(v.pow(2).mean().sqrt()), "max_abs": r5(v.abs().max()), "first8": [r5(a) for a in v[:8].tolist()]}


def run_prompt(model, ids, full_logits=False, hidden_stats=False):
    import torch

    out = {}
    captured = {}
    hooks = []
    if hidden_stats:
        # Explicit forward hooks, so what each entry is does not depend on transformers' conventions.
        def grab(name):
            def hook(_mod, _inp, output):
                t = output[0] if isinstance(output, (tuple, list)) else output
                captured[name] = t[0, -1].detach().clone()

            return hook

        inner = model.model
        hooks.append(inner.embed_tokens.register_forward_hook(grab("embed")))
        for li, layer in enumerate(inner.layers):
            hooks.append(layer.register_forward_hook(grab(f"layer{li}")))
        hooks.append(inner.norm.register_forward_hook(grab("final_norm")))
    with torch.no_grad():
        inp = torch.tensor([ids], dtype=torch.long)
        res = model(input_ids=inp, use_cache=True)
        for h in hooks:
            h.remove()
        last = res.logits[0, -1].float()
        top = torch.topk(last, TOP_K)
        out["last_logits_top"] = [[int(i), r5(v)] for v, i in zip(top.values.tolist(), top.indices.tolist())]
        out["last_logits_stats"] = {k: (v if isinstance(v, int) else r5(v)) for k, v in logit_stats(last).items()}
        if full_logits:
            out["last_logits_full"] = [round(v, 4) for v in last.tolist()]
        if hidden_stats:
            n = len(model.model.layers)
            out["last_position_hidden"] = {
                "note": "residual stream at the last prompt position: embed = token embedding row; layers[i] = "
                "output of decoder layer i (residual added, before any norm); final_norm = after output_norm "
                "(the lm_head input). rms = sqrt(mean(x^2)).",
                "embed": _vec_stats(captured["embed"]),
                "layers": [_vec_stats(captured[f"layer{i}"]) for i in range(n)],
                "final_norm": _vec_stats(captured["final_norm"]),
            }
        past = res.past_key_values
        logits = last
        gen, margins, top1 = [], [], []
        for _step in range(N_GREEDY):
            t2 = torch.topk(logits, 2)
            tok = int(t2.indices[0])
            gen.append(tok)
            margins.append(r5(t2.values[0] - t2.values[1]))
            top1.append(r5(t2.values[0]))
            res = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past = res.past_key_values
            logits = res.logits[0, -1].float()
        out["greedy_ids"] = gen
        out["greedy_margins"] = margins
        out["greedy_top1_logits"] = top1

        # Check 1: teacher-forced full recompute (no KV cache) picks the same argmax at every step.
        full = model(input_ids=torch.tensor([ids + gen[:-1]]), use_cache=False).logits[0].float()
        tf = full[len(ids) - 1 :]
        tf_arg = tf.argmax(-1).tolist()
        tf_top1 = tf.max(-1).values.tolist()
        out["_check_no_cache_argmax_equal"] = tf_arg == gen
        out["_check_no_cache_top1_maxdiff"] = max(abs(a - b) for a, b in zip(tf_top1, top1))
    return out


def check_with_generate(model, ids, gen):
    """Check 2: transformers' own generate() with EOS stopping disabled gives the same tokens."""
    import torch
    from transformers import GenerationConfig

    gc = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=N_GREEDY,
        min_new_tokens=0,
        eos_token_id=None,
        pad_token_id=2,
        repetition_penalty=1.0,
        temperature=None,
        top_k=None,
        top_p=None,
    )
    # generate() fills unset fields from the model's own generation config, whose eos_token_id would
    # stop at <|im_end|>; clear it there too for the duration of this call.
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None
    try:
        with torch.no_grad():
            mask = torch.ones(1, len(ids), dtype=torch.long)
            out = model.generate(torch.tensor([ids]), generation_config=gc, attention_mask=mask)
    finally:
        model.generation_config.eos_token_id = saved
    got = out[0, len(ids) :].tolist()
    return got == gen, got


# --------------------------------------------------------------------------------------------
# Strings for tokenizer_hf.json
# --------------------------------------------------------------------------------------------


def tokenizer_strings():
    s = []

    def add(*xs):
        for x in xs:
            if x not in s:
                s.append(x)

    # Empty, single characters, trivial
    add("", " ", "a", "A", "Hello", " Hello", "Hello ", " Hello ", "hello world", "Hello, world!", "HELLO WORLD")
    # ASCII prose
    add(
        "The quick brown fox jumps over the lazy dog.",
        "It was the best of times, it was the worst of times.",
        "In 1492, Columbus sailed the ocean blue.",
        "Machine learning models are trained on large datasets; inference is cheaper than training.",
        "Q: What's the boiling point of water? A: 100 degrees Celsius (212 °F) at sea level.",
        "e-mail: someone@example.com, web: https://example.org/path?query=1&x=y#frag",
        "Mr. Smith went to Washington, D.C., on Jan. 5th -- or was it the 6th?",
        "ALL CAPS SENTENCE WITH NUMBERS 123 AND SYMBOLS !@#",
        "camelCaseIdentifier snake_case_identifier kebab-case-identifier PascalCase",
        "supercalifragilisticexpialidocious antidisestablishmentarianism",
    )
    # Contractions: GPT-2's regex only knows the lowercase forms with an ASCII apostrophe.
    for suf in ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]:
        add(f"it{suf}", f"IT{suf.upper()}", f"x {suf}", f"word{suf} word")
    add(
        "I'm sure you'll see they've done what we'd've said isn't right.",
        "DON'T STOP; WON'T STOP; CAN'T STOP",
        "rock 'n' roll, 'quoted', ''double'', '''triple'''",
        "it’s a curly apostrophe, isn’t it?",
        "the dog's bone and the dogs' bones",
    )
    # Numbers: digit splitting. Lengths 1..40, with and without a leading space or letters.
    digits = "31415926535897932384626433832795028841971"
    for n in list(range(1, 21)) + [25, 32, 40]:
        add(digits[:n])
    for n in [1, 2, 3, 4, 7, 12]:
        add(" " + digits[:n], "x" + digits[:n], digits[:n] + "x", "  " + digits[:n], "a " + digits[:n] + " b")
    add(
        "0", "00", "007", "-42", "+42", "3.14159", "-0.5e-10", "1,000,000", "1.000.000,50", "1_000_000",
        "0x1F", "0b1010", "1e9", "12:34:56", "2024-01-15", "15/01/2024", "v1.2.3", "192.168.0.1",
        "+1 (555) 123-4567", "$1,234.56", "€99,99", "50%", "3rd 21st 42nd 100th", "H2O CO2 x86_64",
        "½ ¾ ² ³ ① ② Ⅻ ٣ ४ ๓",  # other Unicode numbers (\p{N}: No, Nl, Nd)
        "１２３ full-width digits",
    )
    # Whitespace right before digits: where the individual-digit pre-split changes the result
    add("a  1", "a   12", "x\r\n42", "x \n1", "hello\n\n123", "tab\t\t5", "end \n 7 \n", "(  3  )", "\u00a0\u00a09")
    # Punctuation
    add(
        "!!!", "???", "...", "…", "?!", "--", "---", "—", "–", "(a)", "[b]", "{c}", "<d>", "\"quoted\"",
        "«guillemets»", "„German“", "「Japanese」", "a,b;c:d", "x = (a + b) * c / d - e % f",
        "#include <stdio.h>", "// comment", "/* block */", "<!-- html -->", "@decorator", "~/.config",
        "C:\\Users\\name\\file.txt", "a&&b||!c", "x->y", "a::b", "=>", "!==", "<<=", ">>>", "**kwargs",
    )
    # Code in several languages, with indentation and tabs
    add(
        "def add(a, b):\n    return a + b\n",
        "class Foo:\n\tdef __init__(self):\n\t\tself.x = 1\n",
        "for i in range(10):\n    if i % 2 == 0:\n        print(f\"{i} is even\")\n",
        "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
        "#include <iostream>\nint main() {\n  std::cout << \"Hello\" << std::endl;\n  return 0;\n}\n",
        "function f(x) {\n\treturn x === undefined ? null : x?.y ?? 0;\n}\n",
        "const add = (a, b) => a + b; // arrow\n",
        "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;",
        "<div class=\"box\"><p>Hello &amp; welcome</p></div>",
        "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
        "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
        "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done\n",
        "public static void main(String[] args) {\n        System.out.println(args.length);\n}",
        "    indented four\n        indented eight\n\t\ttwo tabs\n",
        "x\t=\t1\ny\t=\t2",
        "if (a) {\r\n    b();\r\n}\r\n",
        "\\documentclass{article}\n\\begin{document}$E=mc^2$\\end{document}",
        "| col1 | col2 |\n|------|------|\n| 1    | 2    |",
        "- item one\n- item two\n  - nested\n1. first\n2. second",
        "```python\nprint('hi')\n```",
    )
    # Whitespace runs, leading/trailing spaces, newlines, CRLF
    for n in [1, 2, 3, 4, 5, 8, 16, 33]:
        add(" " * n, "\n" * n, "\t" * n, "a" + " " * n + "b", "a" + "\n" * n + "b", " " * n + "x", "x" + " " * n)
    add(
        "\r\n", "\r\n\r\n", "a\r\nb", "a\rb", "line1\nline2\nline3", "  leading", "trailing  ", "  both  ",
        " \n ", "\n \n", " \t \n", "\t\n\t", "a \n b", "a\n\n\n\nb", "end with newline\n", "\nstart with newline",
        "word  \n  word", "\u00a0nbsp\u00a0", "a\u2003em space", "zero\u200bwidth", "\ufeffBOM", "a\x00b", "\x07bell\x1b[31mred\x1b[0m",
        "a\u2028b\u2029c", "\u3000ideographic space",
    )
    # Accented Latin, Greek, Cyrillic, other scripts
    add(
        "café", "naïve façade", "Ünïcödé", "Crème brûlée à la carte", "Ærøskøbing", "Łódź", "İstanbul ıi",
        "straße STRASSE ß ẞ", "cafe\u0301 (combining acute)", "ǅ ǈ ǋ", "Ångström",
        "Je m'appelle Marie et j'habite à Paris.", "¿Dónde está la biblioteca? ¡Aquí!",
        "Καλημέρα κόσμε", "Αλφάβητο: αβγδεζηθικλμνξοπρστυφχψω", "Привет, мир!", "Съешь же ещё этих мягких французских булок.",
        "Україна, Київ", "你好，世界！", "我喜欢学习中文。", "今天天气很好，我们去公园吧。", "こんにちは世界", "カタカナとひらがな、漢字",
        "안녕하세요 세계", "مرحبا بالعالم", "السلام عليكم ورحمة الله", "שלום עולם", "नमस्ते दुनिया", "हिन्दी भाषा",
        "สวัสดีชาวโลก", "Xin chào thế giới", "Γειά σου 123 Мир 456 世界 789", "Tiếng Việt có dấu: ắ ằ ẳ ẵ ặ",
        "ሰላም ለዓለም", "Բարեւ աշխարհ", "გამარჯობა", "বাংলা", "தமிழ்", "ꯃꯩꯇꯩ",
    )
    # Emoji: simple, ZWJ sequences, skin tones, flags, keycaps, variation selectors
    add(
        "😀", "😀😃😄", "I ❤️ you", "👍", "👍🏻 👍🏼 👍🏽 👍🏾 👍🏿", "👨‍👩‍👧‍👦", "👩‍💻", "🧑🏽‍🚀", "🏳️‍🌈", "❤️‍🔥",
        "🇫🇷🇯🇵🇺🇸", "1️⃣ #️⃣", "☺︎ ☺️", "🍕🍕🍕", "emoji🙂inline", " 🚀 rocket", "🤖: beep boop", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙", "𓀀 𐍈",
    )
    # Special tokens written as text (parsed as control tokens, as llama.cpp does with special=true)
    add(
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
        "text<|endoftext|>more", "<|im_start|><|im_end|>", " <|im_start|> ", "<repo_name>weft<file_sep>src/lib.rs",
        "<filename>a.py\n<gh_stars>10", "<jupyter_code>print(1)<jupyter_output>1<empty_output>",
        "<|im_start", "im_start|>", "< |im_start| >", "<|IM_START|>", "<|unknown|>", "<s></s>", "[INST] hi [/INST]",
    )
    # A long mixed string
    add(LONG_PARAGRAPH, (LONG_PARAGRAPH + "\n\n") * 2)

    # Seeded combinations of the pieces above
    rng = random.Random(20240615)
    words = [
        "the", "model", "GPU", "shader", "naïve", "café", "数据", "модель", "δοκιμή", "🙂", "👍🏽", "42", "3.14",
        "don't", "we'll", "x_1", "fn", "=>", "{", "}", "(", ")", "\"", "'", "#", "<|im_end|>", "…", "—", "über",
    ]
    seps = [" ", "  ", "\n", "\t", "", ", ", ". ", "\r\n", "   ", " \n"]
    for _ in range(90):
        n = rng.randint(1, 12)
        parts = []
        for _ in range(n):
            parts.append(rng.choice(words))
            parts.append(rng.choice(seps))
        if rng.random() < 0.5:
            parts = parts[:-1]
        add("".join(parts))
    # Seeded numbers of random lengths, in context
    for _ in range(30):
        n = rng.randint(1, 30)
        num = "".join(rng.choice("0123456789") for _ in range(n))
        add(rng.choice(["", " ", "x", "Total: ", "\n", "  "]) + num + rng.choice(["", " ", ".", "%", "px", "\n", "th"]))
    return s


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


GENERATOR = "tools/make_fixtures.py"


def check_ours(path, force):
    """Refuse to overwrite a file some other tool wrote (tokenizer.json once got clobbered)."""
    if force or not path.exists():
        return
    try:
        gen = json.loads(path.read_text(encoding="utf-8")).get("meta", {}).get("generator")
    except (ValueError, AttributeError):
        gen = None
    if gen != GENERATOR:
        sys.exit(f"{path} exists and was not written by {GENERATOR}; not overwriting it (use --force)")


def dump(obj, path):
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    path.write_text(text + "\n", encoding="utf-8")
    return len(text.encode("utf-8")) + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--skip-model", action="store_true", help="only write tokenizer_hf.json")
    ap.add_argument("--force", action="store_true", help="overwrite output files another tool wrote")
    args = ap.parse_args()

    import gguf
    import tokenizers
    import torch
    import transformers

    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    t_start = time.time()

    model_path = args.model.resolve()
    if not model_path.exists():
        sys.exit(f"missing {model_path}: run `cargo xtask fetch-model` first")
    args.out.mkdir(parents=True, exist_ok=True)
    tok_out, model_out = args.out / "tokenizer_hf.json", args.out / "model.json"
    check_ours(tok_out, args.force)
    if not args.skip_model:
        check_ours(model_out, args.force)
    digest = sha256(model_path)
    reader = gguf.GGUFReader(str(model_path))
    meta = gguf_meta(reader)
    arch = meta["general.architecture"]
    n_head = int(meta[f"{arch}.attention.head_count"])
    n_kv = int(meta[f"{arch}.attention.head_count_kv"])
    log(f"GGUF {model_path.name} sha256 {digest[:16]}… arch={arch} heads={n_head}/{n_kv} pre={meta.get('tokenizer.ggml.pre')}")

    versions = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
        "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf"),
        "numpy": np.__version__,
        "python": sys.version.split()[0],
    }
    source = {"file": model_path.name, "sha256": digest, "size_bytes": model_path.stat().st_size}

    # ---------------- tokenizers ----------------
    tok_raw, tok = load_tokenizers(str(model_path.parent), model_path.name)
    lcpp = LlamaCpp(model_path)
    if lcpp.llm is not None:
        versions["llama_cpp_python"] = lcpp.version
        log(f"llama-cpp-python {lcpp.version} available: cross-checking tokenization")
    else:
        log(f"llama-cpp-python not available ({lcpp.error}); skipping the llama.cpp cross-check")

    vocab = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    control_tokens = {vocab[i]: i for i, t in enumerate(types) if int(t) == 3}  # 3 = CONTROL

    strings = tokenizer_strings()
    entries = []
    n_raw_diff = 0
    lcpp_disagree = []
    lcpp_detok_disagree = []
    for text in strings:
        ids = encode(tok, text)
        e = {"text": text, "ids": ids, "roundtrip": decode(tok, ids) == text}
        raw_ids = encode(tok_raw, text)
        if raw_ids != ids:
            e["hf_gguf_unfixed_ids"] = raw_ids
            n_raw_diff += 1
        if lcpp.llm is not None:
            l_ids = lcpp.tokenize(text)
            if l_ids != ids:
                e["llama_cpp_ids"] = l_ids
                lcpp_disagree.append(text)
            if lcpp.detokenize(ids) != decode(tok, ids):
                lcpp_detok_disagree.append(text)
        entries.append(e)
    n_rt_fail = sum(1 for e in entries if not e["roundtrip"])
    other = {"file": "tests/fixtures/smollm2/tokenizer.json (tools/make_tokenizer_fixtures.py, llama.cpp ids)"}
    other_path = args.out / "tokenizer.json"
    if other_path.exists():
        try:
            cases = json.loads(other_path.read_text(encoding="utf-8"))["cases"]
            bad = [c["text"] for c in cases if encode(tok, c["text"]) != c["ids"]]
            other.update(checked=len(cases), disagree=len(bad), disagree_texts=bad[:10])
        except (KeyError, TypeError, ValueError) as e:
            other["skipped"] = f"unreadable: {e}"
    else:
        other["skipped"] = "absent"
    log(f"vs {other_path.name}: {json.dumps(other, ensure_ascii=False)}")
    tok_meta = {
        "description": "Reference token ids for SmolLM2-135M-Instruct's GGUF tokenizer; encode without adding special "
        "tokens (control tokens written as text ARE matched, like llama.cpp tokenize(special=true)); "
        "roundtrip = decode(ids) == text (special tokens kept, no clean-up of spaces).",
        "generator": GENERATOR,
        "source": source,
        "versions": versions,
        "reference_tokenizer": "transformers AutoTokenizer.from_pretrained(gguf_file=...) with its pre-tokenizer replaced "
        "by SmolLM2's own (Digits(individual_digits) then ByteLevel(add_prefix_space=false,use_regex=true)); "
        "transformers' GGUF conversion does not map tokenizer.ggml.pre='smollm' and uses plain GPT-2 ByteLevel.",
        "pre_tokenizer": pre_tokenizer_json(tok),
        "hf_gguf_unfixed_pre_tokenizer": pre_tokenizer_json(tok_raw),
        "tokenizer_ggml_pre": meta.get("tokenizer.ggml.pre"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "control_tokens": control_tokens,
        "control_tokens_matched_as_one_id": all(encode(tok, t) == [i] for t, i in control_tokens.items()),
        "count": len(entries),
        "checked_against_tokenizer_json": other,
        "roundtrip_failures": n_rt_fail,
        "hf_gguf_unfixed_differs": n_raw_diff,
        "llama_cpp_check": (
            {"checked": len(entries), "ids_disagree": len(lcpp_disagree), "detokenize_disagree": len(lcpp_detok_disagree)}
            if lcpp.llm is not None
            else {"skipped": lcpp.error}
        ),
    }
    tok_bytes = dump({"meta": tok_meta, "cases": entries}, tok_out)
    log(
        f"{tok_out.name}: {len(entries)} strings, {n_rt_fail} round-trip failures, "
        f"{n_raw_diff} differ from unfixed HF-GGUF tokenizer, "
        + (f"{len(lcpp_disagree)} ids / {len(lcpp_detok_disagree)} detok disagree with llama.cpp" if lcpp.llm else "no llama.cpp check")
        + f", {tok_bytes} bytes"
    )
    for t in lcpp_disagree[:20]:
        log(f"  llama.cpp disagrees on {t!r}")

    if args.skip_model:
        return

    # ---------------- model ----------------
    tensors = gguf_tensors_as_hf(reader, n_head, n_kv)
    hf_model, load_error = None, None
    t0 = time.time()
    try:
        hf_model = load_hf_model(str(model_path.parent), model_path.name)
    except Exception as e:  # noqa: BLE001
        load_error = f"{type(e).__name__}: {e}"
        log(f"transformers could not load the GGUF ({load_error}); using the hand-built model")
    log(f"model load {time.time() - t0:.1f}s")
    own_model = build_own_model(meta, tensors)

    if hf_model is not None:
        bad = [n for n, mod in hf_model.named_modules() if "Linear" in type(mod).__name__ and type(mod) is not torch.nn.Linear]
        if bad:
            sys.exit(f"transformers kept packed GGUF modules, not a dense f32 model: {bad[:3]}")
        wrep = verify_weights(hf_model, tensors)
        wrep["qk_unpermuted_vs_raw_gguf_rows_max_abs_diff_layer0_q"] = verify_qk_permutation_matters(hf_model, reader, n_head)
        log(f"weights: {json.dumps(wrep)}")
        if wrep["max_abs_diff"] != 0.0 or wrep["own_decoder_max_abs_diff"] != 0.0:
            sys.exit("transformers' dequantized weights differ from our own dequantization")
        if wrep["qk_unpermuted_vs_raw_gguf_rows_max_abs_diff_layer0_q"] == 0.0:
            sys.exit("Q/K un-permutation had no effect: layout check is vacuous")
        reference = hf_model
        reference_kind = "transformers AutoModelForCausalLM.from_pretrained(gguf_file=..., dtype=float32, GgufConfig(dequantize=True), attn_implementation='eager')"
    else:
        wrep = {"transformers_load_error": load_error}
        reference = own_model
        reference_kind = "hand-built transformers LlamaForCausalLM from GGUF metadata + gguf-py dequantized, un-permuted tensors"

    # Same logits from the hand-built model?
    probe = encode(tok, TEXT_PROMPTS[0][1])
    with torch.no_grad():
        a = reference(input_ids=torch.tensor([probe])).logits
        b = own_model(input_ids=torch.tensor([probe])).logits
    wrep["hand_built_model_logits_max_abs_diff"] = float((a - b).abs().max())
    log(f"hand-built vs reference logits max abs diff {wrep['hand_built_model_logits_max_abs_diff']:.3g}")
    del own_model

    prompts = []
    for name, text in TEXT_PROMPTS:
        prompts.append({"name": name, "kind": "text", "text": text})
    for name, messages in CHAT_PROMPTS:
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompts.append({"name": name, "kind": "chat", "messages": messages, "text": rendered})

    checks = {"no_cache_argmax_equal": True, "generate_equal": True, "no_cache_top1_maxdiff": 0.0, "llama_cpp_prompt_ids_disagree": []}
    for i, p in enumerate(prompts):
        t0 = time.time()
        ids = encode(tok, p["text"])
        p["add_special_tokens"] = False
        p["prompt_ids"] = ids
        if encode(tok_raw, p["text"]) != ids:
            p["hf_gguf_unfixed_prompt_ids"] = encode(tok_raw, p["text"])
        if lcpp.llm is not None and lcpp.tokenize(p["text"]) != ids:
            checks["llama_cpp_prompt_ids_disagree"].append(p["name"])
        r = run_prompt(reference, ids, full_logits=(i == 0), hidden_stats=(i == 0))
        checks["no_cache_argmax_equal"] &= r.pop("_check_no_cache_argmax_equal")
        checks["no_cache_top1_maxdiff"] = max(checks["no_cache_top1_maxdiff"], r.pop("_check_no_cache_top1_maxdiff"))
        same, got = check_with_generate(reference, ids, r["greedy_ids"])
        if not same:
            checks["generate_equal"] = False
            log(f"  generate() differs for {p['name']}: {got}")
        p.update(r)
        p["greedy_text"] = decode(tok, r["greedy_ids"])
        log(f"[{p['name']}] {len(ids)} prompt tokens, min margin {min(r['greedy_margins']):.4f}, {time.time() - t0:.1f}s: {p['greedy_text'][:70]!r}")
        prompts[i] = {k: p[k] for k in _ORDER if k in p} | {k: v for k, v in p.items() if k not in _ORDER}

    lc = llama_cpp_model_check(reader, model_path, prompts)
    log(f"llama.cpp model check: {json.dumps(lc)}")
    checks["llama_cpp_model"] = lc

    model_meta = {
        "description": "Outside-truth reference for SmolLM2-135M-Instruct.Q4_1.gguf: f32 transformers forward on the "
        "exactly-dequantized GGUF weights. Logits are raw (no softmax/temperature). greedy_ids: argmax at every "
        "step, no sampling, no penalties, EOS is just another token (no stop). greedy_margins[i] = top1 - top2 "
        "logit at step i (step 0 = last prompt position); a weft mismatch at a step with a tiny margin is a "
        "near-tie, not necessarily a bug. last_logits_full (first prompt only) is rounded to 4 decimals. "
        "checks.llama_cpp_model: llama.cpp on an all-F32 copy of the GGUF must match (it does to ~1e-2, its KV "
        "cache is f16); llama.cpp on the Q4_1 file quantizes activations (Q8_1) and lands a few tenths away.",
        "generator": GENERATOR,
        "source": source,
        "versions": versions,
        "reference_model": reference_kind,
        "config": {
            "n_layer": int(meta[f"{arch}.block_count"]),
            "n_embd": int(meta[f"{arch}.embedding_length"]),
            "n_ff": int(meta[f"{arch}.feed_forward_length"]),
            "n_head": n_head,
            "n_head_kv": n_kv,
            "vocab_size": int(meta.get(f"{arch}.vocab_size", 0)),
            "rope_freq_base": float(meta[f"{arch}.rope.freq_base"]),
            "rms_norm_eps": float(meta[f"{arch}.attention.layer_norm_rms_epsilon"]),
            "bos_token_id": int(meta["tokenizer.ggml.bos_token_id"]),
            "eos_token_id": int(meta["tokenizer.ggml.eos_token_id"]),
            "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        },
        "chat_template": meta.get("tokenizer.chat_template"),
        "tokenizer_note": tok_meta["reference_tokenizer"],
        "weight_check": wrep,
        "checks": checks,
        "n_greedy": N_GREEDY,
        "top_k": TOP_K,
    }
    model_bytes = dump({"meta": model_meta, "prompts": prompts}, model_out)

    # ---------------- summary ----------------
    print(f"wrote {tok_out} ({tok_bytes} bytes, {len(entries)} strings)")
    print(f"wrote {model_out} ({model_bytes} bytes, {len(prompts)} prompts)")
    print(f"versions: {json.dumps(versions)}")
    print(f"weights vs own dequantization: max abs diff {wrep.get('max_abs_diff')} over {wrep.get('tensors_compared')} tensors")
    print(f"checks: {json.dumps(checks)}")
    print(f"tokenizer: {n_rt_fail} round-trip failures; {n_raw_diff} strings where unfixed HF-GGUF tokenizer differs; llama.cpp: {json.dumps(tok_meta['llama_cpp_check'])}")
    for p in prompts:
        print(f"  {p['name']:<26} {len(p['prompt_ids']):>4} ids  min margin {min(p['greedy_margins']):8.4f}  {p['greedy_text'][:60]!r}")
    print(f"done in {time.time() - t_start:.0f}s")


_ORDER = ["name", "kind", "messages", "text", "add_special_tokens", "prompt_ids"]


def _dist_version(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return None


if __name__ == "__main__":
    main()
