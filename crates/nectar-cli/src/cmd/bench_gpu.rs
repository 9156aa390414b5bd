//! `nectar bench gpu`: the CUDA tier's kernels and copies on GLM-5.2 shapes, each judged as a
//! ratio to a limit measured on the same device in the same run (`docs/gpu.md`).
//!
//! - Kernels: weight + scale GB/s of y = W·x at M activation rows ÷ the better of the
//!   device-to-device copy bandwidth (bytes read + written) and a read-only stream of the same
//!   size (`ratio`: one denominator, the better stream — a second, lower one could pass 1.0);
//!   `same-size` divides by the read stream at the launch's own size instead (launches of that
//!   many bytes rotating through the same arena: what reading a lone matrix of a few MB can
//!   reach, grid fill and drain included). Expert cases launch a token's 8 routed experts together
//!   (gate and up: 16 matrices; down: 8), as a decode step would; `.single` cases launch one
//!   matrix to show what a lone launch costs. Weights rotate through copies spanning at least
//!   8× the L2 cache (and 512 MiB), and every case is checked against the CPU kernels first.
//! - Copies: expert-sized host→device copies from pinned memory ÷ one large pinned copy.
//! - Tensor-core GEMM (prefill): useful TFLOP/s of M-row products on GLM-5.2 shapes, and the
//!   time of the ⌈M/8⌉ GEMV launches they replace, measured on the same weights in the same run.
//!
//! The measurement code is `nectar_cuda::bench`; this module picks the cases and prints.
use crate::args::BenchGpuArgs;
use anyhow::Result;

#[cfg(not(feature = "cuda"))]
pub fn gpu(_a: BenchGpuArgs) -> Result<()> {
    anyhow::bail!("this nectar was built without the CUDA tier; rebuild with `--features cuda`")
}

#[cfg(feature = "cuda")]
pub use with_cuda::gpu;

#[cfg(feature = "cuda")]
mod with_cuda {
    use super::*;
    use anyhow::Context;
    use nectar_cuda::bench::{
        d2d_copy, gemm_case, gemv_case, h2d, read_ref, read_ref_sized, registered_copies,
        round_trip, slot_copies, staged_copies, GemmCase, GemmResult, GemvCase, GemvResult,
        StagedCopies,
    };
    use nectar_cuda::copy::StageConfig;
    use nectar_cuda::{Gpu, Order, Precision};
    use nectar_kernels::WeightFormat;
    use serde_json::json;

    /// GLM-5.2 expert at int4 g64: gate, up [2048, 6144] and down [6144, 2048], codes + scales.
    const EXPERT_INT4_G64_BYTES: usize = 3 * (2048 * 3072 + 2048 * 96 * 4);

    fn cases(a: &BenchGpuArgs) -> Vec<GemvCase> {
        let g64 = WeightFormat::Int4Group { group: 64 };
        let mut shapes: Vec<(&str, WeightFormat, usize, usize, usize)> = Vec::new();
        for f in [
            g64,
            WeightFormat::Int4Row,
            WeightFormat::Int8Row,
            WeightFormat::Bf16,
        ] {
            shapes.push(("expert.gate_up", f, 2048, 6144, 16));
            shapes.push(("expert.down", f, 6144, 2048, 8));
        }
        shapes.push(("expert.gate.single", g64, 2048, 6144, 1));
        shapes.push(("attn.q_a", g64, 2048, 6144, 1));
        shapes.push(("attn.q_b", g64, 16384, 2048, 1));
        shapes.push(("attn.kv_a", WeightFormat::Bf16, 576, 6144, 1));
        shapes.push(("attn.kv_b", g64, 28672, 512, 1));
        shapes.push(("attn.o_proj", g64, 6144, 16384, 1));
        shapes.push(("attn.o_proj", WeightFormat::Int8Row, 6144, 16384, 1));
        shapes.push(("attn.o_proj", WeightFormat::Bf16, 6144, 16384, 1));
        if !a.quick {
            shapes.push(("lm_head", WeightFormat::Int8Row, 154880, 6144, 1));
        }
        let mut v = Vec::new();
        for (name, format, rows, cols, batch) in shapes {
            if a.filter.as_deref().is_some_and(|f| !name.contains(f)) {
                continue;
            }
            let quant = !matches!(
                format,
                WeightFormat::F32 | WeightFormat::Bf16 | WeightFormat::F16
            );
            let tensor = !matches!(format, WeightFormat::F32 | WeightFormat::F16);
            let mut orders = vec![Order::Exact];
            if quant {
                orders.push(Order::Word);
            }
            if tensor {
                orders.push(Order::Tensor);
            }
            for &m in &a.m {
                for &order in &orders {
                    v.push(GemvCase {
                        name: name.to_string(),
                        format,
                        rows,
                        cols,
                        batch,
                        m,
                        order,
                    });
                }
            }
        }
        v
    }

    fn gemm_cases(a: &BenchGpuArgs) -> Vec<GemmCase> {
        let g64 = WeightFormat::Int4Group { group: 64 };
        let shapes = [
            ("expert.gate", g64, 2048, 6144),
            ("expert.gate", WeightFormat::Int8Row, 2048, 6144),
            ("expert.gate", WeightFormat::Bf16, 2048, 6144),
            ("expert.down", g64, 6144, 2048),
            ("attn.q_b", g64, 16384, 2048),
            ("attn.o_proj", WeightFormat::Bf16, 6144, 16384),
        ];
        let top = a.gemm_m.iter().copied().max().unwrap_or(0);
        let mut v = Vec::new();
        for (name, format, rows, cols) in shapes {
            if a.filter.as_deref().is_some_and(|f| !name.contains(f)) {
                continue;
            }
            for &m in a.gemm_m.iter().filter(|&&m| m > 0) {
                let mut precisions = vec![Precision::Split3];
                // Coarser activations, for the record (not what the model uses).
                if m == top && name == "expert.gate" {
                    precisions.extend([Precision::Split2, Precision::Single]);
                }
                for precision in precisions {
                    v.push(GemmCase {
                        name: name.to_string(),
                        format,
                        rows,
                        cols,
                        m,
                        precision,
                    });
                }
            }
        }
        v
    }

    /// The same-size read reference's GB/s for a launch of `bytes`.
    fn size_gbps(sized: &[(usize, f64)], bytes: usize) -> f64 {
        sized
            .iter()
            .find(|&&(b, _)| b == bytes)
            .map_or(f64::NAN, |&(_, g)| g)
    }

    pub fn gpu(a: BenchGpuArgs) -> Result<()> {
        let gpu = std::sync::Arc::new(Gpu::open(a.device).context("nectar bench gpu")?);
        let info = gpu.info().clone();
        let arena = (8 * info.l2_bytes).max(512 << 20);
        let copy_bytes = if a.quick { 512 << 20 } else { 1 << 30 };
        let d2d = d2d_copy(&gpu, copy_bytes)?;
        let copy_gbps = 2.0 * copy_bytes as f64 / d2d.median_s / 1e9;
        let copy_best = 2.0 * copy_bytes as f64 / d2d.best_s / 1e9;
        let read = read_ref(&gpu, copy_bytes)?;
        let read_gbps = copy_bytes as f64 / read.median_s / 1e9;
        // The limit a kernel ratio is taken against: the better of the two streams measured.
        let limit = copy_gbps.max(read_gbps);
        let h2d_total = if a.quick { 48 } else { 96 } * EXPERT_INT4_G64_BYTES;
        let h = h2d(&gpu, h2d_total, EXPERT_INT4_G64_BYTES)?;
        let h_whole = h.whole_bytes as f64 / h.whole.median_s / 1e9;
        let h_chunk = h.whole_bytes as f64 / h.chunked.median_s / 1e9;
        // The pinned limit: the better of the two (both are the same DMA; one large copy is
        // not always the faster, and a ratio above 1 would mean the reference read low).
        let h_limit = h_whole.max(h_chunk);
        // Expert copies from pageable memory through the staging ring (the copied-expert path).
        let stage_configs = [StageConfig::DEFAULT];
        let staged_experts = if a.quick { 24 } else { 48 };
        let mut staged: Vec<StagedCopies> = Vec::new();
        for cfg in stage_configs {
            staged.push(
                staged_copies(&gpu, cfg, EXPERT_INT4_G64_BYTES, staged_experts)
                    .with_context(|| format!("staged copies {}", cfg.name()))?,
            );
        }
        let registered = registered_copies(&gpu, EXPERT_INT4_G64_BYTES, staged_experts)
            .context("registered copies")?;
        // The model's direct route: DMAs from registered slots through the staging area, end
        // to end, alternated with the pinned reference; then pipelined with a prefill-sized
        // expert's products (64 rows: 2048 tokens × top-8 over 256 experts).
        let slots = slot_copies(&gpu, staged_experts / 2, if a.quick { 3 } else { 5 }, 64)
            .context("expert copies from registered slots")?;
        if !a.json {
            println!(
                "GPU: {} — kernels {} in {:.0} ms",
                gpu.describe(),
                if info.kernels_cached {
                    "loaded from the cache"
                } else {
                    "compiled by NVRTC"
                },
                info.compile_ms
            );
            println!(
                "device copy (D2D {} MiB, read + write): {copy_gbps:.0} GB/s median, {copy_best:.0} best",
                copy_bytes >> 20
            );
            println!(
                "device read (read_ref {} MiB): {read_gbps:.0} GB/s median; kernel ratios are ÷ {limit:.0} GB/s, the better of the two",
                copy_bytes >> 20
            );
            println!(
                "pinned H2D: one {:.0} MB copy {h_whole:.1} GB/s; {} expert copies of {:.1} MB {h_chunk:.1} GB/s = {:.2} of the better of the two",
                h.whole_bytes as f64 / 1e6,
                h.chunks,
                h.chunk_bytes as f64 / 1e6,
                h_chunk / h_limit
            );
            for c in &staged {
                println!(
                    "expert copies from pageable RAM ({} × {:.1} MB, ring {}): DMA {:.1} GB/s = {:.2} of pinned ({:.1} GB/s), end to end {:.1} GB/s = {:.2}",
                    c.experts,
                    c.expert_bytes as f64 / 1e6,
                    c.config.name(),
                    c.link_bps / 1e9,
                    c.link_bps / c.pinned_bps,
                    c.pinned_bps / 1e9,
                    c.end_to_end_bps / 1e9,
                    c.end_to_end_bps / c.pinned_bps
                );
            }
            println!(
                "registered pageable source (cuMemHostRegister, {:.0} MB): registration {:.1} GB/s, DMA {:.1} GB/s",
                (staged_experts * EXPERT_INT4_G64_BYTES) as f64 / 1e6,
                registered.0 / 1e9,
                registered.1 / 1e9
            );
            println!(
                "expert copies from registered RAM slots ({} × {:.1} MB, direct DMA into the staging area, {} trials alternated with the pinned reference): end to end {:.1} GB/s ÷ pinned {:.1} GB/s = {:.2} (trials {}); DMA {:.1} GB/s; registration {:.1} GB/s",
                slots.experts,
                slots.expert_bytes as f64 / 1e6,
                slots.direct_bps.len(),
                slots.direct_median() / 1e9,
                slots.pinned_median() / 1e9,
                slots.ratio(),
                slots
                    .direct_bps
                    .iter()
                    .zip(&slots.pinned_bps)
                    .map(|(d, p)| format!("{:.2}", d / p))
                    .collect::<Vec<_>>()
                    .join(" "),
                slots.link_bps / 1e9,
                slots.register_bps / 1e9
            );
            println!(
                "  behind compute ({} rows per expert): copies {:.1} ms, products {:.1} ms, pipelined {:.1} ms: {:.2} of the copy time hidden",
                slots.rows,
                slots.copy_s * 1e3,
                slots.compute_s * 1e3,
                slots.overlapped_s * 1e3,
                slots.hidden()
            );
            println!(
                "{:<20} {:<9} {:>5} {:>2} {:<5} {:<6} {:>9} {:>7} {:>6} {:>9} {:>9}",
                "case",
                "format",
                "batch",
                "m",
                "order",
                "path",
                "µs/launch",
                "GB/s",
                "ratio",
                "same-size",
                "max err"
            );
        }
        let mut results: Vec<GemvResult> = Vec::new();
        // The read reference at each launch's size (`read_ref_sized`), measured right after
        // the first case of that size.
        let mut sized: Vec<(usize, f64)> = Vec::new();
        for c in cases(&a) {
            let r = gemv_case(&gpu, &c, arena)
                .with_context(|| format!("{} {} m={}", c.name, c.format.name(), c.m))?;
            if !sized.iter().any(|&(b, _)| b == r.bytes) {
                let t = read_ref_sized(&gpu, r.bytes, arena)?;
                sized.push((r.bytes, r.bytes as f64 / t.median_s / 1e9));
            }
            if !a.json {
                println!(
                    "{:<20} {:<9} {:>5} {:>2} {:<5} {:<6} {:>9.1} {:>7.0} {:>6.2} {:>9.2} {:>9.1e}",
                    c.name,
                    c.format.name(),
                    c.batch,
                    c.m,
                    c.order.name(),
                    if r.tensor {
                        "tensor"
                    } else if r.vector {
                        "vector"
                    } else {
                        "scalar"
                    },
                    r.timing.median_s * 1e6,
                    r.gbps(),
                    r.gbps() / limit,
                    r.gbps() / size_gbps(&sized, r.bytes),
                    r.max_rel_err
                );
            }
            results.push(r);
        }
        // Products as the model calls them: what a decode step pays per product beyond its
        // kernels (the cases above, events only); and a layer's q_a and kv_a, one by one and in
        // one round trip (`Gpu::matmul_each`, as the model runs them).
        let mut trips = Vec::new();
        let g64 = WeightFormat::Int4Group { group: 64 };
        // (name, matrices (format, rows), cols, in one round trip)
        type TripSet<'a> = (&'a str, &'a [(WeightFormat, usize)], usize, bool);
        let trip_sets: [TripSet<'_>; 4] = [
            ("attn.q_a", &[(g64, 2048)], 6144, false),
            ("attn.o_proj", &[(g64, 6144)], 16384, false),
            (
                "attn.q_a+kv_a",
                &[(g64, 2048), (WeightFormat::Bf16, 576)],
                6144,
                false,
            ),
            (
                "attn.q_a+kv_a",
                &[(g64, 2048), (WeightFormat::Bf16, 576)],
                6144,
                true,
            ),
        ];
        for (name, shapes, cols, together) in trip_sets {
            if a.filter.as_deref().is_some_and(|f| !name.contains(f)) {
                continue;
            }
            let t = round_trip(
                &gpu,
                (shapes, cols, 1, together),
                arena,
                (100, if a.quick { 5 } else { 9 }),
            )
            .with_context(|| format!("round trip {name}"))?;
            // Kernel time from the cases above where the set is one measured matrix.
            let kernel_us = match shapes {
                [(f, rows)] => results
                    .iter()
                    .find(|r| {
                        let c = &r.case;
                        c.name == name
                            && (c.format, c.rows, c.cols, c.m) == (*f, *rows, cols, 1)
                            && c.batch == 1
                            && c.order == Order::MODEL
                    })
                    .map(|r| r.timing.median_s * 1e6),
                _ => None,
            };
            let what = shapes
                .iter()
                .map(|(f, rows)| format!("{} {rows}×{cols}", f.name()))
                .collect::<Vec<_>>()
                .join(" + ");
            let how = match (shapes.len(), together) {
                (1, _) => "",
                (_, false) => ", one round trip each",
                (_, true) => ", one round trip together",
            };
            if !a.json {
                println!(
                    "round trip {name} {what} m=1 (Gpu::matmul: x from the host, y back, waited for{how}): {:.1} µs per call{}",
                    t.median_s * 1e6,
                    kernel_us.map_or(String::new(), |k| format!(
                        "; its kernels {k:.1} µs, so {:.1} µs of fixed cost",
                        t.median_s * 1e6 - k
                    ))
                );
            }
            trips.push(json!({
                "name": name, "matrices": what, "cols": cols, "m": 1, "together": together,
                "host_us": t.median_s * 1e6, "best_us": t.best_s * 1e6, "kernel_us": kernel_us,
            }));
        }
        if !a.json {
            println!(
                "{:<12} {:<9} {:>5} {:<6} {:>9} {:>8} {:>12} {:>8} {:>5} {:>9}",
                "gemm case",
                "format",
                "m",
                "x",
                "µs",
                "TFLOP/s",
                "GEMV µs",
                "speedup",
                "rule",
                "max err"
            );
        }
        let mut gemms: Vec<GemmResult> = Vec::new();
        for c in gemm_cases(&a) {
            let r = gemm_case(&gpu, &c, arena)
                .with_context(|| format!("gemm {} {} m={}", c.name, c.format.name(), c.m))?;
            if !a.json {
                println!(
                    "{:<12} {:<9} {:>5} {:<6} {:>9.1} {:>8.1} {:>12.1} {:>8.2} {:>5} {:>9.1e}",
                    c.name,
                    c.format.name(),
                    c.m,
                    c.precision.name(),
                    r.gemm.median_s * 1e6,
                    r.tflops(),
                    r.gemv.median_s * 1e6,
                    r.speedup(),
                    if r.uses_gemm { "gemm" } else { "gemv" },
                    r.max_rel_err
                );
            }
            gemms.push(r);
        }
        if a.json {
            let gemm_cases: Vec<_> = gemms
                .iter()
                .map(|r| {
                    json!({
                        "name": r.case.name, "format": r.case.format.name(), "rows": r.case.rows,
                        "cols": r.case.cols, "m": r.case.m, "precision": r.case.precision.name(),
                        "median_us": r.gemm.median_s * 1e6, "best_us": r.gemm.best_s * 1e6,
                        "tflops": r.tflops(), "gemv_median_us": r.gemv.median_s * 1e6,
                        "speedup": r.speedup(), "rule": if r.uses_gemm { "gemm" } else { "gemv" },
                        "checked": r.checked, "max_rel_err": r.max_rel_err,
                    })
                })
                .collect();
            let cases: Vec<_> = results
                .iter()
                .map(|r| {
                    json!({
                        "name": r.case.name, "format": r.case.format.name(), "rows": r.case.rows,
                        "cols": r.case.cols, "batch": r.case.batch, "m": r.case.m,
                        "order": r.case.order.name(), "vector": r.vector, "tensor": r.tensor,
                        "median_us": r.timing.median_s * 1e6, "best_us": r.timing.best_s * 1e6,
                        "bytes": r.bytes, "gbps": r.gbps(), "ratio": r.gbps() / limit,
                        "size_read_gbps": size_gbps(&sized, r.bytes),
                        "size_ratio": r.gbps() / size_gbps(&sized, r.bytes),
                        "copies": r.copies, "checked": r.checked, "max_rel_err": r.max_rel_err,
                    })
                })
                .collect();
            println!(
                "{}",
                json!({
                    "gpu": {"name": info.name, "cc": [info.compute_capability.0, info.compute_capability.1],
                            "sms": info.multiprocessors, "l2_bytes": info.l2_bytes,
                            "total_bytes": info.total_bytes, "compile_ms": info.compile_ms, "kernels_cached": info.kernels_cached},
                    "d2d": {"bytes": copy_bytes, "gbps_median": copy_gbps, "gbps_best": copy_best},
                    "read": {"bytes": copy_bytes, "gbps_median": read_gbps},
                    "limit_gbps": limit,
                    "h2d": {"whole_bytes": h.whole_bytes, "whole_gbps": h_whole,
                            "chunk_bytes": h.chunk_bytes, "chunks": h.chunks, "chunked_gbps": h_chunk,
                            "ratio": h_chunk / h_limit},
                    "arena_bytes": arena,
                    "staged_copies": staged.iter().map(|c| json!({
                        "ring": c.config.name(), "expert_bytes": c.expert_bytes, "experts": c.experts,
                        "pinned_gbps": c.pinned_bps / 1e9, "dma_gbps": c.link_bps / 1e9,
                        "end_to_end_gbps": c.end_to_end_bps / 1e9,
                        "dma_over_pinned": c.link_bps / c.pinned_bps,
                        "end_to_end_over_pinned": c.end_to_end_bps / c.pinned_bps,
                    })).collect::<Vec<_>>(),
                    "registered": {"register_gbps": registered.0 / 1e9, "dma_gbps": registered.1 / 1e9},
                    "slot_copies": {"expert_bytes": slots.expert_bytes, "experts": slots.experts,
                            "pinned_gbps": slots.pinned_bps.iter().map(|b| b / 1e9).collect::<Vec<_>>(),
                            "end_to_end_gbps": slots.direct_bps.iter().map(|b| b / 1e9).collect::<Vec<_>>(),
                            "end_to_end_over_pinned": slots.ratio(), "dma_gbps": slots.link_bps / 1e9,
                            "register_gbps": slots.register_bps / 1e9, "rows": slots.rows,
                            "copy_ms": slots.copy_s * 1e3, "compute_ms": slots.compute_s * 1e3,
                            "overlapped_ms": slots.overlapped_s * 1e3, "hidden_fraction": slots.hidden()},
                    "cases": cases,
                    "round_trips": trips,
                    "gemm_cases": gemm_cases,
                })
            );
        }
        Ok(())
    }
}
