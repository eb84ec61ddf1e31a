//! Kernel tests: every GPU kernel (and every weight format) against the plain CPU references in
//! `weft::cpu`, plus batch invariance, tensor splitting and WGSL validation.
//!
//! GPU tests run on whatever adapter wgpu picks (lavapipe in CI). With no adapter they print a
//! notice and pass, unless `WEFT_REQUIRE_GPU=1` (set by `cargo xtask test`), where they fail.

mod altup;
mod common;
mod delta_net;
mod elementwise;
mod embedding;
mod invariance;
mod logit_bias;
mod lora;
mod matmul;
mod moe;
mod paged;
mod recording;
mod reduce;
mod rope;
mod sample;
mod spec_sample;
mod split;
mod ssm;
mod token_mask;
mod wgsl;
