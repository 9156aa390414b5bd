//! `nectar synth`: a synthetic container with the real GLM-5.2 per-expert geometry and random
//! weights, in the same layout `nectar convert` writes — how I/O and memory are benchmarked
//! without a 370 GB download. The model loads and runs (its text is noise).
use crate::atomic::write_atomic_bytes;
use crate::dtype::DType;
use crate::error::{Error, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Geometry of a synthetic model.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthSpec {
    /// MoE layers (every layer is MoE; the first is a full-indexer layer).
    pub layers: usize,
    /// Vocabulary (small: the embedding and head are not what is being measured).
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Routed experts per layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Routed expert width.
    pub inter: usize,
    /// Attention heads.
    pub heads: usize,
    /// q_lora / kv_lora ranks.
    pub q_rank: usize,
    /// kv_lora rank.
    pub kv_rank: usize,
    /// (nope, rope, v) head dims.
    pub head_dims: (usize, usize, usize),
    /// Indexer (heads, dim, top-k).
    pub indexer: (usize, usize, usize),
    /// int4 group size of every quantised matrix.
    pub group: usize,
    /// Random seed.
    pub seed: u64,
    /// Add an MTP layer (`model.layers.{layers}.*`, in `out-mtp-00001.safetensors`) whose
    /// routed experts are int8 per-row, as the converter's default writes them.
    pub mtp: bool,
}

impl SynthSpec {
    /// GLM-5.2's real geometry (hidden 6144, 256 experts of 2048, int4 g64) with `layers` MoE
    /// layers and a 4096-token vocabulary.
    pub fn glm52(layers: usize) -> Self {
        SynthSpec {
            layers,
            vocab: 4096,
            hidden: 6144,
            experts: 256,
            top_k: 8,
            inter: 2048,
            heads: 64,
            q_rank: 2048,
            kv_rank: 512,
            head_dims: (192, 64, 256),
            indexer: (32, 128, 2048),
            group: 64,
            seed: 1,
            mtp: false,
        }
    }

    /// A small model of the same structure whose experts are large enough (0.9 MB, 64 per
    /// layer, top-8) for memory tests to see RSS move, and whose spine is a few MB.
    pub fn small(layers: usize) -> Self {
        SynthSpec {
            layers,
            vocab: 1024,
            hidden: 1024,
            experts: 64,
            top_k: 8,
            inter: 512,
            heads: 8,
            q_rank: 256,
            kv_rank: 128,
            head_dims: (64, 32, 64),
            indexer: (4, 64, 64),
            group: 64,
            seed: 1,
            mtp: false,
        }
    }

    /// A tiny model of the same structure (for tests).
    pub fn tiny(layers: usize) -> Self {
        SynthSpec {
            layers,
            vocab: 256,
            hidden: 128,
            experts: 16,
            top_k: 4,
            inter: 64,
            heads: 4,
            q_rank: 64,
            kv_rank: 32,
            head_dims: (16, 16, 16),
            indexer: (4, 32, 16),
            group: 64,
            seed: 1,
            mtp: false,
        }
    }

    /// Bytes of one routed expert on disk (codes + f32 scales).
    pub fn expert_bytes(&self) -> u64 {
        let m = |o: usize, i: usize| (o * i.div_ceil(2) + o * groups(i, self.group) * 4) as u64;
        2 * m(self.inter, self.hidden) + m(self.hidden, self.inter)
    }

    /// The `config.json` of the model.
    pub fn config(&self) -> serde_json::Value {
        let (dn, dr, dv) = self.head_dims;
        serde_json::json!({
            "architectures": ["GlmMoeDsaForCausalLM"],
            "model_type": "glm_moe_dsa",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "first_k_dense_replace": 0,
            "mlp_layer_types": vec!["sparse"; self.layers],
            "intermediate_size": self.inter * 6,
            "moe_intermediate_size": self.inter,
            "n_routed_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "n_shared_experts": 1,
            "n_group": 1, "topk_group": 1,
            "norm_topk_prob": true,
            "routed_scaling_factor": 2.5,
            "scoring_func": "sigmoid",
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.heads,
            "q_lora_rank": self.q_rank,
            "kv_lora_rank": self.kv_rank,
            "qk_nope_head_dim": dn, "qk_rope_head_dim": dr, "v_head_dim": dv,
            "index_n_heads": self.indexer.0, "index_head_dim": self.indexer.1, "index_topk": self.indexer.2,
            "index_topk_freq": 4, "index_skip_topk_offset": 3,
            "rope_parameters": {"rope_theta": 8000000.0, "rope_type": "default"},
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": false,
            "num_nextn_predict_layers": usize::from(self.mtp),
            "eos_token_id": [self.vocab - 3, self.vocab - 2, self.vocab - 1],
            "max_position_embeddings": 1048576,
            "nectar_synthetic": {"seed": self.seed, "group_size": self.group}
        })
    }
}

fn groups(cols: usize, g: usize) -> usize {
    if g == 0 || g >= cols {
        1
    } else {
        cols.div_ceil(g)
    }
}

/// How a synthetic tensor is filled.
#[derive(Debug, Clone, Copy)]
enum Fill {
    /// bf16 ones (norm weights).
    Ones,
    /// f32 zeros (router bias).
    Zeros,
    /// Random bf16 of a small magnitude (router, indexer head weights).
    Bf16Random,
    /// Random int4 codes (packed) + f32 group scales.
    Int4,
    /// Random int8 codes + per-row scales.
    Int8,
}

struct Planned {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    fill: Fill,
    scales_of: Option<usize>, // for `.qs`: the column count of its matrix
}

/// The MTP layer: a decoder layer (full indexer, int8 experts) plus its glue.
fn tensors_of_mtp(s: &SynthSpec) -> Vec<Planned> {
    let l = s.layers;
    let h = s.hidden;
    let mut out = tensors_of_layer(s, l, true, true);
    for n in ["enorm", "hnorm", "shared_head.norm"] {
        out.push(Planned {
            name: format!("model.layers.{l}.{n}.weight"),
            dtype: DType::BF16,
            shape: vec![h],
            fill: Fill::Ones,
            scales_of: None,
        });
    }
    let name = format!("model.layers.{l}.eh_proj.weight");
    out.push(Planned {
        name: format!("{name}.qs"),
        dtype: DType::F32,
        shape: vec![h],
        fill: Fill::Int8,
        scales_of: Some(2 * h),
    });
    out.push(Planned {
        name,
        dtype: DType::I8,
        shape: vec![h, 2 * h],
        fill: Fill::Int8,
        scales_of: None,
    });
    out
}

fn tensors_of_layer(
    s: &SynthSpec,
    l: usize,
    full_indexer: bool,
    int8_experts: bool,
) -> Vec<Planned> {
    let h = s.hidden;
    let (dn, dr, dv) = s.head_dims;
    let p = |n: &str| format!("model.layers.{l}.{n}");
    let mut out = Vec::new();
    let mut vec_ = |name: String, len: usize, fill: Fill, dtype: DType| {
        out.push(Planned {
            name,
            dtype,
            shape: vec![len],
            fill,
            scales_of: None,
        })
    };
    vec_(p("input_layernorm.weight"), h, Fill::Ones, DType::BF16);
    vec_(
        p("post_attention_layernorm.weight"),
        h,
        Fill::Ones,
        DType::BF16,
    );
    vec_(
        p("self_attn.q_a_layernorm.weight"),
        s.q_rank,
        Fill::Ones,
        DType::BF16,
    );
    vec_(
        p("self_attn.kv_a_layernorm.weight"),
        s.kv_rank,
        Fill::Ones,
        DType::BF16,
    );
    vec_(
        p("mlp.gate.e_score_correction_bias"),
        s.experts,
        Fill::Zeros,
        DType::F32,
    );
    let mut mats: Vec<(String, usize, usize, bool)> = vec![
        (p("self_attn.q_a_proj.weight"), s.q_rank, h, false),
        (
            p("self_attn.q_b_proj.weight"),
            s.heads * (dn + dr),
            s.q_rank,
            false,
        ),
        (
            p("self_attn.kv_a_proj_with_mqa.weight"),
            s.kv_rank + dr,
            h,
            false,
        ),
        (
            p("self_attn.kv_b_proj.weight"),
            s.heads * (dn + dv),
            s.kv_rank,
            false,
        ),
        (p("self_attn.o_proj.weight"), h, s.heads * dv, false),
        (p("mlp.shared_experts.gate_proj.weight"), s.inter, h, false),
        (p("mlp.shared_experts.up_proj.weight"), s.inter, h, false),
        (p("mlp.shared_experts.down_proj.weight"), h, s.inter, false),
    ];
    if full_indexer {
        let (ih, id, _) = s.indexer;
        mats.push((p("self_attn.indexer.wq_b.weight"), ih * id, s.q_rank, true));
        mats.push((p("self_attn.indexer.wk.weight"), id, h, true));
        out.push(Planned {
            name: p("self_attn.indexer.k_norm.weight"),
            dtype: DType::BF16,
            shape: vec![id],
            fill: Fill::Ones,
            scales_of: None,
        });
        out.push(Planned {
            name: p("self_attn.indexer.k_norm.bias"),
            dtype: DType::F32,
            shape: vec![id],
            fill: Fill::Zeros,
            scales_of: None,
        });
        out.push(Planned {
            name: p("self_attn.indexer.weights_proj.weight"),
            dtype: DType::BF16,
            shape: vec![ih, h],
            fill: Fill::Bf16Random,
            scales_of: None,
        });
    }
    out.push(Planned {
        name: p("mlp.gate.weight"),
        dtype: DType::BF16,
        shape: vec![s.experts, h],
        fill: Fill::Bf16Random,
        scales_of: None,
    });
    for e in 0..s.experts {
        for (proj, r, c) in [
            ("gate_proj", s.inter, h),
            ("up_proj", s.inter, h),
            ("down_proj", h, s.inter),
        ] {
            mats.push((
                p(&format!("mlp.experts.{e}.{proj}.weight")),
                r,
                c,
                int8_experts,
            ));
        }
    }
    for (name, rows, cols, int8) in mats {
        if int8 {
            out.push(Planned {
                name: name.clone(),
                dtype: DType::I8,
                shape: vec![rows, cols],
                fill: Fill::Int8,
                scales_of: None,
            });
            out.push(Planned {
                name: format!("{name}.qs"),
                dtype: DType::F32,
                shape: vec![rows],
                fill: Fill::Int8,
                scales_of: Some(cols),
            });
        } else {
            let g = groups(cols, s.group);
            out.push(Planned {
                name: name.clone(),
                dtype: DType::U8,
                shape: vec![rows, cols.div_ceil(2)],
                fill: Fill::Int4,
                scales_of: None,
            });
            out.push(Planned {
                name: format!("{name}.qs"),
                dtype: DType::F32,
                shape: vec![rows, g],
                fill: Fill::Int4,
                scales_of: Some(cols),
            });
        }
    }
    out
}

fn globals(s: &SynthSpec) -> Vec<Planned> {
    let (v, h) = (s.vocab, s.hidden);
    let mut out = vec![Planned {
        name: "model.norm.weight".into(),
        dtype: DType::BF16,
        shape: vec![h],
        fill: Fill::Ones,
        scales_of: None,
    }];
    for name in ["model.embed_tokens.weight", "lm_head.weight"] {
        out.push(Planned {
            name: name.into(),
            dtype: DType::I8,
            shape: vec![v, h],
            fill: Fill::Int8,
            scales_of: None,
        });
        out.push(Planned {
            name: format!("{name}.qs"),
            dtype: DType::F32,
            shape: vec![v],
            fill: Fill::Int8,
            scales_of: Some(h),
        });
    }
    out
}

/// A fast deterministic byte stream (xorshift64*), seeded per tensor.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, name: &str) -> Self {
        let mut h = seed ^ 0x9E37_79B9_7F4A_7C15;
        for b in name.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01B3);
        }
        Rng(h | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

fn write_tensor(w: &mut impl Write, t: &Planned, seed: u64) -> std::io::Result<u64> {
    let n: usize = t.shape.iter().product();
    let bytes = n * t.dtype.size();
    let mut rng = Rng::new(seed, &t.name);
    let mut buf = vec![0u8; bytes.min(1 << 22)];
    let mut left = bytes;
    while left > 0 {
        let k = left.min(buf.len());
        let chunk = &mut buf[..k];
        match (t.fill, t.scales_of) {
            (Fill::Ones, _) => chunk
                .chunks_exact_mut(2)
                .for_each(|c| c.copy_from_slice(&half::bf16::ONE.to_le_bytes())),
            (Fill::Zeros, _) => chunk.fill(0),
            (Fill::Bf16Random, _) => chunk.chunks_exact_mut(2).for_each(|c| {
                let v = ((rng.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.05;
                c.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes())
            }),
            (Fill::Int4 | Fill::Int8, Some(cols)) => {
                // Scales so that each output has about half its input's magnitude.
                let std_code = if matches!(t.fill, Fill::Int4) {
                    4.6
                } else {
                    73.0
                };
                let s = 0.5 / ((cols as f32).sqrt() * std_code);
                chunk
                    .chunks_exact_mut(4)
                    .for_each(|c| c.copy_from_slice(&s.to_le_bytes()))
            }
            _ => rng.fill(chunk),
        }
        w.write_all(chunk)?;
        left -= k;
    }
    Ok(bytes as u64)
}

fn write_shard(
    path: &Path,
    mut tensors: Vec<Planned>,
    seed: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<u64> {
    tensors.sort_by(|a, b| {
        b.dtype
            .size()
            .cmp(&a.dtype.size())
            .then(a.name.cmp(&b.name))
    });
    let mut header = serde_json::Map::new();
    let mut pos = 0u64;
    for t in &tensors {
        let len = t.shape.iter().product::<usize>() as u64 * t.dtype.size() as u64;
        header.insert(t.name.clone(), serde_json::json!({"dtype": t.dtype.as_str(), "shape": t.shape, "data_offsets": [pos, pos + len]}));
        pos += len;
    }
    header.insert(
        "__metadata__".into(),
        serde_json::json!({"format": "pt", "nectar.synthetic": "1"}),
    );
    let mut h = serde_json::to_vec(&header).expect("header serialises");
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let tmp = path.with_extension("safetensors.tmp");
    let io = |e| Error::io(&tmp, e);
    let f = File::create(&tmp).map_err(io)?;
    let mut w = BufWriter::with_capacity(1 << 22, f);
    w.write_all(&(h.len() as u64).to_le_bytes()).map_err(io)?;
    w.write_all(&h).map_err(io)?;
    for t in &tensors {
        let n = write_tensor(&mut w, t, seed).map_err(io)?;
        progress(n);
    }
    let f = w
        .into_inner()
        .map_err(|e| Error::io(&tmp, e.into_error()))?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    Ok(8 + h.len() as u64 + pos)
}

/// Writes the synthetic container into `out`: one shard per layer (`out-NNNNN.safetensors`),
/// one for the embedding, norm and head, and `config.json`. `progress(done, total)` reports bytes.
pub fn synth(
    out: &Path,
    spec: &SynthSpec,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let full: Vec<bool> = (0..spec.layers)
        .map(|i| (i + 1).saturating_sub(3) % 4 == 0)
        .collect();
    let total: u64 = spec.layers as u64 * spec.experts as u64 * spec.expert_bytes();
    let mut done = 0u64;
    let mut files = Vec::new();
    for (l, &is_full) in full.iter().enumerate() {
        let path = out.join(format!("out-{:05}.safetensors", l + 1));
        write_shard(
            &path,
            tensors_of_layer(spec, l, is_full, false),
            spec.seed,
            &mut |n| {
                done += n;
                progress(done.min(total), total)
            },
        )?;
        files.push(path);
    }
    let path = out.join(format!("out-{:05}.safetensors", spec.layers + 1));
    write_shard(&path, globals(spec), spec.seed, &mut |_| {})?;
    files.push(path);
    if spec.mtp {
        let path = out.join("out-mtp-00001.safetensors");
        write_shard(&path, tensors_of_mtp(spec), spec.seed, &mut |_| {})?;
        files.push(path);
    }
    let cfg = serde_json::to_vec_pretty(&spec.config()).expect("config serialises");
    write_atomic_bytes(&out.join("config.json"), &cfg)?;
    Ok(files)
}
