#!/usr/bin/env python3
"""Writes tests/fixtures/quants/blocks.json: a few random but valid blocks of every quantized
weight format weft decodes, and their values as gguf-py dequantizes them, for
tests/quant_fixtures.rs (outside truth for src/quant/, with no python in CI).

gguf-py (`pip install gguf`) is llama.cpp's own Python package; its numpy dequantizers are an
implementation independent of ggml-quants.c (and of weft). A block is random bytes except its
f16 scale fields, which get finite values of a sane size (random scales could be NaN or
infinity, which real files never hold): every other bit pattern of codes, sub-block scales and
mins is valid, so random bytes cover the layouts better than any encoder's output.

Q8_K has no gguf-py dequantizer (ggml only uses it for activations); tests/quant_fixtures.rs
checks it by hand.

    python3 -m venv /work/scratch/venv && /work/scratch/venv/bin/pip install gguf numpy
    /work/scratch/venv/bin/python tools/make_quant_fixtures.py
"""

import json
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize

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
}

# Enough blocks for several rows of 256 elements in the 32-element formats.
BLOCKS = {True: 3, False: 24}


def main():
    rng = np.random.default_rng(20260101)
    out = {}
    for qtype, fields in F16_FIELDS.items():
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        n = BLOCKS[block_elems == 256]
        raw = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
        for at in fields:
            scale = (rng.uniform(0.001, 0.1, size=n) * rng.choice([-1.0, 1.0], size=n)).astype(np.float16)
            raw[:, at:at + 2] = scale.view(np.uint8).reshape(n, 2)
        values = dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
        assert values.size == n * block_elems and np.isfinite(values).all()
        out[qtype.name] = {"bytes": raw.tobytes().hex(), "values_f32_le": values.tobytes().hex()}
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {', '.join(out)}")


if __name__ == "__main__":
    main()
