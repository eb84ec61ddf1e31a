// SPDX-License-Identifier: Apache-2.0
// lora_shrink: the first half of a batched LoRA projection (punica's "shrink"): each token row
// multiplied by the A matrix of the adapter its sequence runs, u = x · Aᵀ, A chosen per row from
// the adapter pool's slots. Rows without an adapter are skipped (lora_expand never reads them).
//
// Bindings (group 0)
//   0 params     uniform  Params  mirrors gpu::kernels::lora::ShrinkParams
//   1 x          read     f32 (rows, in_dim): the projection's input
//   2 a          read     f32 (slots · in_dim, max_rank): each slot's Aᵀ, rank columns used
//   3 row_slots  read     u32 (rows): the row's adapter slot, NO_SLOT for the base model
//   4 slot_info  read     u32 (slots, 2): the slot's rank, its scale's f32 bits
//   5 u          read_write f32 (rows, max_rank): x · Aᵀ, the slot's rank columns written
// Workgroup: 64 invocations, one (row, rank index) pair each; the sum over in_dim runs in a
// fixed order, so a row's u does not depend on the other rows (batch invariance). A is stored
// transposed so that neighbouring invocations (neighbouring rank indices) read neighbouring
// words: coalesced loads on GPUs.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(rows · max_rank / 64).

struct Params {
    rows: u32,
    in_dim: u32,
    max_rank: u32,
}

const WG: u32 = 64u;
const NO_SLOT: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> row_slots: array<u32>;
@group(0) @binding(4) var<storage, read> slot_info: array<u32>;
@group(0) @binding(5) var<storage, read_write> u: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.rows * params.max_rank) {
        return;
    }
    let row = i / params.max_rank;
    let r = i % params.max_rank;
    let slot = row_slots[row];
    if (slot == NO_SLOT || r >= slot_info[2u * slot]) {
        return;
    }
    let x0 = row * params.in_dim;
    let a0 = slot * params.in_dim * params.max_rank + r;
    var acc = 0.0;
    for (var k = 0u; k < params.in_dim; k++) {
        acc += x[x0 + k] * a[a0 + k * params.max_rank];
    }
    u[i] = acc;
}
