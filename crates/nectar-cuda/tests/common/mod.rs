//! Shared by the GPU parity tests: the GPU (or why there is none), random weights of every
//! stored format, and the comparison with the CPU kernels (nectar-kernels) by tolerance.
//!
//! Without a GPU (no driver, no device, no NVRTC) every test prints why and passes, unless
//! `NECTAR_REQUIRE_GPU=1` is set (scripts/gpu-device-run sets it on the GPU machine, so a GPU
//! that fails to open fails there instead of skipping).
#![allow(dead_code)] // each test binary uses its own part
use nectar_cuda::{within_tolerance, Error, Gpu, GpuMat};
use nectar_kernels::{decode_row, matmul, MatRef, WeightFormat};
use std::sync::OnceLock;

pub fn gpu() -> Option<&'static Gpu> {
    static GPU: OnceLock<Option<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::open(0) {
        Ok(g) => {
            eprintln!(
                "GPU: {}, kernels {} in {:.0} ms",
                g.describe(),
                if g.info().kernels_cached {
                    "from the cache"
                } else {
                    "compiled"
                },
                g.info().compile_ms
            );
            Some(g)
        }
        Err(Error::Unavailable(why)) if std::env::var_os("NECTAR_REQUIRE_GPU").is_none() => {
            eprintln!("skipped: {why}");
            None
        }
        Err(e) => panic!("opening the GPU: {e}"),
    })
    .as_ref()
}

/// Every stored format, with a group that splits a 32-bit word (48).
pub const FORMATS: [WeightFormat; 7] = [
    WeightFormat::F32,
    WeightFormat::Bf16,
    WeightFormat::F16,
    WeightFormat::Int8Row,
    WeightFormat::Int4Row,
    WeightFormat::Int4Group { group: 64 },
    WeightFormat::Int4Group { group: 48 },
];

pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    nectar_cuda::bench::random_bytes(len, seed)
}

/// Two bytes → a value in [-1, 1).
pub fn unit(c: &[u8]) -> f32 {
    u16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0 - 1.0
}

/// `n` values in [-2, 2) (three random bytes each).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    random_bytes(n * 3, seed)
        .chunks_exact(3)
        .map(|c| unit(c) * 2.0)
        .collect()
}

/// Random weights of `format` (finite values in [-1, 1) for float formats, any codes, positive
/// scales).
pub fn weights(format: WeightFormat, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let raw = random_bytes(rows * format.row_bytes(cols) * 2, seed);
    let n = rows * format.row_bytes(cols);
    let values = raw.chunks_exact(2).take(rows * cols).map(unit);
    let data: Vec<u8> = match format {
        WeightFormat::F32 => values.flat_map(f32::to_le_bytes).collect(),
        WeightFormat::Bf16 => values
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        WeightFormat::F16 => values
            .flat_map(|v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        _ => raw[..n].to_vec(),
    };
    let scales = random_bytes(rows * format.row_scales(cols), seed ^ 0x5ca1e)
        .iter()
        .map(|&b| 0.01 + b as f32 / 2560.0)
        .collect();
    (data, scales)
}

/// Σ|w·x| for every output element (the tolerance's scale).
pub fn abs_sums(w: &MatRef<'_>, x: &[f32], m: usize) -> Vec<f32> {
    let mut row = vec![0.0; w.cols];
    let mut out = vec![0.0; m * w.rows];
    for r in 0..w.rows {
        decode_row(w, r, &mut row);
        for i in 0..m {
            out[i * w.rows + r] = row
                .iter()
                .zip(&x[i * w.cols..(i + 1) * w.cols])
                .map(|(a, b)| (a * b).abs())
                .sum();
        }
    }
    out
}

/// Random weights of `format` (from `seed`) times `x` (`m` rows) on the GPU by `product`, against
/// the CPU kernels: every element within [`within_tolerance`] (NaN-poisoned outputs, so an
/// element the GPU never wrote fails). Returns the GPU output and its largest |Δ| / Σ|w·x|.
/// `what` names the kernel in a failure.
#[allow(clippy::too_many_arguments)]
pub fn compare(
    gpu: &Gpu,
    format: WeightFormat,
    rows: usize,
    cols: usize,
    m: usize,
    x: &[f32],
    seed: u64,
    what: &str,
    product: impl FnOnce(&GpuMat, &mut [f32]),
) -> (Vec<f32>, f64) {
    let (data, scales) = weights(format, rows, cols, seed);
    let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
    let mut cpu = vec![f32::NAN; m * rows];
    matmul(&w, x, m, &mut cpu).unwrap();
    let dev = gpu.upload(&w).unwrap();
    let mut y = vec![f32::NAN; m * rows];
    product(&dev, &mut y);
    let abs = abs_sums(&w, x, m);
    let mut worst = 0.0f64;
    for (k, ((&g, &c), &a)) in y.iter().zip(&cpu).zip(&abs).enumerate() {
        assert!(
            within_tolerance(g, c, a),
            "{} {rows}x{cols} m={m} {what}: element {k} (token {}, row {}): gpu {g}, cpu {c}, Σ|w·x| {a}",
            format.name(),
            k / rows,
            k % rows
        );
        worst = worst.max(((g - c).abs() / a.max(f32::MIN_POSITIVE)) as f64);
    }
    (y, worst)
}
