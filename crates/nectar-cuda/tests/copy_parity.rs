//! Weights staged from pageable host memory into VRAM (`copy::Staging`, the route of a routed
//! expert copied from its RAM slot) compute exactly what the same weights uploaded as a
//! [`GpuMat`] compute: the same kernels on the same bytes, so the outputs are bit-identical —
//! and within the kernels' tolerance of the CPU's.
//!
//! Without a GPU the test prints why and passes, unless `NECTAR_REQUIRE_GPU=1`.
#![cfg(feature = "cuda")]
mod common;
use common::*;
use nectar_cuda::copy::{slot_bytes_for, HostRegistry, StageConfig, Staging, CHUNK_BYTES};
use nectar_cuda::{use_gemm, within_tolerance, Error, Gpu, Order, Precision};
use nectar_kernels::{matmul, MatRef, WeightFormat};
use std::sync::Arc;

#[test]
fn staged_weights_compute_what_uploaded_weights_compute() {
    if gpu().is_none() {
        return;
    }
    let g = Arc::new(Gpu::open(0).unwrap());
    // (format, rows, cols): a GLM-like int4 expert piece, odd float shapes, and an int8 matrix
    // of 6 MiB, larger than one chunk of the pinned ring.
    let shapes = [
        (WeightFormat::Int4Group { group: 64 }, 96, 128),
        (WeightFormat::F32, 33, 70),
        (WeightFormat::Bf16, 40, 24),
        (WeightFormat::Int8Row, 2048, 3072),
    ];
    let slot = shapes
        .iter()
        .map(|&(f, r, c)| {
            let n = r * f.row_bytes(c);
            slot_bytes_for(&[n, 4 * r * f.row_scales(c), n, 4 * r * f.row_scales(c)])
        })
        .max()
        .unwrap();
    assert!(slot > CHUNK_BYTES);
    let staging = Staging::new(&g, 2, slot).unwrap();
    assert!(staging.pinned_reference(2).unwrap() > 0.0);
    let mut k = 0;
    for (s, &(format, rows, cols)) in shapes.iter().enumerate() {
        let a = weights(format, rows, cols, 10 + s as u64);
        let b = weights(format, rows, cols, 20 + s as u64);
        let mats = [
            MatRef::new(format, rows, cols, &a.0, &a.1).unwrap(),
            MatRef::new(format, rows, cols, &b.0, &b.1).unwrap(),
        ];
        let ms: &[usize] = if rows > 1000 {
            &[1, 16]
        } else {
            &[1, 3, 8, 9, 40]
        };
        for &m in ms {
            let x: Vec<f32> = random_bytes(m * cols * 2, 7 + m as u64)
                .chunks_exact(2)
                .map(unit)
                .collect();
            let slot = k % 2;
            k += 1;
            let (views, t) = staging.copy_mats(slot, &mats).unwrap();
            assert_eq!(
                t.bytes as usize,
                2 * (mats[0].data.len() + 4 * mats[0].scales.len())
            );
            assert!(staging.wait_ready(slot).unwrap() > 0.0);
            // SAFETY: the views address the slot just written, untouched until `release`.
            let staged = unsafe { g.matmul_views(&[(views[0], &x), (views[1], &x)], m) }.unwrap();
            staging.release(slot).unwrap();
            let up: Vec<_> = mats.iter().map(|w| g.upload(w).unwrap()).collect();
            let items = [(&up[0], x.as_slice()), (&up[1], x.as_slice())];
            let want = if use_gemm(mats[0].format, mats[0].rows, mats[0].cols, m) {
                g.gemm_batch(&items, m, Precision::Split3).unwrap()
            } else {
                g.matmul_batch(&items, m, Order::MODEL).unwrap()
            };
            for (i, (got, want)) in staged.iter().zip(&want).enumerate() {
                let same = got
                    .iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{format:?} {rows}x{cols} m={m} matrix {i}: staged ≠ uploaded"
                );
                let mut cpu = vec![0.0; m * rows];
                matmul(&mats[i], &x, m, &mut cpu).unwrap();
                let abs = abs_sums(&mats[i], &x, m);
                for (e, ((&gv, &cv), &av)) in got.iter().zip(&cpu).zip(&abs).enumerate() {
                    assert!(
                        within_tolerance(gv, cv, av),
                        "{format:?} m={m} element {e}: gpu {gv}, cpu {cv}"
                    );
                }
            }
        }
    }
    // Bytes that do not fit a slot are refused, not written past it.
    let big = vec![0u8; slot + 1];
    assert!(staging.copy(0, &[&big]).is_err());
    assert!(staging.copy(2, &[&big[..16]]).is_err());
}

/// Every ring layout (chunk size, ring length, staging threads, cached or write-combined pinned
/// memory) lands the same bytes: a matrix larger than several chunks, copied through each, gives
/// the product of the uploaded matrix bit for bit.
#[test]
fn every_ring_layout_lands_the_same_bytes() {
    if gpu().is_none() {
        return;
    }
    let g = Arc::new(Gpu::open(0).unwrap());
    let (format, rows, cols) = (WeightFormat::Int8Row, 1024, 3072 + 48);
    let (data, scales) = weights(format, rows, cols, 77);
    let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
    let x: Vec<f32> = random_bytes(2 * cols * 2, 78)
        .chunks_exact(2)
        .map(unit)
        .collect();
    let want = g
        .matmul_batch(&[(&g.upload(&w).unwrap(), x.as_slice())], 2, Order::MODEL)
        .unwrap();
    let slot = slot_bytes_for(&[data.len(), 4 * scales.len()]);
    for config in [
        StageConfig::DEFAULT,
        StageConfig {
            chunk_bytes: 1 << 20,
            ring_chunks: 2,
            threads: 3,
            write_combined: false,
        },
        StageConfig {
            chunk_bytes: 3 << 19,
            ring_chunks: 5,
            threads: 8,
            write_combined: true,
        },
    ] {
        let staging = Staging::with_config(&g, 2, slot, config).unwrap();
        for s in 0..2 {
            let (views, t) = staging.copy_mats(s, std::slice::from_ref(&w)).unwrap();
            assert_eq!(t.bytes as usize, data.len() + 4 * scales.len());
            staging.wait_ready(s).unwrap();
            // SAFETY: the view addresses the slot just written, untouched until `release`.
            let got = unsafe { g.matmul_views(&[(views[0], &x)], 2) }.unwrap();
            staging.release(s).unwrap();
            assert!(
                got[0]
                    .iter()
                    .zip(&want[0])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "ring {} slot {s}: staged ≠ uploaded",
                config.name()
            );
        }
        let (bytes, secs) = staging.link();
        assert_eq!(bytes as usize, 2 * (data.len() + 4 * scales.len()));
        assert!(secs > 0.0);
    }
}

/// Writes `w`'s weights, then its f32 scales at a 256-byte boundary, into `slot`, and returns
/// the view of them there.
fn place<'a>(slot: &'a mut [u8], w: &MatRef<'_>) -> MatRef<'a> {
    let n = w.data.len();
    let off = n.div_ceil(256) * 256;
    slot[..n].copy_from_slice(w.data);
    for (i, s) in w.scales.iter().enumerate() {
        slot[off + 4 * i..off + 4 * i + 4].copy_from_slice(&s.to_le_bytes());
    }
    let slot: &'a [u8] = slot;
    // SAFETY: the slot is 4 KiB-aligned and `off` a multiple of 256, so the f32s are aligned;
    // they were just written and the view borrows the slot immutably for 'a.
    let scales =
        unsafe { std::slice::from_raw_parts(slot[off..].as_ptr().cast::<f32>(), w.scales.len()) };
    MatRef::new(w.format, w.rows, w.cols, &slot[..n], scales).unwrap()
}

/// The direct route of a copied expert: a RAM slot of the residency slab registered with the
/// driver, DMAed straight into VRAM, computes what the uploaded weights compute, bit for bit;
/// the slot unregistered, given back to the OS (`MADV_DONTNEED`, as the RSS guard does),
/// refilled with other weights and registered again lands the new bytes, not the pages pinned
/// before; a registration the driver refuses is a typed error.
#[test]
fn registered_slab_slots_copy_directly_and_survive_release() {
    if gpu().is_none() {
        return;
    }
    let g = Arc::new(Gpu::open(0).unwrap());
    let (format, rows, cols) = (WeightFormat::Int4Group { group: 64 }, 2048, 2048);
    let slab = nectar_residency::Slab::new(3, 4 << 20).unwrap();
    let reg = HostRegistry::new(&g);
    let staging = Staging::new(&g, 2, slab.slot_bytes()).unwrap();
    let x: Vec<f32> = random_bytes(cols * 2, 5)
        .chunks_exact(2)
        .map(unit)
        .collect();
    for (round, seed) in [31u64, 32, 33].into_iter().enumerate() {
        let (data, scales) = weights(format, rows, cols, seed);
        let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
        // SAFETY: this test is the slot's only user; no DMA reads it (the last one was waited
        // for, and the slot was unregistered before its release below).
        let slot = unsafe { slab.slot_mut(1) };
        let placed = place(slot, &w);
        let (p, len) = (slab.slot_ptr(1) as *const u8, slab.slot_bytes());
        // SAFETY: the slab outlives the registry's use of the slot: it is unregistered below
        // before the slot is released, and the registry drops before the slab.
        assert!(unsafe { reg.register(p, len) }.unwrap(), "round {round}");
        assert!(!unsafe { reg.register(p, len) }.unwrap(), "registered once");
        assert!(reg.contains(placed.data.as_ptr(), placed.data.len()));
        assert_eq!(reg.registered_bytes(), len);
        let s = round % 2;
        // SAFETY: the slot stays unchanged until `wait_ready` below.
        let (views, t) =
            unsafe { staging.copy_mats_direct(s, std::slice::from_ref(&placed)) }.unwrap();
        assert_eq!(t.bytes as usize, data.len() + 4 * scales.len());
        assert!(staging.wait_ready(s).unwrap() > 0.0);
        // SAFETY: the views address the slot just written, untouched until `release`.
        let got = unsafe { g.matmul_views(&[(views[0], &x)], 1) }.unwrap();
        staging.release(s).unwrap();
        let want = g
            .matmul_batch(&[(&g.upload(&w).unwrap(), x.as_slice())], 1, Order::MODEL)
            .unwrap();
        assert!(
            got[0]
                .iter()
                .zip(&want[0])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "round {round}: the DMA from the registered slot landed other bytes"
        );
        // What the RSS guard does: the hook unregisters, then the pages go back to the OS.
        assert_eq!(
            reg.unregister_within(slab.slot_ptr(0), 3 * len).unwrap(),
            len
        );
        assert!(!reg.contains(p, len));
        slab.release(1);
    }
    let (link_bytes, link_s) = staging.link();
    assert!(link_bytes > 0 && link_s > 0.0, "direct DMAs are timed");
    // A range overlapping a registered one is refused by the driver: a typed error, and the
    // registry keeps only what it registered.
    let (p, len) = (slab.slot_ptr(2) as *const u8, slab.slot_bytes());
    // SAFETY: as above; unregistered when `reg` drops, before the slab.
    assert!(unsafe { reg.register(p, len) }.unwrap());
    // SAFETY: as above (refused, so nothing is registered).
    match unsafe { reg.register(p.wrapping_add(4096), 4096) } {
        Err(Error::Register { bytes: 4096, .. }) => {}
        other => panic!("an overlapping registration must be refused, got {other:?}"),
    }
    // SAFETY: a zero-length range is refused before the driver is asked.
    assert!(matches!(
        unsafe { reg.register(p, 0) },
        Err(Error::Shape(_))
    ));
    assert_eq!(reg.registered_bytes(), len);
    drop(reg);
}

/// A SwiGLU MLP staged from host memory (the route of a copied routed expert) computes, whole on
/// the GPU (`swiglu_views`), the bits the same MLP uploaded computes (`swiglu_batch`), at row
/// counts that take the GEMV and the GEMM.
#[test]
fn a_staged_mlp_computes_what_the_uploaded_mlp_computes() {
    if gpu().is_none() {
        return;
    }
    let g = Arc::new(Gpu::open(0).unwrap());
    let (f, hidden, inter) = (WeightFormat::Int4Group { group: 64 }, 256, 128);
    let raw = [
        weights(f, inter, hidden, 31),
        weights(f, inter, hidden, 32),
        weights(f, hidden, inter, 33),
    ];
    let shapes = [(inter, hidden), (inter, hidden), (hidden, inter)];
    let mats: Vec<MatRef<'_>> = raw
        .iter()
        .zip(shapes)
        .map(|((d, s), (r, c))| MatRef::new(f, r, c, d, s).unwrap())
        .collect();
    let parts: Vec<usize> = mats
        .iter()
        .flat_map(|w| [w.data.len(), 4 * w.scales.len()])
        .collect();
    let staging = Staging::new(&g, 1, slot_bytes_for(&parts)).unwrap();
    let up: Vec<_> = mats.iter().map(|w| g.upload(w).unwrap()).collect();
    for m in [1, 5, 64] {
        let x = values(m * hidden, 40 + m as u64);
        let (views, _) = staging.copy_mats(0, &mats).unwrap();
        staging.wait_ready(0).unwrap();
        // SAFETY: the views address the slot just written, untouched until `release`.
        let staged =
            unsafe { g.swiglu_views(&[[views[0], views[1], views[2]]], &[&x], m) }.unwrap();
        staging.release(0).unwrap();
        let uploaded = g
            .swiglu_batch(&[[&up[0], &up[1], &up[2]]], &[&x], m)
            .unwrap();
        assert_eq!(staged[0].len(), m * hidden);
        assert!(
            staged[0]
                .iter()
                .zip(&uploaded[0])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "m={m}: staged MLP ≠ uploaded MLP"
        );
    }
}
