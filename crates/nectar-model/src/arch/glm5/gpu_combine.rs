//! A streamed MoE layer step combined on the GPU (`--gpu-memory` with `--memory-budget`): the
//! experts that run there (VRAM tier, copied) leave their outputs in VRAM
//! (`nectar_cuda::GpuMoeOut`), the CPU's experts and a CPU shared expert send theirs up in one
//! block, and each row is summed there; the layer's output comes down once. Downloading every
//! GPU expert's output instead moved `hidden` floats per (row, slot) pair through freshly
//! faulted host memory and waited after each expert: on a 2-layer GLM-5.2-geometry synth with
//! 32 experts, an 8,192-token prompt's VRAM experts spent 0.41–0.75 s per layer downloading,
//! against 10–18 ms of work. Steps of fewer than [`MIN_ROWS`] rows (decode) keep the
//! downloads.
//!
//! The pairs are laid out GPU experts first, then the CPU's (each group in the union's order),
//! so the CPU block is one upload. The sums are the host combine's, in its order (`moe.cu`), so
//! the output is the per-expert path's bit for bit. `NECTAR_GPU_MOE_COMBINE=off` keeps the
//! per-expert downloads and the host combine (to compare).
#[cfg(feature = "cuda")]
use super::moe::{LayerInput, Route};
use crate::error::Result;

/// Whether `NECTAR_GPU_MOE_COMBINE` leaves the GPU combine on (anything but `off` / `0`), read
/// once.
#[cfg(feature = "cuda")]
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("NECTAR_GPU_MOE_COMBINE").as_deref(),
            Ok("off" | "0")
        )
    })
}

/// Rows from which a step sums on the GPU. A decode step's outputs are a few KB: there the
/// buffers, tables and stream marks cost more than the downloads they save (decode with copied
/// experts measured 0.90–0.94× with every step combined on the GPU, `benchmarks/RESULTS.md`).
#[cfg(feature = "cuda")]
const MIN_ROWS: usize = 9;

/// One layer step's outputs in VRAM and where each union entry's rows lie.
#[cfg(feature = "cuda")]
#[derive(Debug)]
pub(super) struct GpuCombine {
    gpu: std::sync::Arc<nectar_cuda::Gpu>,
    out: nectar_cuda::GpuMoeOut,
    /// Per union entry, its first pair.
    first: Vec<usize>,
    /// Per expert id, its union entry (`usize::MAX`: not routed this step).
    entry: Vec<usize>,
    /// The union entries computed on the CPU, in order; their pairs follow the GPU's.
    cpu: Vec<usize>,
    /// `m × k` pair index and weight of each (row, slot).
    pairs: Vec<u32>,
    weights: Vec<f32>,
    k: usize,
}

/// Never constructed: a build without the CUDA tier combines on the host.
#[cfg(not(feature = "cuda"))]
#[derive(Debug)]
pub(super) enum GpuCombine {}

#[cfg(feature = "cuda")]
/// The union of a step: each expert with its (row, slot) pairs, first-seen order.
pub(super) type Union = [(u32, Vec<(usize, usize)>)];

#[cfg(not(feature = "cuda"))]
impl GpuCombine {
    pub fn first_of(&self, _e: u32) -> Result<usize> {
        match *self {}
    }
}

#[cfg(feature = "cuda")]
impl GpuCombine {
    /// The step's buffers on `gpu` when the combine is on, any expert runs on the GPU
    /// (`on_gpu[u]` for union entry u) and they fit the VRAM free; else `None` (the caller
    /// downloads expert by expert). `entry`: each expert id's union entry (`usize::MAX`: not
    /// routed), as the step found them.
    pub fn new(
        gpu: &std::sync::Arc<nectar_cuda::Gpu>,
        hidden: usize,
        entry: &[usize],
        k: usize,
        routes: &[Route],
        union: &Union,
        on_gpu: &[bool],
    ) -> Result<Option<GpuCombine>> {
        if !enabled() || routes.len() < MIN_ROWS || !on_gpu.iter().any(|&g| g) {
            return Ok(None);
        }
        let m = routes.len();
        let mut first = vec![0; union.len()];
        let mut next = 0;
        let mut cpu = Vec::new();
        for gpu_side in [true, false] {
            for (u, (_, rows)) in union.iter().enumerate() {
                if on_gpu[u] == gpu_side {
                    first[u] = next;
                    next += rows.len();
                    if !gpu_side {
                        cpu.push(u);
                    }
                }
            }
        }
        let out = match gpu.moe_out(m, hidden, next) {
            Ok(o) => o,
            Err(nectar_cuda::Error::Memory { .. }) => return Ok(None),
            Err(e) => return Err(crate::Error::Gpu(e.to_string())),
        };
        let mut pairs = vec![nectar_cuda::NO_PAIR; m * k];
        let mut weights = vec![0.0f32; m * k];
        for (u, (_, rows)) in union.iter().enumerate() {
            for (j, &(i, s)) in rows.iter().enumerate() {
                pairs[i * k + s] = (first[u] + j) as u32;
                weights[i * k + s] = routes[i].weights[s];
            }
        }
        Ok(Some(GpuCombine {
            gpu: gpu.clone(),
            out,
            first,
            entry: entry.to_vec(),
            cpu,
            pairs,
            weights,
            k,
        }))
    }

    /// The outputs in VRAM, for the experts that write there.
    pub fn out(&self) -> &nectar_cuda::GpuMoeOut {
        &self.out
    }

    /// The first pair of expert `e`'s rows.
    pub fn first_of(&self, e: u32) -> Result<usize> {
        match self.entry.get(e as usize) {
            Some(&u) if u != usize::MAX => Ok(self.first[u]),
            _ => Err(crate::Error::Input(format!(
                "expert {e} is not routed in this step"
            ))),
        }
    }

    /// The layer's output: the CPU experts' outputs (`ys[u]` for each CPU entry u, its rows ×
    /// hidden) up in one block, the shared expert — run here over `input` when its matrices
    /// are in VRAM (`shared_gpu`), else `shared_host` uploaded — then every row summed on the
    /// GPU and downloaded. Waits for everything queued before it.
    pub fn finish(
        self,
        union: &Union,
        ys: &[Vec<f32>],
        shared_gpu: Option<[&crate::blocks::GpuWeight; 3]>,
        shared_host: Option<&[f32]>,
        input: &LayerInput<'_>,
    ) -> Result<Vec<f32>> {
        let gpu_err = |e: nectar_cuda::Error| crate::Error::Gpu(e.to_string());
        let hidden = input.hidden();
        let mut block = Vec::new();
        for &u in &self.cpu {
            let (e, rows) = &union[u];
            if ys[u].len() != rows.len() * hidden {
                return Err(crate::Error::Input(format!(
                    "expert {e} gave {} values for {} rows",
                    ys[u].len(),
                    rows.len()
                )));
            }
            block.extend_from_slice(&ys[u]);
        }
        if let Some(&u) = self.cpu.first() {
            self.gpu
                .upload_pairs(&self.out, self.first[u], &block)
                .map_err(gpu_err)?;
        }
        match (shared_host, shared_gpu) {
            (Some(s), _) => self.gpu.upload_shared(&self.out, s).map_err(gpu_err)?,
            (None, Some(w)) => {
                crate::blocks::GpuWeight::shared_into(w, input.on(&self.gpu)?, &self.out)?
            }
            (None, None) => {
                return Err(crate::Error::Gpu(
                    "the shared expert is neither computed nor in VRAM".into(),
                ))
            }
        }
        let combine = nectar_cuda::MoeCombine {
            k: self.k,
            pairs: &self.pairs,
            weights: &self.weights,
        };
        self.gpu
            .moe_out_combine(&self.out, combine)
            .map_err(gpu_err)
    }
}
