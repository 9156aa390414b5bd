//! The fused routed-expert SwiGLU on the GLM-5.2 expert shape (int4, groups of 64).
use super::common::{activations, assert_bits, config, reference, Owned};
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use nectar_kernels::{expert_swiglu, swiglu_in_place, ExpertRef, WeightFormat};

fn expert(c: &mut Criterion) {
    let mut g = c.benchmark_group("expert_swiglu");
    let f = WeightFormat::Int4Group { group: 64 };
    let (hidden, inter) = (6144, 2048);
    let (gate, up, down) = (
        Owned::new(f, inter, hidden, 1),
        Owned::new(f, inter, hidden, 2),
        Owned::new(f, hidden, inter, 3),
    );
    let e = ExpertRef {
        gate: gate.view(),
        up: up.view(),
        down: down.view(),
    };
    for m in [1usize, 4] {
        let x = activations(m * hidden, 4);
        let mut y = vec![0.0; m * hidden];
        expert_swiglu(&e, &x, m, &mut y).expect("shapes");
        let mut h = reference(&e.gate, &x, m);
        swiglu_in_place(&mut h, &reference(&e.up, &x, m));
        assert_bits("expert_swiglu", &y, &reference(&e.down, &h, m));
        let bytes = e.gate.stream_bytes() + e.up.stream_bytes() + e.down.stream_bytes();
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function(BenchmarkId::new("int4-g64/glm5.2", m), |b| {
            b.iter(|| expert_swiglu(&e, &x, m, &mut y).expect("shapes"))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = expert
}
