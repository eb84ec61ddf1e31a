//! Where weights come from and what they are called: the [`WeightSource`] seam over a GGUF file
//! or a safetensors directory, the checkpoint's tensor names, and the checked upload every
//! architecture uses.
//!
//! GGUF names (`blk.N.attn_q.weight`) are llama.cpp's and shared by its architectures; Hugging
//! Face names (`model.layers.N.self_attn.q_proj.weight`) are the transformers ones of the Llama
//! family, which Qwen2 and Mistral keep.

use std::borrow::Cow;

use crate::error::{Result, WeftError};
use crate::gpu::GpuTensor;
use crate::model::layers::Linear;
use crate::quant::DType;
use crate::tensor::{ByteSource, Joined, TensorFactory};

/// Which naming and RoPE convention a checkpoint follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checkpoint {
    /// llama.cpp's GGUF conversion.
    Gguf,
    /// A Hugging Face model directory (safetensors).
    HuggingFace,
}

/// The weights of one transformer block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    AttnNorm,
    Q,
    K,
    V,
    QBias,
    KBias,
    VBias,
    O,
    /// The attention output's bias (gpt-oss).
    OBias,
    FfnNorm,
    Gate,
    Up,
    Down,
    /// Per-head norms of q and k (Qwen3, Gemma 3).
    QNorm,
    KNorm,
    /// Gemma's norms of the attention and MLP outputs, before each residual add.
    PostAttnNorm,
    PostFfnNorm,
    /// Gemma's norm before the MLP (`ffn_norm` in GGUF, like Llama's; transformers names it
    /// apart from Llama's `post_attention_layernorm`, which in Gemma is the post-attention norm).
    PreFfnNorm,
    /// Phi-3's fused projections: q, k and v stacked by rows; gate and up stacked by rows
    /// (llama.cpp keeps the name `ffn_up` for the stack).
    Qkv,
    GateUp,
}

/// The checkpoint's name of a tensor: `layer = None` for the embedding (`Part::Q` stands in),
/// the final norm (`AttnNorm`) and the LM head (`O`).
pub fn tensor_name(checkpoint: Checkpoint, layer: Option<usize>, part: Part) -> String {
    use Checkpoint::*;
    use Part::*;
    let Some(i) = layer else {
        return match (checkpoint, part) {
            (Gguf, Q) => "token_embd.weight",
            (Gguf, AttnNorm) => "output_norm.weight",
            (Gguf, _) => "output.weight",
            (HuggingFace, Q) => "model.embed_tokens.weight",
            (HuggingFace, AttnNorm) => "model.norm.weight",
            (HuggingFace, _) => "lm_head.weight",
        }
        .to_string();
    };
    match checkpoint {
        Gguf => {
            let name = match part {
                AttnNorm => "attn_norm.weight",
                Q => "attn_q.weight",
                K => "attn_k.weight",
                V => "attn_v.weight",
                QBias => "attn_q.bias",
                KBias => "attn_k.bias",
                VBias => "attn_v.bias",
                O => "attn_output.weight",
                OBias => "attn_output.bias",
                FfnNorm => "ffn_norm.weight",
                Gate => "ffn_gate.weight",
                Up => "ffn_up.weight",
                Down => "ffn_down.weight",
                QNorm => "attn_q_norm.weight",
                KNorm => "attn_k_norm.weight",
                PostAttnNorm => "post_attention_norm.weight",
                PostFfnNorm => "post_ffw_norm.weight",
                PreFfnNorm => "ffn_norm.weight",
                Qkv => "attn_qkv.weight",
                GateUp => "ffn_up.weight",
            };
            format!("blk.{i}.{name}")
        }
        HuggingFace => {
            let name = match part {
                AttnNorm => "input_layernorm.weight",
                Q => "self_attn.q_proj.weight",
                K => "self_attn.k_proj.weight",
                V => "self_attn.v_proj.weight",
                QBias => "self_attn.q_proj.bias",
                KBias => "self_attn.k_proj.bias",
                VBias => "self_attn.v_proj.bias",
                O => "self_attn.o_proj.weight",
                OBias => "self_attn.o_proj.bias",
                FfnNorm => "post_attention_layernorm.weight",
                Gate => "mlp.gate_proj.weight",
                Up => "mlp.up_proj.weight",
                Down => "mlp.down_proj.weight",
                QNorm => "self_attn.q_norm.weight",
                KNorm => "self_attn.k_norm.weight",
                // Gemma's names.
                PostAttnNorm => "post_attention_layernorm.weight",
                PostFfnNorm => "post_feedforward_layernorm.weight",
                PreFfnNorm => "pre_feedforward_layernorm.weight",
                Qkv => "self_attn.qkv_proj.weight",
                GateUp => "mlp.gate_up_proj.weight",
            };
            format!("model.layers.{i}.{name}")
        }
    }
}

/// LFM2's name of the tensor the Llama family calls `name`, where they differ (its norms,
/// attention output and MLP in transformers' naming; its final norm in llama.cpp's, which the
/// converter writes as `token_embd_norm`). The short-convolution tensors, which the Llama
/// family lacks, are named in `arch::lfm2`.
pub fn lfm2_name(checkpoint: Checkpoint, name: &str) -> Option<String> {
    const HF: [(&str, &str); 8] = [
        ("input_layernorm.weight", "operator_norm.weight"),
        ("post_attention_layernorm.weight", "ffn_norm.weight"),
        ("self_attn.o_proj.weight", "self_attn.out_proj.weight"),
        ("self_attn.q_norm.weight", "self_attn.q_layernorm.weight"),
        ("self_attn.k_norm.weight", "self_attn.k_layernorm.weight"),
        ("mlp.gate_proj.weight", "feed_forward.w1.weight"),
        ("mlp.up_proj.weight", "feed_forward.w3.weight"),
        ("mlp.down_proj.weight", "feed_forward.w2.weight"),
    ];
    match checkpoint {
        Checkpoint::Gguf => (name == "output_norm.weight").then(|| "token_embd_norm.weight".to_string()),
        Checkpoint::HuggingFace if name == "model.norm.weight" => Some("model.embedding_norm.weight".to_string()),
        Checkpoint::HuggingFace => HF.iter().find_map(|(llama, lfm2)| {
            let prefix = name.strip_suffix(llama)?;
            Some(format!("{prefix}{lfm2}"))
        }),
    }
}

/// A source asked for tensors by the Llama family's names that reads them under an
/// architecture's own: `rename` gives the checkpoint's name where it differs.
pub struct Renamed<'a> {
    pub source: &'a dyn WeightSource,
    pub rename: fn(Checkpoint, &str) -> Option<String>,
}

impl WeightSource for Renamed<'_> {
    fn checkpoint(&self) -> Checkpoint {
        self.source.checkpoint()
    }

    fn file(&self) -> &str {
        self.source.file()
    }

    fn get(&self, name: &str) -> Result<Option<HostTensor<'_>>> {
        match (self.rename)(self.checkpoint(), name) {
            Some(own) => self.source.get(&own),
            None => self.source.get(name),
        }
    }

    fn get_source(&self, name: &str) -> Result<Option<SourcedTensor<'_>>> {
        match (self.rename)(self.checkpoint(), name) {
            Some(own) => self.source.get_source(&own),
            None => self.source.get_source(name),
        }
    }

    fn get_u8(&self, name: &str) -> Result<Option<(Vec<usize>, &[u8])>> {
        match (self.rename)(self.checkpoint(), name) {
            Some(own) => self.source.get_u8(&own),
            None => self.source.get_u8(name),
        }
    }

    fn release_pages(&self) {
        self.source.release_pages()
    }
}

/// A tensor as a checkpoint holds it on the host, shape outermost first.
pub struct HostTensor<'a> {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub bytes: Cow<'a, [u8]>,
}

/// A tensor as a checkpoint holds it, its bytes read a slice at a time as they are uploaded
/// ([`WeightSource::get_source`]).
pub struct SourcedTensor<'a> {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub bytes: Box<dyn ByteSource + 'a>,
}

impl<'a> From<HostTensor<'a>> for SourcedTensor<'a> {
    /// A tensor already read whole, as a source.
    fn from(t: HostTensor<'a>) -> SourcedTensor<'a> {
        SourcedTensor { shape: t.shape, dtype: t.dtype, bytes: Box::new(HeldBytes(t.bytes)) }
    }
}

/// Sources read in turns of `chunk_bytes` each (the first chunk of every part, then the second
/// of every part, …): a mixture's stacked gate and up experts read as each expert's gate rows
/// then its up rows, a slice at a time.
pub struct Alternating<'a> {
    pub parts: Vec<Box<dyn ByteSource + 'a>>,
    pub chunk_bytes: u64,
}

impl ByteSource for Alternating<'_> {
    fn len_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.len_bytes()).sum()
    }

    fn read_into(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let (chunk, turn) = (self.chunk_bytes.max(1), self.chunk_bytes.max(1) * self.parts.len() as u64);
        let mut done = 0;
        while done < out.len() {
            let at = offset + done as u64;
            let within = at % turn;
            let part = &self.parts[(within / chunk) as usize];
            let from = at / turn * chunk + within % chunk;
            // At most `out.len()` bytes: fits in usize.
            let take = ((chunk - within % chunk) as usize).min(out.len() - done);
            part.read_into(from, &mut out[done..done + take])?;
            done += take;
        }
        Ok(())
    }
}

/// Bytes a source has already read whole (the default [`WeightSource::get_source`]).
struct HeldBytes<'a>(Cow<'a, [u8]>);

impl ByteSource for HeldBytes<'_> {
    fn len_bytes(&self) -> u64 {
        self.0.len() as u64
    }

    fn in_memory(&self) -> Option<&[u8]> {
        Some(&self.0)
    }

    fn read_into(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        (&self.0[..]).read_into(offset, out)
    }
}

/// Where weights come from: a GGUF file or a safetensors directory.
pub trait WeightSource {
    fn checkpoint(&self) -> Checkpoint;
    /// The file or directory, for error messages.
    fn file(&self) -> &str;
    /// The tensor called `name`, `None` if absent, in its own format.
    fn get(&self, name: &str) -> Result<Option<HostTensor<'_>>>;
    /// The tensor called `name`, `None` if absent, in its own format, its bytes read a slice
    /// at a time when uploaded: a file read through a reader is never whole in memory. By
    /// default [`get`](Self::get)'s bytes, read whole.
    fn get_source(&self, name: &str) -> Result<Option<SourcedTensor<'_>>> {
        Ok(self.get(name)?.map(|t| SourcedTensor {
            shape: t.shape,
            dtype: t.dtype,
            bytes: Box::new(HeldBytes(t.bytes)),
        }))
    }
    /// The shape and bytes of the U8 tensor called `name` (packed codes: a safetensors
    /// checkpoint's MXFP4 blocks and scales), `None` if absent or not U8.
    fn get_u8(&self, _name: &str) -> Result<Option<(Vec<usize>, &[u8])>> {
        Ok(None)
    }
    /// The tensors read so far are on the GPU: drop the host pages they were read from, where
    /// the source maps files (they are read back if asked for again).
    fn release_pages(&self) {}
}

/// Loads a checkpoint's tensors by (layer, part) onto the GPU, checking each one's shape.
pub struct Loader<'a> {
    pub source: &'a dyn WeightSource,
    pub factory: &'a dyn TensorFactory,
}

impl Loader<'_> {
    /// The host tensor `part` of `layer`, its shape checked; `None` if the checkpoint lacks it.
    fn host(&self, layer: Option<usize>, part: Part, shape: &[usize]) -> Result<Option<(String, HostTensor<'_>)>> {
        self.host_named(tensor_name(self.source.checkpoint(), layer, part), shape)
    }

    fn host_named(&self, name: String, shape: &[usize]) -> Result<Option<(String, HostTensor<'_>)>> {
        let Some(t) = self.source.get(&name)? else { return Ok(None) };
        if t.shape != shape {
            return Err(WeftError::model(
                self.source.file(),
                format!("tensor {name} has shape {:?}, expected {shape:?}", t.shape),
            ));
        }
        Ok(Some((name, t)))
    }

    /// [`host_named`](Self::host_named), the bytes left in the file until uploaded.
    fn sourced_named(&self, name: String, shape: &[usize]) -> Result<Option<(String, SourcedTensor<'_>)>> {
        let Some(t) = self.source.get_source(&name)? else { return Ok(None) };
        if t.shape != shape {
            return Err(WeftError::model(
                self.source.file(),
                format!("tensor {name} has shape {:?}, expected {shape:?}", t.shape),
            ));
        }
        Ok(Some((name, t)))
    }

    /// A matrix read a slice at a time into its GPU tensor, then the file's pages dropped.
    fn upload_sourced(&self, name: &str, t: &SourcedTensor<'_>) -> Result<GpuTensor> {
        self.released(upload_matrix_from(self.source.file(), name, &t.shape, t.dtype, &*t.bytes, self.factory))
    }

    fn required_host(&self, layer: Option<usize>, part: Part, shape: &[usize]) -> Result<(String, HostTensor<'_>)> {
        self.host(layer, part, shape)?.ok_or_else(|| {
            let name = tensor_name(self.source.checkpoint(), layer, part);
            WeftError::model(self.source.file(), format!("tensor {name} is missing"))
        })
    }

    /// A weight matrix or embedding table, kept in the checkpoint's format.
    pub fn matrix(&self, layer: Option<usize>, part: Part, shape: &[usize]) -> Result<GpuTensor> {
        let name = tensor_name(self.source.checkpoint(), layer, part);
        let (name, t) = self.sourced_named(name.clone(), shape)?.ok_or_else(|| self.missing(&name))?;
        self.upload_sourced(&name, &t)
    }

    /// The tensor called `name`, a matrix of `shape` kept in the checkpoint's format (for
    /// architectures whose names are not the Llama family's).
    pub fn named_matrix(&self, name: &str, shape: &[usize]) -> Result<GpuTensor> {
        let (name, t) = self.sourced_named(name.to_string(), shape)?.ok_or_else(|| self.missing(name))?;
        self.upload_sourced(&name, &t)
    }

    /// The tensor called `name`, if present, as a matrix of `shape`.
    pub fn optional_named_matrix(&self, name: &str, shape: &[usize]) -> Result<Option<GpuTensor>> {
        match self.sourced_named(name.to_string(), shape)? {
            Some((name, t)) => self.upload_sourced(&name, &t).map(Some),
            None => Ok(None),
        }
    }

    /// The values of the tensor called `name`, which must hold `len` of them in any shape
    /// (checkpoints disagree on shapes such as (heads) or (heads, 1)), as F32.
    pub fn named_values(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.source.get(name)?.ok_or_else(|| self.missing(name))?;
        let num_elems: usize = t.shape.iter().product();
        if num_elems != len {
            return Err(WeftError::model(
                self.source.file(),
                format!("tensor {name} has shape {:?}, expected {len} elements", t.shape),
            ));
        }
        float_values(self.source.file(), name, &t)
    }

    /// The values of the tensor called `name`, which must have `shape`, as F32 (F16 and BF16
    /// widened; quantized formats refused).
    pub fn named_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self.named_host(name, shape)?;
        float_values(self.source.file(), name, &t)
    }

    /// The tensor called `name`, which must have `shape`, its bytes left in the file until
    /// uploaded.
    pub(crate) fn named_source(&self, name: &str, shape: &[usize]) -> Result<SourcedTensor<'_>> {
        Ok(self.sourced_named(name.to_string(), shape)?.ok_or_else(|| self.missing(name))?.1)
    }

    /// The host tensor called `name`, which must have `shape`.
    pub(crate) fn named_host(&self, name: &str, shape: &[usize]) -> Result<HostTensor<'_>> {
        Ok(self.host_named(name.to_string(), shape)?.ok_or_else(|| self.missing(name))?.1)
    }

    /// The error for a required tensor the checkpoint lacks.
    pub(crate) fn missing_tensor(&self, name: &str) -> WeftError {
        self.missing(name)
    }

    /// `uploaded`, once the source has dropped the host pages its bytes were read from: a
    /// load holds the file's pages of one matrix at a time (the largest tensor), not of a
    /// whole layer.
    fn released(&self, uploaded: Result<GpuTensor>) -> Result<GpuTensor> {
        self.source.release_pages();
        uploaded
    }

    fn missing(&self, name: &str) -> WeftError {
        WeftError::model(self.source.file(), format!("tensor {name} is missing"))
    }

    /// A norm weight or bias, as F32.
    pub fn vector(&self, layer: Option<usize>, part: Part, len: usize) -> Result<GpuTensor> {
        let (name, t) = self.required_host(layer, part, &[len])?;
        self.factory.upload_f32(&[len], &float_values(self.source.file(), &name, &t)?)
    }

    /// A matrix that may be absent (an untied LM head).
    pub fn optional_matrix(&self, layer: Option<usize>, part: Part, shape: &[usize]) -> Result<Option<GpuTensor>> {
        match self.sourced_named(tensor_name(self.source.checkpoint(), layer, part), shape)? {
            Some((name, t)) => self.upload_sourced(&name, &t).map(Some),
            None => Ok(None),
        }
    }

    /// Projections of one input that run as one (`parts` as (part, output rows); each `cols`
    /// wide): their rows concatenated into one matrix when they share a format, else one
    /// matrix each; their biases (when `biases` names them) concatenated into one vector.
    pub fn linear(
        &self,
        layer: usize,
        parts: &[(Part, usize)],
        biases: Option<&[Part]>,
        cols: usize,
    ) -> Result<Linear> {
        let name = |part: Part| tensor_name(self.source.checkpoint(), Some(layer), part);
        let parts: Vec<(String, usize)> = parts.iter().map(|&(part, rows)| (name(part), rows)).collect();
        let biases: Option<Vec<String>> = biases.map(|b| b.iter().map(|&part| name(part)).collect());
        self.named_linear(&parts, biases.as_deref(), cols)
    }

    /// [`linear`](Self::linear) of tensors named in the checkpoint's own words (an
    /// architecture whose names the `Part` table does not hold).
    pub fn named_linear(&self, parts: &[(String, usize)], biases: Option<&[String]>, cols: usize) -> Result<Linear> {
        let file = self.source.file();
        let mut hosts = Vec::with_capacity(parts.len());
        for (name, rows) in parts {
            hosts.push(self.sourced_named(name.clone(), &[*rows, cols])?.ok_or_else(|| self.missing(name))?);
        }
        let weights = if hosts.iter().all(|(_, t)| t.dtype == hosts[0].1.dtype) && hosts.len() > 1 {
            // One matrix of their rows, read part after part a slice at a time (never joined
            // in memory).
            let rows: usize = parts.iter().map(|(_, r)| r).sum();
            let fused = Joined(hosts.iter().map(|(_, t)| &*t.bytes).collect());
            let names: Vec<&str> = hosts.iter().map(|(n, _)| n.as_str()).collect();
            vec![upload_matrix_from(file, &names.join("+"), &[rows, cols], hosts[0].1.dtype, &fused, self.factory)?]
        } else {
            hosts
                .iter()
                .map(|(name, t)| upload_matrix_from(file, name, &t.shape, t.dtype, &*t.bytes, self.factory))
                .collect::<Result<_>>()?
        };
        drop(hosts);
        self.source.release_pages();
        let bias = match biases {
            Some(biases) => {
                let mut values = Vec::new();
                for (b, (_, rows)) in biases.iter().zip(parts) {
                    let (name, t) = self.host_named(b.clone(), &[*rows])?.ok_or_else(|| self.missing(b))?;
                    values.extend(float_values(file, &name, &t)?);
                }
                Some(self.factory.upload_f32(&[values.len()], &values)?)
            }
            None => None,
        };
        Ok(Linear { weights, bias })
    }
}

/// Upload the stacked experts of one projection, `bytes` holding `num_experts` experts of
/// `shape[0] / num_experts` rows each, kept in the checkpoint's format, with every part of the
/// tensor holding whole experts (what `moe_matmul` reads): where the device's binding limit
/// splits the tensor inside an expert, it is uploaded again in groups of as many whole experts
/// as one part holds.
pub fn upload_experts(
    file: &str,
    name: &str,
    shape: [usize; 2],
    dtype: DType,
    bytes: &dyn ByteSource,
    num_experts: usize,
    factory: &dyn TensorFactory,
) -> Result<GpuTensor> {
    let tensor = upload_matrix_from(file, name, &shape, dtype, bytes, factory)?;
    let expert_rows = shape[0] / num_experts.max(1);
    if tensor
        .parts()
        .iter()
        .all(|p| p.rows.start.is_multiple_of(expert_rows) && p.num_rows().is_multiple_of(expert_rows))
    {
        return Ok(tensor);
    }
    let per_part = tensor.parts()[0].num_rows() / expert_rows;
    drop(tensor);
    let expert_bytes = bytes.len_bytes() / num_experts.max(1) as u64;
    if per_part == 0 {
        return Err(WeftError::model(
            file,
            format!("one expert of {name} takes {expert_bytes} bytes, more than this device binds at once"),
        ));
    }
    let mut joined: Option<GpuTensor> = None;
    let group_bytes = per_part as u64 * expert_bytes;
    let mut start = 0;
    while start < bytes.len_bytes() {
        let len = group_bytes.min(bytes.len_bytes() - start);
        let group = crate::tensor::Window { source: bytes, start, len };
        let rows = (len / expert_bytes) as usize * expert_rows;
        let part = upload_matrix_from(file, name, &[rows, shape[1]], dtype, &group, factory)?;
        joined = Some(match joined {
            None => part,
            Some(head) => head.then_rows(&part)?,
        });
        start += len;
    }
    joined.ok_or_else(|| WeftError::model(file, format!("{name} holds no experts")))
}

/// A norm weight's or bias's values: F32, F16 or BF16, widened on the host; never quantized.
fn float_values(file: &str, name: &str, t: &HostTensor<'_>) -> Result<Vec<f32>> {
    if t.dtype.is_quantized() {
        return Err(WeftError::model(
            file,
            format!("tensor {name} is {}; weft needs norms and biases in F32, F16 or BF16", t.dtype),
        ));
    }
    crate::quant::dequantize(t.dtype, &t.bytes)
}

/// Upload a weight matrix in its own format, where the device's weight kernels read it best.
pub(crate) fn upload_matrix(
    file: &str,
    name: &str,
    t: &HostTensor<'_>,
    factory: &dyn TensorFactory,
) -> Result<GpuTensor> {
    let bytes: &[u8] = &t.bytes;
    upload_matrix_from(file, name, &t.shape, t.dtype, &bytes, factory)
}

/// [`upload_matrix`] of bytes read a slice at a time as they are uploaded.
pub(crate) fn upload_matrix_from(
    file: &str,
    name: &str,
    shape: &[usize],
    dtype: DType,
    bytes: &dyn ByteSource,
    factory: &dyn TensorFactory,
) -> Result<GpuTensor> {
    let cols = shape[shape.len() - 1];
    if !cols.is_multiple_of(crate::quant::QK) {
        return Err(WeftError::model(
            file,
            format!(
                "tensor {name} has rows of {cols} elements; weft's matmul reads whole blocks of {}",
                crate::quant::QK
            ),
        ));
    }
    factory.upload_weight_from(shape, dtype, bytes)
}
