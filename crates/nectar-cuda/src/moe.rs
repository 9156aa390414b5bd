//! A whole MoE layer's expert work on the GPU when every expert it routes to is in VRAM: the
//! rows cross PCIe once (up), each expert's rows are gathered on the GPU, its SwiGLU chain runs
//! there ([`Gpu::swiglu_views`]' launches), the shared expert too, and the routed outputs are
//! weighted and summed with the shared one on the GPU (`moe.cu`); the layer's output crosses
//! once (down). Done expert by expert from the host instead, a 4,096-token prompt of GLM-5.2
//! shape moved every row through host memory five more times (gather, upload, download,
//! scatter, combine: ~0.8 GB each per layer) and waited once per expert.
//!
//! Bits. Experts with the same row count (and shapes) share launches, as in
//! [`Gpu::swiglu_batch`], and run the kernels [`Kernel::model`](crate::gemv::Kernel) picks
//! for that count, so each expert's output is the one `swiglu_batch` gives it over the same
//! gathered rows; the combine is the host's formula in the host's order, each operation rounded
//! alone. So the layer's output is, bit for bit, what the per-expert path computes (tested).
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::gemv::GpuMat;
use crate::rows::GpuRows;
use crate::swiglu::{at, chain_shape};
use crate::view::MatView;
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

/// Threads per block of the gather and the combine.
const THREADS: u32 = 256;

/// A slot a row does not use (fewer than `k` experts routed).
pub const NO_PAIR: u32 = u32::MAX;

/// How a MoE layer's rows sum their experts: row `r`'s slot `s` takes output row
/// `pairs[r·k + s]` of the experts' outputs (expert after expert, each in the order of its
/// `rows`; [`NO_PAIR`] for an unused slot) times `weights[r·k + s]`, slots in order, then the
/// shared expert's row.
#[derive(Debug, Clone, Copy)]
pub struct MoeCombine<'a> {
    /// Slots per row (top-k).
    pub k: usize,
    /// `m × k` indices into the experts' stacked output rows.
    pub pairs: &'a [u32],
    /// `m × k` combine weights.
    pub weights: &'a [f32],
}

impl Gpu {
    /// One MoE layer's output for `m` rows of `x` (`m × hidden`): routed expert `j` (matrices
    /// `experts[j].0`) on the rows `experts[j].1` of x, the shared expert on all rows, combined
    /// by `combine`. Synchronous.
    ///
    /// Returns [`Error::Memory`] without launching anything when its buffers would take more
    /// than half the VRAM free (the caller then runs the experts one by one).
    pub fn moe_batch(
        &self,
        x: &[f32],
        m: usize,
        experts: &[([&GpuMat; 3], &[u32])],
        shared: [&GpuMat; 3],
        combine: MoeCombine<'_>,
    ) -> Result<Vec<f32>> {
        let views: Vec<([MatView; 3], &[u32])> = experts
            .iter()
            .map(|(w, rows)| (w.map(|w| w.view(&self.stream)), *rows))
            .collect();
        let shared = shared.map(|w| w.view(&self.stream));
        // SAFETY: each view is an uploaded matrix borrowed (alive, unchanged) for this call.
        unsafe { self.moe_views(x, m, &views, shared, combine) }
    }

    /// [`Gpu::moe_batch`] over matrices at device addresses.
    ///
    /// # Safety
    /// As [`Gpu::swiglu_views`]: each view describes memory of this context holding its matrix,
    /// unchanged until this call returns.
    pub unsafe fn moe_views(
        &self,
        x: &[f32],
        m: usize,
        experts: &[([MatView; 3], &[u32])],
        shared: [MatView; 3],
        combine: MoeCombine<'_>,
    ) -> Result<Vec<f32>> {
        let all: Vec<[MatView; 3]> = std::iter::once(shared)
            .chain(experts.iter().map(|(w, _)| *w))
            .collect();
        let Some((inter, hidden)) = chain_shape(&all[..1])? else {
            return Ok(Vec::new());
        };
        chain_shape(&all[1..])?;
        if let Some((w, _)) = experts.first() {
            if (w[0].cols, w[2].rows) != (hidden, hidden) {
                return Err(Error::Shape(format!(
                    "moe: experts take {} features, the shared expert {hidden}",
                    w[0].cols
                )));
            }
        }
        let k = combine.k;
        if Some(x.len()) != m.checked_mul(hidden) {
            return Err(Error::Shape(format!(
                "moe: x {} values for {m} rows × hidden {hidden}",
                x.len()
            )));
        }
        let rows: Vec<u32> = experts
            .iter()
            .flat_map(|(_, r)| r.iter().copied())
            .collect();
        let pairs = rows.len();
        if let Some(r) = rows.iter().find(|&&r| r as usize >= m) {
            return Err(Error::Shape(format!("moe: an expert's row {r} of {m}")));
        }
        combine.check(m, pairs)?;
        if m == 0 {
            return Ok(Vec::new());
        }
        // Experts of one row count share launches, in first-seen order of the counts.
        let mut counts: Vec<usize> = Vec::new();
        for (_, r) in experts {
            if !r.is_empty() && !counts.contains(&r.len()) {
                counts.push(r.len());
            }
        }
        let group_rows = |n: usize| experts.iter().filter(|(_, r)| r.len() == n).count() * n;
        let largest = counts.iter().map(|&n| group_rows(n)).max().unwrap_or(0);
        let expert_inter = experts.first().map_or(0, |(w, _)| w[0].rows);
        let need = scratch_bytes(m, hidden, inter, pairs, largest * expert_inter, k);
        let free = self.ctx.mem_get_info()?.0 as u64;
        if need > free / 2 {
            return Err(Error::Memory { need, free });
        }

        let x_dev = self.to_device(x)?;
        let (xp, _x_sync) = x_dev.device_ptr(&self.stream);
        // The shared expert first: it needs only x.
        let sh = self.nan_filled(m * hidden)?;
        let (shp, _sh_sync) = sh.device_ptr(&self.stream);
        // SAFETY: x and sh are m × hidden of this call's buffers; the views are the contract.
        unsafe { self.enqueue_swiglu(&[shared], &[(xp, shp)], m)? };

        // SAFETY: x_dev holds m × hidden f32 and every row index is < m (checked); the views
        // are this fn's contract.
        let y = unsafe { self.enqueue_gathered(xp, hidden, experts, &rows)? };
        let (yp, _y_sync) = y.device_ptr(&self.stream);
        // SAFETY: sh holds m × hidden f32, y pairs × hidden, and the tables are checked.
        unsafe { self.combine_down(yp, shp, m, hidden, combine) }
    }

    /// `moe_combine` over the experts' rows at `yp` and the shared rows at `shp`, downloaded
    /// (after everything queued before it).
    ///
    /// # Safety
    /// `shp` addresses `m × hidden` f32 of this context and `yp` at least as many rows as any
    /// pair of `combine` names, which [`MoeCombine::check`] has passed for `m`.
    pub(crate) unsafe fn combine_down(
        &self,
        yp: u64,
        shp: u64,
        m: usize,
        hidden: usize,
        combine: MoeCombine<'_>,
    ) -> Result<Vec<f32>> {
        let pair_dev = self.stream.clone_htod(combine.pairs)?;
        let weight_dev = self.stream.clone_htod(combine.weights)?;
        let out = self.nan_filled(m * hidden)?;
        let (op, _o_sync) = out.device_ptr(&self.stream);
        let (pp, _p_sync) = pair_dev.device_ptr(&self.stream);
        let (wp, _w_sync) = weight_dev.device_ptr(&self.stream);
        let (m_arg, k_arg, h_arg) = (m as i64, combine.k as i32, hidden as i64);
        let func = self.function("moe_combine")?;
        let mut b = self.stream.launch_builder(&func);
        b.arg(&op).arg(&yp).arg(&shp).arg(&pp).arg(&wp);
        b.arg(&m_arg).arg(&k_arg).arg(&h_arg);
        // SAFETY: out holds m × hidden f32, the tables m × k; the rest is the contract.
        unsafe { b.launch(grid(m * hidden)) }?;
        self.to_host(&out)
    }
}

impl MoeCombine<'_> {
    /// Tables of `m × k` entries whose pairs are below `pairs` (or [`NO_PAIR`]).
    pub(crate) fn check(&self, m: usize, pairs: usize) -> Result<()> {
        let k = self.k;
        if Some(self.pairs.len()) != m.checked_mul(k) || self.weights.len() != self.pairs.len() {
            return Err(Error::Shape(format!(
                "moe: pairs {}, weights {} for {m} rows × k {k}",
                self.pairs.len(),
                self.weights.len()
            )));
        }
        match self
            .pairs
            .iter()
            .find(|&&p| p != NO_PAIR && p as usize >= pairs)
        {
            Some(p) => Err(Error::Shape(format!(
                "moe: a slot takes pair {p} of {pairs}"
            ))),
            None => Ok(()),
        }
    }
}

impl Gpu {
    /// Queues each routed expert of `experts` over its rows of the `rows × hidden` f32 at
    /// device address `xp`: the rows gathered (`moe_gather`) expert after expert, then the
    /// chains of experts with one row count together, first-seen order of the counts (each
    /// expert's bits are its `swiglu_batch` output over the same rows). Returns the experts'
    /// outputs, stacked in the order given (`flat` = every expert's rows, concatenated).
    ///
    /// # Safety
    /// `xp` addresses more rows than any index in `flat`, `hidden` f32 each, of this context,
    /// unchanged until the stream passes; the views as [`Gpu::swiglu_views`].
    unsafe fn enqueue_gathered(
        &self,
        xp: u64,
        hidden: usize,
        experts: &[([MatView; 3], &[u32])],
        flat: &[u32],
    ) -> Result<CudaSlice<f32>> {
        let y = self.nan_filled(flat.len().max(1) * hidden)?;
        let (yp, y_sync) = y.device_ptr(&self.stream);
        let mut at_y = Vec::with_capacity(experts.len());
        let mut next = 0;
        for (_, r) in experts {
            at_y.push(at(yp, next * hidden));
            next += r.len();
        }
        // SAFETY: this fn's contract; expert j's rows of `y` start at `at_y[j]`, disjoint.
        unsafe { self.enqueue_gathered_at(xp, hidden, experts, flat, &at_y)? };
        drop(y_sync);
        Ok(y)
    }

    /// [`Gpu::enqueue_gathered`] writing expert `j`'s output rows from the device address
    /// `ys[j]` (a layer's outputs kept in VRAM, `moe_out.rs`).
    ///
    /// # Safety
    /// As [`Gpu::enqueue_gathered`]; each `ys[j]` addresses `experts[j].1.len() × hidden` f32
    /// of this context that nothing else uses until the stream passes.
    pub(crate) unsafe fn enqueue_gathered_at(
        &self,
        xp: u64,
        hidden: usize,
        experts: &[([MatView; 3], &[u32])],
        flat: &[u32],
        ys: &[u64],
    ) -> Result<()> {
        let pairs = flat.len();
        if pairs == 0 {
            return Ok(());
        }
        if ys.len() != experts.len() {
            return Err(Error::Shape(format!(
                "moe: {} outputs for {} experts",
                ys.len(),
                experts.len()
            )));
        }
        let rows_dev = self.stream.clone_htod(flat)?;
        // SAFETY: written by the gather below before the experts read it.
        let xg: CudaSlice<f32> = unsafe { self.stream.alloc(pairs * hidden)? };
        let (rp, _r_sync) = rows_dev.device_ptr(&self.stream);
        let (gp, _g_sync) = xg.device_ptr(&self.stream);
        let (p_arg, h_arg) = (pairs as i64, hidden as i64);
        let func = self.function("moe_gather")?;
        let mut b = self.stream.launch_builder(&func);
        b.arg(&gp).arg(&xp).arg(&rp).arg(&p_arg).arg(&h_arg);
        // SAFETY: xg holds pairs × hidden f32; x's rows and the indices are the contract.
        unsafe { b.launch(grid(pairs * hidden)) }?;
        let mut counts: Vec<usize> = Vec::new();
        for (_, r) in experts {
            if !r.is_empty() && !counts.contains(&r.len()) {
                counts.push(r.len());
            }
        }
        let mut offset = Vec::with_capacity(experts.len());
        let mut next = 0;
        for (_, r) in experts {
            offset.push(next);
            next += r.len();
        }
        for n in counts {
            let (mlps, io): (Vec<[MatView; 3]>, Vec<(u64, u64)>) = experts
                .iter()
                .zip(&offset)
                .zip(ys)
                .filter(|(((_, r), _), _)| r.len() == n)
                .map(|(((w, _), &o), &y)| (*w, (at(gp, o * hidden), y)))
                .unzip();
            // SAFETY: each x is n rows of xg, each y n rows at the caller's disjoint address;
            // the views are this fn's contract.
            unsafe { self.enqueue_swiglu(&mlps, &io, n)? };
        }
        Ok(())
    }

    /// A MoE layer's input, `m` rows of `width` f32, uploaded once for the experts that run on
    /// the GPU one batch at a time ([`Gpu::swiglu_rows`]): each then gathers its rows there
    /// instead of the host gathering, uploading and the GPU taking them again per expert.
    pub fn upload_rows(&self, x: &[f32], width: usize) -> Result<GpuRows> {
        if width == 0 || !x.len().is_multiple_of(width) {
            return Err(Error::Shape(format!(
                "upload_rows: {} values in rows of {width}",
                x.len()
            )));
        }
        Ok(GpuRows::new(self.to_device(x)?, x.len() / width, width))
    }

    /// [`Gpu::swiglu_rows`] over uploaded matrices.
    pub fn swiglu_rows_mats(
        &self,
        mlps: &[[&GpuMat; 3]],
        x: &GpuRows,
        rows: &[&[u32]],
    ) -> Result<Vec<Vec<f32>>> {
        // SAFETY: each view is an uploaded matrix borrowed (alive, unchanged) for this call.
        unsafe { self.swiglu_rows(&self.mlp_views(mlps), x, rows) }
    }

    /// Each `mlps[j]`'s SwiGLU over the rows `rows[j]` of `x` (gathered on the GPU), downloaded:
    /// the bits of [`Gpu::swiglu_views`] over those rows gathered on the host (the same
    /// kernels for each row count). Synchronous.
    ///
    /// # Safety
    /// As [`Gpu::swiglu_views`]: each view describes memory of this context holding its
    /// matrix, unchanged until this call returns.
    pub unsafe fn swiglu_rows(
        &self,
        mlps: &[[MatView; 3]],
        x: &GpuRows,
        rows: &[&[u32]],
    ) -> Result<Vec<Vec<f32>>> {
        let Some((_, hidden)) = chain_shape(mlps)? else {
            return Ok(Vec::new());
        };
        if rows.len() != mlps.len() || x.width() != hidden {
            return Err(Error::Shape(format!(
                "swiglu_rows: {} row lists for {} MLPs, rows of {} for hidden {hidden}",
                rows.len(),
                mlps.len(),
                x.width()
            )));
        }
        let flat: Vec<u32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        if let Some(r) = flat.iter().find(|&&r| r as usize >= x.rows()) {
            return Err(Error::Shape(format!(
                "swiglu_rows: row {r} of {}",
                x.rows()
            )));
        }
        let experts: Vec<([MatView; 3], &[u32])> =
            mlps.iter().copied().zip(rows.iter().copied()).collect();
        let (xp, _x_sync) = x.buf.device_ptr(&self.stream);
        // SAFETY: x holds x.rows() × hidden f32, every index is below x.rows() (checked); the
        // views are this fn's contract.
        let y_dev = unsafe { self.enqueue_gathered(xp, hidden, &experts, &flat)? };
        let mut y = vec![0.0f32; flat.len() * hidden];
        self.to_host_into(&y_dev, &mut y)?;
        // One MLP (a copied expert): its output as downloaded, without a copy.
        if rows.len() == 1 {
            return Ok(vec![y]);
        }
        let mut out = Vec::with_capacity(rows.len());
        let mut next = 0;
        for r in rows {
            out.push(y[next * hidden..(next + r.len()) * hidden].to_vec());
            next += r.len();
        }
        Ok(out)
    }
}

/// Device bytes [`Gpu::moe_views`] allocates at its peak: x, the shared expert's output and
/// scratch, the gathered rows and the experts' outputs, the largest group's gate/up scratch
/// (`group_inter` = its rows × the experts' intermediate size), the output and the tables.
fn scratch_bytes(
    m: usize,
    hidden: usize,
    inter: usize,
    pairs: usize,
    group_inter: usize,
    k: usize,
) -> u64 {
    let floats = 3 * m * hidden + 2 * m * inter + 2 * pairs * hidden + 2 * group_inter;
    (4 * floats + 4 * pairs + 8 * m * k) as u64
}

/// A grid-stride launch over `n` elements.
fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(THREADS as usize).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}
