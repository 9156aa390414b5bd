//! y = W·x on the GPU for weights in their stored format (`gemv.cu`): upload a matrix once,
//! then run products of M = 1…8 activation rows (larger M in chunks of 8), one matrix or a batch
//! of same-shaped matrices (a layer's experts) per launch.
//!
//! The layout knowledge is nectar-kernels' ([`WeightFormat::row_bytes`],
//! [`WeightFormat::row_scales`], [`MatRef::validate`]); this module only maps a format to a kernel
//! and passes those numbers. Results are not bit-identical to the CPU's (the summation order
//! differs; `gemv.cu` states it), but each row's result is the same whatever M and whatever else
//! shares the launch.
use crate::device::Gpu;
use crate::divide;
use crate::error::{Error, Result};
use crate::gemm::{use_gemm, Precision};
use crate::view::MatView;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
use nectar_kernels::{MatRef, WeightFormat};

/// Activation rows one launch handles; larger M runs in chunks of this many.
pub const MAX_M: usize = 8;
/// Threads per block (4 warps); `gemv.cu`'s `__launch_bounds__`.
const BLOCK_THREADS: u32 = 128;

/// How quantised weights meet their scales (`gemv.cu` states both orders).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Order {
    /// Each weight dequantised exactly as the CPU does (`code × scale` in f32), then one FMA.
    Exact,
    /// A 32-bit word's codes summed first, then one FMA by their shared scale (fewer
    /// instructions per weight; a different rounding of the same sum). Float formats and the
    /// scalar path ignore it.
    Word,
    /// The tensor-core GEMV (`gemv_tc.cu`) for int4, int8 and bf16 weights whose layout admits
    /// it ([`GemvPlan::tensor`]): codes and bf16 weights exact, activations in three bf16
    /// parts, f32 sums per 16-column step; its cost hardly grows with M up to 8. Other layouts
    /// and formats take the `Exact` kernels.
    Tensor,
}

impl Order {
    /// The order the model's products use (its GPU matrices and copied experts): one place,
    /// so a staged expert and a VRAM matrix always compute the same bits.
    pub const MODEL: Order = Order::Tensor;

    /// `exact` / `word` / `tensor`.
    pub fn name(self) -> &'static str {
        match self {
            Order::Exact => "exact",
            Order::Word => "word",
            Order::Tensor => "tensor",
        }
    }

    /// Whether this order runs the tensor-core GEMV where the layout admits it.
    pub fn tensor(self) -> bool {
        self == Order::Tensor
    }
}

/// Warps per block of the tensor-core GEMV (`TC_WARPS`); each takes every fourth 64-column step.
const TC_THREADS: u32 = 128;

/// The tensor-core GEMV's base name for a format, if it has one.
fn tc_base(format: WeightFormat) -> Option<&'static str> {
    match format {
        WeightFormat::Int4Row | WeightFormat::Int4Group { .. } => Some("i4"),
        WeightFormat::Int8Row => Some("i8"),
        WeightFormat::Bf16 => Some("bf16"),
        WeightFormat::F32 | WeightFormat::F16 => None,
    }
}

/// Rows one warp computes at `m` activation rows (`ROWS_PER_WARP` in `gemv.cu`; the integer
/// kernels' `GEMV_WORDS` lines use the same).
fn rows_per_warp(m: usize) -> u32 {
    match m {
        0..=2 => 8,
        3..=4 => 4,
        _ => 2,
    }
}

/// Launches of fewer weight rows than this (rows × matrices) take the integer kernels with four
/// words per row in flight (`_u4`) instead of two, and the tensor-core GEMV one row tile per
/// warp instead of four: they have too few warps to cover the memory latency otherwise
/// (tensor-core GEMV, lone expert gate int4-g64 at M = 1: 18.7 µs with one tile, 23.8 with
/// four; a token's 16 gate/up matrices: 82.6 µs with one, 58.9 with four). Measured on the H200 (benchmarks/RESULTS.md): a lone expert gate 2048 ×
/// 6144 int4-g64 at M = 1 took 16.1 µs with four against 19.5 with two, attention o_proj 6144 ×
/// 16384 51.5 against 55.4 (int8: 67.9 against 74.1), q_b 16384 × 2048 13.3 against 14.3; from
/// kv_b's 28,672 rows up (and a token's 16 expert gate/up matrices, 32,768 rows) two were as
/// fast or faster (int8 expert down 33.3 µs against 41.0).
const FEW_ROWS: usize = 24_576;

/// Integer formats take the word-path kernels (`gemv.cu`).
fn is_int(format: WeightFormat) -> bool {
    matches!(
        format,
        WeightFormat::Int8Row | WeightFormat::Int4Row | WeightFormat::Int4Group { .. }
    )
}

/// One matrix of a launch: device addresses of its weights, scales, activations and output.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Job {
    /// Weight bytes.
    pub w: u64,
    /// f32 scales (any address for float formats).
    pub s: u64,
    /// `m × cols` f32 activations.
    pub x: u64,
    /// `m × rows` f32 outputs.
    pub y: u64,
}

// SAFETY: `Job` is `repr(C)` plain data (four u64), laid out as `struct Job` in `gemv.cu`.
unsafe impl DeviceRepr for Job {}

/// A weight matrix resident on the GPU, in its stored format.
#[derive(Debug)]
pub struct GpuMat {
    /// Storage format.
    pub format: WeightFormat,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    data: CudaSlice<u8>,
    scales: CudaSlice<f32>,
    /// Bytes of the stored weights and scales uploaded (the placeholder allocations of a
    /// format without scales are not counted: a `--gpu-memory` plan made from the headers
    /// then equals what is placed).
    payload: usize,
}

impl GpuMat {
    /// Device bytes of this matrix's weights and scales: the stored bytes its `MatRef` had.
    pub fn device_bytes(&self) -> usize {
        self.payload
    }

    /// Its device addresses, for the batch runner ([`Gpu::run_views`]).
    pub(crate) fn view(&self, stream: &CudaStream) -> MatView {
        let (w, _) = self.data.device_ptr(stream);
        let (s, _) = self.scales.device_ptr(stream);
        MatView {
            format: self.format,
            rows: self.rows,
            cols: self.cols,
            w,
            s,
        }
    }
}

/// A kernel and its arguments for one (format, shape, M, order), ready to launch over jobs.
pub struct GemvPlan {
    func: CudaFunction,
    /// The tensor-core kernels ([`Order::Tensor`] on a layout that admits it) and their row
    /// tiles per warp: for launches of many rows, and of fewer than [`FEW_ROWS`].
    tc: Option<((CudaFunction, u32), (CudaFunction, u32))>,
    /// The integer formats' kernel for launches of fewer than [`FEW_ROWS`] rows.
    func_few: Option<CudaFunction>,
    format: WeightFormat,
    rows: usize,
    cols: usize,
    m: usize,
    layout: RowLayout,
}

/// How a kernel walks the rows of a `rows × cols` matrix of a format: bytes and scales per row,
/// columns per scale (0 for float formats) and that group's magic divisor (`divide.rs`). Both
/// the GEMV and the GEMM plans take it from [`RowLayout::new`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowLayout {
    pub row_bytes: i32,
    pub row_scales: i32,
    pub group: usize,
    pub gmagic: u32,
    pub gshift: i32,
}

impl RowLayout {
    pub(crate) fn new(format: WeightFormat, rows: usize, cols: usize) -> Result<RowLayout> {
        let group = match format {
            WeightFormat::Int8Row | WeightFormat::Int4Row => cols.max(1),
            WeightFormat::Int4Group { group } if group > 0 => group,
            WeightFormat::Int4Group { .. } => return Err(Error::Shape("int4 group size 0".into())),
            _ => 0,
        };
        // Column indices and the magic division are exact below 2^31.
        shape_i32("rows", rows)?;
        shape_i32("cols", cols)?;
        let (gmagic, gshift) = divide::magic(group.clamp(1, 1 << 31) as u32);
        Ok(RowLayout {
            row_bytes: shape_i32("row bytes", format.row_bytes(cols))?,
            row_scales: shape_i32("row scales", format.row_scales(cols))?,
            group,
            gmagic,
            gshift: gshift as i32,
        })
    }
}

/// A format's name in the kernels' entry points (`FMT_*` in `gemv.cu`): `f32`, `bf16`, `f16`,
/// `i8`, `i4` (per row or grouped alike).
pub(crate) fn format_base(format: WeightFormat) -> &'static str {
    match format {
        WeightFormat::F32 => "f32",
        WeightFormat::Bf16 => "bf16",
        WeightFormat::F16 => "f16",
        WeightFormat::Int8Row => "i8",
        WeightFormat::Int4Row | WeightFormat::Int4Group { .. } => "i4",
    }
}

fn kernel_name(format: WeightFormat, m: usize, order: Order) -> String {
    let base = format_base(format);
    let order = if order.tensor() { Order::Exact } else { order };
    if is_int(format) {
        format!("gemv_{base}_{}_m{m}", order.name())
    } else {
        format!("gemv_{base}_m{m}")
    }
}

/// Every kernel the host side can launch (for the compile test).
#[cfg(test)]
pub(crate) fn kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for f in [
        WeightFormat::F32,
        WeightFormat::Bf16,
        WeightFormat::F16,
        WeightFormat::Int8Row,
        WeightFormat::Int4Row,
    ] {
        for m in 1..=MAX_M {
            for order in [Order::Exact, Order::Word] {
                v.push(kernel_name(f, m, order));
                if is_int(f) {
                    v.push(format!("{}_u4", kernel_name(f, m, order)));
                }
            }
        }
    }
    for base in ["i4", "i8", "bf16"] {
        for tiles in [1, 4] {
            v.push(format!("gemv_tc_{base}_t{tiles}"));
        }
    }
    v.sort();
    v.dedup();
    v
}

pub(crate) fn shape_i32(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Shape(format!("{what} {v} exceeds the kernel limit")))
}

impl Gpu {
    /// Copies a validated weight matrix to the device.
    pub fn upload(&self, w: &MatRef<'_>) -> Result<GpuMat> {
        w.validate()?;
        // Zero-length device allocations are not allowed: float formats get one unused scale.
        let data = if w.data.is_empty() {
            self.stream.alloc_zeros(1)?
        } else {
            self.stream.clone_htod(w.data)?
        };
        let scales = if w.scales.is_empty() {
            self.stream.alloc_zeros(1)?
        } else {
            self.stream.clone_htod(w.scales)?
        };
        Ok(GpuMat {
            format: w.format,
            rows: w.rows,
            cols: w.cols,
            data,
            scales,
            payload: w.data.len() + w.scales.len() * 4,
        })
    }

    /// Prepares the kernel for `m` (1…[`MAX_M`]) activation rows of a `rows × cols` matrix.
    pub fn gemv_plan(
        &self,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        m: usize,
        order: Order,
    ) -> Result<GemvPlan> {
        if !(1..=MAX_M).contains(&m) {
            return Err(Error::Shape(format!("gemv: m = {m} outside 1..={MAX_M}")));
        }
        let name = kernel_name(format, m, order);
        let layout = RowLayout::new(format, rows, cols)?;
        let tc = match tc_base(format) {
            Some(base) if order.tensor() && tc_layout(format, cols) => Some((
                (self.function(&format!("gemv_tc_{base}_t4"))?, 4),
                (self.function(&format!("gemv_tc_{base}_t1"))?, 1),
            )),
            _ => None,
        };
        Ok(GemvPlan {
            tc,
            func: self.function(&name)?,
            func_few: if is_int(format) {
                Some(self.function(&format!("{name}_u4"))?)
            } else {
                None
            },
            format,
            rows,
            cols,
            m,
            layout,
        })
    }

    /// Queues one launch of `plan` over `n` jobs read from the job table at device address
    /// `jobs`.
    ///
    /// # Safety
    /// `jobs` must hold `n` [`Job`]s in device memory of this context, and each must hold device addresses of this context with the plan's
    /// shape: `rows × row_bytes` weight bytes, `rows × row_scales` scales (quantised formats),
    /// `m × cols` activations and `m × rows` writable outputs; `vector` may be true only if every
    /// weight and activation address is 16-byte aligned (see [`GemvPlan::vector_ok`]).
    pub unsafe fn gemv_launch(
        &self,
        plan: &GemvPlan,
        jobs: u64,
        n: usize,
        vector: bool,
    ) -> Result<()> {
        if n == 0 || plan.rows == 0 {
            return Ok(());
        }
        if n > 65535 {
            return Err(Error::Shape(format!(
                "gemv: {n} jobs in one launch (at most 65535)"
            )));
        }
        if let (Some((many, few)), true) = (&plan.tc, vector) {
            // Several row tiles per warp share each activation split; launches of few rows need
            // the blocks of one (which rows a warp takes never changes a row's result).
            let (tc, tiles) = if plan.rows.saturating_mul(n) < FEW_ROWS {
                (&few.0, few.1)
            } else {
                (&many.0, many.1)
            };
            let cfg = LaunchConfig {
                grid_dim: ((plan.rows as u32).div_ceil(16 * tiles), n as u32, 1),
                block_dim: (TC_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let (rows, cols, m) = (plan.rows as i32, plan.cols as i32, plan.m as i32);
            let path: i32 = if plan.layout.row_scales == 1 { 2 } else { 0 };
            let mut b = self.stream.launch_builder(tc);
            b.arg(&jobs)
                .arg(&rows)
                .arg(&cols)
                .arg(&m)
                .arg(&plan.layout.row_bytes)
                .arg(&plan.layout.row_scales)
                .arg(&plan.layout.gmagic)
                .arg(&plan.layout.gshift)
                .arg(&path);
            // SAFETY: as below; `tc_layout` admitted the shape (whole 16-column pieces, scale
            // groups of whole 64-column steps) and `vector` the alignment.
            unsafe { b.launch(cfg) }?;
            return Ok(());
        }
        let rows_per_block = (BLOCK_THREADS / 32) * rows_per_warp(plan.m);
        let cfg = LaunchConfig {
            grid_dim: ((plan.rows as u32).div_ceil(rows_per_block), n as u32, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let rows = plan.rows as i32;
        let cols = plan.cols as i32;
        // Bit 0: the vector path; bit 1: one scale per row (the integer formats' word path).
        let path = if vector && plan.vector_layout() {
            1 | if plan.layout.row_scales == 1 { 2 } else { 0 }
        } else {
            0
        };
        let func = match &plan.func_few {
            Some(f) if plan.rows.saturating_mul(n) < FEW_ROWS => f,
            _ => &plan.func,
        };
        let mut b = self.stream.launch_builder(func);
        b.arg(&jobs)
            .arg(&rows)
            .arg(&cols)
            .arg(&plan.layout.row_bytes)
            .arg(&plan.layout.row_scales)
            .arg(&plan.layout.gmagic)
            .arg(&plan.layout.gshift)
            .arg(&path);
        // SAFETY: the caller guarantees the jobs' buffers match the plan (this fn's contract);
        // the grid covers every row once and the kernel bounds-checks the last block.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// y = W·x for `m` activation rows (`x`: m × cols, `y`: m × rows, row-major), synchronously.
    pub fn matmul(
        &self,
        w: &GpuMat,
        x: &[f32],
        m: usize,
        y: &mut [f32],
        order: Order,
    ) -> Result<()> {
        self.run_into(w, x, m, Kernel::Gemv(order), y)
    }

    /// One product written straight into the caller's `y` (no intermediate host buffer).
    fn run_into(
        &self,
        w: &GpuMat,
        x: &[f32],
        m: usize,
        kernel: Kernel,
        y: &mut [f32],
    ) -> Result<()> {
        // SAFETY: the view addresses an uploaded matrix, borrowed (alive, unchanged) here.
        unsafe { self.run_views_into(&[(w.view(&self.stream), x)], m, kernel, y) }
    }

    /// y_j = W_j·x_j for several matrices of one format and shape (a layer's experts) in one
    /// launch per chunk of [`MAX_M`] activation rows. Returns each product's `m × rows` output.
    pub fn matmul_batch(
        &self,
        items: &[(&GpuMat, &[f32])],
        m: usize,
        order: Order,
    ) -> Result<Vec<Vec<f32>>> {
        self.run_batch(items, m, Kernel::Gemv(order))
    }

    /// y = W·x for `m` activation rows on the tensor cores (`gemm.rs`), synchronously.
    pub fn gemm(
        &self,
        w: &GpuMat,
        x: &[f32],
        m: usize,
        y: &mut [f32],
        precision: Precision,
    ) -> Result<()> {
        self.run_into(w, x, m, Kernel::Gemm(precision), y)
    }

    /// [`Gpu::matmul_batch`] on the tensor cores: one launch for all `m` rows of every item.
    pub fn gemm_batch(
        &self,
        items: &[(&GpuMat, &[f32])],
        m: usize,
        precision: Precision,
    ) -> Result<Vec<Vec<f32>>> {
        self.run_batch(items, m, Kernel::Gemm(precision))
    }

    /// Uploads the items' activations, runs `kernel` over them, and downloads the outputs.
    fn run_batch(
        &self,
        items: &[(&GpuMat, &[f32])],
        m: usize,
        kernel: Kernel,
    ) -> Result<Vec<Vec<f32>>> {
        let views: Vec<(MatView, &[f32])> = items
            .iter()
            .map(|&(w, x)| (w.view(&self.stream), x))
            .collect();
        // SAFETY: each view addresses an uploaded matrix of its own shape, borrowed (so alive
        // and unchanged) for this call.
        unsafe { self.run_views(&views, m, kernel) }
    }

    /// [`Gpu::run_batch`] over weights at device addresses: the one batch runner of the GEMV
    /// and GEMM products, whoever owns the weights ([`GpuMat`]s, or an expert staged by
    /// [`crate::copy::Staging`]), so the same matrix gives the same bits either way.
    ///
    /// # Safety
    /// Each view must describe memory of this context that holds its matrix (weights and scales
    /// of the view's format and shape) and that stays unchanged until this call returns.
    pub(crate) unsafe fn run_views(
        &self,
        items: &[(MatView, &[f32])],
        m: usize,
        kernel: Kernel,
    ) -> Result<Vec<Vec<f32>>> {
        let Some(&(first, _)) = items.first() else {
            return Ok(Vec::new());
        };
        let len = m.saturating_mul(first.rows);
        let mut y = vec![0.0; items.len().saturating_mul(len)];
        // SAFETY: this fn's contract.
        unsafe { self.run_views_into(items, m, kernel, &mut y)? };
        Ok(match items.len() {
            1 => vec![y],
            _ => y.chunks(len.max(1)).map(<[f32]>::to_vec).collect(),
        })
    }

    /// [`Gpu::run_views`] writing item j's `m × rows` output at `y[j·m·rows ..]`.
    ///
    /// # Safety
    /// As [`Gpu::run_views`].
    pub(crate) unsafe fn run_views_into(
        &self,
        items: &[(MatView, &[f32])],
        m: usize,
        kernel: Kernel,
        y: &mut [f32],
    ) -> Result<()> {
        let Some(&(first, _)) = items.first() else {
            return Ok(());
        };
        let (format, rows, cols) = (first.format, first.rows, first.cols);
        for (w, x) in items {
            if (w.format, w.rows, w.cols) != (format, rows, cols) {
                return Err(Error::Shape(format!(
                    "matmul: a {}x{} {} matrix among {rows}x{cols} {}",
                    w.rows,
                    w.cols,
                    w.format.name(),
                    format.name()
                )));
            }
            if Some(x.len()) != m.checked_mul(cols) {
                return Err(Error::Shape(format!(
                    "matmul: x has {} values, want m × cols = {m} × {cols}",
                    x.len()
                )));
            }
        }
        let n = items.len();
        if Some(y.len()) != m.checked_mul(rows).and_then(|l| l.checked_mul(n)) {
            return Err(Error::Shape(format!(
                "matmul: y has {} values, want {n} × m × rows = {n} × {m} × {rows}",
                y.len()
            )));
        }
        // Nothing to launch: an empty product, or rows that are sums of no columns.
        if m == 0 || rows == 0 || cols == 0 {
            y.fill(0.0);
            return Ok(());
        }
        // SAFETY: every element is written below before it is read (a NaN fill proves it: an
        // unwritten element would come back NaN, which the parity tests reject).
        let y_dev: CudaSlice<f32> = unsafe { self.stream.alloc(n * m * rows)? };
        let (yp, _y_sync) = y_dev.device_ptr(&self.stream);
        // SAFETY: `yp` addresses `n * m * rows` f32 of this context; 0xff bytes are a NaN.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                yp,
                0xff,
                n * m * rows * 4,
                self.stream.cu_stream(),
            )?
        };
        // SAFETY: the views are this fn's contract; `yp` holds n × m × rows f32.
        unsafe { self.launch_views(items, m, kernel, yp)? };
        drop(_y_sync);
        self.stream.memcpy_dtoh(&y_dev, y)?;
        Ok(())
    }

    /// The launches of [`Gpu::run_views`] (shapes already checked, nothing empty), writing item
    /// j's `m × rows` output at `yp + j·m·rows` floats: a host buffer ([`Gpu::run_views`]) or
    /// its consumer's own device buffer (the MLA keys, `attention.rs`). Enqueued on the
    /// compute stream, not waited for.
    ///
    /// # Safety
    /// As [`Gpu::run_views`], and `yp` addresses `items.len() × m × rows` f32 of this context
    /// that nothing else uses until the stream reaches this point.
    pub(crate) unsafe fn launch_views(
        &self,
        items: &[(MatView, &[f32])],
        m: usize,
        kernel: Kernel,
        yp: u64,
    ) -> Result<()> {
        let Some(&(first, _)) = items.first() else {
            return Ok(());
        };
        let (rows, cols) = (first.rows, first.cols);
        // One activation buffer for the batch (each item's rows apart); a lone item's x as is.
        let x_dev = match items {
            [(_, x)] => self.stream.clone_htod(*x)?,
            _ => self.stream.clone_htod(
                &items
                    .iter()
                    .flat_map(|(_, x)| *x)
                    .copied()
                    .collect::<Vec<f32>>(),
            )?,
        };
        let (xp, _x_sync) = x_dev.device_ptr(&self.stream);
        let jobs: Vec<Job> = items
            .iter()
            .enumerate()
            .map(|(j, (v, _))| Job {
                w: v.w,
                s: v.s,
                x: xp + (j * m * cols * 4) as u64,
                y: yp + (j * m * rows * 4) as u64,
            })
            .collect();
        // SAFETY: each job's x is its item's rows of this call's upload, its y the caller's
        // (this fn's contract), its weights the view's.
        unsafe { self.launch_jobs((first.format, rows, cols), m, kernel, &jobs) }
    }

    /// Launches `kernel` over `jobs` of one `(format, rows, cols)` shape, `m` activation rows
    /// each: every job's `x` holds its `m × cols` activations and `y` its `m × rows` outputs, at
    /// device addresses (GEMV launches take [`MAX_M`] rows at a time). Enqueued on the compute
    /// stream, not waited for.
    ///
    /// # Safety
    /// Every job's weights and scales hold a matrix of that shape, its `x` and `y` the sizes
    /// above, all memory of this context left unchanged (x, weights) and unused (y) by anything
    /// else until the stream reaches this point.
    pub(crate) unsafe fn launch_jobs(
        &self,
        (format, rows, cols): (WeightFormat, usize, usize),
        m: usize,
        kernel: Kernel,
        jobs: &[Job],
    ) -> Result<()> {
        if jobs.is_empty() || m == 0 {
            return Ok(());
        }
        match kernel {
            Kernel::Gemv(order) => {
                for i0 in (0..m).step_by(MAX_M) {
                    let mc = MAX_M.min(m - i0);
                    let plan = self.gemv_plan(format, rows, cols, mc, order)?;
                    let chunk: Vec<Job> = jobs
                        .iter()
                        .map(|j| Job {
                            x: j.x + (i0 * cols * 4) as u64,
                            y: j.y + (i0 * rows * 4) as u64,
                            ..*j
                        })
                        .collect();
                    let vector = plan.vector_ok(&chunk);
                    let table = self.stream.clone_htod(&chunk)?;
                    let (tp, _t_sync) = table.device_ptr(&self.stream);
                    // SAFETY: every job holds the plan's shape and rows i0 .. i0 + mc of its
                    // x and y (this fn's contract); `vector_ok` checked the alignment.
                    unsafe { self.gemv_launch(&plan, tp, chunk.len(), vector)? };
                }
            }
            Kernel::Gemm(precision) => {
                let plan = self.gemm_plan(format, rows, cols, m, precision)?;
                let vec = plan.vector_flags(jobs);
                let table = self.stream.clone_htod(jobs)?;
                let (tp, _t_sync) = table.device_ptr(&self.stream);
                // SAFETY: as above, with the whole m rows per job; `vector_flags` checked the
                // alignment.
                unsafe { self.gemm_launch(&plan, tp, jobs.len(), vec)? };
            }
        }
        Ok(())
    }
}

/// Which kernel family runs a batch.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kernel {
    Gemv(Order),
    Gemm(Precision),
}

impl Kernel {
    /// The kernel the model's products use for `m` rows of a `rows × cols` matrix of `format`:
    /// the GEMV in [`Order::MODEL`], or the tensor-core GEMM with three activation parts where
    /// [`use_gemm`] says it is faster. One rule for every product, so a matrix gives the same
    /// bits whoever owns it and wherever its output goes.
    pub(crate) fn model(format: WeightFormat, rows: usize, cols: usize, m: usize) -> Kernel {
        match use_gemm(format, rows, cols, m) {
            true => Kernel::Gemm(Precision::Split3),
            false => Kernel::Gemv(Order::MODEL),
        }
    }
}

/// Whether the tensor-core GEMV takes a `cols`-wide matrix of `format`: whole 16-column pieces
/// in whole 16-byte rows, and (int4 grouped) scale groups of whole 64-column steps.
fn tc_layout(format: WeightFormat, cols: usize) -> bool {
    cols.is_multiple_of(16)
        && format.row_bytes(cols).is_multiple_of(16)
        && match format {
            WeightFormat::Int4Group { group } => group.is_multiple_of(64),
            _ => true,
        }
}

impl GemvPlan {
    /// Whether launches of this plan run the tensor-core GEMV (on aligned jobs).
    pub fn tensor(&self) -> bool {
        self.tc.is_some()
    }

    /// Whether the layout admits the 16-byte vector path at all: whole 16-byte chunks per row,
    /// and (int4 grouped) scale groups that never split a 32-bit word of 8 codes.
    fn vector_layout(&self) -> bool {
        self.layout.row_bytes % 16 == 0
            && match self.format {
                // An odd width leaves a padding nibble the vector path would read as a column.
                WeightFormat::Int4Row => self.cols.is_multiple_of(2),
                WeightFormat::Int4Group { group } => {
                    self.cols.is_multiple_of(2) && group.is_multiple_of(8)
                }
                _ => true,
            }
    }

    /// Whether `jobs` may take the vector path: the layout admits it and every weight and
    /// activation address is 16-byte aligned.
    pub fn vector_ok(&self, jobs: &[Job]) -> bool {
        self.vector_layout() && jobs.iter().all(|j| j.w % 16 == 0 && j.x % 16 == 0)
    }

    /// Weight and scale bytes one job streams.
    pub fn weight_bytes(&self) -> usize {
        self.rows * (self.format.row_bytes(self.cols) + self.format.row_scales(self.cols) * 4)
    }

    /// Columns per scale (0 for float formats).
    pub fn group(&self) -> usize {
        self.layout.group
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tensor-core GEMV takes exactly the layouts whose 64-column steps lie in one scale
    /// group and whose rows are whole 16-column, 16-byte pieces; the rest stay on `exact`.
    #[test]
    fn the_tensor_core_gemv_takes_only_layouts_it_can_scale() {
        let g = |group| WeightFormat::Int4Group { group };
        for (f, cols, takes) in [
            (g(64), 6144, true),
            (g(128), 2048, true),
            (WeightFormat::Int4Row, 96, true),
            (WeightFormat::Int4Row, 32, true),
            (WeightFormat::Int8Row, 80, true),
            (WeightFormat::Bf16, 48, true),
            // A group splits a 64-column step.
            (g(32), 6144, false),
            (g(48), 768, false),
            // No whole 16-byte rows / 16-column pieces.
            (WeightFormat::Int4Row, 16, false),
            (WeightFormat::Int8Row, 24, false),
            (WeightFormat::Bf16, 40, false),
        ] {
            assert_eq!(
                tc_layout(f, cols) && tc_base(f).is_some(),
                takes,
                "{f:?} × {cols}"
            );
        }
        assert!(tc_base(WeightFormat::F16).is_none() && tc_base(WeightFormat::F32).is_none());
        assert_eq!(Order::MODEL, Order::Tensor);
    }
}
