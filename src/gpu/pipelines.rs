//! WGSL sources, their `#include` composition, and the cache of compiled compute pipelines.
//!
//! Kernels live in `shaders/*.wgsl`. A line `#include shared/NAME.wgsl` pastes a shared file
//! (includes nest); the line `#include weight_format` pastes `shaders/formats/<dtype>.wgsl`, which gives the kernel a
//! `w_block` decoder for one weight format. That is how one matmul source serves every format
//! instead of five copies. Bind-group layouts are derived from the WGSL by wgpu (`layout: None`),
//! never written by hand.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::{Result, WeftError};
use crate::quant::DType;

/// Every WGSL file, embedded so the library works in a browser without fetching them.
const SOURCES: &[(&str, &str)] = &[
    ("add.wgsl", include_str!("../../shaders/add.wgsl")),
    ("argmax.wgsl", include_str!("../../shaders/argmax.wgsl")),
    ("embedding.wgsl", include_str!("../../shaders/embedding.wgsl")),
    ("kv_write.wgsl", include_str!("../../shaders/kv_write.wgsl")),
    ("matmul.wgsl", include_str!("../../shaders/matmul.wgsl")),
    ("penalize.wgsl", include_str!("../../shaders/penalize.wgsl")),
    ("paged_attention.wgsl", include_str!("../../shaders/paged_attention.wgsl")),
    ("rms_norm.wgsl", include_str!("../../shaders/rms_norm.wgsl")),
    ("rope.wgsl", include_str!("../../shaders/rope.wgsl")),
    ("sample.wgsl", include_str!("../../shaders/sample.wgsl")),
    ("silu_mul.wgsl", include_str!("../../shaders/silu_mul.wgsl")),
    ("softmax.wgsl", include_str!("../../shaders/softmax.wgsl")),
    ("token_mask.wgsl", include_str!("../../shaders/token_mask.wgsl")),
    ("formats/f16.wgsl", include_str!("../../shaders/formats/f16.wgsl")),
    ("formats/f32.wgsl", include_str!("../../shaders/formats/f32.wgsl")),
    ("formats/q4_0.wgsl", include_str!("../../shaders/formats/q4_0.wgsl")),
    ("formats/q4_1.wgsl", include_str!("../../shaders/formats/q4_1.wgsl")),
    ("formats/q8_0.wgsl", include_str!("../../shaders/formats/q8_0.wgsl")),
    ("shared/float_weights.wgsl", include_str!("../../shaders/shared/float_weights.wgsl")),
    ("shared/weight_bytes.wgsl", include_str!("../../shaders/shared/weight_bytes.wgsl")),
];

/// Kernels that are compiled once per weight format.
const WEIGHT_KERNELS: &[&str] = &["matmul", "embedding"];

/// Every file under `shaders/` the library embeds (a tidy test checks none is missing).
pub fn embedded_shader_files() -> impl Iterator<Item = &'static str> {
    SOURCES.iter().map(|(path, _)| *path)
}

/// One compilable shader: a kernel, and for weight kernels the weight format it decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShaderVariant {
    pub kernel: &'static str,
    pub weight: Option<DType>,
}

impl std::fmt::Display for ShaderVariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.weight {
            Some(dtype) => write!(f, "{}[{dtype}]", self.kernel),
            None => f.write_str(self.kernel),
        }
    }
}

/// Every shader variant the library can compile.
pub fn shader_variants() -> Vec<ShaderVariant> {
    SOURCES
        .iter()
        .filter_map(|(path, _)| path.strip_suffix(".wgsl").filter(|p| !p.contains('/')))
        .flat_map(|kernel| {
            if WEIGHT_KERNELS.contains(&kernel) {
                DType::WEIGHTS.iter().map(|&d| ShaderVariant { kernel, weight: Some(d) }).collect()
            } else {
                vec![ShaderVariant { kernel, weight: None }]
            }
        })
        .collect()
}

fn source(path: &str) -> Result<&'static str> {
    SOURCES
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, s)| *s)
        .ok_or_else(|| WeftError::Unsupported(format!("no shader file {path}")))
}

/// The full WGSL text of a variant, with its includes resolved.
pub fn compose_shader(variant: ShaderVariant) -> Result<String> {
    let mut out = String::new();
    expand(&format!("{}.wgsl", variant.kernel), variant, &mut out)?;
    Ok(out)
}

fn expand(path: &str, variant: ShaderVariant, out: &mut String) -> Result<()> {
    for line in source(path)?.lines() {
        match line.strip_prefix("#include ") {
            Some("weight_format") => {
                let dtype = variant.weight.ok_or_else(|| {
                    WeftError::Unsupported(format!("kernel {} needs a weight format", variant.kernel))
                })?;
                expand(&format!("formats/{}.wgsl", dtype.name().to_lowercase()), variant, out)?;
            }
            Some(included) => expand(included.trim(), variant, out)?,
            None => out.push_str(line),
        }
        out.push('\n');
    }
    Ok(())
}

/// Compiled pipelines, built on first use and kept for the life of the device.
#[derive(Default)]
pub(crate) struct PipelineCache {
    pipelines: Mutex<HashMap<ShaderVariant, wgpu::ComputePipeline>>,
}

impl PipelineCache {
    pub(crate) fn get(&self, device: &wgpu::Device, variant: ShaderVariant) -> Result<wgpu::ComputePipeline> {
        let mut pipelines = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pipelines.get(&variant) {
            return Ok(p.clone());
        }
        let label = variant.to_string();
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(compose_shader(variant)?.into()),
        };
        // Bounds checks stay on. The one check turned off is the iteration counter wgpu adds to
        // every loop against infinite loops: it hides constant trip counts from the driver,
        // which then cannot unroll the decode loops (on lavapipe the matmul ran 2x slower).
        // Every loop in shaders/ counts towards a bound taken from a shape that the dispatch
        // functions validated, far below u32::MAX, so each one terminates.
        let mut checks = wgpu::ShaderRuntimeChecks::checked();
        checks.force_loop_bounding = false;
        // SAFETY: see above; the shaders are ours and contain no unbounded loop.
        let module = unsafe { device.create_shader_module_trusted(desc, checks) };
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        pipelines.insert(variant, pipeline.clone());
        Ok(pipeline)
    }
}
