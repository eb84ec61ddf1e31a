// SPDX-License-Identifier: Apache-2.0
// altup_correct: Gemma 3n's AltUp correction of every stream's prediction by what the layer made
// of the active one, out[j][t, h] = (1 + Σ_m coefs[j, m] · modal[t, m]) · (activated[t, h] -
// pred[active][t, h]) + pred[j][t, h]; and the corrected active stream times its output scale,
// scaled[t, h] = out[active][t, h] · out_scale[h] (the per-layer branch's input).
//
// Bindings (group 0)
//   0 params     uniform     Params   mirrors gpu::kernels::altup::CorrectParams
//   1 pred       read        f32 (n, stream_rows, hidden): stream j's token t is row j · stream_rows + t
//   2 activated  read        f32 (tokens, hidden)
//   3 modal      read        f32 (tokens, n)
//   4 coefs      read        f32 (n, n)
//   5 out_scale  read        f32 (hidden)
//   6 out        read_write  f32 (n, stream_rows, hidden), laid out as pred
//   7 scaled     read_write  f32 (tokens, hidden)
// Workgroup: 256 invocations, one (token, column) each, over all n streams.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(tokens · hidden / 256).

struct Params {
    tokens: u32,
    hidden: u32,
    stream_rows: u32,
    n: u32,
    active_stream: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> pred: array<f32>;
@group(0) @binding(2) var<storage, read> activated: array<f32>;
@group(0) @binding(3) var<storage, read> modal: array<f32>;
@group(0) @binding(4) var<storage, read> coefs: array<f32>;
@group(0) @binding(5) var<storage, read> out_scale: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
@group(0) @binding(7) var<storage, read_write> scaled: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.tokens * params.hidden) {
        return;
    }
    let n = params.n;
    let t = i / params.hidden;
    let stride = params.stream_rows * params.hidden;
    let innovation = activated[i] - pred[params.active_stream * stride + i];
    for (var j = 0u; j < n; j++) {
        var c = 0.0;
        for (var m = 0u; m < n; m++) {
            c += coefs[j * n + m] * modal[t * n + m];
        }
        let v = innovation * (c + 1.0) + pred[j * stride + i];
        out[j * stride + i] = v;
        if (j == params.active_stream) {
            scaled[i] = v * out_scale[i % params.hidden];
        }
    }
}
