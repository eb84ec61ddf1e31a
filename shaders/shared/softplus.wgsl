// SPDX-License-Identifier: Apache-2.0
// softplus as torch computes it (linear above 20), shared by the two scans so that a step's dt
// is the same bits in both.
fn softplus(v: f32) -> f32 {
    return select(log(1.0 + exp(v)), v, v > 20.0);
}
