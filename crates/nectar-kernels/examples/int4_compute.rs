//! The int4 kernels' compute rate with memory out of the way: one matrix small enough to stay in
//! L2 (512 × 2048 int4-g64 = 512 KiB + scales), multiplied 20,000 times on one thread; the
//! fastest call counts, so time slices lost to other work on a shared machine drop out.
//! `nectar bench kernels` measures the same products streaming from DRAM; this one says how
//! fast they could stream if memory were free (`benchmarks/RESULTS.md`).
//!
//! ```text
//! cargo run --release -p nectar-kernels --example int4_compute -- [digits] [row|int8|bf16] [M ...]   # default 1 2 4 8
//! ```
//!
//! `digits`: int4 in the opt-in `digits` order (`set_int4_order`).
//!
//! `row`: int4 with one scale per row instead of per 64 columns (the same codes); `int8`,
//! `bf16`: those formats, for comparison (finite bf16 values of magnitude 2⁻⁷…2).
use nectar_kernels::{matmul, MatRef, WeightFormat};
use std::time::Instant;

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(at) = args.iter().position(|a| a == "digits") {
        args.remove(at);
        nectar_kernels::set_int4_order("digits")
            .expect("AVX2 or AVX-512 VNNI for the digits order");
    }
    let named = match args.first().map(String::as_str) {
        Some("row") => Some(WeightFormat::Int4Row),
        Some("int8") => Some(WeightFormat::Int8Row),
        Some("bf16") => Some(WeightFormat::Bf16),
        _ => None,
    };
    let ms: Vec<usize> = args
        .iter()
        .skip(named.is_some() as usize)
        .map(|a| a.parse().expect("M values are positive integers"))
        .collect();
    let ms = if ms.is_empty() { vec![1, 2, 4, 8] } else { ms };
    let (rows, cols) = (512, 2048);
    let format = named.unwrap_or(WeightFormat::Int4Group { group: 64 });
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..rows * format.row_bytes(cols))
        .map(|i| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
            let b = (s >> 56) as u8;
            // bf16's high byte: sign and exponent 120–127, never a NaN or a denormal.
            match (format, i % 2) {
                (WeightFormat::Bf16, 1) => (b & 0x80) | 0x3c | (b & 0x03),
                _ => b,
            }
        })
        .collect();
    let scales: Vec<f32> = (0..rows * format.row_scales(cols))
        .map(|i| 1e-3 + (i % 97) as f32 * 1e-4)
        .collect();
    let w = MatRef::new(format, rows, cols, &data, &scales).expect("consistent shape");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");
    println!(
        "isa {}, int4 order {}, {rows}x{cols} {}",
        nectar_kernels::isa(),
        nectar_kernels::int4_order(),
        format.name()
    );
    for m in ms {
        let x: Vec<f32> = (0..m * cols)
            .map(|i| (i % 1000) as f32 * 1e-3 - 0.5)
            .collect();
        let mut y = vec![0f32; m * rows];
        let best = pool.install(|| {
            let mut best = f64::MAX;
            for _ in 0..20_000 {
                let t = Instant::now();
                matmul(&w, &x, m, &mut y).expect("valid product");
                best = best.min(t.elapsed().as_secs_f64());
            }
            best
        });
        println!(
            "M = {m}: {:.2} GB/s of weights + scales (fastest call {:.2} µs)",
            w.stream_bytes() as f64 / best / 1e9,
            best * 1e6
        );
    }
}
