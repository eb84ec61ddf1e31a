#!/usr/bin/env python3
"""Writes tests/fixtures/quants/blocks.json: a few random but valid blocks of every quantized
weight format weft decodes, and their values as gguf-py dequantizes them, for
tests/quant_fixtures.rs (outside truth for src/quant/, with no python in CI).

gguf-py (`pip install gguf`) is llama.cpp's own Python package; its numpy dequantizers are an
implementation independent of ggml-quants.c (and of weft). A block is random bytes except its
f16 scale fields, which get finite values of a sane size (random scales could be NaN or
infinity, which real files never hold; MXFP4's exponent likewise): every other bit pattern of codes, sub-block scales and
mins is valid, so random bytes cover the layouts better than any encoder's output.

BF16 (kept 16-bit on the GPU, so its decoder is weft's too) gets an entry of its own, drawn after
the others so theirs stay as they were: finite f32 values of many magnitudes, their BF16 bytes
as gguf-py rounds them (`source_f32_le` keeps the values, for weft's encoder), and the values
those bytes decode to.

Q8_K has no gguf-py dequantizer (ggml only uses it for activations); tests/quant_fixtures.rs
checks it by hand.

Last written with gguf 0.19.0 and numpy 2.4.6 (entries of the formats it had are unchanged
from earlier versions: the generator draws the same numbers for them first).

    python3 -m venv /work/scratch/venv && /work/scratch/venv/bin/pip install gguf==0.19.0 numpy==2.4.6
    /work/scratch/venv/bin/python tools/make_quant_fixtures.py
"""

import json
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "quants", "blocks.json")

# Byte offsets of the f16 scales (d, and dmin or m) in each block, from ggml-common.h.
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
    T.MXFP4: [],
    T.IQ2_XS: [0],
    T.IQ3_XXS: [0],
    T.IQ3_S: [0],
    T.IQ2_S: [0],
}

# Byte offsets of E8M0 exponents (a power-of-two scale): a random one could overflow (e past
# 251 makes infinities), so each gets a sane scale, 2^-14 .. 2^-2.
E8M0_FIELDS = {
    T.MXFP4: [0],
}

# Enough blocks for several rows of 256 elements in the 32-element formats.
BLOCKS = {True: 3, False: 24}


def set_bits(raw, byte, bit, width, values):
    """Write `values` (one per block) into `width` bits at bit `bit` of byte `byte` on."""
    for b, v in enumerate(values):
        word = int.from_bytes(raw[b, byte:byte + 4].tobytes().ljust(4, b"\0"), "little")
        word = (word & ~(((1 << width) - 1) << bit)) | (int(v) << bit)
        n = min(4, raw.shape[1] - byte)
        raw[b, byte:byte + n] = np.frombuffer(word.to_bytes(4, "little")[:n], dtype=np.uint8)


def iq2_xs_index(raw, block, g, i):
    set_bits(raw[block:block + 1], 2 + 2 * g, 0, 9, [i])


def iq2_s_index(raw, block, g, i):
    raw[block, 2 + g] = i & 0xFF
    set_bits(raw[block:block + 1], 2 + 64 + g // 4, 2 * (g % 4), 2, [i >> 8])


def iq3_xxs_index(raw, block, g, i):
    raw[block, 2 + g] = i


def iq3_s_index(raw, block, g, i):
    raw[block, 2 + g] = i & 0xFF
    set_bits(raw[block:block + 1], 2 + 64 + g // 8, g % 8, 1, [i >> 8])


# The codebook formats: (entries, codebook indices a block, writer of index i as the block's
# g-th), from ggml-common.h's layouts and dequantize_row_*. Their fixtures use every entry of
# the codebook once (in order, block after block), so the test holds weft's copy of each
# codebook to gguf-py's, entry by entry; everything else stays random.
CODEBOOKS = {
    T.IQ2_XS: (512, 32, iq2_xs_index),
    T.IQ3_XXS: (256, 64, iq3_xxs_index),
    T.IQ3_S: (512, 64, iq3_s_index),
    T.IQ2_S: (1024, 32, iq2_s_index),
}


def main():
    rng = np.random.default_rng(20260101)
    out = {}
    for qtype, fields in F16_FIELDS.items():
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        n = BLOCKS[block_elems == 256]
        if qtype in CODEBOOKS:
            entries, per_block, _ = CODEBOOKS[qtype]
            n = entries // per_block
        raw = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
        for at in fields:
            scale = (rng.uniform(0.001, 0.1, size=n) * rng.choice([-1.0, 1.0], size=n)).astype(np.float16)
            raw[:, at:at + 2] = scale.view(np.uint8).reshape(n, 2)
        for at in E8M0_FIELDS.get(qtype, []):
            raw[:, at] = rng.integers(114, 127, size=n, dtype=np.uint8)
        if qtype in CODEBOOKS:
            entries, per_block, write = CODEBOOKS[qtype]
            for i in range(entries):
                write(raw, i // per_block, i % per_block, i)
        values = dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
        assert values.size == n * block_elems and np.isfinite(values).all()
        out[qtype.name] = {"bytes": raw.tobytes().hex(), "values_f32_le": values.tobytes().hex()}
    values = rng.standard_normal(256) * np.exp2(rng.integers(-30, 30, size=256))
    values = values.astype(np.float32)
    raw = quantize(values, T.BF16)
    decoded = dequantize(raw, T.BF16).astype(np.float32).reshape(-1)
    assert np.isfinite(decoded).all()
    out["BF16"] = {
        "bytes": raw.tobytes().hex(),
        "values_f32_le": decoded.tobytes().hex(),
        "source_f32_le": values.tobytes().hex(),
    }
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {', '.join(out)}")


if __name__ == "__main__":
    main()
