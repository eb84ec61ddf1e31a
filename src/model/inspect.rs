//! What a model file is and whether weft can run it, read from its headers alone (nothing is
//! uploaded, no GPU is opened): `weft info --model PATH`.
//!
//! A GGUF file is memory-mapped and only its metadata and tensor infos are read; a Hugging Face
//! directory gives its `config.json` and the safetensors headers. Every reason weft would refuse
//! the model is listed, not only the first.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use crate::error::{Result, WeftError};
use crate::kv::KvCacheConfig;
use crate::model::arch::SUPPORTED;
use crate::model::config::ModelConfig;
use crate::model::gguf::{GgufFile, decoded_types};
use crate::model::load::{SAFETENSORS_TYPES, SafetensorsWeights};
use crate::quant::DType;

/// The tensors of one element type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeCount {
    /// ggml's or safetensors' name of the type ("Q4_K", "BF16").
    pub name: String,
    pub num_tensors: usize,
    pub num_elems: u64,
    pub size_bytes: u64,
    /// Whether weft computes with (or converts at load) this type.
    pub supported: bool,
}

/// A model's description, and the reasons weft cannot run it (none when it can).
#[derive(Clone, Debug)]
pub struct ModelReport {
    pub path: String,
    /// "GGUF v3", or "Hugging Face (safetensors)".
    pub container: String,
    /// `general.name`, when the file has one.
    pub name: Option<String>,
    pub architecture: Option<String>,
    /// The config weft reads, when it can read one.
    pub config: Option<ModelConfig>,
    pub num_params: u64,
    pub size_bytes: u64,
    /// By type, most elements first.
    pub tensor_types: Vec<TypeCount>,
    /// The tokenizer: model and pre-tokenizer (GGUF `tokenizer.ggml.model` / `.pre`).
    pub tokenizer: Option<String>,
    pub has_chat_template: bool,
    /// Why weft cannot run the model; empty when it can.
    pub problems: Vec<String>,
}

impl ModelReport {
    pub fn runnable(&self) -> bool {
        self.problems.is_empty()
    }
}

/// What weft runs, from the registries its loaders consult: every architecture
/// ([`SUPPORTED`]), the tensor types of GGUF files ([`decoded_types`]) and of safetensors.
/// One line each, for `weft info`.
pub fn supported() -> String {
    format!(
        "architectures: {}\nGGUF types:    {}\nsafetensors:   {}",
        SUPPORTED.join(", "),
        decoded_types().join(", "),
        SAFETENSORS_TYPES.join(", ")
    )
}

/// The tensors of an unsupported type, by name: the first few, and how many more.
fn named(names: &[&str]) -> String {
    const SHOWN: usize = 4;
    let listed = names[..names.len().min(SHOWN)].join(", ");
    match names.len().saturating_sub(SHOWN) {
        0 => listed,
        more => format!("{listed} and {more} more"),
    }
}

/// "1 tensor is", "3 tensors are".
fn tensors_are(n: usize) -> String {
    if n == 1 { "1 tensor is".to_string() } else { format!("{n} tensors are") }
}

/// Describe the model at `path` (a GGUF file or a Hugging Face directory). An error means the
/// path is not a model at all (missing, unreadable, not GGUF); anything weft cannot run about
/// a readable model is a [`ModelReport::problems`] entry.
pub fn inspect(path: &Path) -> Result<ModelReport> {
    if path.is_dir() { inspect_hf(path) } else { inspect_gguf(&GgufFile::open(path)?, path_size(path)) }
}

fn path_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// [`inspect`] of an opened GGUF file of `size_bytes`.
pub fn inspect_gguf(gguf: &GgufFile, size_bytes: u64) -> Result<ModelReport> {
    let mut problems = Vec::new();
    let architecture = gguf.architecture().map(String::from);
    let moe = crate::model::config::gguf_moe_refusal(gguf);
    match &architecture {
        None => problems.push("no general.architecture in the metadata".to_string()),
        Some(arch) if !SUPPORTED.contains(&arch.as_str()) => problems.push(crate::model::arch::unsupported(arch)),
        Some(_) => {}
    }
    problems.extend(moe.clone());
    let mut types: BTreeMap<String, TypeCount> = BTreeMap::new();
    for info in &gguf.tensors {
        let name = info.ggml_type.name();
        let entry = types.entry(name.clone()).or_insert(TypeCount {
            name,
            num_tensors: 0,
            num_elems: 0,
            size_bytes: 0,
            supported: info.dtype().is_ok(),
        });
        entry.num_tensors += 1;
        entry.num_elems += info.num_elems();
        entry.size_bytes += info.size_bytes();
    }
    for t in types.values().filter(|t| !t.supported) {
        let names: Vec<&str> =
            gguf.tensors.iter().filter(|i| i.ggml_type.name() == t.name).map(|i| i.name.as_str()).collect();
        problems.push(format!(
            "{} {}, which weft does not decode: {}",
            tensors_are(t.num_tensors),
            t.name,
            named(&names)
        ));
    }
    let config = match ModelConfig::from_gguf(gguf) {
        Ok(c) => Some(c),
        Err(e) => {
            // An unsupported architecture or a mixture of experts is already listed.
            if moe.is_none() && architecture.as_deref().is_some_and(|a| SUPPORTED.contains(&a)) {
                problems.push(detail(e));
            }
            None
        }
    };
    if let Err(e) = crate::tokenizer::HfTokenizer::from_gguf_metadata_of(&gguf.metadata, gguf.name()) {
        problems.push(format!("tokenizer: {}", detail(e)));
    }
    let tokenizer = gguf.get_str("tokenizer.ggml.model").map(|model| match gguf.get_str("tokenizer.ggml.pre") {
        Some(pre) => format!("{model} (pre-tokenizer {pre})"),
        None => model.to_string(),
    });
    Ok(ModelReport {
        path: gguf.name().to_string(),
        container: format!("GGUF v{}", gguf.version),
        name: gguf.get_str("general.name").map(String::from),
        architecture,
        config,
        num_params: gguf.tensors.iter().map(|t| t.num_elems()).sum(),
        size_bytes,
        tensor_types: sorted(types),
        tokenizer,
        has_chat_template: gguf.get_str("tokenizer.chat_template").is_some(),
        problems,
    })
}

fn inspect_hf(dir: &Path) -> Result<ModelReport> {
    let shown = dir.display().to_string();
    let config_path = dir.join("config.json");
    let json = std::fs::read_to_string(&config_path)
        .map_err(|e| WeftError::model(&shown, format!("is a directory but config.json cannot be read ({e})")))?;
    let mut problems = Vec::new();
    let architecture =
        serde_json::from_str::<serde_json::Value>(&json).ok().and_then(|v| v["model_type"].as_str().map(String::from));
    let config = match ModelConfig::from_hf_json(&config_path.display().to_string(), &json) {
        Ok(c) => Some(c),
        Err(e) => {
            problems.push(detail(e));
            None
        }
    };
    let mut types: BTreeMap<String, TypeCount> = BTreeMap::new();
    let mut size_bytes = 0;
    match SafetensorsWeights::open(dir) {
        Ok(weights) => {
            for (_, dtype, shape) in weights.tensor_infos() {
                let num_elems: u64 = shape.iter().map(|&d| d as u64).product();
                let width = match dtype.as_str() {
                    "F32" => 4,
                    "F16" | "BF16" => 2,
                    _ => 1,
                };
                let entry = types.entry(dtype.clone()).or_insert(TypeCount {
                    supported: SAFETENSORS_TYPES.contains(&dtype.as_str()),
                    name: dtype,
                    num_tensors: 0,
                    num_elems: 0,
                    size_bytes: 0,
                });
                entry.num_tensors += 1;
                entry.num_elems += num_elems;
                entry.size_bytes += num_elems * width;
                size_bytes += num_elems * width;
            }
        }
        Err(e) => problems.push(detail(e)),
    }
    for t in types.values().filter(|t| !t.supported) {
        problems.push(format!(
            "{} {}; weft reads {} safetensors",
            tensors_are(t.num_tensors),
            t.name,
            SAFETENSORS_TYPES.join(", ")
        ));
    }
    let tokenizer_path = dir.join("tokenizer.json");
    if !tokenizer_path.exists() {
        problems.push("no tokenizer.json".to_string());
    }
    let has_chat_template = std::fs::read_to_string(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|v| v.get("chat_template").is_some())
        || dir.join("chat_template.jinja").exists();
    Ok(ModelReport {
        path: shown,
        container: "Hugging Face (safetensors)".to_string(),
        name: None,
        architecture,
        config,
        num_params: types.values().map(|t| t.num_elems).sum(),
        size_bytes,
        tensor_types: sorted(types),
        tokenizer: tokenizer_path.exists().then(|| "tokenizer.json".to_string()),
        has_chat_template,
        problems,
    })
}

fn sorted(types: BTreeMap<String, TypeCount>) -> Vec<TypeCount> {
    let mut out: Vec<TypeCount> = types.into_values().collect();
    out.sort_by(|a, b| b.num_elems.cmp(&a.num_elems).then(a.name.cmp(&b.name)));
    out
}

/// The message of an error without its file (the report names the file once).
fn detail(e: WeftError) -> String {
    match e {
        WeftError::Model { detail, .. } => detail,
        other => other.to_string(),
    }
}

/// `1.2 GB`-style sizes, `494M`-style counts.
fn human(n: u64, unit: &str) -> String {
    let n = n as f64;
    let (v, suffix) = if n >= 1e9 {
        (n / 1e9, "G")
    } else if n >= 1e6 {
        (n / 1e6, "M")
    } else if n >= 1e3 {
        (n / 1e3, "k")
    } else {
        (n, "")
    };
    if suffix.is_empty() { format!("{n} {unit}").trim_end().to_string() } else { format!("{v:.1} {suffix}{unit}") }
}

impl fmt::Display for ModelReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "model:        {}", self.path)?;
        writeln!(f, "container:    {}", self.container)?;
        if let Some(name) = &self.name {
            writeln!(f, "name:         {name}")?;
        }
        writeln!(f, "architecture: {}", self.architecture.as_deref().unwrap_or("(none)"))?;
        writeln!(f, "parameters:   {}", human(self.num_params, ""))?;
        writeln!(f, "size:         {}", human(self.size_bytes, "B"))?;
        if let Some(c) = &self.config {
            let mlp = match &c.moe {
                Some(m) => format!(
                    "{} experts of MLP {} ({} a token{}){}",
                    m.num_experts,
                    m.expert_intermediate_size,
                    m.experts_per_token,
                    match (m.routing, m.gate) {
                        (_, crate::model::config::ExpertGate::SwigluOai) => ", top-k logits softmaxed, clamped SwiGLU",
                        (_, crate::model::config::ExpertGate::GeluTanh) => ", weights renormalised, GeGLU",
                        (crate::model::config::Routing::Softmax { normalize: true }, _) => ", weights renormalised",
                        (crate::model::config::Routing::TopKSoftmax, _) => ", top-k logits softmaxed",
                        _ => "",
                    },
                    if m.shared_expert_size > 0 {
                        let gated = if m.shared_expert_gated { "sigmoid-gated " } else { "" };
                        format!(" + a {gated}shared expert of MLP {}", m.shared_expert_size)
                    } else if c.gemma4.is_some() {
                        // Gemma 4's dense MLP runs beside its experts in every layer.
                        format!(" + a dense MLP {}", c.intermediate_size)
                    } else {
                        String::new()
                    }
                ),
                None => format!("MLP {}", c.intermediate_size),
            };
            writeln!(
                f,
                "shape:        {} layers, hidden {}, {} heads / {} KV heads of {}, {mlp}, vocab {}, context {}",
                c.num_layers,
                c.hidden_size,
                c.num_heads,
                c.num_kv_heads,
                c.head_dim,
                c.vocab_size,
                c.max_position_embeddings
            )?;
            if c.num_attention_layers() > 0 {
                // What --kv-memory buys: bytes a token takes over every attention layer, K and V.
                let per_token = |dtype| KvCacheConfig::block_bytes(1, c.kv_token_values(), dtype) as u64;
                let (full, half) = (per_token(DType::F32), per_token(DType::F16));
                let context = c.max_position_embeddings as u64;
                writeln!(
                    f,
                    "KV cache:     {} a token in f32, {} in f16 (--kv-cache-dtype); a full context {} / {}",
                    human(full, "B"),
                    human(half, "B"),
                    human(full * context, "B"),
                    human(half * context, "B")
                )?;
            }
        }
        writeln!(f, "tensors:")?;
        for t in &self.tensor_types {
            let note = if t.supported { "" } else { "  (not supported)" };
            writeln!(
                f,
                "  {:<8} {:>5} tensors {:>10} elements {:>10}{note}",
                t.name,
                t.num_tensors,
                human(t.num_elems, ""),
                human(t.size_bytes, "B")
            )?;
        }
        if let Some(tok) = &self.tokenizer {
            writeln!(f, "tokenizer:    {tok}")?;
        }
        writeln!(
            f,
            "chat template: {}",
            if self.has_chat_template { "yes" } else { "no (a base model: text completion)" }
        )?;
        if self.problems.is_empty() {
            write!(f, "weft runs it: yes")
        } else {
            write!(f, "weft runs it: no")?;
            for p in &self.problems {
                write!(f, "\n  - {p}")?;
            }
            Ok(())
        }
    }
}
