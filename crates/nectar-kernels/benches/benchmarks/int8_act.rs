//! The opt-in, quality-changing int8-activation path. It is not bit-exact by design, so the
//! check before timing bounds its error against the scalar reference of the exact product.
use super::common::{activations, config, reference, Owned};
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use nectar_kernels::{matmul_int8_act, WeightFormat, INT8_ACT_BLOCK};

fn int8_act(c: &mut Criterion) {
    let mut g = c.benchmark_group("matmul_int8_act");
    let (rows, cols) = (512, 6144);
    for format in [WeightFormat::Int4Group { group: 64 }, WeightFormat::Int8Row] {
        let w = Owned::new(format, rows, cols, 1);
        let w = w.view();
        for m in [1usize, 4] {
            let x = activations(m * cols, 2);
            let mut y = vec![0.0; m * rows];
            matmul_int8_act(&w, &x, m, &mut y, INT8_ACT_BLOCK).expect("shapes");
            let exact = reference(&w, &x, m);
            let num: f64 = exact
                .iter()
                .zip(&y)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum();
            let den: f64 = exact.iter().map(|a| (*a as f64).powi(2)).sum();
            let rel = (num / den).sqrt();
            assert!(rel < 0.01, "{}: relative RMS error {rel}", format.name());
            g.throughput(Throughput::Bytes(w.stream_bytes() as u64));
            let id = BenchmarkId::new(format!("{}/{rows}x{cols}", format.name()), m);
            g.bench_function(id, |b| {
                b.iter(|| matmul_int8_act(&w, &x, m, &mut y, INT8_ACT_BLOCK).expect("shapes"))
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = int8_act
}
