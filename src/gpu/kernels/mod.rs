//! Typed dispatch functions, one module per kernel family: each checks its operands, fills the
//! kernel's `Params` uniform and pushes [`Dispatch`](super::Dispatch)es onto a recording.
//!
//! Every `Params` struct mirrors the WGSL struct of the same kernel field for field; the
//! `wgsl_params_match_rust` test compares them through naga.

pub mod altup;
pub mod elementwise;
pub mod embedding;
pub mod lora;
pub mod matmul;
pub mod moe;
pub mod paged;
pub mod penalize;
pub mod reduce;
pub mod rope;
pub mod sample;
pub mod spec_sample;
pub mod ssm;
pub mod token_mask;

use crate::error::{Result, WeftError};
use crate::gpu::GpuTensor;
use crate::quant::DType;

/// A `#[repr(C)]` uniform struct shared with a shader; `FIELDS` lists (name, byte offset).
pub trait ShaderParams: bytemuck::Pod {
    const FIELDS: &'static [(&'static str, usize)];
}

macro_rules! shader_params {
    ($(#[$meta:meta])* $name:ident { $($field:ident: $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
        pub struct $name {
            $(pub $field: $ty),*
        }

        impl $crate::gpu::kernels::ShaderParams for $name {
            const FIELDS: &'static [(&'static str, usize)] =
                &[$((stringify!($field), std::mem::offset_of!($name, $field))),*];
        }
    };
}
pub(crate) use shader_params;

/// One params struct as the Rust side lays it out: (kernel file stem, WGSL struct name, size in
/// bytes, (field, offset) pairs).
pub type ParamsLayout = (&'static str, &'static str, usize, &'static [(&'static str, usize)]);

/// The layout of every params struct, for the test that compares them with the WGSL.
pub fn params_layouts() -> Vec<ParamsLayout> {
    fn entry<P: ShaderParams>(kernel: &'static str, wgsl: &'static str) -> ParamsLayout {
        (kernel, wgsl, std::mem::size_of::<P>(), P::FIELDS)
    }
    vec![
        entry::<matmul::Params>("matmul", "Params"),
        entry::<altup::PredictParams>("altup_predict", "Params"),
        entry::<altup::CorrectParams>("altup_correct", "Params"),
        entry::<altup::MagnitudeParams>("magnitude_match", "Params"),
        entry::<altup::TopkParams>("gaussian_topk", "Params"),
        entry::<embedding::Params>("embedding", "Params"),
        entry::<reduce::RmsNormParams>("rms_norm", "Params"),
        entry::<reduce::AddRmsNormParams>("add_rms_norm", "Params"),
        entry::<reduce::RowParams>("softmax", "Params"),
        entry::<reduce::RowParams>("argmax", "Params"),
        entry::<elementwise::GateMulParams>("gate_mul", "Params"),
        entry::<elementwise::ScaleParams>("scale", "Params"),
        entry::<reduce::HeadNormParams>("head_rms_norm", "Params"),
        entry::<elementwise::Params>("add", "Params"),
        entry::<paged::RopeKvParams>("rope_kv_write", "Params"),
        entry::<paged::AttentionParams>("paged_attention", "Params"),
        entry::<paged::AttentionParams>("flash_attention", "Params"),
        entry::<paged::MergeParams>("attention_merge", "Params"),
        entry::<sample::Params>("sample", "Params"),
        entry::<penalize::Params>("penalize", "Params"),
        entry::<spec_sample::Params>("spec_sample", "Params"),
        entry::<token_mask::Params>("token_mask", "Params"),
        entry::<ssm::ConvParams>("ssm_conv", "Params"),
        entry::<ssm::ScanParams>("ssm_scan", "Params"),
        entry::<ssm::SsdParams>("ssd_chunk_dt", "Params"),
        entry::<ssm::SsdParams>("ssd_chunk_cb", "Params"),
        entry::<ssm::SsdParams>("ssd_chunk_state", "Params"),
        entry::<ssm::SsdParams>("ssd_state_pass", "Params"),
        entry::<ssm::SsdParams>("ssd_chunk_scan", "Params"),
        entry::<ssm::GatedNormParams>("gated_rms_norm", "Params"),
        entry::<lora::ShrinkParams>("lora_shrink", "Params"),
        entry::<lora::ExpandParams>("lora_expand", "Params"),
        entry::<moe::RouteParams>("moe_route", "Params"),
        entry::<moe::MatmulParams>("moe_matmul", "Params"),
        entry::<moe::CombineParams>("moe_combine", "Params"),
        entry::<moe::GroupParams>("moe_group", "Params"),
        entry::<moe::MatmulParams>("moe_matmul_grouped", "Params"),
    ]
}

/// Fail unless `t` has dtype `dtype` and, where `shape` gives `Some`, those dimensions.
pub(crate) fn expect(op: &'static str, name: &str, t: &GpuTensor, dtype: DType, shape: &[Option<usize>]) -> Result<()> {
    let dims_ok =
        t.shape().len() == shape.len() && t.shape().iter().zip(shape).all(|(&got, want)| want.is_none_or(|w| w == got));
    if t.dtype() != dtype || !dims_ok {
        let want: Vec<String> = shape.iter().map(|d| d.map_or("_".into(), |d| d.to_string())).collect();
        return Err(WeftError::shape(
            op,
            format!(
                "{name} must be {dtype} of shape [{}], got {} of shape {:?}",
                want.join(", "),
                t.dtype(),
                t.shape()
            ),
        ));
    }
    Ok(())
}

/// `value` as a u32 shader field, or a shape error naming it.
pub(crate) fn u32_of(op: &'static str, name: &str, value: usize) -> Result<u32> {
    u32::try_from(value).map_err(|_| WeftError::shape(op, format!("{name} = {value} does not fit in 32 bits")))
}
