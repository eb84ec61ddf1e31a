//! LoRA adapters as plain data: a PEFT adapter (`adapter_config.json` +
//! `adapter_model.safetensors`) or a llama.cpp GGUF LoRA (`general.type` "adapter", from
//! `convert_lora_to_gguf.py`) read into f32 matrices per layer and projection, checked against
//! the base model's shape ([`LoraShape`]) and the pool's rank limit, with its scale
//! (`lora_alpha / r`, or `lora_alpha / √r` under rsLoRA) worked out once.
//!
//! A projection `y = x·Wᵀ` of a layer the adapter targets becomes `y + scale · (x·Aᵀ)·Bᵀ`, with
//! A (rank, in) and B (out, rank) as peft stores them. The GPU side (`model::lora_pool`) keeps
//! resident adapters in slots; the scheduler (`kv::LoraSlots`) decides which.
//!
//! **Invariant:** an adapter that does not fit its base model is refused when it is read, naming
//! the tensor (or config field) at fault; nothing is refused later.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Result, WeftError};

/// A projection LoRA can target, in the order of [`LoraModule::ALL`] (the pool's index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LoraModule {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl LoraModule {
    pub const ALL: [LoraModule; 7] = [
        LoraModule::Q,
        LoraModule::K,
        LoraModule::V,
        LoraModule::O,
        LoraModule::Gate,
        LoraModule::Up,
        LoraModule::Down,
    ];

    /// The module's name in Hugging Face checkpoints (and peft's `target_modules`).
    pub fn hf_name(self) -> &'static str {
        match self {
            LoraModule::Q => "q_proj",
            LoraModule::K => "k_proj",
            LoraModule::V => "v_proj",
            LoraModule::O => "o_proj",
            LoraModule::Gate => "gate_proj",
            LoraModule::Up => "up_proj",
            LoraModule::Down => "down_proj",
        }
    }
}

/// What one checkpoint tensor pair adapts: a projection, or projections a checkpoint fuses into
/// one matrix (Phi-3's `qkv_proj` and `gate_up_proj`, Granite 4.0-H's `input_linear`). A fused pair has one A over the shared
/// input and B's rows stacked in the group's order, so `B·A·x` splits exactly into each
/// projection's `B_part·A·x`: it is stored as the parts, each with the same A.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Target {
    /// The name in Hugging Face checkpoints (peft's `target_modules`).
    name: &'static str,
    parent: &'static str,
    modules: &'static [LoraModule],
}

const TARGETS: [Target; 11] = [
    Target { name: "q_proj", parent: "self_attn", modules: &[LoraModule::Q] },
    Target { name: "k_proj", parent: "self_attn", modules: &[LoraModule::K] },
    Target { name: "v_proj", parent: "self_attn", modules: &[LoraModule::V] },
    Target { name: "qkv_proj", parent: "self_attn", modules: &[LoraModule::Q, LoraModule::K, LoraModule::V] },
    Target { name: "o_proj", parent: "self_attn", modules: &[LoraModule::O] },
    Target { name: "gate_proj", parent: "mlp", modules: &[LoraModule::Gate] },
    Target { name: "up_proj", parent: "mlp", modules: &[LoraModule::Up] },
    Target { name: "gate_up_proj", parent: "mlp", modules: &[LoraModule::Gate, LoraModule::Up] },
    Target { name: "down_proj", parent: "mlp", modules: &[LoraModule::Down] },
    // Granite 4.0-H's dense MLP: gate and up fused, then down.
    Target { name: "input_linear", parent: "shared_mlp", modules: &[LoraModule::Gate, LoraModule::Up] },
    Target { name: "output_linear", parent: "shared_mlp", modules: &[LoraModule::Down] },
];

impl Target {
    fn by_name(name: &str) -> Option<Target> {
        TARGETS.into_iter().find(|t| t.name == name)
    }

    /// (in, out) of the target's matrix: the parts share their input and stack their outputs.
    fn dims(&self, shape: &LoraShape) -> (usize, usize) {
        (shape.dims(self.modules[0]).0, self.modules.iter().map(|&m| shape.dims(m).1).sum())
    }
}

/// Each projection's (A, B) as read so far.
type Found = BTreeMap<(usize, LoraModule), [Option<Vec<f32>>; 2]>;

/// Store a target's A (`which` 0) or B (1) of `layer` as its parts' (B split by rows of
/// `rank` values). A projection adapted twice (say by `q_proj` and `qkv_proj`) is an error.
fn put(
    found: &mut Found,
    layer: usize,
    target: Target,
    which: usize,
    rank: usize,
    values: Vec<f32>,
    shape: &LoraShape,
) -> std::result::Result<(), String> {
    let mut start = 0;
    for &m in target.modules {
        let part = match which {
            0 => values.clone(),
            _ => {
                let len = shape.dims(m).1 * rank;
                start += len;
                values[start - len..start].to_vec()
            }
        };
        let slot = &mut found.entry((layer, m)).or_default()[which];
        if slot.is_some() {
            return Err(format!(
                "layer {layer} {} is adapted twice (by {} and another tensor)",
                m.hf_name(),
                target.name
            ));
        }
        *slot = Some(part);
    }
    Ok(())
}

/// What an adapter must fit: the base model's layers and each projection's (in, out) width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoraShape {
    pub num_layers: usize,
    /// (in features, out features), indexed like [`LoraModule::ALL`].
    pub dims: [(usize, usize); 7],
}

impl LoraShape {
    /// A Llama-style layer: q (heads · head_dim), k and v (kv heads · head_dim) from hidden, o
    /// back to hidden, gate and up to the MLP width, down back.
    pub fn llama(num_layers: usize, hidden: usize, q_rows: usize, kv_rows: usize, intermediate: usize) -> Self {
        LoraShape {
            num_layers,
            dims: [
                (hidden, q_rows),
                (hidden, kv_rows),
                (hidden, kv_rows),
                (q_rows, hidden),
                (hidden, intermediate),
                (hidden, intermediate),
                (intermediate, hidden),
            ],
        }
    }

    pub fn dims(&self, m: LoraModule) -> (usize, usize) {
        self.dims[m as usize]
    }
}

/// An executor's adapter pool, as the scheduler and the engine see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoraConfig {
    /// Slots: adapters resident at once, hence distinct adapters in one step at most.
    pub max_loras: usize,
    /// The highest rank a slot holds.
    pub max_rank: usize,
    /// What every adapter must fit.
    pub shape: LoraShape,
}

/// One targeted projection's matrices, in f32.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraWeights {
    pub a: Vec<f32>, // (rank, in)
    pub b: Vec<f32>, // (out, rank)
}

/// A LoRA adapter checked against its base model.
#[derive(Debug)]
pub struct LoraAdapter {
    /// Unique in the process: two adapters read from the same files are still two (the prefix
    /// cache and the slots key on it).
    pub id: u64,
    pub name: String,
    pub rank: usize,
    /// `lora_alpha / rank` (`lora_alpha / √rank` with `use_rslora`).
    pub scale: f32,
    /// Per layer, per module (indexed like [`LoraModule::ALL`]); `None` where not targeted.
    pub layers: Vec<[Option<LoraWeights>; 7]>,
    /// B's q and k rows are in llama.cpp's interleaved-RoPE order (a GGUF adapter of a Llama
    /// model, converted as its base was), not Hugging Face's.
    pub qk_interleaved: bool,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The fields of peft's `adapter_config.json` weft reads; others are checked by name below.
#[derive(serde::Deserialize)]
struct PeftConfig {
    #[serde(default)]
    peft_type: Option<String>,
    r: usize,
    lora_alpha: f64,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    bias: Option<String>,
    #[serde(default)]
    rank_pattern: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    alpha_pattern: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    modules_to_save: Option<Vec<String>>,
}

impl LoraAdapter {
    /// Read the adapter at `path`: a GGUF LoRA file, or a PEFT adapter directory.
    pub fn open(name: &str, path: &Path, shape: &LoraShape, max_rank: usize) -> Result<LoraAdapter> {
        if path.is_file() {
            let gguf = crate::model::gguf::GgufFile::open(path)?;
            Self::from_gguf(name, &gguf, shape, max_rank)
                .map_err(|e| WeftError::model(path.display().to_string(), format!("LoRA adapter {name:?}: {e}")))
        } else {
            Self::from_peft_dir(name, path, shape, max_rank)
        }
    }

    /// A llama.cpp LoRA adapter: `blk.N.{attn_q,…,ffn_down}.weight.lora_a` (rank, in) and
    /// `.lora_b` (out, rank), scaled by `adapter.lora.alpha / rank` as llama.cpp scales it.
    pub fn from_gguf(
        name: &str,
        gguf: &crate::model::gguf::GgufFile,
        shape: &LoraShape,
        max_rank: usize,
    ) -> Result<LoraAdapter> {
        let meta = gguf;
        let bad = |detail: String| WeftError::model(gguf.name(), detail);
        if meta.get_str("general.type") != Some("adapter") || meta.get_str("adapter.type") != Some("lora") {
            return Err(bad(format!(
                "not a LoRA adapter (general.type {:?}, adapter.type {:?})",
                meta.get_str("general.type"),
                meta.get_str("adapter.type")
            )));
        }
        let alpha = meta.get_f64("adapter.lora.alpha").ok_or_else(|| bad("adapter.lora.alpha is missing".into()))?;
        // llama.cpp's phi3 keeps gate and up fused in `ffn_up`.
        let fused_up = meta.architecture() == Some("phi3");
        let mut found = Found::new();
        let mut rank = None;
        for info in &gguf.tensors {
            let (layer, target, which) = parse_gguf_name(&info.name, fused_up)
                .ok_or_else(|| bad(format!("tensor {:?} is not a LoRA A or B of a supported projection", info.name)))?;
            if layer >= shape.num_layers {
                return Err(bad(format!(
                    "tensor {:?} is for layer {layer}, but the base model has {} layers",
                    info.name, shape.num_layers
                )));
            }
            let dims = info.shape();
            let r = *rank.get_or_insert(if which == 0 { dims[0] } else { dims.get(1).copied().unwrap_or(0) });
            if r == 0 || r > max_rank {
                return Err(bad(format!("rank {r} is outside 1..={max_rank} (--max-lora-rank)")));
            }
            let (in_dim, out_dim) = target.dims(shape);
            let want = if which == 0 { vec![r, in_dim] } else { vec![out_dim, r] };
            if dims != want {
                return Err(bad(format!(
                    "tensor {:?} has shape {dims:?}; rank {r} over the base model's {} ({in_dim} in, {out_dim} out) \
                     needs {want:?}",
                    info.name, target.name
                )));
            }
            let bytes = gguf.tensor_bytes(info)?;
            let values = crate::quant::dequantize(info.dtype()?, &bytes)?;
            put(&mut found, layer, target, which, r, values, shape).map_err(bad)?;
        }
        let rank = rank.ok_or_else(|| bad("no LoRA tensors".into()))?;
        // llama.cpp's converter permutes an adapter's q and k rows as it permutes its base's,
        // except for granitehybrid, whose adapters keep Hugging Face's order (llama-cpp-python
        // 0.3.36's converter; the lora_granite_hybrid fixture pins it).
        let interleaved = meta
            .architecture()
            .is_some_and(|arch| crate::model::arch::gguf_qk_interleaved(arch) && arch != "granitehybrid");
        Self::assemble(name, rank, (alpha / rank as f64) as f32, shape, found, interleaved, gguf.name())
    }

    /// Read a PEFT adapter directory.
    pub fn from_peft_dir(name: &str, dir: &Path, shape: &LoraShape, max_rank: usize) -> Result<LoraAdapter> {
        let read = |file: &str| {
            let path = dir.join(file);
            std::fs::read(&path).map_err(|e| WeftError::model(path.display().to_string(), e.to_string()))
        };
        let config = read("adapter_config.json")?;
        let tensors = read("adapter_model.safetensors")?;
        let config = std::str::from_utf8(&config)
            .map_err(|e| WeftError::model(dir.join("adapter_config.json").display().to_string(), e.to_string()))?;
        Self::from_peft_bytes(name, config, &tensors, shape, max_rank)
            .map_err(|e| WeftError::model(dir.display().to_string(), format!("LoRA adapter {name:?}: {e}")))
    }

    /// A PEFT adapter from its config's text and its safetensors bytes (the browser's way in).
    pub fn from_peft_bytes(
        name: &str,
        config: &str,
        safetensors: &[u8],
        shape: &LoraShape,
        max_rank: usize,
    ) -> Result<LoraAdapter> {
        let bad = |detail: String| WeftError::model("adapter_config.json", detail);
        let c: PeftConfig = serde_json::from_str(config).map_err(|e| bad(e.to_string()))?;
        if c.peft_type.as_deref().is_some_and(|t| t != "LORA") {
            return Err(bad(format!("peft_type is {:?}; only LORA adapters are supported", c.peft_type)));
        }
        if c.r == 0 || c.r > max_rank {
            return Err(bad(format!("rank r = {} is outside 1..={max_rank} (--max-lora-rank)", c.r)));
        }
        let refused = [
            (c.use_dora, "use_dora (DoRA)"),
            (c.fan_in_fan_out, "fan_in_fan_out"),
            (c.bias.as_deref().is_some_and(|b| b != "none"), "bias other than \"none\""),
            (!c.rank_pattern.is_empty(), "rank_pattern (per-module ranks)"),
            (!c.alpha_pattern.is_empty(), "alpha_pattern (per-module alphas)"),
            (c.modules_to_save.as_ref().is_some_and(|m| !m.is_empty()), "modules_to_save"),
        ];
        if let Some((_, what)) = refused.iter().find(|(on, _)| *on) {
            return Err(bad(format!("{what} is not supported")));
        }
        let scale = if c.use_rslora { c.lora_alpha / (c.r as f64).sqrt() } else { c.lora_alpha / c.r as f64 } as f32;

        let file = |detail: String| WeftError::model("adapter_model.safetensors", detail);
        let st = safetensors::SafeTensors::deserialize(safetensors).map_err(|e| file(e.to_string()))?;
        let mut found = Found::new();
        for (tensor_name, view) in st.tensors() {
            let (layer, target, which) = parse_peft_name(&tensor_name).ok_or_else(|| {
                file(format!("tensor {tensor_name:?} is not a LoRA A or B of a supported projection"))
            })?;
            if layer >= shape.num_layers {
                return Err(file(format!(
                    "tensor {tensor_name:?} is for layer {layer}, but the base model has {} layers",
                    shape.num_layers
                )));
            }
            let (in_dim, out_dim) = target.dims(shape);
            let want = if which == 0 { [c.r, in_dim] } else { [out_dim, c.r] };
            if view.shape() != want {
                return Err(file(format!(
                    "tensor {tensor_name:?} has shape {:?}; rank {} over the base model's {} ({in_dim} in, \
                     {out_dim} out) needs {want:?}",
                    view.shape(),
                    c.r,
                    target.name
                )));
            }
            let values = to_f32(view.dtype(), view.data())
                .ok_or_else(|| file(format!("tensor {tensor_name:?} is {:?}; use F32, F16 or BF16", view.dtype())))?;
            put(&mut found, layer, target, which, c.r, values, shape).map_err(file)?;
        }
        if found.is_empty() {
            return Err(file("no LoRA tensors".into()));
        }
        Self::assemble(name, c.r, scale, shape, found, false, "adapter_model.safetensors")
    }

    /// The adapter from each projection's (A, B), both required.
    fn assemble(
        name: &str,
        rank: usize,
        scale: f32,
        shape: &LoraShape,
        found: Found,
        qk_interleaved: bool,
        file: &str,
    ) -> Result<LoraAdapter> {
        let mut layers: Vec<[Option<LoraWeights>; 7]> = (0..shape.num_layers).map(|_| Default::default()).collect();
        for ((layer, module), [a, b]) in found {
            let missing = |which: &str| {
                WeftError::model(
                    file,
                    format!("layer {layer} {}: LoRA {which} is missing beside its pair", module.hf_name()),
                )
            };
            let (a, b) = (a.ok_or_else(|| missing("A"))?, b.ok_or_else(|| missing("B"))?);
            layers[layer][module as usize] = Some(LoraWeights { a, b });
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Ok(LoraAdapter { id, name: name.to_string(), rank, scale, layers, qk_interleaved })
    }
}

impl LoraAdapter {
    /// An adapter of no layers, for tests of the bookkeeping around adapters.
    pub fn for_tests(name: &str) -> LoraAdapter {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        LoraAdapter { id, name: name.into(), rank: 1, scale: 1.0, layers: vec![], qk_interleaved: false }
    }
}

/// `base_model.model.model.layers.{i}.{self_attn|mlp}.{target}.lora_{A|B}.weight` → (i,
/// target, 0 for A or 1 for B).
fn parse_peft_name(name: &str) -> Option<(usize, Target, usize)> {
    let rest = name.strip_prefix("base_model.model.model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (parent, rest) = rest.split_once('.')?;
    let (target, rest) = rest.split_once('.')?;
    let which = match rest {
        "lora_A.weight" => 0,
        "lora_B.weight" => 1,
        _ => return None,
    };
    let target = Target::by_name(target)?;
    (target.parent == parent).then_some(())?;
    Some((layer.parse().ok()?, target, which))
}

/// `blk.{i}.{attn_q|attn_k|attn_v|attn_qkv|attn_output|ffn_gate|ffn_up|ffn_down}.weight.lora_{a|b}`
/// → (i, target, 0 for A or 1 for B); `ffn_up` is gate and up fused where `fused_up` (phi3).
fn parse_gguf_name(name: &str, fused_up: bool) -> Option<(usize, Target, usize)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (tensor, which) = rest.rsplit_once(".weight.lora_")?;
    let which = match which {
        "a" => 0,
        "b" => 1,
        _ => return None,
    };
    let target = match tensor {
        "attn_q" => "q_proj",
        "attn_k" => "k_proj",
        "attn_v" => "v_proj",
        "attn_qkv" => "qkv_proj",
        "attn_output" => "o_proj",
        "ffn_gate" => "gate_proj",
        "ffn_up" if fused_up => "gate_up_proj",
        "ffn_up" => "up_proj",
        "ffn_down" => "down_proj",
        _ => return None,
    };
    Some((layer.parse().ok()?, Target::by_name(target)?, which))
}

fn to_f32(dtype: safetensors::Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    let halves = || bytes.chunks_exact(2).map(|h| u16::from_le_bytes([h[0], h[1]]));
    Some(match dtype {
        safetensors::Dtype::F32 => {
            bytes.chunks_exact(4).map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect()
        }
        safetensors::Dtype::F16 => halves().map(|h| half::f16::from_bits(h).to_f32()).collect(),
        safetensors::Dtype::BF16 => halves().map(|h| half::bf16::from_bits(h).to_f32()).collect(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peft_names_parse_and_others_do_not() {
        let p = |name| parse_peft_name(name).map(|(layer, t, which)| (layer, t.name, which));
        assert_eq!(p("base_model.model.model.layers.3.self_attn.k_proj.lora_B.weight"), Some((3, "k_proj", 1)));
        assert_eq!(p("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"), Some((0, "down_proj", 0)));
        assert_eq!(p("base_model.model.model.layers.1.self_attn.qkv_proj.lora_A.weight"), Some((1, "qkv_proj", 0)));
        assert_eq!(p("base_model.model.model.layers.1.mlp.gate_up_proj.lora_B.weight"), Some((1, "gate_up_proj", 1)));
        assert_eq!(p("base_model.model.model.layers.0.mlp.q_proj.lora_A.weight"), None, "q under mlp");
        assert_eq!(p("base_model.model.lm_head.lora_A.weight"), None);
        assert_eq!(p("base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"), None);
        let g = |name, fused| parse_gguf_name(name, fused).map(|(layer, t, which)| (layer, t.name, which));
        assert_eq!(g("blk.1.attn_output.weight.lora_b", false), Some((1, "o_proj", 1)));
        assert_eq!(g("blk.0.ffn_down.weight.lora_a", false), Some((0, "down_proj", 0)));
        assert_eq!(g("blk.0.attn_qkv.weight.lora_a", true), Some((0, "qkv_proj", 0)));
        assert_eq!(g("blk.0.ffn_up.weight.lora_b", false), Some((0, "up_proj", 1)));
        assert_eq!(g("blk.0.ffn_up.weight.lora_b", true), Some((0, "gate_up_proj", 1)));
        assert_eq!(g("token_embd.weight.lora_a", false), None);
    }

    /// A fused B splits by rows into its parts, each over the same A; a projection adapted
    /// twice is refused.
    #[test]
    fn fused_targets_split_into_their_parts() {
        let shape = LoraShape::llama(1, 4, 4, 2, 3);
        let qkv = Target::by_name("qkv_proj").unwrap();
        assert_eq!(qkv.dims(&shape), (4, 8));
        let mut found = Found::new();
        let rank = 2;
        let a: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..16).map(|i| 100.0 + i as f32).collect();
        put(&mut found, 0, qkv, 0, rank, a.clone(), &shape).unwrap();
        put(&mut found, 0, qkv, 1, rank, b.clone(), &shape).unwrap();
        let part = |m| found[&(0, m)].clone();
        assert_eq!(part(LoraModule::Q), [Some(a.clone()), Some(b[..8].to_vec())]);
        assert_eq!(part(LoraModule::K), [Some(a.clone()), Some(b[8..12].to_vec())]);
        assert_eq!(part(LoraModule::V), [Some(a.clone()), Some(b[12..].to_vec())]);
        let q = Target::by_name("q_proj").unwrap();
        let err = put(&mut found, 0, q, 0, rank, a, &shape).unwrap_err();
        assert!(err.contains("q_proj is adapted twice"), "{err}");
    }
}
