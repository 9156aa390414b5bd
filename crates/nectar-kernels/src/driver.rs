//! How a product is cut into work: output rows into parallel tasks, each task into register
//! blocks of R weight rows × MB activation rows, and the dispatch to one instruction set.
//!
//! Blocking never changes a result: every output element is one canonical dot product (see
//! `dot.rs`) accumulated in its own register lanes, whatever block, task or thread computes it.
//! It only decides how often a weight row is read and decoded: once per MB activation rows, from
//! L1 after the first time, so the DRAM stream is read once per call.
use crate::dot::Isa;
use crate::format::{MatRef, WeightFormat};
use crate::xpack::{Layout, XPack};
use std::ops::Range;

/// Work each parallel task covers at least, in weight bytes × activation rows: small enough to
/// balance two to a few dozen cores on one matrix, large enough that scheduling costs nothing
/// next to the stream. Counting activation rows lets a prefill chunk (hundreds of rows) split a
/// small matrix that a single decode row leaves on one thread.
const TASK_BYTES: usize = 64 * 1024;

/// Parallel tasks per thread at most (see [`par_rows`]): a few, for balance on a shared machine,
/// but no more, because each task start restarts the weight stream.
const TASKS_PER_THREAD: usize = 4;

/// Weight rows per row block (and the row granularity of tasks): 8 for AVX-512 (one register
/// block of 8 rows at M = 1, else several narrower register blocks over the same 8 rows), 4
/// elsewhere.
pub(crate) const ROW_BLOCK: usize = 8;

/// One instruction set's register-blocked kernel for one weight format.
pub(crate) trait Block {
    /// Register file size class: `true` for 32 × 512-bit (AVX-512), `false` for 16 × 256-bit
    /// (AVX2) or 32 × 128-bit (NEON), where a 16-lane accumulator takes 2 or 4 registers.
    const WIDE: bool;

    /// For AVX-512 blocks of 2–3 activation rows: one 8 × 2 register block (`true`) or two
    /// 4 × 2 blocks. Which one spills less depends on the decoder (measured: int8 runs 2× faster
    /// as 8 × 2, int4 2× slower).
    const PAIR8: bool = false;

    /// For AVX-512 blocks of 4–7 activation rows: four 2 × 4 register blocks (`true`) or two
    /// 4 × 4. Again a matter of spills, measured per decoder (int8 2.3× and int4-g64 1.1×
    /// faster as 2 × 4, int4 per-row 1.3× slower).
    fn narrow4(&self) -> bool {
        false
    }

    /// Computes weight rows `r0..r0 + R` against packed activation rows `i0..i0 + MB`, writing
    /// row `r0 + k`, activation `i0 + i` to `*out.add(i * stride + k)`.
    ///
    /// # Safety
    /// The rows and activation rows exist; `out` is valid for those writes; the CPU supports
    /// the implementing instruction set.
    unsafe fn block<const R: usize, const MB: usize>(
        &self,
        r0: usize,
        x: &XPack,
        i0: usize,
        out: *mut f32,
        stride: usize,
    );
}

/// Runs `b` over weight rows `rows` and all activation rows, writing row `r`, activation `i`
/// to `*out.add(i * stride + (r - rows.start))`.
///
/// Register blocks: 4 weight rows × 1, 2 or 4 activation rows, or 2 × 8 (AVX-512); 4 × 1,
/// 2 × 2 or 1 × 4 elsewhere. Each weight step is decoded once per block and used for all of
/// its activation rows; for the second and later activation blocks of a tile the rows' bytes
/// come from L1, and for later tiles from the LLC (a task's rows are a few MiB at most), so
/// DRAM sees each weight once per call.
///
/// # Safety
/// As [`Block::block`], for every row in `rows` and every activation row.
pub(crate) unsafe fn run<B: Block>(
    b: &B,
    rows: Range<usize>,
    x: &XPack,
    out: *mut f32,
    stride: usize,
) {
    // Activation tiles: every weight row of the task meets one tile of activation rows
    // before the next tile starts, so the tile stays in L2 while the task's weights stream
    // past it (from L3 after the first tile). Without them a prefill chunk streamed *all* its
    // activation rows (hundreds × 24–64 KiB) from DRAM once per 8 weight rows: measured, a
    // 2,048-token prefill of a GLM-5.2-geometry layer spent most of its time there.
    let per = act_tile(x.stride);
    let mut i0 = 0;
    while i0 < x.m {
        let acts = i0..(i0 + per).min(x.m);
        i0 = acts.end;
        // SAFETY: forwarded from this function's contract (a sub-range of the activations).
        unsafe { run_acts(b, rows.clone(), x, acts, out, stride) };
    }
}

/// Bytes of packed activations an activation tile may hold (half an L2 of the smallest
/// AVX-512/Neon cores we target, 1 MiB, leaving the rest to the weights in flight).
const ACT_TILE_BYTES: usize = 512 * 1024;

/// Activation rows per tile for packed rows of `stride` floats: whole 8-row blocks, at least
/// one, so the register blocks are the same as without tiles except at a tile's end (blocking
/// never changes a result).
pub(crate) fn act_tile(stride: usize) -> usize {
    (ACT_TILE_BYTES / (stride.max(1) * 4) / 8).max(1) * 8
}

/// [`run`] for the activation rows `acts`.
///
/// # Safety
/// As [`run`]; `acts` lies inside `0..x.m`.
unsafe fn run_acts<B: Block>(
    b: &B,
    rows: Range<usize>,
    x: &XPack,
    acts: Range<usize>,
    out: *mut f32,
    stride: usize,
) {
    let mut r = rows.start;
    while r < rows.end {
        if B::WIDE && rows.end - r >= 8 {
            // SAFETY: rows r..r + 8 exist; forwarded from this function's contract.
            unsafe { run8(b, r, rows.start, x, acts.clone(), out, stride) };
            r += 8;
            continue;
        }
        let nr = (rows.end - r).min(4);
        let mut i = acts.start;
        while i < acts.end {
            let left = acts.end - i;
            // SAFETY: (r, i) lies inside the caller's output region.
            let o = unsafe { out.add(i * stride + (r - rows.start)) };
            // SAFETY (all calls below): rows r..r + nr and activations i..i + mb exist, and the
            // writes land inside the caller's region at offsets < mb * stride + nr.
            let mb = unsafe {
                if B::WIDE {
                    match (nr, left) {
                        (4, 8..) => {
                            b.block::<2, 8>(r, x, i, o, stride);
                            b.block::<2, 8>(r + 2, x, i, o.add(2), stride);
                            8
                        }
                        (4, 4..) => {
                            b.block::<4, 4>(r, x, i, o, stride);
                            4
                        }
                        (4, 2..) => {
                            b.block::<4, 2>(r, x, i, o, stride);
                            2
                        }
                        (4, _) => {
                            b.block::<4, 1>(r, x, i, o, stride);
                            1
                        }
                        (_, left) => {
                            let mb = [1, 2, 2, 4, 4, 4, 4, 8][left.min(8) - 1];
                            for k in 0..nr {
                                let o = o.add(k);
                                match mb {
                                    8 => b.block::<1, 8>(r + k, x, i, o, stride),
                                    4 => b.block::<1, 4>(r + k, x, i, o, stride),
                                    2 => b.block::<1, 2>(r + k, x, i, o, stride),
                                    _ => b.block::<1, 1>(r + k, x, i, o, stride),
                                }
                            }
                            mb
                        }
                    }
                } else {
                    match (nr, left) {
                        (4, 1) => {
                            b.block::<4, 1>(r, x, i, o, stride);
                            1
                        }
                        (_, 4..) => {
                            for k in 0..nr {
                                b.block::<1, 4>(r + k, x, i, o.add(k), stride);
                            }
                            4
                        }
                        (_, 2..) => {
                            let mut k = 0;
                            while k + 2 <= nr {
                                b.block::<2, 2>(r + k, x, i, o.add(k), stride);
                                k += 2;
                            }
                            if k < nr {
                                b.block::<1, 2>(r + k, x, i, o.add(k), stride);
                            }
                            2
                        }
                        (_, _) => {
                            for k in 0..nr {
                                b.block::<1, 1>(r + k, x, i, o.add(k), stride);
                            }
                            1
                        }
                    }
                }
            };
            i += mb;
        }
        r += nr;
    }
}

/// One row block of 8 AVX-512 rows (`r..r + 8`) against every activation row: one 8 × 1
/// register block at M = 1 (eight independent FMA chains hide the 4-cycle FMA latency that
/// bounded a 4-row block: +15–30 % at M = 1), 8 × 2 or 2 × (4 × 2) for two activation rows
/// ([`Block::PAIR8`]), and 2 × (4 × 4) or 4 × (2 × 4) for every four ([`Block::narrow4`]).
/// Eight activation rows as 4 × (2 × 8) blocks (one weight decode per 8 FMAs) were slower than
/// two passes of 4 × 4 on every format (Intel Xeon, one thread, L2-hot: 1.16–1.35× at M = 8
/// and 32, `benchmarks/RESULTS.md`): the 2 × 8 block's eight activation loads per step, not the
/// decodes, were the limit.
///
/// # Safety
/// As [`run`] for rows `r..r + 8` and activation rows `acts`; `base` is the first row of the
/// caller's output region.
unsafe fn run8<B: Block>(
    b: &B,
    r: usize,
    base: usize,
    x: &XPack,
    acts: Range<usize>,
    out: *mut f32,
    stride: usize,
) {
    let mut i = acts.start;
    while i < acts.end {
        let left = acts.end - i;
        // SAFETY: (r, i) lies inside the caller's output region.
        let o = unsafe { out.add(i * stride + (r - base)) };
        // SAFETY (all calls): rows r..r + 8 and activations i..i + mb exist, and the writes
        // land inside the caller's region at offsets < mb * stride + 8.
        let mb = unsafe {
            match left {
                4.. => {
                    if b.narrow4() {
                        for k in [0, 2, 4, 6] {
                            b.block::<2, 4>(r + k, x, i, o.add(k), stride);
                        }
                    } else {
                        b.block::<4, 4>(r, x, i, o, stride);
                        b.block::<4, 4>(r + 4, x, i, o.add(4), stride);
                    }
                    4
                }
                2.. => {
                    if B::PAIR8 {
                        b.block::<8, 2>(r, x, i, o, stride);
                    } else {
                        b.block::<4, 2>(r, x, i, o, stride);
                        b.block::<4, 2>(r + 4, x, i, o.add(4), stride);
                    }
                    2
                }
                _ => {
                    b.block::<8, 1>(r, x, i, o, stride);
                    1
                }
            }
        };
        i += mb;
    }
}

/// The activation layout `isa` wants for weights in `format`.
pub(crate) fn layout_for(isa: Isa, format: WeightFormat) -> Layout {
    match (isa, format) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512, WeightFormat::Int4Row | WeightFormat::Int4Group { .. }) => Layout::Nib16,
        _ => Layout::Natural,
    }
}

/// Computes weight rows `rows` of `w` against every row of `x` on `isa`, one thread, writing
/// row `r`, activation `i` to `*out.add(i * stride + (r - rows.start))`.
///
/// # Safety
/// `w` is validated, `rows.end <= w.rows`, `x` was packed with `layout_for(isa, w.format)` and
/// has `w.cols` columns, `isa` is supported by this CPU, and `out` is valid for those writes.
pub(crate) unsafe fn tile(
    isa: Isa,
    w: &MatRef<'_>,
    rows: Range<usize>,
    x: &XPack,
    out: *mut f32,
    stride: usize,
) {
    debug_assert!(rows.end <= w.rows && x.cols == w.cols);
    // SAFETY (each arm): forwarded from this function's contract.
    unsafe {
        match isa {
            Isa::Scalar => crate::scalar::tile(w, rows, x, out, stride),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => crate::x86::avx2::tile(w, rows, x, out, stride),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => crate::x86::avx512::tile(w, rows, x, out, stride),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => crate::aarch64::neon::tile(w, rows, x, out, stride),
        }
    }
}

/// A raw output pointer that parallel tasks share; each task writes a disjoint set of elements.
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub *mut f32);

impl SharedOut {
    /// The pointer. (A method, so closures capture the whole `Sync` wrapper, not the field.)
    #[inline(always)]
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: tasks write disjoint elements (each owns a distinct row range) and the owner of the
// buffer waits for all of them (`team::for_each` returns after the last) before reading it.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

/// Splits `rows` into tasks of whole row blocks covering at least [`TASK_BYTES`] of work each
/// (`row_bytes` of weights per row, applied to `m` activation rows) and runs `f` on every task
/// in parallel (on this thread's compute team, see [`crate::team`]).
pub(crate) fn par_rows(
    rows: Range<usize>,
    row_bytes: usize,
    m: usize,
    f: impl Fn(Range<usize>) + Sync + Send,
) {
    let work = row_bytes.saturating_mul(m.max(1)).max(1);
    let threads = crate::team::threads();
    if threads == 1 {
        // One thread: one task, so the weight stream (and its prefetch) never restarts.
        f(rows);
        return;
    }
    // At least TASK_BYTES of work, and no more than TASKS_PER_THREAD tasks per thread: each
    // task start is a cold start of the weight stream, so tasks are as long as load balance
    // allows.
    let per = (TASK_BYTES / work)
        .max(rows.len() / (threads * TASKS_PER_THREAD))
        .max(1)
        .div_ceil(ROW_BLOCK)
        * ROW_BLOCK;
    let n = rows.len().div_ceil(per);
    if n <= 1 {
        f(rows);
        return;
    }
    crate::team::for_each(n, |t| {
        let a = rows.start + t * per;
        f(a..(a + per).min(rows.end));
    });
}

/// Computes rows `rows` of `w · x` for every packed activation row, in parallel, writing row
/// `r`, activation `i` to `y[i * stride + (r - rows.start)]`.
///
/// # Safety
/// As [`tile`] for the whole range; `y` must hold `(x.m - 1) * stride + rows.len()` elements.
pub(crate) unsafe fn par_tile(
    isa: Isa,
    w: &MatRef<'_>,
    rows: Range<usize>,
    x: &XPack,
    y: &mut [f32],
    stride: usize,
) {
    if rows.is_empty() || x.m == 0 {
        return;
    }
    debug_assert!(y.len() >= (x.m - 1) * stride + rows.len());
    let base = rows.start;
    let out = SharedOut(y.as_mut_ptr());
    par_rows(rows, w.format.row_bytes(w.cols), x.m, |t| {
        prefetch_start(w, t.clone());
        // SAFETY: task `t` writes only its own rows' elements of `y` (disjoint from every other
        // task's); the rest is forwarded from this function's contract.
        unsafe { tile(isa, w, t.clone(), x, out.get().add(t.start - base), stride) }
    });
}

/// Prefetches the first row block of `rows` (weights and scales): the kernels prefetch one
/// block ahead of the block they compute, so a task's first block would otherwise start cold.
pub(crate) fn prefetch_start(w: &MatRef<'_>, rows: Range<usize>) {
    let rb = w.format.row_bytes(w.cols);
    let n = rows.len().min(ROW_BLOCK);
    let p = w.data.as_ptr().wrapping_add(rows.start * rb);
    let mut o = 0;
    while o < n * rb {
        prefetch(p.wrapping_add(o));
        o += 64;
    }
    let spr = w.format.row_scales(w.cols);
    let p = w
        .scales
        .as_ptr()
        .wrapping_add(rows.start * spr)
        .cast::<u8>();
    let mut o = 0;
    while o < n * spr * 4 {
        prefetch(p.wrapping_add(o));
        o += 64;
    }
}

/// Software prefetch of the next register block's weight bytes, spread evenly over the steps
/// of the current block (the kernels prefetch the next block's scales where they start a
/// block, see [`prefetch_scales`]).
///
/// Why: a block reads R interleaved rows, i.e. R short streams (1–8 KiB each at GLM widths);
/// the hardware prefetcher ramps up on each too late, and a single core then waits on DRAM
/// latency instead of streaming (measured: M = 1 int4 at 2048 columns ran at a third of the
/// read bandwidth). Fetching block b + 1 at the same fraction while computing block b turns
/// the whole matrix into one continuous stream one block ahead. Prefetches never fault, so the
/// block after the last row is harmless.
///
/// A block larger than [`PREFETCH_L1_BLOCK`] is fetched into L2 only: one block ahead is then
/// 24–64 KiB before use (GLM-5.2's expert gate/up, 6,144 columns; o_proj, 16,384), which with
/// the activations is more than L1 holds, so lines fetched into L1 were evicted before the
/// block started. Measured at M = 1, one thread, streaming from DRAM (`nectar bench kernels`,
/// AMD EPYC guest, `benchmarks/RESULTS.md`): int4-g64 gate_up 1.25× and o_proj 1.21×, int4-row
/// gate_up 1.30×, int8 gate_up, o_proj and lm_head 1.6×; narrower matrices unchanged. Fetching
/// every block into L2 cost the narrower ones 3–12 %, and a second, per-row L1 prefetch 512
/// bytes ahead beside the L2 one gained nothing.
pub(crate) struct Prefetch {
    p: *const u8,
    /// Bytes of the next block per 16-column step (`nrows` rows × 16 columns).
    step: usize,
    /// The block is larger than [`PREFETCH_L1_BLOCK`]: fetch into L2.
    far: bool,
}

/// Least prefetch distance in bytes (see [`Prefetch::new`]).
const PREFETCH_MIN: usize = 8192;

/// Largest block (weight bytes of its rows) prefetched into L1, half the 32 KiB L1 of the
/// smallest x86 cores we target: the activations share it (see [`Prefetch`]).
const PREFETCH_L1_BLOCK: usize = 16 * 1024;

impl Prefetch {
    /// For the `nrows` rows starting at `row`.
    #[inline(always)]
    pub(crate) fn new(w: &MatRef<'_>, row: usize, nrows: usize) -> Prefetch {
        let rb = w.format.row_bytes(w.cols);
        // `row` is the first row after the current block; prefetch at least MIN_DIST ahead.
        // One block ahead, and at least PREFETCH_MIN bytes: a block of short rows (attn.kv_b:
        // 8 × 256 bytes) is too little to cover the DRAM latency (measured: kv_b at M = 1 from
        // ≈ 0.5 to ≈ 0.65 of the read reference).
        let ahead = (nrows * rb).max(PREFETCH_MIN);
        Prefetch {
            p: w.data.as_ptr().wrapping_add((row - nrows) * rb + ahead),
            step: nrows * rb * 16 / w.cols.max(16),
            far: nrows * rb > PREFETCH_L1_BLOCK,
        }
    }

    /// Fetches into L2 also where the block alone would fit L1 beside `act_bytes` of
    /// activations per row that the kernel reads from L1 (the `digits` order's records are as
    /// large as f32 activations, and its blocks are half as tall).
    #[inline(always)]
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the VNNI kernel's
    pub(crate) fn beside(mut self, act_bytes: usize) -> Prefetch {
        self.far |= act_bytes > PREFETCH_L1_BLOCK;
        self
    }

    /// Issues the prefetches of `n` steps.
    #[inline(always)]
    pub(crate) fn steps(&mut self, n: usize) {
        let bytes = self.step * n;
        let mut o = 0;
        if self.far {
            while o < bytes {
                prefetch_l2(self.p.wrapping_add(o));
                o += 64;
            }
        } else {
            while o < bytes {
                prefetch(self.p.wrapping_add(o));
                o += 64;
            }
        }
        self.p = self.p.wrapping_add(bytes);
    }
}

/// Prefetches the scales of rows `row..row + nrows` (the next register block's), one prefetch
/// per line, where a block starts. A prefetch per row at every scale segment cost about a tenth
/// of int4-g64's rate on AVX-512 and 4–6 % on AVX2 (measured; `benchmarks/RESULTS.md`). The
/// AVX-512 blocks keep their own copy of this loop: calling this helper there made int8
/// products 9 % slower in an A/B (the same instructions; code placement, not understood).
#[inline(always)]
pub(crate) fn prefetch_scales(w: &MatRef<'_>, row: usize, nrows: usize) {
    let spr = w.format.row_scales(w.cols);
    let p = w.scales.as_ptr().wrapping_add(row * spr).cast::<u8>();
    let mut o = 0;
    while o < nrows * spr * 4 {
        prefetch(p.wrapping_add(o));
        o += 64;
    }
}

/// Hints the cache line holding `p` into L1. Never faults, whatever `p` is.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` only hints the cache; it never dereferences architecturally.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `prfm` only hints the cache and never faults.
    unsafe {
        std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

/// Hints the cache line holding `p` into L2 (not L1). Never faults, whatever `p` is.
#[inline(always)]
pub(crate) fn prefetch_l2(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht1` only hints the cache; it never dereferences architecturally.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.cast())
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `prfm` only hints the cache and never faults.
    unsafe {
        std::arch::asm!("prfm pldl2keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}
