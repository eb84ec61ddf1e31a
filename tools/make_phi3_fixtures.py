#!/usr/bin/env python3
"""Make the outside-truth fixture of weft's Phi-3 test: a tiny random-weight ``Phi3ForCausalLM``
in transformers with LongRoPE scaling, saved as a Hugging Face directory and converted to GGUF
by llama.cpp's own ``convert_hf_to_gguf.py``, with transformers' logits and greedy tokens.

Writes ``tests/fixtures/phi3/``: ``hf/`` (config.json, model.safetensors in f32,
tokenizer.json, tokenizer_config.json with Phi-3-mini's chat template), ``model.gguf`` and
``expected.json`` (as ``tools/make_recurrent_fixtures.py`` writes them, whose tokenizer,
weight randomizer and converter run this reuses), plus the chat template rendered by
transformers.

The model: hidden 64, 4 heads of 16 with 2 KV heads, MLP 96, 2 layers, untied LM head;
LongRoPE with an original context of 32 and a context of 128 (attention factor
sqrt(1 + ln 4 / ln 32)), short and long factors far from 1 and from each other. transformers
picks the factors per forward pass: long once a position passes 32. The first two prompts (5
and 17 tokens, 12 generated) stay within 32 positions (short factors); the third (33 tokens)
starts past it (long factors), so each prompt uses one factor set throughout.

Usage::

    python tools/make_phi3_fixtures.py --llama-cpp /path/to/llama-cpp-python-x.y.z/vendor/llama.cpp
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_recurrent_fixtures as recurrent  # noqa: E402

# Phi-3-mini-4k-instruct's chat template.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)
HEAD_DIM = 16


def phi3(vocab: int):
    from transformers import Phi3Config, Phi3ForCausalLM

    half = HEAD_DIM // 2
    config = Phi3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, original_max_position_embeddings=32,
        rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.5 * i for i in range(half)],
            "long_factor": [2.0 + 3.0 * i for i in range(half)],
        },
        rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=None, pad_token_id=1, bos_token_id=0,
        eos_token_id=0,
    )
    return Phi3ForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="vendor/llama.cpp of llama-cpp-python")
    args = parser.parse_args()
    sys.path.insert(0, str(args.llama_cpp))
    sys.path.insert(1, str(args.llama_cpp / "gguf-py"))
    hf = recurrent.FIXTURES / "phi3" / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    # The converter reads a GPT-2 style vocabulary when the tokenizer class says so (Phi-4's
    # path); the GGUF takes the chat template from here.
    (hf / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "add_bos_token": False, "chat_template": CHAT_TEMPLATE}, indent=2) + "\n")
    recurrent.make("phi3", phi3, args.llama_cpp)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the state of a token"}]
    expected_path = recurrent.FIXTURES / "phi3" / "expected.json"
    expected = json.loads(expected_path.read_text())
    expected["chat"] = {"messages": messages,
                        "text": tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)}
    expected_path.write_text(json.dumps(expected) + "\n")


if __name__ == "__main__":
    main()
