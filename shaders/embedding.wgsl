// SPDX-License-Identifier: Apache-2.0
// embedding: out[t, :] = table[ids[t], :] * scale, decoding the table's weight format (also
// used to gather rows of f32 activations, with scale 1, which changes no bit).
//
// Bindings (group 0)
//   0 params  uniform        Params                      mirrors gpu::kernels::embedding::Params
//   1 ids     read           u32 (num_tokens)            row of the table for each token
//   2 w       weight_source  raw rows first_row .. first_row + part_rows of one part, starting
//                            w_base bytes into a texture (0 for a buffer)
//   3 out     read_write     f32 (num_tokens, k)
// Workgroup: 64 invocations; one invocation decodes one 32-element block of one token's row
// (w_block_at) and writes value = d · q + m exactly as quant::dequantize computes it.
// Tokens whose id lies outside this part are left to the dispatch of the part that holds them.
// An id at or past the table's rows reads row 0: a per-layer token table shorter than the
// vocabulary (Gemma 3n's, whose last ids are multimodal placeholders), as transformers reads it.
// Grid: (ceil(k / 32 / 64), num_tokens, 1). Requires k % 32 == 0.

#include weight_source
#include weight_format

struct Params {
    num_tokens: u32,
    k: u32,
    row_bytes: u32,
    first_row: u32,
    part_rows: u32,
    w_base: u32,
    scale: f32,
    table_rows: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x;
    let t = gid.y;
    let k = params.k;
    var id = ids[t];
    if (id >= params.table_rows) {
        id = 0u;
    }
    let row = id - params.first_row; // wraps past part_rows when id < first_row
    if (b * 32u >= k || row >= params.part_rows) {
        return;
    }
    let blk = w_block_at(params.w_base + w_row_byte(row, params.row_bytes), b);
    let base = t * k + b * 32u;
    for (var j = 0u; j < 8u; j++) {
        let v = (blk.dm.x * blk.q[j] + blk.dm.y) * params.scale;
        out[base + 4u * j] = v.x;
        out[base + 4u * j + 1u] = v.y;
        out[base + 4u * j + 2u] = v.z;
        out[base + 4u * j + 3u] = v.w;
    }
}
