//! Synthetic weights and the scalar reference the benchmarks check against.
use criterion::Criterion;
use nectar_kernels::{decode_row, dot_scalar, MatRef, WeightFormat};
use std::time::Duration;

/// Short runs: these are regression probes, not the reported numbers.
pub fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}

fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// An owned matrix of random weights (finite floats; scales of both signs).
pub struct Owned {
    pub format: WeightFormat,
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<u8>,
    pub scales: Vec<f32>,
}

impl Owned {
    pub fn new(format: WeightFormat, rows: usize, cols: usize, seed: u64) -> Owned {
        let mut s = seed;
        let nb = rows * format.row_bytes(cols);
        let mut value = || (splitmix(&mut s) >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        let data: Vec<u8> = match format {
            WeightFormat::F32 => (0..nb / 4).flat_map(|_| value().to_le_bytes()).collect(),
            WeightFormat::Bf16 => (0..nb / 2)
                .flat_map(|_| half::bf16::from_f32(value()).to_le_bytes())
                .collect(),
            WeightFormat::F16 => (0..nb / 2)
                .flat_map(|_| half::f16::from_f32(value()).to_le_bytes())
                .collect(),
            _ => (0..nb).map(|_| (value().to_bits() >> 7) as u8).collect(),
        };
        let scales = (0..rows * format.row_scales(cols))
            .map(|_| value() * 0.02)
            .collect();
        Owned {
            format,
            rows,
            cols,
            data,
            scales,
        }
    }

    pub fn view(&self) -> MatRef<'_> {
        MatRef::new(self.format, self.rows, self.cols, &self.data, &self.scales)
            .expect("consistent sizes")
    }
}

pub fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| (splitmix(&mut s) >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        .collect()
}

/// `y = W · x` for `m` rows with `decode_row` + `dot_scalar`: the bits every path must match.
pub fn reference(w: &MatRef<'_>, x: &[f32], m: usize) -> Vec<f32> {
    let mut y = vec![0.0; m * w.rows];
    let mut buf = vec![0.0; w.cols];
    for r in 0..w.rows {
        decode_row(w, r, &mut buf);
        for i in 0..m {
            y[i * w.rows + r] = dot_scalar(&buf, &x[i * w.cols..(i + 1) * w.cols]);
        }
    }
    y
}

/// Panics unless `got` and `want` are bit-identical.
pub fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (k, (a, b)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "{what}: element {k}: {a:e} vs reference {b:e}"
        );
    }
}
