//! `--gpu-memory`: which of the model's matrices live in VRAM and run on the GPU.
//!
//! Placement order (hottest classes first, as much as fits): every layer's attention and
//! indexer matrices, the dense MLPs, routers and shared experts (read by every token), the MTP
//! layer's, then the LM head, then resident routed experts (only when experts are not streamed).
//! A matrix that does not fit is skipped and the next tried. Without a usable GPU (or without
//! the `cuda` feature) nothing moves and the summary says why: the model runs on the CPU.
use super::Glm5;
use crate::error::Result;

/// Where the model's matrices run.
#[derive(Debug, Clone, Default)]
pub struct GpuPlacement {
    /// One line for the user: the device and what was placed, or why everything stays on the
    /// CPU.
    pub summary: String,
    /// Matrices placed in VRAM.
    pub matrices: usize,
    /// Device bytes they use.
    pub bytes: u64,
    /// Matrices left on the CPU because the budget ran out.
    pub left_on_cpu: usize,
}

/// Places matrices within `budget` bytes of VRAM.
#[cfg(not(feature = "cuda"))]
pub(super) fn place(_model: &mut Glm5, _budget: u64) -> Result<GpuPlacement> {
    Ok(GpuPlacement {
        summary: "--gpu-memory: this nectar was built without the CUDA tier (rebuild with \
                  `--features cuda`); running on the CPU"
            .into(),
        ..Default::default()
    })
}

/// Places matrices within `budget` bytes of VRAM.
#[cfg(feature = "cuda")]
pub(super) fn place(model: &mut Glm5, budget: u64) -> Result<GpuPlacement> {
    let gpu = match crate::blocks::open_gpu() {
        Ok(g) => g,
        Err(why) => {
            return Ok(GpuPlacement {
                summary: format!("--gpu-memory: {why}; running on the CPU"),
                ..Default::default()
            })
        }
    };
    let mut p = GpuPlacement::default();
    let mut place_all = |ls: Vec<&mut crate::blocks::Linear>| -> Result<()> {
        for l in ls {
            if p.bytes + l.bytes() as u64 > budget {
                p.left_on_cpu += 1;
                continue;
            }
            p.bytes += l.place_on_gpu(&gpu)? as u64;
            p.matrices += 1;
        }
        Ok(())
    };
    for layer in &mut model.layers {
        place_all(layer.attn.linears_mut())?;
    }
    for layer in &mut model.layers {
        place_all(layer.mlp.spine_linears_mut())?;
    }
    if let Some(mtp) = &mut model.mtp {
        let mut v = vec![&mut mtp.eh_proj];
        v.extend(mtp.layer.attn.linears_mut());
        v.extend(mtp.layer.mlp.spine_linears_mut());
        place_all(v)?;
    }
    let mut heads = vec![&mut model.lm_head];
    if let Some(h) = model.mtp.as_mut().and_then(|m| m.head.as_mut()) {
        heads.push(h);
    }
    place_all(heads)?;
    for layer in &mut model.layers {
        place_all(layer.mlp.resident_expert_linears_mut())?;
    }
    if let Some(mtp) = &mut model.mtp {
        place_all(mtp.layer.mlp.resident_expert_linears_mut())?;
    }
    p.summary = format!(
        "GPU: {} — {} matrices ({:.1} MiB) in VRAM, {} left on the CPU",
        gpu.describe(),
        p.matrices,
        p.bytes as f64 / (1u64 << 20) as f64,
        p.left_on_cpu
    );
    Ok(p)
}
