//! y = W·x on the tensor cores for many activation rows at once (`gemm.cu`): prefill and
//! batched verify. Weight tiles are dequantised to bf16 in shared memory and multiplied with
//! f32 accumulation; activations (and f32/f16 weights) are split into bf16 parts so that the
//! product keeps about 24 bits of each (`gemm.cu` states the order and the error bound).
//!
//! Which of the two runs a product is decided in one place, [`use_gemm`], per shape: up to
//! [`MAX_M`] rows always the GEMV kernels (`gemv.rs`), beyond that whichever a cost model
//! measured on the H200 says is faster.
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::gemv::{shape_i32, Job, RowLayout, MAX_M};
use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use nectar_kernels::WeightFormat;

/// Whether an `m`-row product of a `rows × cols` matrix of `format` runs on the tensor-core
/// GEMM (one launch, each weight read once per 64 rows) rather than as ⌈m/8⌉ GEMV launches
/// (each streaming every weight). The one place this is decided (the model's `GpuWeight` asks).
///
/// Both kernels are latency-bound on short matrices: the GEMM walks the row in 32-column steps
/// of about 1.1 µs whatever M up to 64, and the tensor-core GEMV (whose time hardly grows with
/// M up to 8) has each warp walk a quarter of the row's 64-column steps, about 0.7 µs per 256
/// columns, or streams the bytes at the format's rate when that is longer. So a short, wide
/// matrix (an expert gate, 2048 × 6144: GEMM 214 µs, GEMV 20 µs per 8 rows) stays on the GEMV
/// launches to M ≈ 80, while a tall, narrow one (attention q_b, 16384 × 2048: GEMM 75 µs, GEMV
/// 18–24 µs) switches at M ≈ 25. Both times are modelled below with constants measured on the
/// H200 against the tensor-core GEMV (benchmarks/RESULTS.md, 2026-12-02 11:10 "use_gemm"); the
/// rule picks the faster kernel at every measured (shape, format, M) point of that run but one
/// tie (bf16 o_proj at M = 64: 506.5 against 506.9 µs). Both kernels are held to the same
/// tolerance, so the choice changes speed, not correctness.
pub fn use_gemm(format: WeightFormat, rows: usize, cols: usize, m: usize) -> bool {
    m > MAX_M && gemm_cost_us(rows, cols, m) < gemv_cost_us(format, rows, cols, m)
}

/// Fixed cost of a launch, µs (both kernels; it decides only for tiny matrices).
const LAUNCH_US: f64 = 3.0;
/// The GEMM's 32-column step, µs (212 µs for 192 steps, 73 for 64, 500 for 512).
const GEMM_STEP_US: f64 = 1.1;
/// The GEMM's useful rate once the tensor cores are the limit, flop/µs (58–72 TFLOP/s at M = 512).
const GEMM_FLOP_PER_US: f64 = 65e6;
/// The tensor-core GEMV's time per 256 columns of a row (one 64-column step of each of the
/// block's 4 warps), µs: a lone expert gate (6144 columns) takes 19.7 µs at M = 8 whatever its
/// format, o_proj (16384) 50–60.
const GEMV_STEP_US: f64 = 0.7;

fn gemm_cost_us(rows: usize, cols: usize, m: usize) -> f64 {
    let latency = GEMM_STEP_US * cols.div_ceil(32) as f64;
    let compute = 2.0 * (rows * cols) as f64 * m as f64 / GEMM_FLOP_PER_US;
    LAUNCH_US + latency.max(compute)
}

/// Weight + scale GB/s of one GEMV launch over a lone matrix at 1 and at 8 activation rows
/// (the tensor-core GEMV on GLM-5.2 shapes on the H200, 2026-12-02: int4 q_b / kv_b / o_proj
/// 1.2–1.3 TB/s at M = 1, 0.8–1.1 at M = 8; int8 o_proj 1.9–2.0; bf16 o_proj 3.2–3.3; f32 and
/// f16 take the f32 kernels, whose time grows with M). Times between are interpolated
/// linearly in M.
fn gemv_gbps(format: WeightFormat) -> (f64, f64) {
    match format {
        WeightFormat::Int4Row | WeightFormat::Int4Group { .. } => (1250.0, 1000.0),
        WeightFormat::Int8Row => (2000.0, 1800.0),
        WeightFormat::Bf16 => (3500.0, 3300.0),
        WeightFormat::F32 | WeightFormat::F16 => (2400.0, 800.0),
    }
}

fn gemv_cost_us(format: WeightFormat, rows: usize, cols: usize, m: usize) -> f64 {
    let bytes = (rows * (format.row_bytes(cols) + 4 * format.row_scales(cols))) as f64;
    let latency = GEMV_STEP_US * cols.div_ceil(256) as f64;
    let (g1, g8) = gemv_gbps(format);
    let (t1, t8) = (bytes / (g1 * 1e3), bytes / (g8 * 1e3));
    (0..m)
        .step_by(MAX_M)
        .map(|i0| {
            let mc = MAX_M.min(m - i0);
            let stream = t1 + (t8 - t1) * (mc - 1) as f64 / (MAX_M - 1) as f64;
            LAUNCH_US + latency.max(stream)
        })
        .sum()
}
/// Weight rows and tokens one block covers (`GEMM_BW`, `GEMM_BX` in `gemm.cu`).
const TILE_ROWS: u32 = 128;
const TILE_TOKENS: u32 = 64;
/// Threads per block (`GEMM_THREADS`).
const BLOCK_THREADS: u32 = 256;

/// How activations enter the tensor cores: in how many bf16 parts (x = x0 + x1 + x2, each the
/// rounding of what the earlier parts left).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Three parts: x kept to about 2⁻²⁴·|x|, like f32. What the model uses.
    Split3,
    /// Two parts: x kept to 2⁻¹⁶·|x|. Measured by the tests and `nectar bench gpu` only (a
    /// first two-part version failed the f32 fixtures' router-weight check; docs/gpu.md).
    Split2,
    /// One bf16 (2⁻⁹·|x|): ten times the model's parity bar. Measured only.
    Single,
}

impl Precision {
    /// `x3` / `x2` / `x1`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Split3 => "x3",
            Precision::Split2 => "x2",
            Precision::Single => "x1",
        }
    }
}

/// A GEMM kernel and its arguments for one (format, shape, M, precision).
pub struct GemmPlan {
    func: CudaFunction,
    format: WeightFormat,
    rows: usize,
    cols: usize,
    m: usize,
    layout: RowLayout,
}

/// The kernel for a format: integer codes go to the tensor cores exact, with the scale applied
/// per 16-column step, when no scale group splits such a step; other groups are dequantised to
/// the CPU's f32 values first (`_deq`).
pub(crate) fn kernel_name(format: WeightFormat, cols: usize, precision: Precision) -> String {
    let codes = |group: usize| group.is_multiple_of(16) || group >= cols;
    let base = match format {
        WeightFormat::F32 => "f32",
        WeightFormat::F16 => "f16",
        WeightFormat::Bf16 => "bf16",
        WeightFormat::Int8Row => "i8",
        WeightFormat::Int4Row => "i4",
        WeightFormat::Int4Group { group } if codes(group) => "i4",
        WeightFormat::Int4Group { .. } => "i4_deq",
    };
    // The coarser activations exist for the formats whose weights take one part.
    match precision {
        Precision::Split3 => format!("gemm_{base}"),
        p if matches!(base, "bf16" | "i8" | "i4") => format!("gemm_{base}_{}", p.name()),
        _ => format!("gemm_{base}"),
    }
}

/// Every GEMM entry point (for the compile test).
#[cfg(test)]
pub(crate) fn kernel_names() -> Vec<String> {
    let mut v: Vec<String> = [
        "f32", "f16", "bf16", "i8", "i4", "i4_deq", "bf16_x2", "i8_x2", "i4_x2", "bf16_x1",
        "i8_x1", "i4_x1",
    ]
    .iter()
    .map(|b| format!("gemm_{b}"))
    .collect();
    v.sort();
    v
}

impl Gpu {
    /// Prepares the GEMM for `m` (≥ 1) activation rows of a `rows × cols` matrix.
    pub fn gemm_plan(
        &self,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        m: usize,
        precision: Precision,
    ) -> Result<GemmPlan> {
        if m == 0 || m.div_ceil(TILE_TOKENS as usize) > 65535 {
            return Err(Error::Shape(format!(
                "gemm: m = {m} outside 1..={}",
                65535 * TILE_TOKENS as usize
            )));
        }
        shape_i32("m", m)?;
        Ok(GemmPlan {
            func: self.function(&kernel_name(format, cols, precision))?,
            format,
            rows,
            cols,
            m,
            layout: RowLayout::new(format, rows, cols)?,
        })
    }

    /// Queues one GEMM launch of `plan` over `n` jobs read from the job table at `jobs`.
    ///
    /// # Safety
    /// As [`Gpu::gemv_launch`]: `jobs` holds `n` [`Job`]s in device memory of this context whose
    /// addresses match the plan's shape (`rows × row_bytes` weight bytes, `rows × row_scales`
    /// scales, `m × cols` activations, `m × rows` writable outputs); `vec` only as
    /// [`GemmPlan::vector_flags`] computed it for these jobs.
    pub unsafe fn gemm_launch(&self, plan: &GemmPlan, jobs: u64, n: usize, vec: i32) -> Result<()> {
        if n == 0 || plan.rows == 0 || plan.cols == 0 {
            return Ok(());
        }
        if n > 65535 {
            return Err(Error::Shape(format!(
                "gemm: {n} jobs in one launch (at most 65535)"
            )));
        }
        let cfg = LaunchConfig {
            grid_dim: (
                (plan.rows as u32).div_ceil(TILE_ROWS),
                (plan.m as u32).div_ceil(TILE_TOKENS),
                n as u32,
            ),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (rows, cols, m) = (plan.rows as i32, plan.cols as i32, plan.m as i32);
        let mut b = self.stream.launch_builder(&plan.func);
        b.arg(&jobs)
            .arg(&rows)
            .arg(&cols)
            .arg(&m)
            .arg(&plan.layout.row_bytes)
            .arg(&plan.layout.row_scales)
            .arg(&plan.layout.gmagic)
            .arg(&plan.layout.gshift)
            .arg(&vec);
        // SAFETY: the caller guarantees the jobs' buffers match the plan (this fn's contract);
        // the grid covers every (row, token) once and the kernel bounds-checks both.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

impl GemmPlan {
    /// The kernel's vector-load flags for `jobs`: bit 0, weight rows in whole 16-byte chunks at
    /// 16-byte-aligned addresses; bit 1, activation rows of whole float4s, 16-byte aligned.
    /// Anything else is read element by element (still exact).
    pub fn vector_flags(&self, jobs: &[Job]) -> i32 {
        let w = self.layout.row_bytes % 16 == 0 && jobs.iter().all(|j| j.w % 16 == 0);
        let x = self.cols.is_multiple_of(4) && jobs.iter().all(|j| j.x % 16 == 0);
        i32::from(w) | (i32::from(x) << 1)
    }

    /// Multiply-adds one job performs (rows × cols × m).
    pub fn macs(&self) -> usize {
        self.rows * self.cols * self.m
    }

    /// The plan's format.
    pub fn format(&self) -> WeightFormat {
        self.format
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The switch follows the H200 measurements (RESULTS, "GEMV or GEMM"): GEMV at every shape
    /// up to 8 rows; on a short, wide expert gate GEMV to beyond M = 32 (the GEMM was 0.22–0.54×
    /// as fast there), on tall matrices the GEMM from M = 16 or 32; and at M = 512 the GEMM
    /// everywhere (7–14× faster). A single threshold (the former `GEMM_MIN_M = 9`) fails the
    /// gate cases.
    #[test]
    fn the_switch_is_per_shape_as_measured() {
        let g64 = WeightFormat::Int4Group { group: 64 };
        let (i8r, bf16) = (WeightFormat::Int8Row, WeightFormat::Bf16);
        // (format, rows, cols, M, GEMM measured faster): RESULTS 2026-12-02 11:10 (GEMM against
        // ⌈M/8⌉ tensor-core GEMV launches on the same weights), and M = 128 / 9 from 04:42.
        let measured = [
            (g64, 2048, 6144, 9, false),
            (g64, 2048, 6144, 16, false),
            (g64, 2048, 6144, 32, false),
            (g64, 2048, 6144, 64, false),
            (g64, 2048, 6144, 128, true),
            (g64, 2048, 6144, 512, true),
            (i8r, 2048, 6144, 32, false),
            (i8r, 2048, 6144, 64, false),
            (i8r, 2048, 6144, 512, true),
            (bf16, 2048, 6144, 32, false),
            (bf16, 2048, 6144, 64, false),
            (bf16, 2048, 6144, 512, true),
            (g64, 6144, 2048, 16, false),
            (g64, 6144, 2048, 32, false),
            (g64, 6144, 2048, 64, true),
            (g64, 6144, 2048, 512, true),
            (g64, 16384, 2048, 9, false),
            (g64, 16384, 2048, 16, false),
            (g64, 16384, 2048, 32, true),
            (g64, 16384, 2048, 512, true),
            (bf16, 6144, 16384, 16, false),
            (bf16, 6144, 16384, 32, false),
            (bf16, 6144, 16384, 512, true),
        ];
        for (f, rows, cols, m, gemm) in measured {
            assert_eq!(
                use_gemm(f, rows, cols, m),
                gemm,
                "{f:?} {rows}x{cols} M={m}"
            );
        }
        for (f, rows, cols) in [(g64, 2048, 6144), (bf16, 6144, 16384), (g64, 16384, 2048)] {
            for m in 1..=MAX_M {
                assert!(!use_gemm(f, rows, cols, m));
            }
            assert!(use_gemm(f, rows, cols, 512));
        }
        // A fixture-sized matrix: one GEMM launch beats ⌈24/8⌉ GEMV launches.
        assert!(use_gemm(WeightFormat::F32, 64, 64, 24));
    }

    /// Which kernel a format takes decides exactness: codes only when no scale group splits a
    /// 16-column step, and coarse activations only where they were built.
    #[test]
    fn formats_map_to_their_kernels() {
        let k = |f, cols, p| kernel_name(f, cols, p);
        let g = |group| WeightFormat::Int4Group { group };
        assert_eq!(k(g(64), 6144, Precision::Split3), "gemm_i4");
        assert_eq!(k(g(48), 768, Precision::Split3), "gemm_i4");
        assert_eq!(k(g(40), 200, Precision::Split3), "gemm_i4_deq");
        assert_eq!(k(g(5), 63, Precision::Split3), "gemm_i4_deq");
        // One group covering the row is a per-row scale.
        assert_eq!(k(g(100), 64, Precision::Split3), "gemm_i4");
        assert_eq!(k(WeightFormat::Int4Row, 101, Precision::Split3), "gemm_i4");
        assert_eq!(
            k(WeightFormat::Int8Row, 70, Precision::Split2),
            "gemm_i8_x2"
        );
        assert_eq!(k(WeightFormat::Bf16, 7, Precision::Single), "gemm_bf16_x1");
        // Split weights always take three activation parts.
        assert_eq!(k(WeightFormat::F32, 64, Precision::Single), "gemm_f32");
        assert_eq!(k(g(5), 63, Precision::Split2), "gemm_i4_deq");
        for f in [
            WeightFormat::F32,
            WeightFormat::F16,
            WeightFormat::Bf16,
            WeightFormat::Int8Row,
            WeightFormat::Int4Row,
            g(64),
            g(5),
        ] {
            for p in [Precision::Split3, Precision::Split2, Precision::Single] {
                assert!(kernel_names().contains(&k(f, 64, p)), "{f:?} {p:?}");
            }
        }
    }
}
