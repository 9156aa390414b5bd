//! Measurements for `nectar bench gpu`: GEMV kernels and host→device copies, each against a
//! physical limit measured on the same device in the same run.
//!
//! - Device copy bandwidth: `cuMemcpyDtoD` of a large buffer, counting bytes read plus written.
//!   Kernel GB/s (weight and scale bytes per second) is divided by it.
//! - Pinned host→device bandwidth: one large `cuMemcpyHtoD` from page-locked memory. Expert-sized
//!   copies (back to back from distinct pinned regions into distinct device slots) are divided by
//!   it.
//!
//! Timing uses CUDA events around a run of launches or copies; the median of several trials is
//! reported. Kernel cases rotate through copies of their weights spanning several times the L2
//! cache, so every launch streams from HBM as a decode step would, and each case is checked
//! against the CPU kernels (sampled rows, by [`crate::within_tolerance`]) before it is timed.
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::gemm::Precision;
use crate::gemv::{packs, GpuMat, Job, Order};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use nectar_kernels::{decode_row, dot_scalar, MatRef, WeightFormat};

/// Per-call times of a timed region.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Median over trials of (trial time / calls per trial), seconds.
    pub median_s: f64,
    /// Fastest trial's per-call time, seconds.
    pub best_s: f64,
    /// Trials timed.
    pub trials: usize,
}

impl Gpu {
    /// Times `f(i)` (which queues work on this handle's stream) over `trials` trials of `reps`
    /// calls each, after `warmup` untimed calls; `i` counts calls from 0 across warm-up and
    /// trials (for rotation).
    pub fn time(
        &self,
        warmup: usize,
        reps: usize,
        trials: usize,
        mut f: impl FnMut(usize) -> Result<()>,
    ) -> Result<Timing> {
        let reps = reps.max(1);
        let mut i = 0;
        for _ in 0..warmup {
            f(i)?;
            i += 1;
        }
        self.synchronize()?;
        let mut per_call = Vec::with_capacity(trials.max(1));
        for _ in 0..trials.max(1) {
            let start = self
                .stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            for _ in 0..reps {
                f(i)?;
                i += 1;
            }
            let end = self
                .stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            end.synchronize()?;
            per_call.push(start.elapsed_ms(&end)? as f64 * 1e-3 / reps as f64);
        }
        per_call.sort_by(f64::total_cmp);
        Ok(Timing {
            median_s: per_call[per_call.len() / 2],
            best_s: per_call[0],
            trials: per_call.len(),
        })
    }
}

/// Device-to-device copy of `bytes`: per-copy timing; GB/s = 2 × bytes / time (read + write).
pub fn d2d_copy(gpu: &Gpu, bytes: usize) -> Result<Timing> {
    let src = fill_device(gpu, bytes, 0x5eed)?;
    let mut dst: CudaSlice<u8> = gpu.stream.alloc_zeros(bytes)?;
    gpu.time(2, 5, 9, |_| Ok(gpu.stream.memcpy_dtod(&src, &mut dst)?))
}

/// Read-only streaming of `bytes` (the `read_ref` kernel): per-pass timing; GB/s = bytes / time.
/// A kernel that mostly reads can beat a copy (which turns the bus around for writes), so the
/// kernel ratios use the better of the two as the limit.
pub fn read_ref(gpu: &Gpu, bytes: usize) -> Result<Timing> {
    read_rotating(gpu, bytes, 1, 5)
}

/// The read reference at one product's size: `read_ref` launches of `bytes` each, rotating
/// through copies spanning at least `arena_bytes` as [`gemv_case`] rotates its weights, so a
/// launch streams from HBM and pays the same launch, ramp and drain as a product of that size.
/// A single matrix of a few MB cannot reach the large buffer's rate (its grid fills and drains
/// within microseconds); this says how far a kernel is from what reading its bytes can do.
pub fn read_ref_sized(gpu: &Gpu, bytes: usize, arena_bytes: usize) -> Result<Timing> {
    let bytes = bytes.next_multiple_of(256).max(256);
    read_rotating(
        gpu,
        bytes,
        copies_for(arena_bytes, bytes),
        launches_per_trial(bytes),
    )
}

/// Copies of a launch's `bytes` that span at least `arena_bytes` (and two), so that rotating
/// through them every launch streams from HBM instead of the L2 cache.
fn copies_for(arena_bytes: usize, bytes: usize) -> usize {
    arena_bytes.div_ceil(bytes.max(1)).max(2)
}

/// Launches of `bytes` each per timed trial: enough to pass ~2 ms at ~3 TB/s.
fn launches_per_trial(bytes: usize) -> usize {
    ((2e-3 / (bytes as f64 / 3e12)).ceil() as usize).clamp(4, 2000)
}

/// `reps` launches per trial of the `read_ref` kernel over `bytes`, launch `i` reading copy
/// `i % copies` of a buffer of `copies × bytes`.
fn read_rotating(gpu: &Gpu, bytes: usize, copies: usize, reps: usize) -> Result<Timing> {
    let n16 = (bytes / 16) as u64;
    let src = fill_device(gpu, bytes * copies, 0x7265_6164)?;
    let blocks = (gpu.info().multiprocessors * 8) as u32;
    let out: CudaSlice<u8> = gpu.stream.alloc_zeros(blocks as usize * 16)?;
    let func = gpu.function("read_ref")?;
    let (sp, _) = src.device_ptr(&gpu.stream);
    let (op, _) = out.device_ptr(&gpu.stream);
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    gpu.time(copies.clamp(2, 8), reps, 9, |i| {
        let p = sp + ((i % copies) * bytes) as u64;
        let mut b = gpu.stream.launch_builder(&func);
        b.arg(&p).arg(&n16).arg(&op);
        // SAFETY: `p` is the start of copy `i % copies`, `bytes` (n16 × 16 or more) readable
        // bytes inside `src`; `op` holds one 16-byte slot per block.
        unsafe { b.launch(cfg) }?;
        Ok(())
    })
}

/// Host→device copies from page-locked memory.
#[derive(Debug, Clone, Copy)]
pub struct H2d {
    /// One copy of the whole buffer.
    pub whole: Timing,
    /// Bytes of the whole-buffer copy.
    pub whole_bytes: usize,
    /// A pass of back-to-back `chunk`-sized copies over the same buffer (per pass).
    pub chunked: Timing,
    /// Bytes of one chunk (an expert).
    pub chunk_bytes: usize,
    /// Chunks per pass.
    pub chunks: usize,
}

/// Pinned host→device bandwidth: `total` bytes in one copy, and in `chunk`-byte copies from
/// distinct host regions into distinct device slots.
pub fn h2d(gpu: &Gpu, total: usize, chunk: usize) -> Result<H2d> {
    let chunk = chunk.clamp(1, total.max(1));
    let chunks = total / chunk;
    if chunks == 0 {
        return Err(Error::Shape(format!(
            "h2d: {total} bytes hold no {chunk}-byte chunk"
        )));
    }
    let total = chunks * chunk;
    // SAFETY: the buffer is filled before any copy reads it.
    let mut host = unsafe { gpu.ctx.alloc_pinned_with_flags::<u8>(total, 0)? };
    {
        let h = host.as_mut_slice()?;
        let bytes = random_bytes(chunk, 0x4832_4421);
        for c in h.chunks_mut(chunk) {
            c.copy_from_slice(&bytes[..c.len()]);
        }
    }
    let mut dev: CudaSlice<u8> = gpu.stream.alloc_zeros(total)?;
    let whole = gpu.time(1, 1, 7, |_| Ok(gpu.stream.memcpy_htod(&host, &mut dev)?))?;
    let h = host.as_slice()?;
    let chunked = gpu.time(1, 1, 7, |_| {
        for c in 0..chunks {
            let mut d = dev.slice_mut(c * chunk..(c + 1) * chunk);
            gpu.stream
                .memcpy_htod(&h[c * chunk..(c + 1) * chunk], &mut d)?;
        }
        Ok(())
    })?;
    gpu.synchronize()?;
    Ok(H2d {
        whole,
        whole_bytes: total,
        chunked,
        chunk_bytes: chunk,
        chunks,
    })
}

/// One kernel case: `batch` same-shaped matrices per launch (a layer's experts), `m` rows.
#[derive(Debug, Clone)]
pub struct GemvCase {
    /// Stable name (`expert.gate_up`, `attn.o_proj`, ...).
    pub name: String,
    /// Weight format.
    pub format: WeightFormat,
    /// Output features of each matrix.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Matrices per launch.
    pub batch: usize,
    /// Activation rows.
    pub m: usize,
    /// Scale order for quantised formats ([`Order::MODEL`] is what the model runs).
    pub order: Order,
}

/// A timed kernel case.
#[derive(Debug, Clone)]
pub struct GemvResult {
    /// The case.
    pub case: GemvCase,
    /// Per-launch timing.
    pub timing: Timing,
    /// Weight and scale bytes one launch streams.
    pub bytes: usize,
    /// Rotating copies of the batch's weights.
    pub copies: usize,
    /// Whether the 16-byte vector path ran.
    pub vector: bool,
    /// Whether the tensor-core GEMV ran.
    pub tensor: bool,
    /// Largest |gpu − cpu| / Σ|w·x| over the checked elements.
    pub max_rel_err: f64,
    /// Elements checked against the CPU kernels.
    pub checked: usize,
}

impl GemvResult {
    /// Weight GB/s at the median launch time.
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.timing.median_s / 1e9
    }
}

/// Rows of each matrix checked against the CPU kernels.
const CHECK_ROWS: usize = 24;

/// Measures one case: its weights rotate through copies spanning at least `arena_bytes`.
pub fn gemv_case(gpu: &Gpu, case: &GemvCase, arena_bytes: usize) -> Result<GemvResult> {
    let (f, rows, cols, m, batch) = (case.format, case.rows, case.cols, case.m, case.batch);
    let plan = gpu.gemv_plan(f, rows, cols, m, case.order)?;
    let wb = rows * f.row_bytes(cols);
    let sc = rows * f.row_scales(cols);
    let per_launch = batch * (wb + sc * 4);
    let copies = copies_for(arena_bytes, per_launch);
    let mats = copies * batch;
    // Host data for one batch: random codes, positive scales, activations in [-1, 1).
    let host_w = random_weights(f, batch * wb, 0x77_6569_6768);
    let host_s = random_scales(batch * sc, 0x73_6361_6c65);
    let host_x = random_activations(batch * m * cols, 0x78);
    // Every copy of the batch holds the same bytes (the cache cannot tell).
    let mut w_dev: CudaSlice<u8> = gpu.stream.alloc_zeros((mats * wb).max(1))?;
    let mut s_dev: CudaSlice<f32> = gpu.stream.alloc_zeros((mats * sc).max(1))?;
    for c in 0..copies {
        if wb > 0 {
            gpu.stream.memcpy_htod(
                &host_w,
                &mut w_dev.slice_mut(c * batch * wb..(c + 1) * batch * wb),
            )?;
        }
        if sc > 0 {
            gpu.stream.memcpy_htod(
                &host_s,
                &mut s_dev.slice_mut(c * batch * sc..(c + 1) * batch * sc),
            )?;
        }
    }
    let x_dev = gpu.stream.clone_htod(&host_x)?;
    let mut y_dev: CudaSlice<f32> = gpu.stream.alloc_zeros(batch * m * rows)?;
    let (wp, _) = w_dev.device_ptr(&gpu.stream);
    let (sp, _) = s_dev.device_ptr(&gpu.stream);
    let (xp, _) = x_dev.device_ptr(&gpu.stream);
    let (yp, _) = y_dev.device_ptr_mut(&gpu.stream);
    let jobs: Vec<Job> = (0..mats)
        .map(|i| {
            let j = i % batch;
            Job {
                w: wp + (i * wb) as u64,
                s: sp + (i * sc * 4) as u64,
                x: xp + (j * m * cols * 4) as u64,
                y: yp + (j * m * rows * 4) as u64,
                packed: 0,
            }
        })
        .collect();
    // The model's layout: int4 packed as `Gpu::upload` holds it.
    let mut jobs = jobs;
    let _packed = match case.order.tensor() && packs(f, rows, cols) {
        true => Some(pack_all(gpu, f, (rows, cols), &mut jobs, (wb, sc))?),
        false => None,
    };
    let vector = plan.vector_ok(&jobs);
    // SAFETY: the jobs' activations are this function's x buffer.
    let digits = match vector {
        true => unsafe { gpu.digits_for(&plan, &mut jobs)? },
        false => None,
    };
    let table = gpu.stream.clone_htod(&jobs)?;
    let (tp, _) = table.device_ptr(&gpu.stream);
    let srcs = digits
        .as_ref()
        .map(|d| gpu.stream.clone_htod(&d.srcs))
        .transpose()?;
    let job_bytes = std::mem::size_of::<Job>() as u64;
    let launch = |copy: usize| -> Result<()> {
        // The int4 GEMV's activation split is part of every product the model runs.
        if let Some(s) = &srcs {
            let (sp, _) = s.device_ptr(&gpu.stream);
            // SAFETY: the sources `digits_for` made for this plan over this function's x.
            unsafe { gpu.q_split(&plan, sp, s.len())? };
        }
        // SAFETY: the table's jobs point into this function's buffers with the plan's shape
        // (copy `copy` of each matrix, each item's own x or its digits, and y); alignment
        // checked above.
        unsafe { gpu.gemv_launch(&plan, tp + (copy * batch) as u64 * job_bytes, batch, vector) }
    };

    // Check: poison y, run copy 0, compare sampled rows with the CPU's decode + dot.
    let poison = vec![f32::NAN; batch * m * rows];
    gpu.stream.memcpy_htod(&poison, &mut y_dev)?;
    launch(0)?;
    let y = gpu.stream.clone_dtoh(&y_dev)?;
    let mut max_rel_err = 0.0f64;
    let mut checked = 0;
    let mut row = vec![0.0f32; cols];
    for j in 0..batch {
        let w = MatRef::new(
            f,
            rows,
            cols,
            &host_w[j * wb..(j + 1) * wb],
            &host_s[j * sc..(j + 1) * sc],
        )?;
        for k in 0..CHECK_ROWS.min(rows) {
            let r = k * rows / CHECK_ROWS.min(rows);
            decode_row(&w, r, &mut row);
            for i in 0..m {
                let x = &host_x[(j * m + i) * cols..(j * m + i + 1) * cols];
                let cpu = dot_scalar(&row, x);
                let abs: f32 = row.iter().zip(x).map(|(a, b)| (a * b).abs()).sum();
                let g = y[(j * m + i) * rows + r];
                if !crate::within_tolerance(g, cpu, abs) {
                    return Err(Error::Shape(format!(
                        "{} {} m={m}: matrix {j} row {r} act {i}: gpu {g} vs cpu {cpu} \
                         (Σ|w·x| = {abs})",
                        case.name,
                        f.name()
                    )));
                }
                max_rel_err =
                    max_rel_err.max(((g - cpu).abs() / abs.max(f32::MIN_POSITIVE)) as f64);
                checked += 1;
            }
        }
    }
    if y.iter().any(|v| v.is_nan()) {
        return Err(Error::Shape(format!(
            "{} {}: an output element was never written",
            case.name,
            f.name()
        )));
    }

    // Time: each launch streams the next copy. Enough launches per trial to pass ~2 ms.
    let reps = launches_per_trial(per_launch);
    let timing = gpu.time(copies.min(8), reps, 11, |i| launch(i % copies))?;
    Ok(GemvResult {
        case: case.clone(),
        timing,
        bytes: per_launch,
        copies,
        vector,
        tensor: vector && plan.tensor(),
        max_rel_err,
        checked,
    })
}

/// A device buffer of `bytes` pseudo-random bytes.
fn fill_device(gpu: &Gpu, bytes: usize, seed: u64) -> Result<CudaSlice<u8>> {
    let block = random_bytes((64 << 20).min(bytes.max(1)), seed);
    let mut d: CudaSlice<u8> = gpu.stream.alloc_zeros(bytes.max(1))?;
    let mut off = 0;
    while off < bytes {
        let n = block.len().min(bytes - off);
        gpu.stream
            .memcpy_htod(&block[..n], &mut d.slice_mut(off..off + n))?;
        off += n;
    }
    Ok(d)
}

/// Products as the model calls them ([`Gpu::matmul`]: activations from host memory, outputs
/// back into it, waited for): `m` rows of one `× cols` activation block times matrices of
/// `shapes` (format, rows) — one by one, or (`together`) in one round trip
/// ([`Gpu::matmul_each`], a layer's q_a and kv_a). The host's wall time per call of the set,
/// median of `trials` runs of `calls`. The calls rotate through copies of the matrices spanning
/// at least `arena_bytes`, so the weights stream from HBM as in a decode step; what the wall
/// time holds beyond the kernels' own time is the fixed cost (allocations, uploads, launches,
/// the download and the wait).
pub fn round_trip(
    gpu: &Gpu,
    (shapes, cols, m, together): (&[(WeightFormat, usize)], usize, usize, bool),
    arena_bytes: usize,
    (calls, trials): (usize, usize),
) -> Result<Timing> {
    let mut set_bytes = 0;
    let mut host = Vec::new();
    for (k, &(f, rows)) in shapes.iter().enumerate() {
        let w = random_weights(f, rows * f.row_bytes(cols), 0x0072_7472_6970 + k as u64);
        let s = random_scales(rows * f.row_scales(cols), 0x73);
        set_bytes += w.len() + 4 * s.len();
        host.push((f, rows, w, s));
    }
    let copies = copies_for(arena_bytes, set_bytes);
    let sets = (0..copies)
        .map(|_| {
            host.iter()
                .map(|(f, rows, w, s)| gpu.upload(&MatRef::new(*f, *rows, cols, w, s)?))
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    let x = random_activations(m * cols, 0x78);
    let mut ys: Vec<Vec<f32>> = shapes
        .iter()
        .map(|&(_, rows)| vec![0.0; m * rows])
        .collect();
    let call = |set: &Vec<GpuMat>, ys: &mut Vec<Vec<f32>>| -> Result<()> {
        if together {
            let mats: Vec<&GpuMat> = set.iter().collect();
            *ys = gpu.matmul_each(&mats, &x, m, Order::MODEL)?;
        } else {
            for (w, y) in set.iter().zip(ys.iter_mut()) {
                gpu.matmul(w, &x, m, y, Order::MODEL)?;
            }
        }
        Ok(())
    };
    for set in &sets {
        call(set, &mut ys)?;
    }
    let mut per_call = Vec::with_capacity(trials.max(1));
    let mut i = 0;
    for _ in 0..trials.max(1) {
        let start = std::time::Instant::now();
        for _ in 0..calls.max(1) {
            call(&sets[i % copies], &mut ys)?;
            i += 1;
        }
        per_call.push(start.elapsed().as_secs_f64() / calls.max(1) as f64);
    }
    per_call.sort_by(f64::total_cmp);
    Ok(Timing {
        median_s: per_call[per_call.len() / 2],
        best_s: per_call[0],
        trials: per_call.len(),
    })
}

/// Deterministic pseudo-random bytes (splitmix64), fast enough for hundreds of megabytes.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// `bytes` of random weights of format `f`: codes as drawn, or for the float formats (whose
/// random bit patterns include NaN and infinities) finite values in [-1, 1).
fn random_weights(f: WeightFormat, bytes: usize, seed: u64) -> Vec<u8> {
    let raw = random_bytes(bytes, seed);
    match f {
        WeightFormat::F32 | WeightFormat::Bf16 | WeightFormat::F16 => float_bytes(f, &raw),
        _ => raw,
    }
}

/// `n` positive random scales in [1e-3, 2e-3).
fn random_scales(n: usize, seed: u64) -> Vec<f32> {
    random_bytes(n, seed)
        .iter()
        .map(|&b| 1e-3 * (1.0 + b as f32 / 256.0))
        .collect()
}

/// `n` random activations in [-1, 1).
fn random_activations(n: usize, seed: u64) -> Vec<f32> {
    random_bytes(2 * n, seed)
        .chunks_exact(2)
        .map(|p| u16::from_le_bytes([p[0], p[1]]) as f32 / 32768.0 - 1.0)
        .collect()
}

/// Replaces random bytes by finite float weights in [-1, 1) of format `f`, same byte length.
fn float_bytes(f: WeightFormat, raw: &[u8]) -> Vec<u8> {
    let unit = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0 - 1.0;
    match f {
        WeightFormat::F32 => raw
            .chunks_exact(4)
            .flat_map(|c| unit(c).to_le_bytes())
            .collect(),
        WeightFormat::Bf16 => raw
            .chunks_exact(2)
            .flat_map(|c| ((unit(c).to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        WeightFormat::F16 => raw
            .chunks_exact(2)
            .flat_map(|c| half::f16::from_f32(unit(c)).to_le_bytes())
            .collect(),
        _ => raw.to_vec(),
    }
}

/// One prefill-shaped product: `m` activation rows through one `rows × cols` matrix, on the
/// tensor cores and, for comparison in the same run, as the ⌈m/8⌉ GEMV launches of the path it
/// replaces.
#[derive(Debug, Clone)]
pub struct GemmCase {
    /// Stable name (`expert.gate`, `attn.q_b`, ...).
    pub name: String,
    /// Weight format.
    pub format: WeightFormat,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Activation rows.
    pub m: usize,
    /// How activations enter the tensor cores.
    pub precision: Precision,
}

/// A timed GEMM case.
#[derive(Debug, Clone)]
pub struct GemmResult {
    /// The case.
    pub case: GemmCase,
    /// Per-product timing on the tensor cores.
    pub gemm: Timing,
    /// Per-product timing as ⌈m/8⌉ GEMV launches ([`Order::MODEL`]), same weights, same run.
    pub gemv: Timing,
    /// Whether the model's per-shape rule ([`crate::use_gemm`]) picks the GEMM for this case.
    pub uses_gemm: bool,
    /// Largest |gpu − cpu| / Σ|w·x| over the checked elements (GEMM).
    pub max_rel_err: f64,
    /// Elements checked against the CPU kernels.
    pub checked: usize,
}

impl GemmResult {
    /// Useful TFLOP/s (2 · rows · cols · m per product) at the median GEMM time.
    pub fn tflops(&self) -> f64 {
        2.0 * (self.case.rows * self.case.cols * self.case.m) as f64 / self.gemm.median_s / 1e12
    }

    /// GEMV-path time ÷ GEMM time.
    pub fn speedup(&self) -> f64 {
        self.gemv.median_s / self.gemm.median_s
    }
}

/// Measures one GEMM case; weights rotate through copies spanning at least `arena_bytes`, as
/// in [`gemv_case`], so each product reads its weights from HBM.
pub fn gemm_case(gpu: &Gpu, case: &GemmCase, arena_bytes: usize) -> Result<GemmResult> {
    let (f, rows, cols, m) = (case.format, case.rows, case.cols, case.m);
    let plan = gpu.gemm_plan(f, rows, cols, m, case.precision)?;
    let wb = rows * f.row_bytes(cols);
    let sc = rows * f.row_scales(cols);
    let copies = copies_for(arena_bytes, wb + sc * 4);
    let host_w = random_weights(f, wb, 0x6765_6d6d);
    let host_s = random_scales(sc, 0x73_6361_6c65);
    let host_x = random_activations(m * cols, 0x78);
    let mut w_dev: CudaSlice<u8> = gpu.stream.alloc_zeros((copies * wb).max(1))?;
    let mut s_dev: CudaSlice<f32> = gpu.stream.alloc_zeros((copies * sc).max(1))?;
    for c in 0..copies {
        gpu.stream
            .memcpy_htod(&host_w, &mut w_dev.slice_mut(c * wb..(c + 1) * wb))?;
        if sc > 0 {
            gpu.stream
                .memcpy_htod(&host_s, &mut s_dev.slice_mut(c * sc..(c + 1) * sc))?;
        }
    }
    let x_dev = gpu.stream.clone_htod(&host_x)?;
    let mut y_dev: CudaSlice<f32> = gpu.stream.alloc_zeros(m * rows)?;
    let (wp, _) = w_dev.device_ptr(&gpu.stream);
    let (sp, _) = s_dev.device_ptr(&gpu.stream);
    let (xp, _) = x_dev.device_ptr(&gpu.stream);
    let (yp, _) = y_dev.device_ptr_mut(&gpu.stream);
    // One job per copy (the model's layout: int4 packed as `Gpu::upload` holds it), for the
    // whole m (GEMM) and per chunk of 8 rows (GEMV).
    let mut mats: Vec<Job> = (0..copies)
        .map(|c| Job {
            w: wp + (c * wb) as u64,
            s: sp + (c * sc * 4) as u64,
            ..Job::default()
        })
        .collect();
    let _packed = match packs(f, rows, cols) {
        true => Some(pack_all(gpu, f, (rows, cols), &mut mats, (wb, sc))?),
        false => None,
    };
    let job = |c: usize, i0: usize| Job {
        x: xp + (i0 * cols * 4) as u64,
        y: yp + (i0 * rows * 4) as u64,
        ..mats[c]
    };
    let chunks: Vec<usize> = (0..m).step_by(crate::MAX_M).collect();
    let gemm_jobs: Vec<Job> = (0..copies).map(|c| job(c, 0)).collect();
    let vec = plan.vector_flags(&gemm_jobs);
    let gemm_table = gpu.stream.clone_htod(&gemm_jobs)?;
    let (gt, _) = gemm_table.device_ptr(&gpu.stream);
    let job_bytes = std::mem::size_of::<Job>() as u64;
    let gemm = |copy: usize| {
        // SAFETY: job `copy` points at copy `copy` of the weights, x (m × cols) and y (m ×
        // rows) of this function, the plan's shape; `vector_flags` checked alignment.
        unsafe { gpu.gemm_launch(&plan, gt + copy as u64 * job_bytes, 1, vec) }
    };
    // Per chunk: its plan, its jobs' table (one per copy) and the int4 GEMV's digits.
    let mut gemv_chunks = Vec::new();
    for &i0 in &chunks {
        let p = gpu.gemv_plan(f, rows, cols, crate::MAX_M.min(m - i0), Order::MODEL)?;
        let mut jobs: Vec<Job> = (0..copies).map(|c| job(c, i0)).collect();
        let vector = p.vector_ok(&jobs);
        // SAFETY: the jobs' activations are rows of this function's x.
        let digits = match vector {
            true => unsafe { gpu.digits_for(&p, &mut jobs)? },
            false => None,
        };
        let table = gpu.stream.clone_htod(&jobs)?;
        let srcs = digits
            .as_ref()
            .map(|d| gpu.stream.clone_htod(&d.srcs))
            .transpose()?;
        gemv_chunks.push((p, table, vector, digits, srcs));
    }
    let gemv = |copy: usize| -> Result<()> {
        for (p, table, vector, _digits, srcs) in &gemv_chunks {
            if let Some(s) = srcs {
                let (sp, _) = s.device_ptr(&gpu.stream);
                // SAFETY: the sources `digits_for` made for this plan over this function's x.
                unsafe { gpu.q_split(p, sp, s.len())? };
            }
            let (tp, _) = table.device_ptr(&gpu.stream);
            // SAFETY: as above, for rows i0 … i0 + 8 of x (or their digits) and y.
            unsafe { gpu.gemv_launch(p, tp + copy as u64 * job_bytes, 1, *vector)? };
        }
        Ok(())
    };

    // Check the GEMM against the CPU on sampled rows (NaN-poisoned output first).
    gpu.stream
        .memcpy_htod(&vec![f32::NAN; m * rows], &mut y_dev)?;
    gemm(0)?;
    let y = gpu.stream.clone_dtoh(&y_dev)?;
    let w = MatRef::new(f, rows, cols, &host_w, &host_s)?;
    let (mut max_rel_err, mut checked) = (0.0f64, 0);
    let mut row = vec![0.0f32; cols];
    for k in 0..CHECK_ROWS.min(rows) {
        let r = k * rows / CHECK_ROWS.min(rows);
        decode_row(&w, r, &mut row);
        for i in (0..m).step_by(m.div_ceil(16)) {
            let x = &host_x[i * cols..(i + 1) * cols];
            let cpu = dot_scalar(&row, x);
            let abs: f32 = row.iter().zip(x).map(|(a, b)| (a * b).abs()).sum();
            let g = y[i * rows + r];
            let ok = match case.precision {
                Precision::Split3 => crate::within_tolerance(g, cpu, abs),
                Precision::Split2 => crate::within_gemm_tolerance(g, cpu, abs),
                Precision::Single => (g - cpu).abs() <= abs / 256.0 + 1e-5 * abs,
            };
            if !ok {
                return Err(Error::Shape(format!(
                    "gemm {} {} m={m}: row {r} token {i}: gpu {g} vs cpu {cpu} (Σ|w·x| = {abs})",
                    case.name,
                    f.name()
                )));
            }
            max_rel_err = max_rel_err.max(((g - cpu).abs() / abs.max(f32::MIN_POSITIVE)) as f64);
            checked += 1;
        }
    }
    if y.iter().any(|v| v.is_nan()) {
        return Err(Error::Shape(format!(
            "gemm {} {}: an output element was never written",
            case.name,
            f.name()
        )));
    }
    // Enough products per trial to pass ~2 ms at a guessed 100 TFLOP/s.
    let t_est = 2.0 * (rows * cols * m) as f64 / 1e14;
    let reps = ((2e-3 / t_est).ceil() as usize).clamp(3, 500);
    let gemm_t = gpu.time(copies.min(4), reps, 9, |i| gemm(i % copies))?;
    let gemv_t = gpu.time(copies.min(4), reps.div_ceil(4), 5, |i| gemv(i % copies))?;
    Ok(GemmResult {
        case: case.clone(),
        gemm: gemm_t,
        gemv: gemv_t,
        uses_gemm: crate::use_gemm(f, rows, cols, m),
        max_rel_err,
        checked,
    })
}

/// Expert-sized copies from pageable host memory through [`crate::copy::Staging`] (the route of
/// a routed expert copied from its RAM slot), against the pinned reference of the same area.
#[derive(Debug, Clone, Copy)]
pub struct StagedCopies {
    /// The ring's layout.
    pub config: crate::copy::StageConfig,
    /// Bytes per expert.
    pub expert_bytes: usize,
    /// Experts copied.
    pub experts: usize,
    /// Pinned host→device bytes per second on the copy stream ([`Staging::pinned_reference`]).
    ///
    /// [`Staging::pinned_reference`]: crate::copy::Staging::pinned_reference
    pub pinned_bps: f64,
    /// The DMAs' own rate (each chunk timed by its events).
    pub link_bps: f64,
    /// Bytes ÷ wall time from the first copy to the last DMA's end.
    pub end_to_end_bps: f64,
}

/// Copies `experts` distinct pageable buffers of `expert_bytes` into two slots in turn, each
/// slot released as soon as its copy landed (no kernels), as [`crate::copy::Staging`] runs for
/// the model; returns the rates against the pinned reference measured on the same area.
pub fn staged_copies(
    gpu: &std::sync::Arc<Gpu>,
    config: crate::copy::StageConfig,
    expert_bytes: usize,
    experts: usize,
) -> Result<StagedCopies> {
    let staging = crate::copy::Staging::with_config(gpu, 2, expert_bytes, config)?;
    let pinned_bps = staging.pinned_reference(8)?;
    let src = pageable_source(expert_bytes * experts);
    // One warm-up copy (the pool's threads, the first touch of the ring).
    staging.copy(0, &[&src[..expert_bytes]])?;
    staging.wait_ready(0)?;
    staging.release(0)?;
    let (b0, s0) = staging.link();
    let started = std::time::Instant::now();
    for e in 0..experts {
        let slot = e % 2;
        staging.copy(slot, &[&src[e * expert_bytes..(e + 1) * expert_bytes]])?;
        if e > 0 {
            staging.wait_ready(1 - slot)?;
            staging.release(1 - slot)?;
        }
    }
    staging.wait_ready((experts + 1) % 2)?;
    let wall = started.elapsed().as_secs_f64();
    let (b1, s1) = staging.link();
    Ok(StagedCopies {
        config,
        expert_bytes,
        experts,
        pinned_bps,
        link_bps: (b1 - b0) as f64 / (s1 - s0).max(1e-12),
        end_to_end_bps: (experts * expert_bytes) as f64 / wall.max(1e-12),
    })
}

/// `bytes` of ordinary (pageable) memory, every page written.
fn pageable_source(bytes: usize) -> Vec<u8> {
    let block = random_bytes(1 << 20, 0x5041_4745);
    let mut v = vec![0u8; bytes];
    for c in v.chunks_mut(block.len()) {
        c.copy_from_slice(&block[..c.len()]);
    }
    v
}

/// The same copies with the pageable source registered with the driver (`cuMemHostRegister`)
/// and each expert one DMA straight from it: the ceiling of a design that pins the RAM slots.
/// Returns (registration bytes per second, DMA bytes per second).
pub fn registered_copies(gpu: &Gpu, expert_bytes: usize, experts: usize) -> Result<(f64, f64)> {
    use cudarc::driver::sys;
    let mut src = pageable_source(expert_bytes * experts);
    let dev: CudaSlice<u8> = gpu.stream.alloc_zeros(2 * expert_bytes)?;
    let (dp, _) = dev.device_ptr(&gpu.stream);
    gpu.ctx.bind_to_thread()?;
    let t = std::time::Instant::now();
    // SAFETY: `src` is a live allocation of this length; it is unregistered below before it is
    // dropped, and not resized meanwhile.
    unsafe { sys::cuMemHostRegister_v2(src.as_mut_ptr().cast(), src.len(), 0).result()? };
    let reg_s = t.elapsed().as_secs_f64();
    let run = || -> Result<Timing> {
        gpu.time(0, 1, 3, |_| {
            for e in 0..experts {
                // SAFETY: the source is registered and alive; the destination is one of the
                // two expert-sized halves of `dev`.
                unsafe {
                    cudarc::driver::result::memcpy_htod_async(
                        dp + ((e % 2) * expert_bytes) as u64,
                        &src[e * expert_bytes..(e + 1) * expert_bytes],
                        gpu.stream.cu_stream(),
                    )?
                };
            }
            Ok(())
        })
    };
    let timing = run();
    gpu.synchronize()?;
    // SAFETY: registered above, no copy in flight (synchronised).
    unsafe { sys::cuMemHostUnregister(src.as_mut_ptr().cast()).result()? };
    let timing = timing?;
    Ok((
        src.len() as f64 / reg_s.max(1e-12),
        src.len() as f64 / timing.median_s,
    ))
}

/// Expert copies by the model's direct route ([`crate::copy::Staging::copy_direct`]): DMAs
/// straight from pageable memory registered with the driver (as the RAM cache's slots are),
/// into two staging slots in turn, each waited for and released as the model does; alternated
/// trial by trial with the pinned reference of the same area, so both see the same machine.
#[derive(Debug, Clone)]
pub struct SlotCopies {
    /// Bytes per expert (gate, up and down of GLM-5.2 at int4 g64, weights then scales).
    pub expert_bytes: usize,
    /// Experts copied per trial.
    pub experts: usize,
    /// Pinned reference per trial, bytes/s ([`crate::copy::Staging::pinned_reference`]).
    pub pinned_bps: Vec<f64>,
    /// End to end per trial (first DMA queued to the last one landed, the host's queueing,
    /// waits and releases included), bytes/s.
    pub direct_bps: Vec<f64>,
    /// The DMAs' own rate over all trials (each copy timed by its slot's events), bytes/s.
    pub link_bps: f64,
    /// Registering the whole source once (the model registers each slot on its first copy),
    /// bytes/s.
    pub register_bps: f64,
    /// Activation rows of the overlap measurement.
    pub rows: usize,
    /// Seconds of the `experts` products alone (gate + up launch, SwiGLU on the host, down), on
    /// experts already staged.
    pub compute_s: f64,
    /// Seconds of the copies alone (the median trial above).
    pub copy_s: f64,
    /// Seconds of copy and compute pipelined as the model does (the copy of expert e + 1
    /// queued before the products of expert e).
    pub overlapped_s: f64,
}

impl SlotCopies {
    /// Median of a list.
    fn median(v: &[f64]) -> f64 {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }

    /// Median end to end ÷ median pinned reference.
    pub fn ratio(&self) -> f64 {
        Self::median(&self.direct_bps) / Self::median(&self.pinned_bps).max(1e-12)
    }

    /// Median end-to-end bytes/s.
    pub fn direct_median(&self) -> f64 {
        Self::median(&self.direct_bps)
    }

    /// Median pinned reference bytes/s.
    pub fn pinned_median(&self) -> f64 {
        Self::median(&self.pinned_bps)
    }

    /// Fraction of the copy time hidden behind the products when pipelined:
    /// 1 − (overlapped − compute) ÷ copy, within [0, 1].
    pub fn hidden(&self) -> f64 {
        (1.0 - (self.overlapped_s - self.compute_s) / self.copy_s.max(1e-12)).clamp(0.0, 1.0)
    }
}

/// [`SlotCopies`]: `experts` GLM-5.2 experts (int4 g64 gate, up [2048, 6144] and down [6144,
/// 2048]) in one registered pageable buffer, `trials` alternated trials, and the overlap with
/// products of `rows` activation rows.
pub fn slot_copies(
    gpu: &std::sync::Arc<Gpu>,
    experts: usize,
    trials: usize,
    rows: usize,
) -> Result<SlotCopies> {
    use crate::copy::{slot_bytes_for, HostRegistry, Staging, PART_ALIGN};
    let f = WeightFormat::Int4Group { group: 64 };
    let shapes = [(2048usize, 6144usize), (2048, 6144), (6144, 2048)];
    let mut parts = Vec::new();
    for (r, c) in shapes {
        parts.push(r * f.row_bytes(c));
        parts.push(4 * r * f.row_scales(c));
    }
    let expert_bytes: usize = parts.iter().sum();
    // Experts laid out as the slots hold them (each part at a PART_ALIGN boundary), one every
    // `stride` bytes of a u32 buffer (4-byte aligned scales).
    let stride = slot_bytes_for(&parts).div_ceil(4096) * 4096;
    let mut buf = vec![0u32; stride * experts / 4];
    {
        let codes = random_bytes(1 << 20, 0x534c_4f54);
        // SAFETY: u32 → u8 view of the same allocation, no other reference while it lives.
        let bytes: &mut [u8] =
            unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast(), buf.len() * 4) };
        for e in 0..experts {
            let mut off = e * stride;
            for (k, &len) in parts.iter().enumerate() {
                let dst = &mut bytes[off..off + len];
                if k % 2 == 0 {
                    for c in dst.chunks_mut(codes.len()) {
                        c.copy_from_slice(&codes[..c.len()]);
                    }
                } else {
                    for c in dst.chunks_exact_mut(4) {
                        c.copy_from_slice(&0.01f32.to_le_bytes());
                    }
                }
                off += len.div_ceil(PART_ALIGN) * PART_ALIGN;
            }
        }
    }
    let bytes: &[u8] = {
        // SAFETY: as above, read-only from here on.
        unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), buf.len() * 4) }
    };
    let mats = |e: usize| -> Result<Vec<MatRef<'_>>> {
        let mut off = e * stride;
        let mut v = Vec::new();
        for (r, c) in shapes {
            let n = r * f.row_bytes(c);
            let s_off = off + n.div_ceil(PART_ALIGN) * PART_ALIGN;
            let ns = r * f.row_scales(c);
            // SAFETY: `s_off` is a multiple of 4 inside the u32 buffer; the f32 view covers
            // exactly the scales written above and lives as long as `bytes`.
            let scales =
                unsafe { std::slice::from_raw_parts(bytes[s_off..].as_ptr().cast::<f32>(), ns) };
            v.push(MatRef::new(f, r, c, &bytes[off..off + n], scales)?);
            off = s_off + (4 * ns).div_ceil(PART_ALIGN) * PART_ALIGN;
        }
        Ok(v)
    };
    let staging = Staging::new(gpu, 2, slot_bytes_for(&parts))?;
    let reg = HostRegistry::new(gpu);
    let t = std::time::Instant::now();
    // SAFETY: `buf` outlives `reg` (declared before it, so dropped after), and is neither
    // freed nor released while registered.
    unsafe { reg.register(bytes.as_ptr(), bytes.len())? };
    let register_bps = bytes.len() as f64 / t.elapsed().as_secs_f64().max(1e-12);
    // One pass: every expert copied into the two slots in turn; `work(e, views)` runs on each
    // landed expert before its slot is released (the products, or nothing).
    let pass = |work: &mut dyn FnMut(&[crate::MatView]) -> Result<()>| -> Result<f64> {
        let started = std::time::Instant::now();
        let mut pending: Option<(usize, Vec<crate::MatView>)> = None;
        for e in 0..experts {
            let slot = e % 2;
            // SAFETY: the buffer is registered and unchanged until every copy has landed
            // (the pass waits for each slot before it returns).
            let (views, _) = unsafe { staging.copy_mats_direct(slot, &mats(e)?)? };
            if let Some((s, v)) = pending.take() {
                staging.wait_ready(s)?;
                work(&v)?;
                staging.release(s)?;
            }
            pending = Some((slot, views));
        }
        if let Some((s, v)) = pending {
            staging.wait_ready(s)?;
            work(&v)?;
            staging.release(s)?;
        }
        Ok(started.elapsed().as_secs_f64())
    };
    pass(&mut |_| Ok(()))?; // warm-up
    let (b0, s0) = staging.link();
    let (mut pinned_bps, mut direct_bps) = (Vec::new(), Vec::new());
    for _ in 0..trials.max(1) {
        pinned_bps.push(staging.pinned_reference(8)?);
        let s = pass(&mut |_| Ok(()))?;
        direct_bps.push((experts * expert_bytes) as f64 / s);
    }
    let (b1, s1) = staging.link();
    // The products of `rows` rows as the model runs a copied expert.
    let x: Vec<f32> = (0..rows * 6144)
        .map(|i| ((i % 97) as f32 - 48.0) / 97.0)
        .collect();
    let mut products = |v: &[crate::MatView]| -> Result<()> {
        // SAFETY: the views address a slot whose DMA landed (`wait_ready`) and which is not
        // refilled before `release`, after this returns.
        let mut gu = unsafe { gpu.matmul_views(&[(v[0], &x), (v[1], &x)], rows)? };
        let u = gu.pop().unwrap_or_default();
        let mut g = gu.pop().unwrap_or_default();
        nectar_kernels::swiglu_in_place(&mut g, &u);
        // SAFETY: as above.
        unsafe { gpu.matmul_views(&[(v[2], &g)], rows)? };
        Ok(())
    };
    // Compute alone: the products of each expert on the two staged slots, no copies.
    // SAFETY: as in `pass`: registered, unchanged, waited for below.
    let (views0, _) = unsafe { staging.copy_mats_direct(0, &mats(0)?)? };
    staging.wait_ready(0)?;
    products(&views0)?; // warm-up (kernels, buffers)
    let t = std::time::Instant::now();
    for _ in 0..experts {
        products(&views0)?;
    }
    let compute_s = t.elapsed().as_secs_f64();
    staging.release(0)?;
    let overlapped_s = pass(&mut products)?;
    gpu.synchronize()?;
    let copy_s = (experts * expert_bytes) as f64 / SlotCopies::median(&direct_bps).max(1e-12);
    drop(reg);
    drop(buf);
    Ok(SlotCopies {
        expert_bytes,
        experts,
        pinned_bps,
        direct_bps,
        link_bps: (b1 - b0) as f64 / (s1 - s0).max(1e-12),
        register_bps,
        rows,
        compute_s,
        copy_s,
        overlapped_s,
    })
}

/// Packs each job's int4 matrix (`rows × cols`, `wb` weight bytes and `sc` scales, stored)
/// into new buffers in [`Gpu::upload`]'s layout and points the job there.
fn pack_all(
    gpu: &Gpu,
    f: WeightFormat,
    (rows, cols): (usize, usize),
    jobs: &mut [Job],
    (wb, sc): (usize, usize),
) -> Result<(CudaSlice<u8>, CudaSlice<f32>)> {
    let mut w: CudaSlice<u8> = gpu.stream.alloc_zeros((jobs.len() * wb).max(1))?;
    let mut s: CudaSlice<f32> = gpu.stream.alloc_zeros((jobs.len() * sc).max(1))?;
    {
        let (wp, _w_sync) = w.device_ptr_mut(&gpu.stream);
        let (sp, _s_sync) = s.device_ptr_mut(&gpu.stream);
        for (i, j) in jobs.iter_mut().enumerate() {
            let dst = (wp + (i * wb) as u64, sp + (i * sc * 4) as u64);
            // SAFETY: each job's weights and scales hold a stored matrix of this shape (the
            // caller's buffers), `dst` its own slice of the new ones.
            unsafe { gpu.q_pack(f, rows, cols, (j.w, j.s), dst)? };
            (j.w, j.s, j.packed) = (dst.0, dst.1, 1);
        }
    }
    Ok((w, s))
}
