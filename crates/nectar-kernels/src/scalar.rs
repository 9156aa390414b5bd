//! The reference tile: decode each weight row to f32 ([`decode_row`]), then one
//! [`dot_scalar`] per activation row. It defines the bits every SIMD tile must reproduce and is
//! the fallback on CPUs without a SIMD path.
use crate::decode::decode_row;
use crate::dot::dot_scalar;
use crate::format::MatRef;
use crate::xpack::XPack;
use std::cell::RefCell;
use std::ops::Range;

thread_local! {
    static ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Scalar [`crate::driver::tile`].
///
/// # Safety
/// `x` is in the natural layout with `w.cols` columns; `out` is valid for writes at
/// `i * stride + (r - rows.start)` for every activation `i` and row `r` in `rows`.
pub(crate) unsafe fn tile(
    w: &MatRef<'_>,
    rows: Range<usize>,
    x: &XPack,
    out: *mut f32,
    stride: usize,
) {
    ROW.with(|cell| {
        let mut buf = cell.borrow_mut();
        buf.resize(w.cols, 0.0);
        for r in rows.clone() {
            decode_row(w, r, &mut buf);
            for i in 0..x.m {
                let v = dot_scalar(&buf, &x.row(i)[..w.cols]);
                // SAFETY: in the caller's output region by this function's contract.
                unsafe { *out.add(i * stride + (r - rows.start)) = v };
            }
        }
    })
}
