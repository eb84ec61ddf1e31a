// SPDX-License-Identifier: Apache-2.0
// embedding: out[t, :] = table[ids[t], :], decoding the table's weight format.
//
// Bindings (group 0)
//   0 params  uniform     Params                      mirrors gpu::kernels::embedding::Params
//   1 ids     read        u32 (num_tokens)            row of the table for each token
//   2 w       read        u32 (part_rows, row_bytes)  raw rows first_row .. first_row + part_rows
//   3 out     read_write  f32 (num_tokens, k)
// Workgroup: 64 invocations; one invocation decodes one 8-element chunk of one token's row,
// value = d · code + m exactly as quant::dequantize computes it.
// Tokens whose id lies outside this part are left to the dispatch of the part that holds them.
// Grid: (ceil(ceil(k / W_BLOCK) · W_CHUNKS / 64), num_tokens, 1).

#include shared/weight_bytes.wgsl
#include weight_format

struct Params {
    num_tokens: u32,
    k: u32,
    row_bytes: u32,
    first_row: u32,
    part_rows: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let blk = gid.x / W_CHUNKS;
    let c = gid.x % W_CHUNKS;
    let t = gid.y;
    let k = params.k;
    let row = ids[t] - params.first_row; // wraps past part_rows when ids[t] < first_row
    let k0 = blk * W_BLOCK;
    if (k0 >= k || row >= params.part_rows) {
        return;
    }
    let row_byte = row * params.row_bytes;
    let dm = w_scale(row_byte, blk);
    let q = w_chunk(row_byte, blk, c, k);
    for (var half = 0u; half < 2u; half++) {
        for (var j = 0u; j < 4u; j++) {
            let e = k0 + w_first(c) + half * W_GAP + j;
            if (e < k) {
                out[t * k + e] = dm.x * q[half][j] + dm.y;
            }
        }
    }
}
