//! A streamed MoE layer's expert outputs kept in VRAM and combined there ([`GpuMoeOut`]).
//!
//! Under `--memory-budget` a layer's experts run in three places: the VRAM tier, copied from
//! their RAM slot to the GPU, and the CPU. Each GPU expert used to download its output and the
//! host combined the rows: at a prompt that is every (row, slot) pair's `hidden` floats down
//! (a GLM-5.2 layer at 8,192 rows: 1.6 GB into freshly faulted host memory, then read again by
//! the combine), and a wait after every expert. Here the GPU experts write their outputs into
//! one buffer of the layer's pairs, the CPU experts' outputs (and the shared expert's when it
//! ran on the CPU) go up into theirs, and `moe_combine` sums each row on the GPU: the layer's
//! output crosses once, `m × hidden` floats.
//!
//! Bits: each expert's output is the one [`Gpu::swiglu_rows`] gives it (the same launches for
//! its row count), a CPU output is copied unchanged, and `moe_combine` is the host's formula in
//! the host's order — so the layer's output is, bit for bit, what the per-expert path and the
//! host's combine compute (tested in `moe_parity.rs`).
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::gemv::GpuMat;
use crate::moe::MoeCombine;
use crate::rows::GpuRows;
use crate::swiglu::{at, chain_shape};
use crate::view::MatView;
use cudarc::driver::{CudaSlice, DevicePtr};

/// One layer step's outputs in VRAM: the routed experts' `pairs × hidden` rows (each expert's
/// rows together, from its first pair) and the shared expert's `m × hidden`. Every element
/// starts as NaN, so a pair no expert wrote reaches the output as NaN, never as a stale value.
#[derive(Debug)]
pub struct GpuMoeOut {
    y: CudaSlice<f32>,
    shared: CudaSlice<f32>,
    m: usize,
    hidden: usize,
    pairs: usize,
}

impl GpuMoeOut {
    /// Rows of the step.
    pub fn rows(&self) -> usize {
        self.m
    }

    /// (row, slot) pairs the experts write.
    pub fn pairs(&self) -> usize {
        self.pairs
    }

    /// Whether pairs `first .. first + n` lie inside the buffer.
    fn check(&self, first: usize, n: usize) -> Result<()> {
        match first.checked_add(n) {
            Some(end) if end <= self.pairs => Ok(()),
            _ => Err(Error::Shape(format!(
                "moe out: pairs {first} + {n} of {}",
                self.pairs
            ))),
        }
    }
}

impl Gpu {
    /// Buffers for a layer step of `m` rows of `hidden` with `pairs` routed (row, slot)
    /// pairs. [`Error::Memory`] (nothing allocated) when they and the combine's output would
    /// take more than half the VRAM free: the caller then downloads expert by expert.
    pub fn moe_out(&self, m: usize, hidden: usize, pairs: usize) -> Result<GpuMoeOut> {
        let floats = (pairs.max(1) + 2 * m.max(1)) as u64 * hidden.max(1) as u64;
        let need = 4 * floats + 8 * pairs as u64;
        let free = self.ctx.mem_get_info()?.0 as u64;
        if need > free / 2 {
            return Err(Error::Memory { need, free });
        }
        Ok(GpuMoeOut {
            y: self.nan_filled(pairs.max(1) * hidden.max(1))?,
            shared: self.nan_filled(m.max(1) * hidden.max(1))?,
            m,
            hidden,
            pairs,
        })
    }

    /// Queues `mlps[j]` over the rows `rows[j]` of `x` (gathered on the GPU), its output into
    /// pairs `first[j] ..` of `out`: [`Gpu::swiglu_rows`]' launches and bits, nothing
    /// downloaded, nothing waited for.
    ///
    /// # Safety
    /// As [`Gpu::swiglu_views`]: each view describes memory of this context holding its
    /// matrix, unchanged until the stream has passed these launches (a staged expert's slot is
    /// released after them, `copy::Staging::release`).
    pub unsafe fn swiglu_rows_into(
        &self,
        mlps: &[[MatView; 3]],
        x: &GpuRows,
        rows: &[&[u32]],
        out: &GpuMoeOut,
        first: &[usize],
    ) -> Result<()> {
        let Some((_, hidden)) = chain_shape(mlps)? else {
            return Ok(());
        };
        if rows.len() != mlps.len()
            || first.len() != mlps.len()
            || x.width() != hidden
            || out.hidden != hidden
        {
            return Err(Error::Shape(format!(
                "swiglu_rows_into: {} row lists and {} offsets for {} MLPs, rows of {} and \
                 outputs of {} for hidden {hidden}",
                rows.len(),
                first.len(),
                mlps.len(),
                x.width(),
                out.hidden
            )));
        }
        for (r, &f) in rows.iter().zip(first) {
            out.check(f, r.len())?;
        }
        let flat: Vec<u32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        if let Some(r) = flat.iter().find(|&&r| r as usize >= x.rows()) {
            return Err(Error::Shape(format!(
                "swiglu_rows_into: row {r} of {}",
                x.rows()
            )));
        }
        let experts: Vec<([MatView; 3], &[u32])> =
            mlps.iter().copied().zip(rows.iter().copied()).collect();
        let (xp, _x_sync) = x.buf.device_ptr(&self.stream);
        let (yp, _y_sync) = out.y.device_ptr(&self.stream);
        let ys: Vec<u64> = first.iter().map(|&f| at(yp, f * hidden)).collect();
        // SAFETY: x holds x.rows() × hidden f32 and every index is below x.rows() (checked);
        // each expert's output pairs lie inside `out.y` (checked); the views are this fn's
        // contract.
        unsafe { self.enqueue_gathered_at(xp, hidden, &experts, &flat, &ys) }
    }

    /// [`Gpu::swiglu_rows_into`] over uploaded matrices.
    pub fn swiglu_rows_into_mats(
        &self,
        mlps: &[[&GpuMat; 3]],
        x: &GpuRows,
        rows: &[&[u32]],
        out: &GpuMoeOut,
        first: &[usize],
    ) -> Result<()> {
        // SAFETY: each view is an uploaded matrix borrowed (alive, unchanged) for this call,
        // and a matrix is freed in stream order, after the launches queued here.
        unsafe { self.swiglu_rows_into(&self.mlp_views(mlps), x, rows, out, first) }
    }

    /// Queues the shared expert over every row of `x` into `out`'s shared rows: the launches
    /// (and bits) of [`Gpu::swiglu_batch`] over the same `m` rows.
    pub fn shared_into_mats(&self, mlp: [&GpuMat; 3], x: &GpuRows, out: &GpuMoeOut) -> Result<()> {
        let views = self.mlp_views(&[mlp]);
        let Some((_, hidden)) = chain_shape(&views)? else {
            return Ok(());
        };
        if (x.rows(), x.width()) != (out.m, hidden) || out.hidden != hidden {
            return Err(Error::Shape(format!(
                "shared_into: {} rows of {} for {} rows of hidden {hidden}",
                x.rows(),
                x.width(),
                out.m
            )));
        }
        let (xp, _x_sync) = x.buf.device_ptr(&self.stream);
        let (sp, _s_sync) = out.shared.device_ptr(&self.stream);
        // SAFETY: x and the shared rows hold m × hidden f32 (checked); the views are uploaded
        // matrices borrowed for this call and freed in stream order.
        unsafe { self.enqueue_swiglu(&views, &[(xp, sp)], out.m) }
    }

    /// An expert's output computed on the CPU, `y` (its rows × hidden), into pairs `first ..`
    /// of `out`. Queued; `y` may be reused when this returns.
    pub fn upload_pairs(&self, out: &GpuMoeOut, first: usize, y: &[f32]) -> Result<()> {
        if out.hidden == 0 || !y.len().is_multiple_of(out.hidden) {
            return Err(Error::Shape(format!(
                "upload_pairs: {} values in rows of {}",
                y.len(),
                out.hidden
            )));
        }
        out.check(first, y.len() / out.hidden)?;
        if y.is_empty() {
            return Ok(());
        }
        let (yp, _sync) = out.y.device_ptr(&self.stream);
        // SAFETY: the pairs lie inside `out.y` (checked), which only this stream uses.
        unsafe { self.upload_at(at(yp, first * out.hidden), y) }
    }

    /// The shared expert's output computed on the CPU (`m × hidden`) into `out`. Queued.
    pub fn upload_shared(&self, out: &GpuMoeOut, y: &[f32]) -> Result<()> {
        if Some(y.len()) != out.m.checked_mul(out.hidden) {
            return Err(Error::Shape(format!(
                "upload_shared: {} values for {} rows of {}",
                y.len(),
                out.m,
                out.hidden
            )));
        }
        let (sp, _sync) = out.shared.device_ptr(&self.stream);
        // SAFETY: the shared rows hold m × hidden f32 (checked), used only on this stream.
        unsafe { self.upload_at(sp, y) }
    }

    /// The layer's output: row `r` sums `combine.weights[r·k + s]` × pair
    /// `combine.pairs[r·k + s]` of `out` over its slots in order, then adds its shared row
    /// (`moe_combine`, the host's order); downloaded, after everything queued before it.
    pub fn moe_out_combine(&self, out: &GpuMoeOut, combine: MoeCombine<'_>) -> Result<Vec<f32>> {
        combine.check(out.m, out.pairs)?;
        if out.m == 0 || out.hidden == 0 {
            return Ok(Vec::new());
        }
        let (yp, _y_sync) = out.y.device_ptr(&self.stream);
        let (shp, _sh_sync) = out.shared.device_ptr(&self.stream);
        // SAFETY: the shared rows hold m × hidden f32, the experts' rows pairs × hidden, and
        // the tables are checked against both.
        unsafe { self.combine_down(yp, shp, out.m, out.hidden, combine) }
    }
}

/// A point of the GPU's stream ([`Gpu::mark`]): two of them time the work queued between them
/// without the host waiting in between (a copied expert's products, queued and left running).
#[derive(Debug)]
pub struct StreamMark(cudarc::driver::CudaEvent);

impl Gpu {
    /// Marks the stream here: the mark completes when the work queued before it has.
    pub fn mark(&self) -> Result<StreamMark> {
        let e = self
            .ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        e.record(&self.stream)?;
        Ok(StreamMark(e))
    }
}

impl StreamMark {
    /// GPU seconds from `start` to this mark, once this mark is reached (waits for it).
    pub fn seconds_since(&self, start: &StreamMark) -> Result<f64> {
        self.0.synchronize()?;
        Ok(f64::from(start.0.elapsed_ms(&self.0)?) / 1e3)
    }
}
