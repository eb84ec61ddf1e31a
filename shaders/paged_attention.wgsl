// SPDX-License-Identifier: Apache-2.0
// paged_attention: the CPU family's grouped-query attention of each query token over its
// sequence's paged KV cache (the GPU families run flash_attention.wgsl). One kernel serves
// decode (one token per sequence) and prefill chunks that start at any position: token t of
// sequence s attends to positions [first, p] of s, where p is the last position token_info
// gives it and first = 0, or p + 1 - window with a sliding window. The mask mode is p: the
// token's own position (causal), or its sequence's last (bidirectional: an encoder's prompt,
// whole in one step; gpu::kernels::paged::AttentionMask). The chunk's own K/V are written
// first (rope_kv_write). A token's whole context is one workgroup's: CPU drivers' threads are
// kept busy by heads and tokens, so split-K (the GPU families') would only add a second pass.
// With params.has_sinks = 1 each head h has a learned sink logit sinks[h] (gpt-oss) that joins
// the softmax's denominator and adds no value: out = Σ_p e^(s_p - M) v_p / (Σ_p e^(s_p - M) +
// e^(sink - M)), M = max(max_p s_p, sink); without sinks those lines are skipped, not
// multiplied by 1.
//
// Bindings (group 0)
//   0 params        uniform     Params                  mirrors gpu::kernels::paged::AttentionParams
//   1 x (queries)   x_source    vec4 (tokens, q_stride / 4): head h at vec4 h·HD/4 ..; a
//                               storage buffer, or (CPU drivers) a 64 KiB uniform window of
//                               whole rows from token q_row0, one dispatch per window
//   2 k_cache       kv_read     vec4 (num_slots, num_kv_heads, HD / 4) from cache_offset
//   3 v_cache       kv_read     likewise (rgba32float or rgba16float textures)
//   4 block_tables  read        u32 (num_seqs, max_blocks_per_seq)  physical block of each block
//   5 token_info    read        u32 (num_tokens, 2)     (sequence index, last position seen) per token
//   6 out           read_write  vec4 (num_tokens, num_heads · HD / 4)
//   7 sinks         read        f32 (num_heads)         each head's sink logit; unused (any
//                                                       buffer) when has_sinks is 0
// HD (the head size) is a compile-time constant and the loops over a head's HV = HD/4 vec4s are
// unrolled when composed (`#for`), so q and the running output are HV vec4 variables: CPU
// drivers lower a private array indexed in a loop to per-lane gathers and scatters.
// QH query heads that share one KV head go through a workgroup together (the largest divisor
// of the group up to 4, or 2 at heads of 512, where that leaves the driver's threads enough
// workgroups, else 1; gpu::attention_query_heads): each K and V vec4 is loaded once for all
// of them, where CPU drivers gather it lane by lane.
// Workgroup: WG = 8 invocations per (QH heads, token). Lane j takes positions first + j,
// first + j + 8, … with one online softmax per head (running max, sum, weighted V); scores are
// vec4 fma chains folded (x + y) + (z + w). Each head's 8 partial states are merged in lane
// order through workgroup memory, one head after another and CH vec4s of the head at a time,
// so a head's result depends only on the token's own keys, and not on QH: batch invariant, the
// same bits at any QH. Workgroup memory: 8 · CH vec4s and 16 words, CH = min(HV, 64): 8 KiB
// at most (a whole head of 512 would fill WebGPU's 16 KiB before the maxima and sums).
// Grid: (num_heads / QH, tokens, 1): the dispatch's tokens from token0 on.

#include kv_read
#include x_source
#include shared/attention_splits.wgsl
#include shared/attention_params.wgsl

const WG: u32 = 8u; // the merges below unroll over its 8 lanes
const HD: u32 = {{HD}}u;
const HV: u32 = HD / 4u;
const QH: u32 = {{QH}}u;
const CH: u32 = min(HV, 64u); // a head's vec4s merged at a time

// Declared here, not in shared/attention_params.wgsl: flash_attention's binding 7 is its
// split-K partials, which this kernel has none of.
@group(0) @binding(7) var<storage, read> sinks: array<f32>;

var<workgroup> sh_max: array<f32, WG>;
var<workgroup> sh_sum: array<f32, WG>;
var<workgroup> sh_acc: array<vec4<f32>, WG * CH>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let head0 = wid.x * QH;
    let t = params.token0 + wid.y;
    let seq = token_info[2u * t];
    let pos = token_info[2u * t + 1u];
    let first = first_position(pos, params.window);
    let kv_head = head0 / (params.num_heads / params.num_kv_heads);
    let kv_stride = params.num_kv_heads * HV;
    let q_base = (t - params.q_row0) * (params.q_stride / 4u) + head0 * HV;
#for h in 0..QH
#for d in 0..HV
    let q_{{h}}_{{d}} = xload(q_base + {{h}}u * HV + {{d}}u) * params.scale;
    var acc_{{h}}_{{d}} = vec4<f32>(0.0);
#end
    var run_max_{{h}} = NEG_MAX;
    var run_sum_{{h}} = 0.0;
#end
    for (var p = first + lid; p <= pos; p += WG) {
        let block = block_tables[seq * params.max_blocks_per_seq + p / params.block_size];
        let slot = block * params.block_size + p % params.block_size;
        let base = params.cache_offset + slot * kv_stride + kv_head * HV;
#for h in 0..QH
        var s4_{{h}} = vec4<f32>(0.0);
#end
#for d in 0..HV
        let k_{{d}} = kload(base + {{d}}u);
#for h in 0..QH
        s4_{{h}} = fma(q_{{h}}_{{d}}, k_{{d}}, s4_{{h}});
#end
#end
#for h in 0..QH
        let score_{{h}} = (s4_{{h}}.x + s4_{{h}}.y) + (s4_{{h}}.z + s4_{{h}}.w);
        let new_max_{{h}} = max(run_max_{{h}}, score_{{h}});
        let correction_{{h}} = exp(run_max_{{h}} - new_max_{{h}});
        let weight_{{h}} = exp(score_{{h}} - new_max_{{h}});
        run_sum_{{h}} = run_sum_{{h}} * correction_{{h}} + weight_{{h}};
        run_max_{{h}} = new_max_{{h}};
#end
#for d in 0..HV
        let v_{{d}} = vload(base + {{d}}u);
#for h in 0..QH
        acc_{{h}}_{{d}} = acc_{{h}}_{{d}} * correction_{{h}} + weight_{{h}} * v_{{d}};
#end
#end
    }
#for h in 0..QH
    sh_max[lid] = run_max_{{h}};
    sh_sum[lid] = run_sum_{{h}};
    for (var c = 0u; c < HV; c += CH) {
#for d in 0..HV
        // d - c wraps past CH for the vec4s before this chunk.
        if ({{d}}u - c < CH) {
            sh_acc[lid * CH + {{d}}u - c] = acc_{{h}}_{{d}};
        }
#end
        workgroupBarrier();
        finish_head(lid, t, head0 + {{h}}u, c);
        workgroupBarrier();
    }
#end
}

// Merge the 8 lanes' states of one head (left in sh_*) in lane order and write vec4s c ..
// c + CH of the head's output.
fn finish_head(lid: u32, t: u32, head: u32, c: u32) {
    var total_max = NEG_MAX;
    for (var j = 0u; j < WG; j++) {
        total_max = max(total_max, sh_max[j]);
    }
    // Each lane's weight in the merge, computed once a chunk (exp is the merge's costly part).
#for j in 0..8
    let scale_{{j}} = exp(sh_max[{{j}}] - total_max);
#end
    var total_sum = 0.0;
#for j in 0..8
    total_sum += sh_sum[{{j}}] * scale_{{j}};
#end
    // The sink: the sum and the weighted V sum move to M = max(total_max, sink).
    var sink_scale = 1.0;
    if (params.has_sinks == 1u) {
        let sink = sinks[head];
        let m = max(total_max, sink);
        sink_scale = exp(total_max - m);
        total_sum = total_sum * sink_scale + exp(sink - m);
    }
    let out_base = (t * params.num_heads + head) * HV + c;
    for (var d = lid; d < CH; d += WG) {
        var o = vec4<f32>(0.0);
#for j in 0..8
        o += sh_acc[{{j}}u * CH + d] * scale_{{j}};
#end
        if (params.has_sinks == 1u) {
            out[out_base + d] = o * sink_scale / total_sum;
        } else {
            out[out_base + d] = o / total_sum;
        }
    }
}
