#!/usr/bin/env python3
"""Make the outside-truth fixtures of weft's embedding tests: a tiny random-weight Qwen3 set up
as Qwen3-Embedding is (sentence-transformers: the model, last-token pooling, L2 normalisation),
and a tiny random-weight BERT encoder set up as BAAI/bge-small-en-v1.5 is (CLS pooling,
Normalize), each saved as a Hugging Face directory and converted to GGUF by llama.cpp's own
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

``tests/fixtures/bert_embedding/``
    ``hf/``            config.json, model.safetensors (f32), vocab.txt and tokenizer.json (a
                       WordPiece vocabulary of a few hundred pieces made for the fixture,
                       lower-cased, accents stripped), modules.json, ``1_Pooling/config.json``
                       (``pooling_mode_cls_token``) and ``2_Normalize``.
    ``model.gguf``     the same model, ``--outtype f32``: ``bert.pooling_type`` 2 (CLS),
                       ``tokenizer.ggml.model`` "bert".
    ``expected.json``  per input: the text, its token ids ([CLS] … [SEP]), sentence-transformers'
                       embedding with CLS pooling and, of the same weights, with mean pooling
                       (``embedding_mean``).

The BERT: hidden 64, 4 heads of 16, intermediate 128, 2 layers, 128 positions, 2 token types,
GELU (erf), LayerNorm eps 1e-12, like bge-small's config at a toy size. llama.cpp's converter
recognises a vocabulary's pre-tokenizer by hashing its tokenization of a test text; the
fixture's vocabulary is its own, so the run names it "bert-bge" (bge-small's), which weft reads
as the WordPiece pre-tokenizer it is.

Made with torch 2.15.0 (CPU), transformers 5.25.0, sentence-transformers 6.3.0, gguf-py and
``convert_hf_to_gguf.py`` of llama-cpp-python 0.3.36's ``vendor/llama.cpp``.

Usage::

    python tools/make_embedding_fixtures.py --llama-cpp /path/to/llama-cpp-python-0.3.36/vendor/llama.cpp [--only bert]
"""

import argparse
import json
import string
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
    parser.add_argument("--only", choices=["qwen3", "bert"], help="make one fixture (default: both)")
    args = parser.parse_args()
    sys.path.insert(0, str(args.llama_cpp))
    sys.path.insert(1, str(args.llama_cpp / "gguf-py"))
    if args.only in (None, "qwen3"):
        qwen3()
    if args.only in (None, "bert"):
        bert()


def versions() -> dict:
    import sentence_transformers
    import transformers

    return {"generator": "tools/make_embedding_fixtures.py", "torch": torch.__version__,
            "transformers": transformers.__version__, "sentence_transformers": sentence_transformers.__version__}


def qwen3() -> None:
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
    expected = {"meta": {**versions(), "pooling": "last", "dimensions": 64}, "inputs": []}
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


BERT_INPUTS = [
    "Hello, world!",
    "Continuous batching runs many requests in one step on the GPU.",
    "an encoder attends to every token",
    "Naïve CAFÉ tokens: 42 WordPieces & [brackets]?",
]

# Whole words and suffixes of the fixture's WordPiece vocabulary, beside every single character
# (and its "##" continuation), so any ASCII text tokenizes and the inputs split into pieces.
WORDS = """the an of to in on one many every hello world continuous batch runs request step gpu
encoder attend token word piece naive cafe bracket model state""".split()
SUFFIXES = "es ing ed er ers ion ions al ly ive ous ch end".split()


def bert_vocab() -> list[str]:
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    punctuation = list(string.punctuation)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + punctuation
    tokens += ["##" + c for c in chars] + WORDS + ["##" + s for s in SUFFIXES]
    assert len(tokens) == len(set(tokens))
    return tokens


def bert() -> None:
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    out = recurrent.FIXTURES / "bert_embedding"
    hf = out / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    tokens = bert_vocab()
    tokenizer = BertTokenizerFast(vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=True,
                                  strip_accents=None, tokenize_chinese_chars=True, model_max_length=128)
    tokenizer.save_pretrained(hf)
    torch.manual_seed(39)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, hidden_act="gelu", max_position_embeddings=128, type_vocab_size=2,
        layer_norm_eps=1e-12, pad_token_id=0,
    )
    model = BertModel(config, add_pooling_layer=False).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(0.2 * torch.randn_like(p))
            elif "embeddings" in name:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    model.save_pretrained(hf, safe_serialization=True)

    def stack(mode: str):
        transformer = models.Transformer(str(hf), max_seq_length=128)
        pooling = models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode=mode)
        return SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu")

    # bge's stack: CLS pooling, Normalize; the same weights mean-pooled as all-MiniLM is.
    st = stack("cls")
    st.save(str(hf))
    (hf / "README.md").unlink()
    mean = stack("mean")
    expected = {"meta": {**versions(), "pooling": "cls", "dimensions": 64}, "inputs": []}
    cls_vectors = st.encode(BERT_INPUTS, batch_size=len(BERT_INPUTS), convert_to_numpy=True)
    mean_vectors = mean.encode(BERT_INPUTS, batch_size=len(BERT_INPUTS), convert_to_numpy=True)
    for text, cls_vector, mean_vector in zip(BERT_INPUTS, cls_vectors, mean_vectors):
        ids = st.tokenizer(text)["input_ids"]
        expected["inputs"].append({"text": text, "ids": ids,
                                   "embedding": [round(float(v), 7) for v in cls_vector],
                                   "embedding_mean": [round(float(v), 7) for v in mean_vector]})
    (out / "expected.json").write_text(json.dumps(expected) + "\n")

    import conversion.base
    import convert_hf_to_gguf

    conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "bert-bge"
    sys.argv = ["convert_hf_to_gguf.py", str(hf), "--outtype", "f32", "--outfile", str(out / "model.gguf")]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
