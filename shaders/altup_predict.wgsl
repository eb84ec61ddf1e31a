// SPDX-License-Identifier: Apache-2.0
// altup_predict: Gemma 3n's AltUp prediction of every stream from all of them,
// out[j][t, h] = Σ_k c_t[j, k] · s[k][t, h] + s[j][t, h], where token t's coefficients are
// c_t[j, k] = Σ_m coefs[j · n + k, m] · modal[t, m] (transformers' prediction_coefs of the
// router's tanh outputs, reshaped (n, n) and applied as a matrix on the streams).
//
// Bindings (group 0)
//   0 params   uniform     Params   mirrors gpu::kernels::altup::PredictParams
//   1 streams  read        f32 (n, stream_rows, hidden): stream j's token t is row j · stream_rows + t
//   2 modal    read        f32 (tokens, n)
//   3 coefs    read        f32 (n · n, n)
//   4 out      read_write  f32 (n, stream_rows, hidden), laid out as streams
// Workgroup: 256 invocations, one (token, column) each, over all n (at most 8) streams. Each
// invocation forms its token's n · n coefficients itself (n³ products, 64 for Gemma 3n's 4
// streams): cheaper than a dispatch and a buffer for them.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(tokens · hidden / 256).

struct Params {
    tokens: u32,
    hidden: u32,
    stream_rows: u32,
    n: u32,
}

const WG: u32 = 256u;
const MAX_STREAMS: u32 = 8u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> streams: array<f32>;
@group(0) @binding(2) var<storage, read> modal: array<f32>;
@group(0) @binding(3) var<storage, read> coefs: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.tokens * params.hidden) {
        return;
    }
    let n = params.n;
    let t = i / params.hidden;
    let stride = params.stream_rows * params.hidden;
    var s = array<f32, MAX_STREAMS>();
    for (var k = 0u; k < n; k++) {
        s[k] = streams[k * stride + i];
    }
    for (var j = 0u; j < n; j++) {
        var acc = 0.0;
        for (var k = 0u; k < n; k++) {
            var c = 0.0;
            for (var m = 0u; m < n; m++) {
                c += coefs[(j * n + k) * n + m] * modal[t * n + m];
            }
            acc += c * s[k];
        }
        out[j * stride + i] = acc + s[j];
    }
}
