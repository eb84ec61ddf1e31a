// SPDX-License-Identifier: Apache-2.0
// gelu: x[i] = gelu(x[i]) in place, the exact (erf) GELU of BERT's MLP (transformers' "gelu",
// torch's default): gelu(v) = v · (1 + erf(v / √2)) / 2. WGSL has no erf: Abramowitz and
// Stegun's 7.1.26, erf(z) ≈ 1 - (a1 t + … + a5 t⁵) e^(-z²) with t = 1 / (1 + p z) for z ≥ 0
// (odd for z < 0), whose error is at most 1.5e-7, about an f32 rounding of the result.
//
// Bindings (group 0)
//   0 params  uniform     Params    mirrors gpu::kernels::elementwise::GeluParams
//   1 x       read_write  f32 (len)
// Workgroup: 256 invocations, one element each.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(len / 256).

struct Params {
    len: u32,
}

const WG: u32 = 256u;
const FRAC_1_SQRT_2: f32 = 0.7071067811865476;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;

fn erf_approx(z: f32) -> f32 {
    let a = abs(z);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return sign(z) * (1.0 - poly * exp(-a * a));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.len) {
        return;
    }
    let v = x[i];
    x[i] = 0.5 * v * (1.0 + erf_approx(v * FRAC_1_SQRT_2));
}
