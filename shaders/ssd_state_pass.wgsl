// SPDX-License-Identifier: Apache-2.0
// ssd_state_pass: the fourth pass of the chunked (SSD) scan: each run of consecutive chunks of
// one sequence walks its chunks in order from the state it starts from (its slot, a prefix
// snapshot being restored, or zero at position 0):
//   S_in[c] = S;  S = exp(cs_end[c]) · S + dS[c]
// replacing each chunk's dS by the S_in it starts from (what ssd_chunk_scan reads), and leaves
// the final S in the sequence's slot (and in a snapshot slot when asked).
//
// Bindings (group 0)
//   0 params  uniform     Params  mirrors gpu::kernels::ssm::SsdParams
//   1 runs    read        u32 (num_runs, 6): first chunk, chunks, own slot, start position,
//                             slot read from, snapshot slot written (0xffffffff: none)
//   2 dtcs    read        vec4<f32> (num_chunks, heads, Q): (dt_t, cs_t, w_t, 0)
//   3 states  read_write  vec4<f32> (num_chunks, heads, head_dim, state_size / 4): dS in, S_in out
//   4 state   read_write  vec4<f32> (slots, heads, head_dim, state_size / 4)
// Workgroup: 64 invocations, four states of one channel of one head of one run each.
// Grid: (ceil(heads · head_dim · state_size / 4 / 64), num_runs, 1).

#include shared/ssd_params.wgsl

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> runs: array<u32>;
@group(0) @binding(2) var<storage, read> dtcs: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> states: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> state: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n4 = params.state_size / 4u;
    let inner = params.heads * params.head_dim;
    let i = gid.x;
    if (i >= inner * n4) {
        return;
    }
    let r = gid.y;
    let h = i / n4 / params.head_dim;
    let first_chunk = runs[SEQ_COLS * r];
    let num_chunks = runs[SEQ_COLS * r + 1u];
    let slot = runs[SEQ_COLS * r + 2u];
    let fresh = runs[SEQ_COLS * r + 3u] == 0u;
    let read_slot = runs[SEQ_COLS * r + 4u];
    let save_slot = runs[SEQ_COLS * r + 5u];
    var s = select(state[read_slot * inner * n4 + i], vec4<f32>(0.0), fresh);
    for (var k = 0u; k < num_chunks; k++) {
        let c = first_chunk + k;
        let at = c * inner * n4 + i;
        let ds = states[at];
        states[at] = s;
        let decay = exp(dtcs[(c * params.heads + h) * params.q + params.q - 1u].y);
        s = fma(s, vec4<f32>(decay), ds);
    }
    state[slot * inner * n4 + i] = s;
    if (save_slot != NO_SLOT) {
        state[save_slot * inner * n4 + i] = s;
    }
}
