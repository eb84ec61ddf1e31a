//! Opening a model from disk or bytes: a GGUF file, or a Hugging Face directory (config.json +
//! safetensors), as a config plus a [`WeightSource`].

use std::borrow::Cow;

use crate::error::{Result, WeftError};
use crate::model::gguf::GgufFile;
use crate::model::weights::{Checkpoint, HostTensor, SourcedTensor, WeightSource};
use crate::quant::DType;

/// Weights read from a GGUF file.
pub struct GgufWeights<'a> {
    pub gguf: &'a GgufFile,
}

impl WeightSource for GgufWeights<'_> {
    fn checkpoint(&self) -> Checkpoint {
        Checkpoint::Gguf
    }

    fn file(&self) -> &str {
        self.gguf.name()
    }

    fn get(&self, name: &str) -> Result<Option<HostTensor<'_>>> {
        let Some(info) = self.gguf.tensor(name) else { return Ok(None) };
        let dtype = info.dtype()?;
        Ok(Some(HostTensor { shape: info.shape(), dtype, bytes: self.gguf.tensor_bytes(info)? }))
    }

    fn get_source(&self, name: &str) -> Result<Option<SourcedTensor<'_>>> {
        let Some(info) = self.gguf.tensor(name) else { return Ok(None) };
        let dtype = info.dtype()?;
        Ok(Some(SourcedTensor { shape: info.shape(), dtype, bytes: Box::new(self.gguf.tensor_source(info)?) }))
    }

    fn release_pages(&self) {
        self.gguf.release_pages();
    }
}

/// A GGUF file whose tensor types weft cannot read is refused before anything is uploaded.
pub fn check_gguf(gguf: &GgufFile) -> Result<()> {
    gguf.check_tensor_types().map_err(|e| match e {
        WeftError::Model { .. } => e,
        other => WeftError::model(gguf.name(), other.to_string()),
    })
}

/// The safetensors element types weft reads (by safetensors' names), each kept as it is; U8
/// holds packed codes (gpt-oss's MXFP4 experts, `WeightSource::get_u8`).
pub const SAFETENSORS_TYPES: [&str; 4] = ["F32", "F16", "BF16", "U8"];

/// Weights of a Hugging Face model directory: `model.safetensors`, or the shards listed by
/// `model.safetensors.index.json`, memory-mapped. F32, F16 and BF16 tensors.
pub struct SafetensorsWeights {
    dir: String,
    shards: Vec<crate::rt::MappedFile>,
    /// name -> (shard, dtype, shape, byte range within the shard)
    tensors: std::collections::HashMap<String, (usize, safetensors::Dtype, Vec<usize>, std::ops::Range<usize>)>,
}

impl SafetensorsWeights {
    pub fn open(dir: &std::path::Path) -> Result<SafetensorsWeights> {
        let shown = dir.display().to_string();
        let index_path = dir.join("model.safetensors.index.json");
        let shard_names: Vec<String> = if index_path.exists() {
            let text = std::fs::read_to_string(&index_path)
                .map_err(|e| WeftError::model(index_path.display().to_string(), e.to_string()))?;
            let index: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| WeftError::model(index_path.display().to_string(), format!("not valid JSON: {e}")))?;
            let map = index["weight_map"]
                .as_object()
                .ok_or_else(|| WeftError::model(index_path.display().to_string(), "no weight_map object"))?;
            let mut names: Vec<String> = map.values().filter_map(|v| v.as_str().map(String::from)).collect();
            names.sort();
            names.dedup();
            names
        } else if dir.join("model.safetensors").exists() {
            vec!["model.safetensors".into()]
        } else {
            return Err(WeftError::model(&shown, "has neither model.safetensors nor model.safetensors.index.json"));
        };
        let mut shards = Vec::new();
        let mut tensors = std::collections::HashMap::new();
        for (i, name) in shard_names.iter().enumerate() {
            let path = dir.join(name);
            let file_name = path.display().to_string();
            let map = crate::rt::map_file(&path).map_err(|e| WeftError::model(&file_name, e.to_string()))?;
            let (header_len, meta) = safetensors::SafeTensors::read_metadata(&map[..])
                .map_err(|e| WeftError::model(&file_name, format!("not a safetensors file: {e}")))?;
            let data_start = 8 + header_len;
            for (tensor, info) in meta.tensors() {
                let (start, end) = info.data_offsets;
                tensors.insert(tensor, (i, info.dtype, info.shape.clone(), data_start + start..data_start + end));
            }
            shards.push(map);
        }
        Ok(SafetensorsWeights { dir: shown, shards, tensors })
    }

    /// Every tensor's name, element type (safetensors' name, e.g. "BF16") and shape.
    pub fn tensor_infos(&self) -> impl Iterator<Item = (&str, String, &[usize])> {
        self.tensors.iter().map(|(name, (_, dtype, shape, _))| (name.as_str(), format!("{dtype:?}"), shape.as_slice()))
    }
}

impl WeightSource for SafetensorsWeights {
    fn checkpoint(&self) -> Checkpoint {
        Checkpoint::HuggingFace
    }

    fn file(&self) -> &str {
        &self.dir
    }

    fn get(&self, name: &str) -> Result<Option<HostTensor<'_>>> {
        let Some((shard, dtype, shape, range)) = self.tensors.get(name) else { return Ok(None) };
        let bytes = &self.shards[*shard][range.clone()];
        let (dtype, bytes) = match dtype {
            safetensors::Dtype::F32 => (DType::F32, Cow::Borrowed(bytes)),
            safetensors::Dtype::F16 => (DType::F16, Cow::Borrowed(bytes)),
            safetensors::Dtype::BF16 => (DType::BF16, Cow::Borrowed(bytes)),
            safetensors::Dtype::U8 => {
                return Err(WeftError::model(
                    &self.dir,
                    format!("tensor {name} is U8; weft reads U8 tensors only as gpt-oss's MXFP4 experts"),
                ));
            }
            other => {
                return Err(WeftError::model(
                    &self.dir,
                    format!("tensor {name} is {other:?}; weft reads {} safetensors", SAFETENSORS_TYPES.join(", ")),
                ));
            }
        };
        Ok(Some(HostTensor { shape: shape.clone(), dtype, bytes }))
    }

    fn get_u8(&self, name: &str) -> Result<Option<(Vec<usize>, &[u8])>> {
        match self.tensors.get(name) {
            Some((shard, safetensors::Dtype::U8, shape, range)) => {
                Ok(Some((shape.clone(), &self.shards[*shard][range.clone()])))
            }
            _ => Ok(None),
        }
    }

    fn release_pages(&self) {
        self.shards.iter().for_each(crate::rt::MappedFile::release_pages);
    }
}

/// The checkpoint behind a loaded model.
enum Checkpointed {
    Gguf(GgufFile),
    HuggingFace(SafetensorsWeights),
}

/// A model opened from disk or bytes: its config, tokenizer and weights, ready to upload.
pub struct ModelFiles {
    pub config: crate::model::config::ModelConfig,
    pub tokenizer: std::sync::Arc<crate::tokenizer::HfTokenizer>,
    checkpoint: Checkpointed,
}

impl ModelFiles {
    /// A GGUF file, or a Hugging Face directory (config.json, tokenizer.json, safetensors).
    pub fn open(path: &std::path::Path) -> Result<ModelFiles> {
        let shown = path.display().to_string();
        if path.is_dir() {
            let config_path = path.join("config.json");
            let json = std::fs::read_to_string(&config_path)
                .map_err(|e| WeftError::model(&shown, format!("is a directory but config.json cannot be read ({e}); a model directory needs config.json, tokenizer.json and safetensors weights")))?;
            let config = crate::model::config::ModelConfig::from_hf_json(&config_path.display().to_string(), &json)?;
            let tokenizer_config = path.join("tokenizer_config.json");
            let tokenizer = crate::tokenizer::HfTokenizer::from_file(
                &path.join("tokenizer.json"),
                tokenizer_config.exists().then_some(tokenizer_config.as_path()),
            )?;
            let weights = SafetensorsWeights::open(path)?;
            return Ok(ModelFiles {
                config,
                tokenizer: std::sync::Arc::new(tokenizer),
                checkpoint: Checkpointed::HuggingFace(weights),
            });
        }
        if !path.exists() {
            return Err(WeftError::model(&shown, "no such file or directory"));
        }
        Self::from_gguf(GgufFile::open(path)?)
    }

    /// GGUF bytes held in memory (tests, tools).
    pub fn from_gguf_bytes(name: &str, bytes: Vec<u8>) -> Result<ModelFiles> {
        Self::from_gguf(GgufFile::from_bytes(name, bytes)?)
    }

    /// A GGUF file read in slices through `reader` (the browser's path: a stored or downloaded
    /// model is never whole in WebAssembly memory; each tensor is read as it is uploaded).
    pub fn from_gguf_reader(name: &str, reader: Box<dyn crate::model::gguf::ReadAt>) -> Result<ModelFiles> {
        Self::from_gguf(GgufFile::from_reader(name, reader)?)
    }

    fn from_gguf(gguf: GgufFile) -> Result<ModelFiles> {
        check_gguf(&gguf)?;
        let config = crate::model::config::ModelConfig::from_gguf(&gguf)?;
        let tokenizer = crate::tokenizer::HfTokenizer::from_gguf_metadata_of(&gguf.metadata, gguf.name())?;
        Ok(ModelFiles { config, tokenizer: std::sync::Arc::new(tokenizer), checkpoint: Checkpointed::Gguf(gguf) })
    }

    /// Upload the weights and make an executor with a KV pool shaped by `kv`.
    pub fn executor(
        &self,
        factory: &crate::gpu::GpuTensorFactory,
        kv: crate::kv::KvCacheConfig,
    ) -> Result<crate::model::executor::GpuExecutor> {
        self.executor_with_progress(factory, kv, &mut |_, _| {})
    }

    /// [`executor`](Self::executor), reporting `progress(layers uploaded, layers in all)`.
    pub fn executor_with_progress(
        &self,
        factory: &crate::gpu::GpuTensorFactory,
        kv: crate::kv::KvCacheConfig,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<crate::model::executor::GpuExecutor> {
        crate::model::executor::GpuExecutor::new(factory.clone(), self.architecture(factory, progress)?, kv)
    }

    /// [`executor_with_progress`](Self::executor_with_progress) with `num_slots` recurrent-state
    /// slots and `num_snapshots` prefix-state snapshot slots (used only by models with
    /// recurrent layers).
    pub fn executor_with_state_slots(
        &self,
        factory: &crate::gpu::GpuTensorFactory,
        kv: crate::kv::KvCacheConfig,
        num_slots: usize,
        num_snapshots: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<crate::model::executor::GpuExecutor> {
        let model = self.architecture(factory, progress)?;
        crate::model::executor::GpuExecutor::with_state_slots(factory.clone(), model, kv, num_slots, num_snapshots)
    }

    /// About the bytes the weights take on the device, from the checkpoint's headers: each
    /// tensor's bytes in the file
    /// and the RoPE tables (f32 cos and sin of up to 32k positions; Gemma 3 has two). What
    /// [`architecture`](Self::architecture) uploads, before uploading it.
    pub fn weight_bytes_estimate(&self) -> u64 {
        let c = &self.config;
        let num_tables = if c.num_attention_layers() == 0 { 0 } else { 1 + c.rope_local_theta.is_some() as usize };
        let rope = (num_tables * c.max_position_embeddings.min(32768) * c.head_dim * 4) as u64;
        let tensors: u64 = match &self.checkpoint {
            Checkpointed::Gguf(gguf) => gguf.tensors.iter().map(|t| t.size_bytes()).sum(),
            Checkpointed::HuggingFace(weights) => {
                weights.tensors.values().map(|(_, _, _, range)| range.len() as u64).sum()
            }
        };
        rope + tensors
    }

    /// The bytes of the checkpoint's largest tensor as the file holds it: what loading may hold
    /// on the host at once beside a fixed staging ring.
    pub fn largest_tensor_bytes(&self) -> u64 {
        match &self.checkpoint {
            Checkpointed::Gguf(gguf) => gguf.tensors.iter().map(|t| t.size_bytes()).max(),
            Checkpointed::HuggingFace(weights) => weights.tensors.values().map(|(_, _, _, r)| r.len() as u64).max(),
        }
        .unwrap_or(0)
    }

    /// Upload the weights as the model's architecture (no KV pool, no executor).
    pub fn architecture(
        &self,
        factory: &dyn crate::tensor::TensorFactory,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Box<dyn crate::model::arch::Architecture>> {
        let config = self.config.clone();
        let model = match &self.checkpoint {
            Checkpointed::Gguf(gguf) => crate::model::arch::load(config, &GgufWeights { gguf }, factory, progress),
            Checkpointed::HuggingFace(weights) => crate::model::arch::load(config, weights, factory, progress),
        }?;
        factory.finish_uploads()?;
        Ok(model)
    }
}
