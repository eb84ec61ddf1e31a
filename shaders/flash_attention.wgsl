// SPDX-License-Identifier: Apache-2.0
// flash_attention: the GPU families' paged attention (baseline and subgroup; the CPU family
// keeps paged_attention.wgsl). The same contract as paged_attention: token t of sequence s
// attends to positions [first, p] of s, p from token_info (causal or bidirectional), first = 0
// or p + 1 - window; optional sink logits (gpt-oss); split-K by shared/attention_splits.wgsl,
// joined by attention_merge into the same `partials` layout. What differs is the work's shape:
// a workgroup takes params.rows (at most R) query rows that share one KV head (the GQA group's
// heads of consecutive tokens: row i of the dispatch is token i / G, head kv_head · G + i % G;
// a decode step takes G rows, one token, a workgroup) and walks keys in
// tiles of TK positions staged in workgroup memory, so every K and V read serves all R rows;
// the queries sit in workgroup memory too, and no invocation holds a whole head.
//
// Bit invariance (batch and chunk): tiles are fixed by absolute position (tile k holds
// positions k·TK .. k·TK + TK - 1), and each row folds only its own positions of each tile, in
// order, with one online-softmax step per tile:
//   s_j = fold(q·scale, k_j)  (vec4 fma chain over the head, then (x + y) + (z + w))
//   m' = max(m, max_j s_j),  c = exp(m - m'),  p_j = exp(s_j - m')
//   l' = l·c + (Σ_j p_j in order),  o' = o·c + (Σ_j p_j·v_j in order, fma chain)
// Each of those values is computed whole by one invocation, whichever it is: a row's bits depend
// on its own positions and TK only, not on R, on its neighbours in the workgroup or dispatch,
// or on decode versus prefill. Rows of different sequences in one workgroup take turns (runs
// of consecutive rows of one sequence share each tile); a row's range is cut by its split.
//
// Bindings (group 0)
//   0 params        uniform     Params                  mirrors gpu::kernels::paged::AttentionParams
//   1 x (queries)   storage     vec4 (tokens, q_stride / 4): head h at vec4 h·HV ..
//   2 k_cache       kv_read     vec4 (num_slots, num_kv_heads, HV) from cache_offset (f32 or f16)
//   3 v_cache       kv_read     likewise
//   4 block_tables  read        u32 (num_seqs, max_blocks_per_seq)  physical block of each block
//   5 token_info    read        u32 (num_tokens, 2)     (sequence index, last position seen)
//   6 out           read_write  vec4 (num_tokens, num_heads · HV)
//   7 partials      read_write  vec4 (num_tokens, num_heads, SPLITS, 1 + HV): per split
//                               (max, sum, 0, 0) then the unnormalised weighted V sum; unused
//                               when split_min is 0
//   8 sinks         read        f32 (num_heads)  each head's sink logit; unused when has_sinks is 0
// Workgroup: WG invocations, R rows, TK keys a tile (gpu::flash_tile: R·HD + TK·(HD + 4) +
// R·TK floats and a few words per row of workgroup memory, within WebGPU's 16 KiB).
// Per tile: the K tile is loaded (invocation i takes vec4s i, i + WG, …), the R·TK scores are
// shared out the same way, invocation r < R takes row r's softmax step while all load the V
// tile over the K tile, and each invocation folds the output vec4s lid, lid + WG, … of the
// R·HV it owns (in registers across tiles).
// Grid: (ceil(num_tokens · G / params.rows), num_kv_heads, 1), or SPLITS deep when splitting.

#include kv_read
#include x_source
#include shared/attention_splits.wgsl
#include shared/attention_params.wgsl

@group(0) @binding(7) var<storage, read_write> partials: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read> sinks: array<f32>;

const WG: u32 = {{WG}}u;
const TK: u32 = {{TN}}u; // keys a tile
const R: u32 = {{TM}}u; // the most query rows a workgroup takes (params.rows of them)
const HD: u32 = {{HD}}u;
const HV: u32 = HD / 4u;
const KS: u32 = HV + 1u; // a staged key's stride in vec4s: consecutive keys start in different banks
const E: u32 = (R * HV + WG - 1u) / WG; // output vec4s an invocation owns
const NO_SEQ: u32 = 0xffffffffu;

var<workgroup> sh_q: array<vec4<f32>, R * HV>; // the rows' queries, times scale
var<workgroup> sh_kv: array<vec4<f32>, TK * KS>; // the tile's K, then its V
var<workgroup> sh_p: array<f32, R * TK>; // scores, then weights
var<workgroup> sh_seq: array<u32, R>; // the row's sequence (NO_SEQ past the dispatch's rows)
var<workgroup> sh_start: array<u32, R>; // the row's positions in this split: [start, stop)
var<workgroup> sh_stop: array<u32, R>;
var<workgroup> sh_splits: array<u32, R>;
var<workgroup> sh_max: array<f32, R>; // running max, then (finished) the sink's rescale
var<workgroup> sh_sum: array<f32, R>;
var<workgroup> sh_corr: array<f32, R>; // this tile's rescale of the row's output
var<workgroup> sh_run: vec3<u32>; // the current run of rows: end row, first and end position

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let group = params.num_heads / params.num_kv_heads;
    let kv_head = wid.y;
    let split = wid.z;
    let num_rows = params.num_tokens * group;
    let rows = params.rows;
    let row0 = wid.x * rows;
    if (lid < rows) {
        var seq = NO_SEQ;
        var start = 0u;
        var stop = 0u;
        var splits = 0u;
        if (row0 + lid < num_rows) {
            let t = (row0 + lid) / group;
            seq = token_info[2u * t];
            let pos = token_info[2u * t + 1u];
            let first = first_position(pos, params.window);
            let parts = split_layout(pos + 1u - first, params.split_min);
            splits = parts.y;
            if (split < parts.y) {
                start = first + split * parts.x;
                stop = min(pos + 1u, start + parts.x);
            }
        }
        sh_seq[lid] = seq;
        sh_start[lid] = start;
        sh_stop[lid] = stop;
        sh_splits[lid] = splits;
        sh_max[lid] = NEG_MAX;
        sh_sum[lid] = 0.0;
    }
    for (var i = lid; i < rows * HV; i += WG) {
        let row = row0 + i / HV;
        var q = vec4<f32>(0.0);
        if (row < num_rows) {
            let head = kv_head * group + row % group;
            q = xload((row / group) * (params.q_stride / 4u) + head * HV + i % HV) * params.scale;
        }
        sh_q[i] = q;
    }
    var acc: array<vec4<f32>, E>;
    let kv_stride = params.num_kv_heads * HV;
    var run0 = 0u;
    loop {
        if (run0 >= rows) {
            break;
        }
        workgroupBarrier();
        // The run of rows of one sequence from run0, and the positions any of them sees here.
        if (lid == 0u) {
            let seq = sh_seq[run0];
            var end = run0;
            var lo = NO_SEQ;
            var hi = 0u;
            while (end < rows && sh_seq[end] == seq) {
                if (sh_start[end] < sh_stop[end]) {
                    lo = min(lo, sh_start[end]);
                    hi = max(hi, sh_stop[end]);
                }
                end++;
            }
            sh_run = vec3<u32>(end, lo, hi);
        }
        let run = workgroupUniformLoad(&sh_run);
        let run1 = run.x;
        let lo = run.y;
        let hi = run.z;
        let seq = sh_seq[run0];
        let table = seq * params.max_blocks_per_seq;
        for (var tile = lo / TK; lo < hi && tile * TK < hi; tile++) {
            let p0 = tile * TK;
            load_tile(true, table, kv_head, kv_stride, p0, lo, hi, lid);
            workgroupBarrier();
            for (var i = lid; i < rows * TK; i += WG) {
                let r = i / TK;
                let p = p0 + i % TK;
                if (r >= run0 && r < run1 && p >= sh_start[r] && p < sh_stop[r]) {
                    let q = r * HV;
                    let k = (i % TK) * KS;
                    var s4 = vec4<f32>(0.0);
#for d in 0..HV
                    s4 = fma(sh_q[q + {{d}}u], sh_kv[k + {{d}}u], s4);
#end
                    sh_p[i] = (s4.x + s4.y) + (s4.z + s4.w);
                }
            }
            workgroupBarrier();
            load_tile(false, table, kv_head, kv_stride, p0, lo, hi, lid);
            if (lid >= run0 && lid < run1) {
                softmax_step(lid, p0);
            }
            workgroupBarrier();
            for (var e = 0u; e < E; e++) {
                let i = lid + e * WG;
                let r = i / HV;
                if (i < rows * HV && r >= run0 && r < run1) {
                    let a = clamp(sh_start[r], p0, p0 + TK) - p0;
                    let b = clamp(sh_stop[r], p0, p0 + TK) - p0;
                    if (a < b) {
                        var o = vec4<f32>(0.0);
                        for (var j = a; j < b; j++) {
                            o = fma(vec4<f32>(sh_p[r * TK + j]), sh_kv[j * KS + i % HV], o);
                        }
                        acc[e] = acc[e] * sh_corr[r] + o;
                    }
                }
            }
            workgroupBarrier();
        }
        run0 = run1;
    }
    finish(row0, rows, group, kv_head, split, lid, acc);
}

// Stage the K (or V) rows of positions p0 .. p0 + TK - 1 of the run's sequence, kv_head, in
// sh_kv; positions outside the run's [lo, hi) are not read (their blocks may not exist).
fn load_tile(keys: bool, table: u32, kv_head: u32, kv_stride: u32, p0: u32, lo: u32, hi: u32, lid: u32) {
    for (var i = lid; i < TK * HV; i += WG) {
        let p = p0 + i / HV;
        var v = vec4<f32>(0.0);
        if (p >= lo && p < hi) {
            let block = block_tables[table + p / params.block_size];
            let slot = block * params.block_size + p % params.block_size;
            let at = params.cache_offset + slot * kv_stride + kv_head * HV + i % HV;
            if (keys) {
                v = kload(at);
            } else {
                v = vload(at);
            }
        }
        sh_kv[(i / HV) * KS + i % HV] = v;
    }
}

// Row r's online-softmax step over its positions of the tile at p0: its scores in sh_p become
// weights, its running max and sum move on, and sh_corr holds its output's rescale (1 where
// the tile holds none of its positions).
fn softmax_step(r: u32, p0: u32) {
    let a = clamp(sh_start[r], p0, p0 + TK) - p0;
    let b = clamp(sh_stop[r], p0, p0 + TK) - p0;
    sh_corr[r] = 1.0;
    if (a >= b) {
        return;
    }
    var tile_max = NEG_MAX;
    for (var j = a; j < b; j++) {
        tile_max = max(tile_max, sh_p[r * TK + j]);
    }
    let m = max(sh_max[r], tile_max);
    let corr = exp(sh_max[r] - m);
    var sum = 0.0;
    for (var j = a; j < b; j++) {
        let w = exp(sh_p[r * TK + j] - m);
        sh_p[r * TK + j] = w;
        sum += w;
    }
    sh_max[r] = m;
    sh_sum[r] = sh_sum[r] * corr + sum;
    sh_corr[r] = corr;
}

// Write each row's output (one split: divided by its sum, with its sink where it has one) or
// its split's partial state for attention_merge.
fn finish(row0: u32, rows: u32, group: u32, kv_head: u32, split: u32, lid: u32, acc: array<vec4<f32>, E>) {
    if (lid < rows && sh_start[lid] < sh_stop[lid]) {
        let row = row0 + lid;
        let head = kv_head * group + row % group;
        let t = row / group;
        var total_sum = sh_sum[lid];
        if (sh_splits[lid] > 1u) {
            partials[((t * params.num_heads + head) * SPLITS + split) * (HV + 1u)] =
                vec4<f32>(sh_max[lid], total_sum, 0.0, 0.0);
        } else if (params.has_sinks == 1u) {
            // The sum and the weighted V sum move to M = max(max, sink); sh_max keeps the factor.
            let sink = sinks[head];
            let m = max(sh_max[lid], sink);
            let sink_scale = exp(sh_max[lid] - m);
            sh_sum[lid] = total_sum * sink_scale + exp(sink - m);
            sh_max[lid] = sink_scale;
        }
    }
    workgroupBarrier();
    for (var e = 0u; e < E; e++) {
        let i = lid + e * WG;
        let r = i / HV;
        if (i < rows * HV && sh_start[r] < sh_stop[r]) {
            let row = row0 + r;
            let head = kv_head * group + row % group;
            let t = row / group;
            let d = i % HV;
            if (sh_splits[r] > 1u) {
                partials[((t * params.num_heads + head) * SPLITS + split) * (HV + 1u) + 1u + d] = acc[e];
            } else if (params.has_sinks == 1u) {
                out[(t * params.num_heads + head) * HV + d] = acc[e] * sh_max[r] / sh_sum[r];
            } else {
                out[(t * params.num_heads + head) * HV + d] = acc[e] / sh_sum[r];
            }
        }
    }
}
