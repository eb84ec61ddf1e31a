#!/usr/bin/env python3
"""Make the outside-truth fixture of weft's embedding tests: a tiny random-weight Qwen3 set up
as Qwen3-Embedding is (sentence-transformers: the model, last-token pooling, L2 normalisation),
saved as a Hugging Face directory and converted to GGUF by llama.cpp's own
``convert_hf_to_gguf.py``, with sentence-transformers' embeddings of a few inputs.

``tests/fixtures/qwen3_embedding/``
    ``hf/``            config.json, model.safetensors (f32), tokenizer.json, modules.json and
                       ``1_Pooling/config.json`` (``pooling_mode_lasttoken``).
    ``model.gguf``     the same model, ``--outtype f32``, with ``qwen3.pooling_type`` 3 (last).
    ``expected.json``  per input: the text, its token ids (sentence-transformers' tokenizer)
                       and sentence-transformers' embedding.

llama.cpp's Qwen3 converter writes no pooling type (Qwen3-Embedding's GGUFs are run with
``--pooling last``); this run calls the converter's ``_try_set_pooling_type``, which reads
``modules.json`` as llama.cpp's other sentence-transformers decoders do, so the file names its
pooling. The model: hidden 64, 4 heads of 16 with 2 KV heads, MLP 96, 2 layers, the toy
byte-level BPE of ``tools/make_recurrent_fixtures.py``.

Made with torch 2.15.0 (CPU), transformers 5.25.0, sentence-transformers 6.3.0, gguf-py and
``convert_hf_to_gguf.py`` of llama-cpp-python 0.3.36's ``vendor/llama.cpp``.

Usage::

    python tools/make_embedding_fixtures.py --llama-cpp /path/to/llama-cpp-python-0.3.36/vendor/llama.cpp
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_recurrent_fixtures as recurrent  # noqa: E402

INPUTS = [
    "the state of a sequence",
    "continuous batching runs many requests in one step on the GPU",
    "a selective scan",
    "tokens",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="vendor/llama.cpp of llama-cpp-python")
    args = parser.parse_args()
    sys.path.insert(0, str(args.llama_cpp))
    sys.path.insert(1, str(args.llama_cpp / "gguf-py"))
    from sentence_transformers import SentenceTransformer, models
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = recurrent.FIXTURES / "qwen3_embedding"
    hf = out / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    vocab = recurrent.tokenizer(hf)
    (hf / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>", "add_bos_token": False}, indent=2) + "\n")
    torch.manual_seed(39)
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-6,
        tie_word_embeddings=True, use_sliding_window=False, bos_token_id=0, eos_token_id=0,
    )
    model = Qwen3ForCausalLM(config).float().eval()
    recurrent.randomize(model)
    model.save_pretrained(hf, safe_serialization=True)

    # Qwen3-Embedding's sentence-transformers stack: the model, last-token pooling, Normalize.
    transformer = models.Transformer(str(hf), tokenizer_args={"padding_side": "left"})
    pooling = models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode="lasttoken")
    st = SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu")
    st.save(str(hf))
    import sentence_transformers
    import transformers

    expected = {"meta": {"generator": "tools/make_embedding_fixtures.py", "torch": torch.__version__,
                         "transformers": transformers.__version__,
                         "sentence_transformers": sentence_transformers.__version__, "pooling": "last",
                         "dimensions": 64}, "inputs": []}
    embeddings = st.encode(INPUTS, batch_size=len(INPUTS), convert_to_numpy=True)
    for text, vector in zip(INPUTS, embeddings):
        ids = st.tokenizer(text)["input_ids"]
        expected["inputs"].append({"text": text, "ids": ids, "embedding": [round(float(v), 7) for v in vector]})
    (out / "expected.json").write_text(json.dumps(expected) + "\n")

    import conversion.base
    import conversion.qwen
    import convert_hf_to_gguf

    conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    plain = conversion.qwen.Qwen3Model.set_gguf_parameters

    def with_pooling(self):
        plain(self)
        self._try_set_pooling_type()

    conversion.qwen.Qwen3Model.set_gguf_parameters = with_pooling
    sys.argv = ["convert_hf_to_gguf.py", str(hf), "--outtype", "f32", "--outfile", str(out / "model.gguf")]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
