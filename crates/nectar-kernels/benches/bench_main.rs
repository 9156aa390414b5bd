//! Criterion benchmarks of the kernels, cache-hot (one matrix, reused): they measure compute
//! throughput. DRAM-streamed throughput against the machine's read bandwidth is
//! `nectar bench kernels` (see `benchmarks/RESULTS.md`). Every benchmark first checks its
//! kernel against the scalar reference and panics on any difference.
use criterion::criterion_main;

mod benchmarks;

criterion_main! {
    benchmarks::matmul::benches,
    benchmarks::expert::benches,
    benchmarks::int8_act::benches,
}
