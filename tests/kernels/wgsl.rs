//! Static checks of the shaders, no GPU needed: every variant parses and validates with naga for
//! the portable baseline (no f16, no subgroups, <= 256 invocations, <= 16 KiB workgroup memory,
//! <= 8 storage buffers; the subgroup family's own kernels may add subgroup arithmetic and
//! nothing else), every params struct matches its Rust mirror, every file is embedded and
//! starts with the header the style card asks for.

use naga::valid::{Capabilities, ValidationFlags, Validator};

fn parse(variant: weft::gpu::ShaderVariant) -> naga::Module {
    let source = weft::gpu::compose_shader(variant).unwrap();
    naga::front::wgsl::parse_str(&source).unwrap_or_else(|e| panic!("{variant}: {}", e.emit_to_string(&source)))
}

#[test]
fn every_shader_validates_for_the_baseline_profile() {
    let variants = weft::gpu::shader_variants();
    assert!(variants.len() >= 18, "expected every kernel and weight variant, got {}", variants.len());
    for variant in variants {
        let module = parse(variant);
        // unpack2x16float is core WGSL; naga lists it as a capability only because some old
        // GL/D3D targets lack it. Nothing else (no f16 type, no subgroups) is allowed, except
        // subgroup arithmetic in the kernels only the subgroup family dispatches.
        let subgroup = weft::gpu::SUBGROUP_KERNELS.contains(&variant.kernel);
        let mut caps = Capabilities::SHADER_FLOAT16_IN_FLOAT32;
        if subgroup {
            caps |= Capabilities::SUBGROUP;
        }
        let mut validator = Validator::new(ValidationFlags::all(), caps);
        if subgroup {
            use naga::valid::{ShaderStages, SubgroupOperationSet};
            validator
                .subgroup_stages(ShaderStages::COMPUTE)
                .subgroup_operations(SubgroupOperationSet::BASIC | SubgroupOperationSet::ARITHMETIC);
        }
        validator.validate(&module).unwrap_or_else(|e| panic!("{variant} fails baseline validation: {e:?}"));
        let [entry] = &module.entry_points[..] else { panic!("{variant}: expected one entry point") };
        let invocations: u32 = entry.workgroup_size.iter().product();
        assert!(invocations <= 256, "{variant}: {invocations} invocations per workgroup");

        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).unwrap();
        let shared: u32 = module
            .global_variables
            .iter()
            .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
            .map(|(_, g)| layouter[g.ty].size)
            .sum();
        assert!(shared <= 16 * 1024, "{variant}: {shared} bytes of workgroup memory");
        let storage = module
            .global_variables
            .iter()
            .filter(|(_, g)| matches!(g.space, naga::AddressSpace::Storage { .. }))
            .count();
        assert!(storage <= 8, "{variant}: {storage} storage buffers");
    }
}

#[test]
fn wgsl_params_match_rust() {
    for (kernel, wgsl_name, size, fields) in weft::gpu::kernels::params_layouts() {
        let variant = weft::gpu::shader_variants().into_iter().find(|v| v.kernel == kernel).unwrap();
        let module = parse(variant);
        let (handle, ty) = module
            .types
            .iter()
            .find(|(_, t)| t.name.as_deref() == Some(wgsl_name))
            .unwrap_or_else(|| panic!("{kernel}: no struct {wgsl_name}"));
        let naga::TypeInner::Struct { members, span } = &ty.inner else { panic!("{kernel}: not a struct") };
        let wgsl: Vec<(&str, usize)> =
            members.iter().map(|m| (m.name.as_deref().unwrap(), m.offset as usize)).collect();
        assert_eq!(wgsl, fields, "{kernel}: field names and offsets");
        assert_eq!(*span as usize, size, "{kernel}: size of {wgsl_name} ({handle:?})");
    }
}

#[test]
fn every_shader_file_is_embedded_and_has_a_header() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/shaders");
    let mut on_disk = Vec::new();
    for dir in ["", "formats/", "shared/"] {
        for entry in std::fs::read_dir(format!("{root}/{dir}")).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".wgsl") {
                on_disk.push(format!("{dir}{name}"));
            }
        }
    }
    on_disk.sort();
    let mut embedded: Vec<String> = weft::gpu::embedded_shader_files().map(String::from).collect();
    embedded.sort();
    assert_eq!(on_disk, embedded, "shaders/ and the embedded list in gpu/pipelines.rs differ");

    for file in on_disk {
        let text = std::fs::read_to_string(format!("{root}/{file}")).unwrap();
        assert!(
            text.starts_with("// SPDX-License-Identifier: Apache-2.0\n// "),
            "{file}: SPDX line, then a purpose line"
        );
        if !file.contains('/') {
            for section in ["Bindings", "Workgroup", "Grid"] {
                assert!(text.contains(&format!("// {section}")), "{file}: header lacks a {section} line");
            }
        }
    }
}

/// A `var` declared inside a nested block (a loop body, a branch) must be initialized where it is
/// declared. naga writes every local at the top of its function when it emits WGSL — what
/// browsers compile — so a bare `var x: T;` in a loop body is zeroed once there, not on every
/// iteration as the source says (matmul's per-block sums were wrong in Chromium this way).
/// Function bodies are indented 4 spaces, so a deeper `var` is a nested one.
#[test]
fn nested_vars_are_initialized() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/shaders");
    for file in weft::gpu::embedded_shader_files() {
        let text = std::fs::read_to_string(format!("{root}/{file}")).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let indent = code.len() - code.trim_start().len();
            if indent > 4 && code.trim_start().starts_with("var ") && !code.contains('=') {
                panic!("{file}:{}: `{}` is declared without an initializer inside a block", n + 1, code.trim());
            }
        }
    }
}

// One test per family, so that nextest compiles the three families' shaders side by side
// (together they took lavapipe nearly two minutes in one test, the suite's longest).
#[test]
fn every_baseline_shader_compiles_on_the_device() {
    every_shader_of_the_family_compiles(weft::gpu::KernelFamily::Baseline);
}

#[test]
fn every_cpu_family_shader_compiles_on_the_device() {
    every_shader_of_the_family_compiles(weft::gpu::KernelFamily::Cpu);
}

#[test]
fn every_subgroup_shader_compiles_on_the_device() {
    every_shader_of_the_family_compiles(weft::gpu::KernelFamily::Subgroup);
}

fn every_shader_of_the_family_compiles(family: weft::gpu::KernelFamily) {
    use weft::gpu::KernelFamily;
    let Some(f) = crate::common::gpu_with_family(family) else { return };
    // On the device every variant compiles but, outside `cargo xtask test --full`, the CPU
    // family's matmul tiles of other than 16 weight rows a lane only for two formats (one of
    // 32-element blocks, one of super-blocks): tiles differ only in unrolled counts, and
    // check_shaders has the device validate every variant's text. All of them take
    // lavapipe minutes.
    let full = std::env::var("WEFT_FULL").as_deref() == Ok("1");
    let sampled = |v: &weft::gpu::ShaderVariant| {
        let rows_per_lane = usize::from(v.tile[1]) * v.epilogue.rows_per_output();
        let formats = [weft::quant::DType::Q4_1, weft::quant::DType::Q4_K];
        full || v.kernel != "matmul" || rows_per_lane == 16 || v.weight.is_some_and(|w| formats.contains(&w))
    };
    let n = weft::rt::block_on(f.context().compile_shaders(sampled)).unwrap();
    let all = f.context().own_shader_variants().len();
    assert_eq!(n == all, full || family != KernelFamily::Cpu, "{n} of {all} variants compiled");
    assert_eq!(weft::rt::block_on(f.context().check_shaders(&weft::quant::DType::WEIGHTS)).unwrap(), all);
    // A model's formats only: every kernel without weights, and the F32 and Q8_0 variants.
    let formats = [weft::quant::DType::F32, weft::quant::DType::Q8_0];
    let of_formats = |v: &weft::gpu::ShaderVariant| v.weight.is_none_or(|w| formats.contains(&w)) && sampled(v);
    let some = weft::rt::block_on(f.context().compile_shaders(of_formats)).unwrap();
    let own = f.context().own_shader_variants();
    assert_eq!(some, own.iter().filter(|v| of_formats(v)).count());
    assert!(some < all / 2, "{some} of {all} variants compiled for two formats");
}

/// Every variant is some family's own, so the tests above compile it.
#[test]
fn every_shader_variant_belongs_to_a_family() {
    use weft::gpu::KernelFamily;
    let mut owned = std::collections::HashSet::new();
    let mut cpu_lanes = 0;
    for family in [KernelFamily::Baseline, KernelFamily::Cpu, KernelFamily::Subgroup] {
        let Some(f) = crate::common::gpu_with_family(family) else { return };
        if family == KernelFamily::Cpu {
            cpu_lanes = f.context().cpu_lanes();
        }
        owned.extend(f.context().own_shader_variants());
    }
    // The CPU family's matmuls come in the width of the driver's vectors (8 lanes, or 16 with
    // lavapipe's 512-bit ones); `cargo xtask test` runs these tests at both widths, so each run
    // compiles every variant but the other width's matmuls.
    let missing: Vec<_> = weft::gpu::shader_variants().into_iter().filter(|v| !owned.contains(v)).collect();
    let other_width = |v: &weft::gpu::ShaderVariant| {
        (v.kernel == "matmul" || v.kernel == "moe_matmul_grouped") && v.tile[0] != cpu_lanes
    };
    assert!(missing.iter().all(other_width), "some variant belongs to no family: {missing:?}");
}

#[test]
fn binding_declarations_are_read_as_naga_reads_them() {
    use weft::gpu::BindingKind;
    for variant in weft::gpu::shader_variants() {
        let source = weft::gpu::compose_shader(variant).unwrap();
        let kinds = weft::gpu::binding_kinds(&source).unwrap();
        let module = parse(variant);
        let mut from_naga: Vec<(u32, BindingKind)> = module
            .global_variables
            .iter()
            .filter_map(|(_, g)| {
                let binding = g.binding.as_ref()?;
                assert_eq!(binding.group, 0, "{variant}");
                let kind = match (g.space, &module.types[g.ty].inner) {
                    (naga::AddressSpace::Uniform, _) => BindingKind::Uniform,
                    (naga::AddressSpace::Storage { access }, _) if access.contains(naga::StorageAccess::STORE) => {
                        BindingKind::StorageReadWrite
                    }
                    (naga::AddressSpace::Storage { .. }, _) => BindingKind::StorageRead,
                    (naga::AddressSpace::Handle, naga::TypeInner::Image { class, .. }) => {
                        let naga::ImageClass::Storage { format, access } = class else {
                            panic!("{variant}: unexpected image {class:?}")
                        };
                        let format = match format {
                            naga::StorageFormat::Rgba32Uint => wgpu::TextureFormat::Rgba32Uint,
                            naga::StorageFormat::Rgba32Float => wgpu::TextureFormat::Rgba32Float,
                            naga::StorageFormat::Rgba16Float => wgpu::TextureFormat::Rgba16Float,
                            other => panic!("{variant}: unexpected texel format {other:?}"),
                        };
                        let access = match *access {
                            naga::StorageAccess::LOAD => wgpu::StorageTextureAccess::ReadOnly,
                            naga::StorageAccess::STORE => wgpu::StorageTextureAccess::WriteOnly,
                            other => panic!("{variant}: unexpected texture access {other:?}"),
                        };
                        BindingKind::StorageTexture { format, access }
                    }
                    other => panic!("{variant}: unexpected binding {other:?}"),
                };
                Some((binding.binding, kind))
            })
            .collect();
        from_naga.sort_by_key(|(b, _)| *b);
        let from_naga: Vec<BindingKind> = from_naga.into_iter().map(|(_, k)| k).collect();
        assert_eq!(kinds, from_naga, "{variant}");
    }
}

/// The subgroup family forced where subgroups are not offered (here: the device opened with
/// core WebGPU features only) is refused with what to use instead; `open_or_skip` skips it.
#[test]
fn a_forced_subgroup_family_without_subgroups_is_refused() {
    use weft::gpu::{GpuContext, GpuOptions, KernelFamily};
    if crate::common::gpu().is_none() {
        return;
    }
    let options = GpuOptions { kernels: Some(KernelFamily::Subgroup), baseline_only: true, ..Default::default() };
    let err = weft::rt::block_on(GpuContext::new(options.clone())).err().unwrap().to_string();
    assert!(err.contains("the subgroup kernels need subgroups of at least 8 lanes"), "{err}");
    assert!(err.contains("use WEFT_KERNELS=baseline"), "{err}");
    assert!(weft::gpu::open_or_skip(options).unwrap().is_none());
}
