//! `matmul` on GLM-5.2 expert shapes, every weight format, M = 1 and 4.
use super::common::{activations, assert_bits, config, reference, Owned};
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use nectar_kernels::{matmul, WeightFormat};

fn matmul_formats(c: &mut Criterion) {
    let mut g = c.benchmark_group("matmul");
    let formats = [
        WeightFormat::Int4Group { group: 64 },
        WeightFormat::Int4Row,
        WeightFormat::Int8Row,
        WeightFormat::Bf16,
        WeightFormat::F16,
        WeightFormat::F32,
    ];
    // Expert gate/up (2048 × 6144) and down (6144 × 2048), cut to 512 rows to stay cache-hot.
    for (rows, cols) in [(512, 6144), (512, 2048)] {
        for format in formats {
            let w = Owned::new(format, rows, cols, 1);
            let w = w.view();
            for m in [1usize, 4] {
                let x = activations(m * cols, 2);
                let mut y = vec![0.0; m * rows];
                matmul(&w, &x, m, &mut y).expect("shapes");
                assert_bits(&format.name(), &y, &reference(&w, &x, m));
                g.throughput(Throughput::Bytes(w.stream_bytes() as u64));
                let id = BenchmarkId::new(format!("{}/{rows}x{cols}", format.name()), m);
                g.bench_function(id, |b| {
                    b.iter(|| matmul(&w, &x, m, &mut y).expect("shapes"))
                });
            }
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = matmul_formats
}
