// SPDX-License-Identifier: Apache-2.0
// lora_expand: the second half of a batched LoRA projection (punica's "expand"): each token row
// with an adapter adds scale · u · Bᵀ to its columns of the projection's output, B and scale
// chosen per row from the adapter pool's slots. Rows without an adapter are left untouched, so
// the base model's numbers do not change beside adapters.
//
// Bindings (group 0)
//   0 params     uniform     Params  mirrors gpu::kernels::lora::ExpandParams
//   1 u          read        f32 (rows, max_rank): lora_shrink's x · Aᵀ
//   2 b          read        f32 (slots · max_rank, out_dim): each slot's Bᵀ, rank rows used
//   3 row_slots  read        u32 (rows): the row's adapter slot, NO_SLOT for the base model
//   4 slot_info  read        u32 (slots, 2): the slot's rank, its scale's f32 bits
//   5 y          read_write  f32 (rows, y_cols): columns col .. col + out_dim get the delta
// Workgroup: 64 invocations, one output element (row, j) each; the sum over the rank runs in a
// fixed order (batch invariance), then is scaled and added. B is stored transposed so that
// neighbouring invocations (neighbouring columns j) read neighbouring words: coalesced loads
// on GPUs.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(rows · out_dim / 64).

struct Params {
    rows: u32,
    out_dim: u32,
    y_cols: u32,
    col: u32,
    max_rank: u32,
}

const WG: u32 = 64u;
const NO_SLOT: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> u: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> row_slots: array<u32>;
@group(0) @binding(4) var<storage, read> slot_info: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.rows * params.out_dim) {
        return;
    }
    let row = i / params.out_dim;
    let j = i % params.out_dim;
    let slot = row_slots[row];
    if (slot == NO_SLOT) {
        return;
    }
    let rank = slot_info[2u * slot];
    let u0 = row * params.max_rank;
    let b0 = slot * params.max_rank * params.out_dim + j;
    var acc = 0.0;
    for (var r = 0u; r < rank; r++) {
        acc += u[u0 + r] * b[b0 + r * params.out_dim];
    }
    y[row * params.y_cols + params.col + j] += bitcast<f32>(slot_info[2u * slot + 1u]) * acc;
}
