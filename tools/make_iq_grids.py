#!/usr/bin/env python3
"""Writes src/quant/iq_grids.rs: the codebooks of IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S, read from
llama.cpp's ggml-common.h (the one source of their values), packed small.

A ggml grid entry is 8 (IQ2) or 4 (IQ3) bytes, one grid value per element, each byte one of 3
(IQ2: 0x08, 0x19, 0x2b) or 8 values (IQ3_XXS: 4, 12, ..., 52, 62; IQ3_S: 1, 3, ..., 15). An
entry is stored as the indices of its bytes among those values, 2 or 3 bits each, element j at
bits 2j or 3j: 16 or 12 bits, so every table fits in u16s (a quarter of ggml's bytes). The CPU
decoders and the shaders (which get the same numbers, rendered into WGSL by
src/gpu/pipelines.rs) unpack them with those value lists; tests/quant_fixtures.rs holds the
result to gguf-py's own copy of the grids, every entry.

    python3 tools/make_iq_grids.py PATH/TO/llama.cpp/ggml/src/ggml-common.h

(llama.cpp as vendored by llama-cpp-python 0.3.36; `pip download --no-deps --no-binary
llama-cpp-python llama-cpp-python==0.3.36`.)
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "src", "quant", "iq_grids.rs")

# (ggml table, Rust name, entries, bytes an entry, the byte values in index order)
TABLES = [
    ("iq2xs_grid", "IQ2XS_GRID", 512, 8, [0x08, 0x19, 0x2B]),
    ("iq2s_grid", "IQ2S_GRID", 1024, 8, [0x08, 0x19, 0x2B]),
    ("iq3xxs_grid", "IQ3XXS_GRID", 256, 4, [4, 12, 20, 28, 36, 44, 52, 62]),
    ("iq3s_grid", "IQ3S_GRID", 512, 4, [1, 3, 5, 7, 9, 11, 13, 15]),
]


def table(header, name):
    m = re.search(r"GGML_TABLE_BEGIN\(\w+, " + name + r", \w+\)(.*?)GGML_TABLE_END\(\)", header, re.S)
    assert m, name
    return [int(v, 16) for v in re.findall(r"0x[0-9a-fA-F]+", m.group(1))]


def main():
    header = open(sys.argv[1]).read()
    out = [
        "//! The codebooks of IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S: ggml-common.h's `iq2xs_grid`,",
        "//! `iq2s_grid`, `iq3xxs_grid` and `iq3s_grid`, each entry packed as the indices of its bytes",
        "//! among the format's grid values (element j at bits 2j for IQ2, 3j for IQ3; see",
        "//! [`super::grid_value`]). Written by `tools/make_iq_grids.py` from llama.cpp's",
        "//! ggml-common.h; do not edit.",
        "",
    ]
    for ggml, rust, entries, width, values in TABLES:
        words = table(header, ggml)
        assert len(words) == entries, (ggml, len(words))
        bits = 2 if len(values) == 3 else 3
        packed = []
        for w in words:
            p = 0
            for j in range(width):
                p |= values.index((w >> (8 * j)) & 0xFF) << (bits * j)
            packed.append(p)
        out.append(f"/// ggml's `{ggml}`, {entries} entries of {width} elements, {bits} bits each.")
        out.append(f"pub(crate) const {rust}: [u16; {entries}] = [")
        for i in range(0, entries, 12):
            out.append("    " + " ".join(f"0x{p:04x}," for p in packed[i:i + 12]))
        out.append("];")
        out.append("")
    with open(OUT, "w") as f:
        f.write("\n".join(out).rstrip("\n") + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
