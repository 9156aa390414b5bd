//! Large activation copies go through a page-locked bounce buffer in pieces (`bounce.rs`):
//! rows uploaded and downloaded come back bit for bit at sizes below, at and across the
//! threshold and the pieces (odd tails included), and a product whose activations and output
//! take that route gives what the CPU gives within the kernels' tolerance (so the pieces land
//! before the kernel reads them, and the download waits for the kernel).
//!
//! Without a GPU the test prints why and passes, unless `NECTAR_REQUIRE_GPU=1`.
#![cfg(feature = "cuda")]
mod common;
use common::*;
use nectar_cuda::Order;
use nectar_kernels::WeightFormat;

#[test]
fn rows_cross_the_bounce_buffer_unchanged() {
    let Some(g) = gpu() else {
        return;
    };
    const MIB: usize = 1 << 20;
    // Widths × rows: a decode-sized copy, just under and at the 1 MiB threshold, one value past
    // one 8 MiB piece, a ragged several-piece copy, and one of exactly three pieces.
    let cases = [
        (7, 3),
        (1023, 256),
        (1024, 256),
        (8 * MIB / 4 + 1, 1),
        (6144, 1_379),
        (3 * 2 * MIB / 4, 4),
    ];
    for (i, &(width, rows)) in cases.iter().enumerate() {
        // Every bit pattern class: NaN payloads and signed zeros travel as bytes.
        let mut x = values(width * rows, 0xb0 + i as u64);
        x[0] = -0.0;
        if x.len() > 2 {
            x[1] = f32::from_bits(0x7fc0_1234);
            x[2] = f32::NEG_INFINITY;
        }
        let dev = g.upload_rows(&x, width).unwrap();
        let back = g.download_rows(&dev).unwrap();
        assert_eq!(back.len(), x.len(), "{width} × {rows}");
        let same = back
            .iter()
            .zip(&x)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(same, None, "{width} × {rows}: first differing value");
    }
}

#[test]
fn a_product_through_the_bounce_buffer_matches_the_cpu() {
    let Some(g) = gpu() else {
        return;
    };
    // 700 rows of 6,144 f32 up (17 MB: three pieces) and 700 × 2,048 down (5.7 MB).
    let (rows, cols, m) = (2048, 6144, 700);
    let x = values(m * cols, 0xb7);
    let format = WeightFormat::Int4Group { group: 64 };
    compare(g, format, rows, cols, m, &x, 0xb8, "matmul", |dev, y| {
        g.matmul(dev, &x, m, y, Order::MODEL).unwrap()
    });
}
