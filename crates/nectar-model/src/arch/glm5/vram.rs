//! The VRAM expert tier of a streamed MoE layer: routed experts read once from the model files
//! into VRAM at load (no host copy is kept, so they cost no RAM) and computed on the GPU, while
//! the layer's other experts go through the RAM cache and the CPU (`placement.rs` chooses them).
//!
//! A VRAM expert computes `down(silu(gate·x) ⊙ up·x)` like [`super::moe::SwiGlu`], all on the GPU
//! (every weight dequantised to the CPU's value, sums in the kernels' order, the combine within
//! CUDA's `expf` of the CPU's). Results equal the CPU's within the GPU kernels' tolerance
//! (`nectar_cuda::within_tolerance`), the bar of every GPU product.
use crate::error::Result;

/// A layer's experts in VRAM.
#[cfg(feature = "cuda")]
#[derive(Debug)]
pub(super) struct VramExperts {
    /// Per expert id: its index in `experts`.
    slot: Vec<Option<usize>>,
    /// gate, up, down of each expert held.
    experts: Vec<[crate::blocks::GpuWeight; 3]>,
}

/// Never constructed: a build without the CUDA tier holds no expert in VRAM.
#[cfg(not(feature = "cuda"))]
#[derive(Debug)]
pub(super) enum VramExperts {}

#[cfg(not(feature = "cuda"))]
impl VramExperts {
    pub fn holds(&self, _e: u32) -> bool {
        match *self {}
    }

    pub fn forward(
        &self,
        _x: &super::moe::LayerInput,
        _jobs: &[(u32, Vec<u32>)],
    ) -> Result<Vec<Vec<f32>>> {
        match *self {}
    }

    pub fn forward_into(
        &self,
        _x: &super::moe::LayerInput,
        _jobs: &[(u32, Vec<u32>)],
        _out: &super::gpu_combine::GpuCombine,
    ) -> Result<()> {
        match *self {}
    }
}

#[cfg(feature = "cuda")]
impl VramExperts {
    /// Reads experts `ids` of layer `layer` (of `count`) into VRAM; returns the tier and the
    /// device bytes it uses.
    pub fn load(
        gpu: &std::sync::Arc<nectar_cuda::Gpu>,
        catalog: &nectar_format::Catalog,
        cfg: &super::Config,
        layer: usize,
        count: usize,
        ids: &[u32],
    ) -> Result<(VramExperts, u64)> {
        use crate::blocks::{GpuWeight, Loader};
        // Owned reads (pread), not the shared maps: the host copy is dropped once uploaded and
        // leaves nothing resident behind.
        let ld = Loader::owned(catalog);
        let r = &cfg.raw;
        let (h, inter) = (r.hidden_size, r.moe_intermediate_size);
        let mut t = VramExperts {
            slot: vec![None; count],
            experts: Vec::with_capacity(ids.len()),
        };
        let mut bytes = 0u64;
        for &e in ids {
            let p = |m: &str| format!("model.layers.{layer}.mlp.experts.{e}.{m}_proj.weight");
            let mut up = |name: String, rows, cols| -> Result<GpuWeight> {
                let w = GpuWeight::upload(gpu, &ld.linear(&name, rows, cols)?.mat()?, false)?;
                bytes += w.device_bytes() as u64;
                Ok(w)
            };
            let mats = [
                up(p("gate"), inter, h)?,
                up(p("up"), inter, h)?,
                up(p("down"), h, inter)?,
            ];
            let Some(s) = t.slot.get_mut(e as usize) else {
                return Err(crate::Error::Input(format!(
                    "layer {layer}: VRAM expert {e} of {count}"
                )));
            };
            *s = Some(t.experts.len());
            t.experts.push(mats);
        }
        Ok((t, bytes))
    }

    /// Whether expert `e` is in VRAM.
    pub fn holds(&self, e: u32) -> bool {
        self.slot.get(e as usize).is_some_and(Option::is_some)
    }

    /// The GPU the tier lives on (`None`: it holds no expert).
    pub fn gpu(&self) -> Option<&std::sync::Arc<nectar_cuda::Gpu>> {
        self.experts.first().map(|w| w[0].gpu())
    }

    /// Gate, up and down of expert `e`, when it is in VRAM.
    pub fn mats(&self, e: u32) -> Option<[&crate::blocks::GpuWeight; 3]> {
        let i = self.slot.get(e as usize).copied().flatten()?;
        let w = &self.experts[i];
        Some([&w[0], &w[1], &w[2]])
    }

    /// The output of each `(expert, its rows of the layer's input)`, on the GPU with the
    /// input uploaded once for the layer and each expert's rows gathered there: experts of the
    /// same row count share one launch for their gate and up products and one for their downs.
    pub fn forward(
        &self,
        x: &super::moe::LayerInput,
        jobs: &[(u32, Vec<u32>)],
    ) -> Result<Vec<Vec<f32>>> {
        let mut mlps = Vec::with_capacity(jobs.len());
        for (e, _) in jobs {
            let Some(w) = self.mats(*e) else {
                return Err(crate::Error::Input(format!("expert {e} is not in VRAM")));
            };
            mlps.push(w);
        }
        let Some(first) = mlps.first() else {
            return Ok(Vec::new());
        };
        let rows: Vec<&[u32]> = jobs.iter().map(|(_, r)| r.as_slice()).collect();
        crate::blocks::GpuWeight::swiglu_rows(&mlps, x.on(first[0].gpu())?, &rows)
    }

    /// [`VramExperts::forward`] with each output left in the step's outputs in VRAM, at its
    /// expert's pairs: queued, the same bits.
    pub fn forward_into(
        &self,
        x: &super::moe::LayerInput,
        jobs: &[(u32, Vec<u32>)],
        out: &super::gpu_combine::GpuCombine,
    ) -> Result<()> {
        let mut mlps = Vec::with_capacity(jobs.len());
        let mut first = Vec::with_capacity(jobs.len());
        for (e, _) in jobs {
            let Some(w) = self.mats(*e) else {
                return Err(crate::Error::Input(format!("expert {e} is not in VRAM")));
            };
            mlps.push(w);
            first.push(out.first_of(*e)?);
        }
        let Some(w0) = mlps.first() else {
            return Ok(());
        };
        let rows: Vec<&[u32]> = jobs.iter().map(|(_, r)| r.as_slice()).collect();
        let x = x.on(w0[0].gpu())?;
        crate::blocks::GpuWeight::swiglu_rows_into(&mlps, x, &rows, out.out(), &first)
    }
}
