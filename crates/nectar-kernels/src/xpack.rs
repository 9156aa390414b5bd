//! Activation rows packed for the SIMD kernels: zero-padded to whole 16-column steps and, for
//! the AVX-512 int4 kernel, reordered within each step to match the order in which that kernel
//! unpacks nibbles.
//!
//! Packing costs `m × cols` floats per call, which is noise next to the `rows × cols` weights
//! the product streams; in exchange every kernel reads full 16-wide activation steps (the
//! zero tail is exactly the canonical order's zero padding) and needs no per-lane fix-ups.
use crate::dot::LANES;
use std::cell::RefCell;

/// How the 16 columns of one step are laid out in the packed activation row.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Layout {
    /// Column `c0 + j` at position `j`.
    Natural,
    /// Column `c0 + k` at position `2k` and `c0 + 8 + k` at `2k + 1` (k < 8): the order of
    /// `vpsrlvq`-unpacked nibbles in the AVX-512 int4 kernel (see `x86/avx512.rs`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Nib16,
}

impl Layout {
    /// Packed position of step-relative column `j`.
    #[inline]
    pub(crate) fn pos(self, j: usize) -> usize {
        match self {
            Layout::Natural => j,
            Layout::Nib16 => {
                if j < 8 {
                    2 * j
                } else {
                    2 * (j - 8) + 1
                }
            }
        }
    }
}

thread_local! {
    // Recycled buffers, so steady-state decoding allocates nothing per product.
    static POOL: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// A zeroed f32 buffer from the calling thread's pool; it goes back to the pool on drop.
pub(crate) struct PoolBuf(Vec<f32>);

impl PoolBuf {
    pub(crate) fn zeroed(len: usize) -> PoolBuf {
        let mut v = POOL.with(|p| p.borrow_mut().pop()).unwrap_or_default();
        v.clear();
        v.resize(len, 0.0);
        PoolBuf(v)
    }
}

impl std::ops::Deref for PoolBuf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.0
    }
}

impl std::ops::DerefMut for PoolBuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.0
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        // Keep a few buffers only: a pool is for reuse, not for holding memory.
        let _ = POOL.try_with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < 8 {
                p.push(v);
            }
        });
    }
}

/// `m` activation rows of `cols` columns, each padded to `stride` (a multiple of 16).
pub(crate) struct XPack {
    buf: PoolBuf,
    /// Activation rows.
    pub m: usize,
    /// Logical columns.
    pub cols: usize,
    /// Floats per packed row (`cols` rounded up to a whole step).
    pub stride: usize,
}

impl XPack {
    /// Packs `x` (`m × cols`, row-major) in `layout`.
    pub(crate) fn new(x: &[f32], m: usize, cols: usize, layout: Layout) -> XPack {
        debug_assert_eq!(x.len(), m * cols);
        let stride = cols.div_ceil(LANES) * LANES;
        let mut buf = PoolBuf::zeroed(m * stride);
        if cols > 0 {
            for (dst, src) in buf.chunks_exact_mut(stride).zip(x.chunks_exact(cols)) {
                match layout {
                    Layout::Natural => dst[..cols].copy_from_slice(src),
                    Layout::Nib16 => {
                        for (d, s) in dst.chunks_exact_mut(LANES).zip(src.chunks(LANES)) {
                            if s.len() == LANES {
                                for k in 0..8 {
                                    d[2 * k] = s[k];
                                    d[2 * k + 1] = s[k + 8];
                                }
                            } else {
                                for (j, &v) in s.iter().enumerate() {
                                    d[layout.pos(j)] = v;
                                }
                            }
                        }
                    }
                }
            }
        }
        XPack {
            buf,
            m,
            cols,
            stride,
        }
    }

    /// Packed row `i` (length `stride`).
    #[inline]
    pub(crate) fn row(&self, i: usize) -> &[f32] {
        &self.buf[i * self.stride..(i + 1) * self.stride]
    }

    /// Start of the packed data (`m × stride` floats).
    #[inline]
    pub(crate) fn ptr(&self) -> *const f32 {
        self.buf.as_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nib16_layout_is_a_permutation_and_pads_with_zeros() {
        let x: Vec<f32> = (1..=20).map(|v| v as f32).collect();
        let p = XPack::new(&x, 1, 20, Layout::Nib16);
        assert_eq!(p.stride, 32);
        let r = p.row(0);
        assert_eq!(&r[..4], &[1.0, 9.0, 2.0, 10.0]);
        assert_eq!(&r[16..24], &[17.0, 0.0, 18.0, 0.0, 19.0, 0.0, 20.0, 0.0]);
        let mut seen: Vec<f32> = r.iter().copied().filter(|v| *v != 0.0).collect();
        seen.sort_by(f32::total_cmp);
        assert_eq!(seen, x);
    }
}
