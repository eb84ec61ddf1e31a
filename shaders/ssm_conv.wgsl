// SPDX-License-Identifier: Apache-2.0
// ssm_conv: the causal depthwise convolution of a Mamba2 layer, continuing each sequence's
// convolution window from a state slot (its own, or a prefix snapshot being restored) and
// leaving the window after its last token in its own slot (and in a snapshot slot when asked):
//   y[t, c] = silu(bias[c] + Σ_j weight[c, j] · u[t - (kernel - 1) + j, c]),  j = 0..kernel
// where u[t', c] for t' before the chunk comes from the slot (zero at position 0).
// With `gated` (LFM2's short convolution) the row holds B, C and x side by side from x_offset,
// u = B · x (what the window keeps) and y = C · (the sum), without the SiLU.
//
// Bindings (group 0)
//   0 params      uniform     Params  mirrors gpu::kernels::ssm::ConvParams
//   1 x           read        f32 (tokens, x_stride): u[t, c] = x[t, x_offset + c] (gated:
//                                   x[t, x_offset + c] · x[t, x_offset + 2 · channels + c])
//   2 weight      read        f32 (channels, kernel)
//   3 bias        read        f32 (channels)
//   4 seqs        read        u32 (num_seqs, 6): first row, rows, own slot, start position,
//                                   slot read from, snapshot slot written (0xffffffff: none)
//   5 conv_state  read_write  f32 (slots, kernel - 1, channels): the last kernel - 1 inputs
//   6 y           read_write  f32 (tokens, channels)
// Workgroup: 64 invocations, one channel of one sequence each. An invocation keeps its window
// in registers and walks its sequence's rows in order, so a chunk continued from the slot
// gives the same bits as one pass, and a sequence's rows do not depend on its batch.
// Grid: (ceil(channels / 64), num_seqs, 1).

struct Params {
    channels: u32,
    kernel: u32,
    x_stride: u32,
    x_offset: u32,
    gated: u32,
}

const WG: u32 = 64u;
// The longest kernel the window holds (Mamba2 models use 4).
const MAX_KERNEL: u32 = 8u;
// Columns of the seqs table, and its "no slot" entry.
const SEQ_COLS: u32 = 6u;
const NO_SLOT: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read> seqs: array<u32>;
@group(0) @binding(5) var<storage, read_write> conv_state: array<f32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= params.channels) {
        return;
    }
    let s = gid.y;
    let first_row = seqs[SEQ_COLS * s];
    let num_rows = seqs[SEQ_COLS * s + 1u];
    let slot = seqs[SEQ_COLS * s + 2u];
    let fresh = seqs[SEQ_COLS * s + 3u] == 0u;
    let read_slot = seqs[SEQ_COLS * s + 4u];
    let save_slot = seqs[SEQ_COLS * s + 5u];
    let k1 = params.kernel - 1u;
    let slot_len = k1 * params.channels;

    // window[j] = u[t - k1 + j] for the next row t.
    var window: array<f32, MAX_KERNEL>;
    for (var j = 0u; j < k1; j++) {
        window[j] = select(conv_state[read_slot * slot_len + j * params.channels + c], 0.0, fresh);
    }
    for (var t = 0u; t < num_rows; t++) {
        let row = first_row + t;
        let at = row * params.x_stride + params.x_offset + c;
        var u = x[at];
        if (params.gated != 0u) {
            u *= x[at + 2u * params.channels];
        }
        var acc = bias[c];
        for (var j = 0u; j < k1; j++) {
            acc += weight[c * params.kernel + j] * window[j];
        }
        acc += weight[c * params.kernel + k1] * u;
        if (params.gated != 0u) {
            y[row * params.channels + c] = x[at + params.channels] * acc;
        } else {
            y[row * params.channels + c] = acc / (1.0 + exp(-acc));
        }
        for (var j = 0u; j + 1u < k1; j++) {
            window[j] = window[j + 1u];
        }
        window[k1 - 1u] = u;
    }
    for (var j = 0u; j < k1; j++) {
        conv_state[slot * slot_len + j * params.channels + c] = window[j];
        if (save_slot != NO_SLOT) {
            conv_state[save_slot * slot_len + j * params.channels + c] = window[j];
        }
    }
}
