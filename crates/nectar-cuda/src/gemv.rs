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
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig,
    PushKernelArg,
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
    /// The tensor-core GEMVs where the layout admits them ([`GemvPlan::tensor`]): int8 and
    /// bf16 on `gemv_tc.cu` (weights exact, activations in three bf16 parts, f32 sums per
    /// 16-column step), int4 on the integer tensor cores (`gemv_q.cu`: codes exact,
    /// activations as four 7-bit digits per 64-column step, exact integer sums); their cost
    /// hardly grows with M up to 8. Other layouts and formats take the `Exact` kernels. A
    /// packed int4 matrix ([`Gpu::upload`]) takes the int4 one whatever the order.
    Tensor,
}

impl Order {
    /// The order jobs run in when any of their weights are `packed`: a packed int4 matrix has
    /// one GEMV, the integer tensor-core one.
    pub(crate) fn for_packed(self, packed: bool) -> Order {
        match packed {
            true => Order::Tensor,
            false => self,
        }
    }

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

/// Warps per block of the tensor-core GEMV over int8 and bf16 (`gemv_tc.cu`, `_w{warps}`): warp
/// w takes 64-column steps w, w + warps, …, so the count is part of a row's accumulation order
/// and follows from the matrix's shape alone (never from M or the launch) — 16 for matrices of
/// at most 1,024 rows and 4,097 to 12,288 columns, else 4. A lone matrix of few long rows has
/// too few blocks to keep HBM busy with four warps each: kv_a, 576 bf16 rows × 6,144, is 36
/// blocks on 132 SMs — 18.5 µs with four, 11.5 with eight on an H100 (RESULTS 2026-12-05);
/// on an H200 11.7 µs with eight, 8.3 with sixteen, where loading two steps ahead instead
/// (eight warps) gave 11.0 and sixteen warps two steps ahead 8.6 (RESULTS 2026-12-06).
/// Taller matrices have blocks enough, and more warps only cost: int8 o_proj (6,144 × 16,384)
/// took 54.2 µs with four and 58.2 with eight; a token's 16 int8 expert gate/up matrices
/// (2,048 × 6,144) 80.0 against 83.9, bf16 136.7 against 138.9 (H100, alternated).
fn tc_warps(rows: usize, cols: usize) -> u32 {
    if rows <= 1024 && (4097..=12_288).contains(&cols) {
        16
    } else {
        4
    }
}

/// Row tiles per warp of the tensor-core GEMV's kernel for launches of many rows: four, but two
/// with sixteen warps, whose sums of four tiles would outgrow a block's static shared memory.
fn tc_many_tiles(warps: u32) -> u32 {
    if warps >= 16 {
        2
    } else {
        4
    }
}

/// The tensor-core GEMV's kernels for a shape, with their row tiles per warp: the one for
/// launches of many rows, then the one for few.
fn tc_kernels(base: &str, rows: usize, cols: usize) -> [(String, u32); 2] {
    let w = tc_warps(rows, cols);
    let t = tc_many_tiles(w);
    [
        (format!("gemv_tc_{base}_t{t}_w{w}"), t),
        (format!("gemv_tc_{base}_t1_w{w}"), 1),
    ]
}

/// The tensor-core GEMV's base name for a format, if it has one.
fn tc_base(format: WeightFormat) -> Option<&'static str> {
    match format {
        WeightFormat::Int8Row => Some("i8"),
        WeightFormat::Bf16 => Some("bf16"),
        WeightFormat::Int4Row | WeightFormat::Int4Group { .. } => None,
        WeightFormat::F32 | WeightFormat::F16 => None,
    }
}

fn is_int4(format: WeightFormat) -> bool {
    matches!(
        format,
        WeightFormat::Int4Row | WeightFormat::Int4Group { .. }
    )
}

/// Whether [`Gpu::upload`] packs a matrix (`gemv_q.cu`'s layout): int4 the int4 GEMV takes,
/// whole 16-row tiles and 64-column steps.
pub fn packs(format: WeightFormat, rows: usize, cols: usize) -> bool {
    is_int4(format)
        && tc_layout(format, cols)
        && rows > 0
        && rows.is_multiple_of(16)
        && cols.is_multiple_of(64)
}

/// The int4 GEMV kernel for `rows × cols` matrices, `n` per launch, `groups` token pairs
/// (`gemv_q.cu`, `gemv_q_t{tiles}_g{groups}_w{warps}`): `(tiles, warps)`.
///
/// Warps per block split a row's 64-column steps, so they are part of the accumulation order
/// and follow from `cols` alone: 4 up to 4,096 columns, 8 up to 12,288, else 16 (more warps give
/// a launch of few long rows the loads in flight it lacks; with short rows their partial sums
/// cost more than they bring). Row tiles per warp never change a row's bits and follow the
/// launch. Measured on the H200 against the 4-warp kernels of before (RESULTS, "The int4 GEMV's
/// warps per block"; packed, after the activation split, ÷ the read reference, M = 1):
/// - 16 warps, o_proj 6144 × 16384: 0.58 against 0.36 (2 tiles from M = 5 on: 4 spill there);
/// - 8 warps at 6,144 columns: a lone 2048 × 6144 (q_a) 0.16 against 0.11, a shared expert's
///   gate and up 0.30 against 0.20, kv_a 576 × 6144 0.049 against 0.031; a token's 16 expert
///   gate/up matrices 0.76 against 0.79 (and 0.46 against 0.54 at M = 3–6: one layer still
///   gains, its lone matrices more than the batch loses);
/// - 4 warps at 2,048 columns and fewer: 2 tiles at M ≤ 4 (expert down × 8: 0.63; 4 warps
///   beat 8 there), 4 from M = 5 on where the launch has the rows (down × 8 at M = 8: 0.35
///   against 0.28, q_b 0.30 against 0.24); launches of few rows one tile (indexer wq_b).
fn q_kernel(rows: usize, cols: usize, n: usize, groups: usize) -> (u32, u32) {
    let launch_rows = rows.saturating_mul(n);
    match cols {
        c if c > 12_288 => (if groups <= 2 { 4 } else { 2 }, 16),
        c if c > 4096 => (if launch_rows >= FEW_ROWS { 4 } else { 1 }, 8),
        _ if launch_rows < FEW_ROWS / 2 => (1, 4),
        _ if groups > 2 => (4, 4),
        _ => (2, 4),
    }
}

/// One source of the int4 GEMV's activation digits (`struct QSrc`, `gemv_q.cu`): `m × cols`
/// f32 activations at `x`, their digits written at `q`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QSrc {
    /// Activations.
    pub x: u64,
    /// Their digits ([`GemvPlan::digit_bytes`]).
    pub q: u64,
}

// SAFETY: `QSrc` is `repr(C)` plain data (two u64), laid out as `struct QSrc` in `gemv_q.cu`.
unsafe impl DeviceRepr for QSrc {}

impl QSrc {
    /// Its u64 words in `struct QSrc`'s order (see [`Job::words`]).
    pub(crate) fn words(&self) -> [u64; 2] {
        [self.x, self.q]
    }
}
const _: () = assert!(std::mem::size_of::<QSrc>() == 2 * 8);

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
    /// 1 where the weights are int4 in the packed layout of [`Gpu::upload`] (`gemv_q.cu`),
    /// which only the int4 GEMV and the GEMM read; 0: the stored layout.
    pub packed: u64,
}

// SAFETY: `Job` is `repr(C)` plain data (five u64), laid out as `struct Job` in `gemv.cu`.
unsafe impl DeviceRepr for Job {}

impl Job {
    /// Its u64 words in `struct Job`'s order (a table shared with other records in one upload).
    pub(crate) fn words(&self) -> [u64; 5] {
        [self.w, self.s, self.x, self.y, self.packed]
    }
}
const _: () = assert!(std::mem::size_of::<Job>() == 5 * 8);

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
    /// Whether `data` and `scales` are in the packed int4 layout ([`packs`]).
    packed: bool,
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

    /// Whether it is held in the packed int4 layout ([`Gpu::upload`]).
    pub fn packed(&self) -> bool {
        self.packed
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
            packed: self.packed,
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
    /// The int4 GEMV on the integer tensor cores ([`Order::Tensor`] on int4 layouts it takes):
    /// its column groups (two tokens each), `ceil(m / 2)`.
    q_groups: Option<usize>,
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
    for base in ["i8", "bf16"] {
        for warps in [4, 16] {
            for tiles in [1, tc_many_tiles(warps)] {
                v.push(format!("gemv_tc_{base}_t{tiles}_w{warps}"));
            }
        }
    }
    for groups in 1..=4 {
        for (tiles, warps) in [(1, 4), (2, 4), (4, 4), (1, 8), (4, 8)] {
            v.push(format!("gemv_q_t{tiles}_g{groups}_w{warps}"));
        }
        let tiles = if groups <= 2 { 4 } else { 2 };
        v.push(format!("gemv_q_t{tiles}_g{groups}_w16"));
    }
    v.push("q_split".into());
    v.push("q_pack".into());
    v.sort();
    v.dedup();
    v
}

pub(crate) fn shape_i32(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Shape(format!("{what} {v} exceeds the kernel limit")))
}

impl Gpu {
    /// Copies a validated weight matrix to the device, int4 in the packed layout where it
    /// [`packs`] (the int4 GEMV reads it at ~0.8 of HBM bandwidth against ~0.6 stored; the GEMM
    /// reads both, and both give the same bits). Kernels that read single weights in place
    /// (the absorbed attention's kv_b) need [`Gpu::upload_stored`].
    pub fn upload(&self, w: &MatRef<'_>) -> Result<GpuMat> {
        if !packs(w.format, w.rows, w.cols) {
            return self.upload_stored(w);
        }
        w.validate()?;
        let stored = self.upload_stored(w)?;
        // SAFETY: `q_pack` below writes every byte of both (each 16-column piece and each
        // row's every scale) before anything reads them.
        let (mut data, mut scales): (CudaSlice<u8>, CudaSlice<f32>) = unsafe {
            (
                self.stream.alloc(w.data.len())?,
                self.stream.alloc(w.scales.len())?,
            )
        };
        {
            let (sw, _a) = stored.data.device_ptr(&self.stream);
            let (ss, _b) = stored.scales.device_ptr(&self.stream);
            let (dw, _c) = data.device_ptr_mut(&self.stream);
            let (ds, _d) = scales.device_ptr_mut(&self.stream);
            // SAFETY: `stored` holds the validated matrix, `data` / `scales` its sizes; the
            // stored copy is freed only after the stream has run the kernel.
            unsafe { self.q_pack(w.format, w.rows, w.cols, (sw, ss), (dw, ds))? };
        }
        Ok(GpuMat {
            data,
            scales,
            packed: true,
            ..stored
        })
    }

    /// Copies a validated weight matrix to the device in its stored layout.
    pub fn upload_stored(&self, w: &MatRef<'_>) -> Result<GpuMat> {
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
            packed: false,
            payload: w.data.len() + w.scales.len() * 4,
        })
    }

    /// Packs the stored int4 matrix at `src` (weights, scales) into `dst` (`gemv_q.cu`'s
    /// layout; the format and shape must [`packs`]).
    ///
    /// # Safety
    /// `src` holds a matrix of this format and shape, `dst` room for its weights and scales,
    /// all memory of this context unused by anything else until the stream reaches this point.
    pub(crate) unsafe fn q_pack(
        &self,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        src: (u64, u64),
        dst: (u64, u64),
    ) -> Result<()> {
        if !packs(format, rows, cols) {
            return Err(Error::Shape(format!(
                "pack: a {rows} × {cols} {} matrix has no packed layout",
                format.name()
            )));
        }
        let layout = RowLayout::new(format, rows, cols)?;
        let n = rows * cols / 16;
        let cfg = LaunchConfig {
            grid_dim: (shape_i32("pack threads", n.div_ceil(256))? as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (r, c) = (rows as i32, cols as i32);
        let f = self.function("q_pack")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&src.0)
            .arg(&src.1)
            .arg(&r)
            .arg(&c)
            .arg(&layout.row_bytes)
            .arg(&layout.row_scales)
            .arg(&layout.gmagic)
            .arg(&layout.gshift)
            .arg(&dst.0)
            .arg(&dst.1);
        // SAFETY: one thread per 16-column piece of the shape checked above; the buffers are
        // this fn's contract.
        unsafe { b.launch(cfg) }?;
        Ok(())
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
        let q_groups =
            (is_int4(format) && order.tensor() && tc_layout(format, cols)).then(|| m.div_ceil(2));
        let tc = match tc_base(format) {
            Some(base) if q_groups.is_none() && order.tensor() && tc_layout(format, cols) => {
                let [(many, t), (few, _)] = tc_kernels(base, rows, cols);
                Some(((self.function(&many)?, t), (self.function(&few)?, 1)))
            }
            _ => None,
        };
        Ok(GemvPlan {
            tc,
            q_groups,
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
    /// `m × cols` activations and `m × rows` writable outputs; `vector` may be true only if
    /// [`GemvPlan::vector_ok`] said so for these jobs. With `vector` on an int4 plan
    /// ([`GemvPlan::digit_bytes`] > 0) each job's `x` holds instead the digits [`Gpu::q_split`]
    /// wrote of its activations; without it no job may be packed.
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
        if let (Some(groups), true) = (plan.q_groups, vector) {
            let (tiles, warps) = q_kernel(plan.rows, plan.cols, n, groups);
            let f = self.function(&format!("gemv_q_t{tiles}_g{groups}_w{warps}"))?;
            let (rows, cols, m) = (plan.rows as i32, plan.cols as i32, plan.m as i32);
            let path: i32 = if plan.layout.row_scales == 1 { 2 } else { 0 };
            let l = &plan.layout;
            let mut args: [*mut std::ffi::c_void; 9] = [
                &jobs as *const u64 as *mut _,
                &rows as *const i32 as *mut _,
                &cols as *const i32 as *mut _,
                &m as *const i32 as *mut _,
                &l.row_bytes as *const i32 as *mut _,
                &l.row_scales as *const i32 as *mut _,
                &l.gmagic as *const u32 as *mut _,
                &l.gshift as *const i32 as *mut _,
                &path as *const i32 as *mut _,
            ];
            // SAFETY: as below; every job's x holds the digits of `q_split` for this plan (this
            // fn's contract) and `vector` the weights' and scales' alignment; the arguments
            // are `gemv_q_*`'s, in order, alive for the call.
            unsafe {
                self.launch_dependent(
                    &f,
                    ((plan.rows as u32).div_ceil(16 * tiles), n as u32),
                    32 * warps,
                    &mut args,
                )
            }?;
            return Ok(());
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
                block_dim: (32 * tc_warps(plan.rows, plan.cols), 1, 1),
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

    /// Queues the int4 GEMV's activation digits for `plan` (`q_split`, `gemv_q.cu`): each of
    /// the `n` sources in the device table at `srcs` gets [`GemvPlan::digit_bytes`] at its `q`.
    ///
    /// # Safety
    /// `srcs` holds `n` [`QSrc`]s of this context: `m × cols` f32 at each `x`, room for the
    /// digits at each `q` (16-byte aligned), unused by anything else until the stream gets here.
    pub unsafe fn q_split(&self, plan: &GemvPlan, srcs: u64, n: usize) -> Result<()> {
        let Some(groups) = plan.q_groups else {
            return Err(Error::Shape("q_split: not an int4 GEMV plan".into()));
        };
        if n == 0 {
            return Ok(());
        }
        let warps = plan.cols.div_ceil(64) * 2 * groups;
        let cfg = LaunchConfig {
            grid_dim: (warps.div_ceil(4) as u32, shape_i32("sources", n)? as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (m, cols, groups) = (plan.m as i32, plan.cols as i32, groups as i32);
        let f = self.function("q_split")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&srcs).arg(&m).arg(&cols).arg(&groups);
        // SAFETY: one warp per (step, token slot) of each source; the buffers are this fn's
        // contract.
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

    /// y_i = W_i·x for matrices of any shapes over one `m × cols` activation block (projections
    /// of one hidden state), in one round trip for `m ≤ MAX_M` (`round_trip.rs`: one upload, the
    /// launches, one download, one wait) instead of one per matrix. Each product's kernels, so
    /// its bits, are [`Gpu::matmul`]'s. Returns each matrix's `m × rows` output.
    pub fn matmul_each(
        &self,
        mats: &[&GpuMat],
        x: &[f32],
        m: usize,
        order: Order,
    ) -> Result<Vec<Vec<f32>>> {
        let mut ys: Vec<Vec<f32>> = mats.iter().map(|w| vec![0.0; m * w.rows]).collect();
        let plain = |w: &GpuMat| w.rows > 0 && w.cols > 0 && Some(x.len()) == m.checked_mul(w.cols);
        if !(1..=MAX_M).contains(&m) || !mats.iter().all(|w| plain(w)) {
            // Shapes to check or nothing to launch: each product on its own says which.
            for (w, y) in mats.iter().zip(&mut ys) {
                self.matmul(w, x, m, y, order)?;
            }
            return Ok(ys);
        }
        let views: Vec<[(MatView, &[f32]); 1]> =
            mats.iter().map(|w| [(w.view(&self.stream), x)]).collect();
        let mut groups: Vec<crate::round_trip::Group<'_, '_>> = views
            .iter()
            .zip(&mut ys)
            .map(|(items, y)| crate::round_trip::Group { items, order, y })
            .collect();
        // SAFETY: each view addresses an uploaded matrix, borrowed (alive, unchanged) here;
        // every x holds m × its cols values and every y m × its rows (checked above).
        unsafe { self.gemv_round_trip(&mut groups, m)? };
        Ok(ys)
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
        // Decode and verify products: one upload, one download, buffers kept between calls.
        if let (Kernel::Gemv(order), true) = (kernel, m <= MAX_M) {
            let group = crate::round_trip::Group { items, order, y };
            // SAFETY: this fn's contract; shapes checked above.
            return unsafe { self.gemv_round_trip(&mut [group], m) };
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
        self.to_host_into(&y_dev, y)?;
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
            [(_, x)] => self.to_device(x)?,
            _ => self.to_device(
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
            .map(|(j, (v, _))| {
                v.job(
                    xp + (j * m * cols * 4) as u64,
                    yp + (j * m * rows * 4) as u64,
                )
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
                let order = order.for_packed(jobs.iter().any(|j| j.packed != 0));
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
                    plan.takes_packed(chunk.iter().any(|j| j.packed != 0), vector)?;
                    let mut chunk = chunk;
                    // The int4 GEMV reads digits of the activations: one split per distinct x.
                    // SAFETY: the chunk's activations are this fn's contract.
                    let digits = match vector {
                        true => unsafe { self.digits_for(&plan, &mut chunk)? },
                        false => None,
                    };
                    // One upload: the job table, then the split's sources.
                    let srcs = digits.as_ref().map_or(&[][..], |d| &d.srcs[..]);
                    let words: Vec<u64> = chunk
                        .iter()
                        .flat_map(Job::words)
                        .chain(srcs.iter().flat_map(QSrc::words))
                        .collect();
                    let table = self.stream.clone_htod(&words)?;
                    let (tp, _t_sync) = table.device_ptr(&self.stream);
                    if !srcs.is_empty() {
                        let sp = tp + (chunk.len() * std::mem::size_of::<Job>()) as u64;
                        // SAFETY: the sources point at the chunk's activations and at the
                        // digits `digits_for` made room for (16-byte aligned: the digit bytes
                        // are a multiple of 16).
                        unsafe { self.q_split(&plan, sp, srcs.len())? };
                    }
                    // SAFETY: every job holds the plan's shape and rows i0 .. i0 + mc of its
                    // x and y (this fn's contract), its x the digits where `_digits` split
                    // them; `vector_ok` checked the alignment.
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

/// Activation digits for the int4 GEMV ([`Gpu::digits_for`]): the buffer and its sources.
pub(crate) struct Digits {
    _buf: CudaSlice<u8>,
    /// Where each distinct activation's digits go, for [`Gpu::q_split`]'s table.
    pub(crate) srcs: Vec<QSrc>,
}

impl Gpu {
    /// Points each job's `x` at room for the digits of its activations for the int4 GEMV (one
    /// set per distinct x); `None` (jobs unchanged) for plans without it. The caller queues
    /// [`Gpu::q_split`] over the result's sources right before the GEMV (so that the GEMV
    /// launches as the split's dependent) and keeps the result until the GEMV has run.
    ///
    /// # Safety
    /// As [`Gpu::launch_jobs`] for `jobs`' activations.
    pub(crate) unsafe fn digits_for(
        &self,
        plan: &GemvPlan,
        jobs: &mut [Job],
    ) -> Result<Option<Digits>> {
        let d = plan.digit_bytes();
        if d == 0 {
            return Ok(None);
        }
        let mut xs: Vec<u64> = jobs.iter().map(|j| j.x).collect();
        xs.sort_unstable();
        xs.dedup();
        // SAFETY: `q_split` writes every byte of every source's digits before the GEMV reads.
        let buf: CudaSlice<u8> = unsafe { self.stream.alloc(xs.len() * d)? };
        let (bp, b_sync) = buf.device_ptr(&self.stream);
        let at = |x: u64| bp + (xs.binary_search(&x).unwrap_or(0) * d) as u64;
        let srcs: Vec<QSrc> = xs.iter().map(|&x| QSrc { x, q: at(x) }).collect();
        for j in jobs.iter_mut() {
            j.x = at(j.x);
        }
        drop(b_sync);
        Ok(Some(Digits { _buf: buf, srcs }))
    }

    /// Queues `f` on the compute stream as a programmatic dependent launch where the device
    /// has them (sm_90+): its blocks may start while the kernel before it (`q_split`) runs and
    /// wait for it at `griddepcontrol.wait` (`gemv_q.cu`), which hides most of the split's
    /// launch latency. Elsewhere an ordinary launch.
    ///
    /// # Safety
    /// `args` are `f`'s parameters in order, each pointing at a value of its type.
    unsafe fn launch_dependent(
        &self,
        f: &CudaFunction,
        (gx, gy): (u32, u32),
        threads: u32,
        args: &mut [*mut std::ffi::c_void],
    ) -> Result<()> {
        use cudarc::driver::sys;
        // SAFETY: an all-zero attribute value is valid plain data; the field set is the one
        // the attribute id reads.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: gx,
            gridDimY: gy,
            gridDimZ: 1,
            blockDimX: threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.info().compute_capability.0 >= 9),
        };
        // SAFETY: `f` is a kernel of this context's module, `args` its parameters (this fn's
        // contract), the stream this context's.
        unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                f.cu_function(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()?;
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
    /// Refuses jobs over `packed` weights that this plan would not run on the int4 GEMV
    /// (`vector`: [`GemvPlan::vector_ok`] of the jobs) — the only kernel that reads packed
    /// weights.
    pub(crate) fn takes_packed(&self, packed: bool, vector: bool) -> Result<()> {
        if packed && !(vector && self.digit_bytes() > 0) {
            return Err(Error::Shape(format!(
                "gemv: packed {} × {} {} weights need the int4 GEMV",
                self.rows,
                self.cols,
                self.format.name()
            )));
        }
        Ok(())
    }

    /// Whether launches of this plan run a tensor-core GEMV (on aligned jobs).
    pub fn tensor(&self) -> bool {
        self.tc.is_some() || self.q_groups.is_some()
    }

    /// Bytes of one source's activation digits for the int4 GEMV (`q_split`), 0 for plans
    /// without it.
    pub fn digit_bytes(&self) -> usize {
        self.q_groups
            .map_or(0, |groups| self.cols.div_ceil(64) * groups * 576)
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
        if self.q_groups.is_some() {
            // The int4 GEMV reads digits, not x: the weights' and scales' alignment only.
            return jobs.iter().all(|j| j.w % 16 == 0 && j.s % 8 == 0);
        }
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
                tc_layout(f, cols) && (tc_base(f).is_some() || is_int4(f)),
                takes,
                "{f:?} × {cols}"
            );
        }
        assert!(tc_base(WeightFormat::F16).is_none() && tc_base(WeightFormat::F32).is_none());
        // int4 takes the integer tensor cores (`gemv_q.cu`), packed where whole tiles allow.
        assert!(tc_base(g(64)).is_none() && tc_base(WeightFormat::Int4Row).is_none());
        assert!(packs(g(64), 2048, 6144) && packs(WeightFormat::Int4Row, 16, 64));
        assert!(!packs(g(64), 2040, 6144) && !packs(g(64), 16, 6112) && !packs(g(32), 16, 64));
        assert!(!packs(WeightFormat::Int8Row, 16, 64) && !packs(g(64), 0, 64));
        assert_eq!(Order::MODEL, Order::Tensor);
    }

    /// The tensor-core GEMV's warps follow the matrix's shape (few long rows get 16), and every
    /// kernel the rule picks is compiled.
    #[test]
    fn the_tensor_core_gemv_picks_compiled_kernels_with_warps_by_shape() {
        let names = kernel_names();
        for base in ["i8", "bf16"] {
            for (rows, cols) in [
                (576, 6144),
                (2048, 6144),
                (1024, 4097),
                (6144, 16_384),
                (16, 64),
            ] {
                for (name, _) in tc_kernels(base, rows, cols) {
                    assert!(names.contains(&name), "{name} is not compiled");
                }
            }
        }
        assert_eq!(tc_warps(576, 6144), 16, "kv_a: few long rows");
        assert_eq!(tc_warps(2048, 6144), 4, "an expert's gate: blocks enough");
        assert_eq!(tc_warps(576, 16_384), 4);
        assert_eq!(
            tc_kernels("bf16", 576, 6144)[0].1,
            2,
            "16 warps hold two tiles each"
        );
    }

    /// The int4 GEMV's warps per block are in its accumulation order: they follow from the
    /// column count alone, whatever the launch (rows, matrices, tokens), and every kernel the
    /// rule picks is compiled.
    #[test]
    fn the_int4_gemv_warps_follow_the_columns_alone() {
        let names = kernel_names();
        for cols in [64, 512, 2048, 4096, 4160, 6144, 12_288, 12_352, 16_384] {
            let mut warps = Vec::new();
            for rows in [16, 576, 2048, 6144, 16_384, 28_672] {
                for n in [1, 2, 8, 16] {
                    for groups in 1..=MAX_M / 2 {
                        let (t, w) = q_kernel(rows, cols, n, groups);
                        let name = format!("gemv_q_t{t}_g{groups}_w{w}");
                        assert!(names.contains(&name), "{name} is not compiled");
                        warps.push(w);
                    }
                }
            }
            warps.dedup();
            assert_eq!(warps.len(), 1, "{cols} columns: warps {warps:?}");
        }
        assert_eq!(q_kernel(6144, 16_384, 1, 1), (4, 16));
        assert_eq!(q_kernel(2048, 6144, 16, 1), (4, 8));
        assert_eq!(q_kernel(2048, 6144, 1, 1), (1, 8));
        assert_eq!(q_kernel(6144, 2048, 8, 1), (2, 4));
        assert_eq!(q_kernel(6144, 2048, 8, 4), (4, 4));
    }
}
