//! NEON kernels: a canonical 16-lane accumulator is four 4-lane registers (lanes 0..4, 4..8,
//! 8..12, 12..16), `vfmaq_f32` is the fused multiply-add, and the fold adds the registers in the
//! canonical order (see `dot.rs`).
//!
//! Covered formats: f32, bf16, int8 per row, int4 per row and grouped. f16 weights use the
//! scalar tile (no f16 model needs a fast path today).
use crate::driver::{prefetch_scales, run, Block, Prefetch};
use crate::format::{MatRef, WeightFormat};
use crate::xpack::XPack;
use std::arch::aarch64::*;
use std::ops::Range;

/// Segment length meaning "the whole row".
const WHOLE_ROW: usize = usize::MAX & !15;

type V = [float32x4_t; 4];

static IOTA: [u32; 4] = [0, 1, 2, 3];

/// Folds 16 canonical lanes: l[j] += l[j+8], l[j] += l[j+4], l[j] += l[j+2], l[0] + l[1].
#[inline]
#[target_feature(enable = "neon")]
fn fold(v: V) -> f32 {
    let s0 = vaddq_f32(v[0], v[2]); // lanes 0..4 + lanes 8..12
    let s1 = vaddq_f32(v[1], v[3]); // lanes 4..8 + lanes 12..16
    let t = vaddq_f32(s0, s1); // + l[j+4]
    let u = vadd_f32(vget_low_f32(t), vget_high_f32(t)); // + l[j+2]
    vget_lane_f32::<0>(u) + vget_lane_f32::<1>(u)
}

#[inline]
#[target_feature(enable = "neon")]
fn fma4(a: V, w: V, x: V) -> V {
    [
        vfmaq_f32(a[0], w[0], x[0]),
        vfmaq_f32(a[1], w[1], x[1]),
        vfmaq_f32(a[2], w[2], x[2]),
        vfmaq_f32(a[3], w[3], x[3]),
    ]
}

/// 16 floats at `p`.
///
/// # Safety
/// `p` is valid for 16 reads.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load16(p: *const f32) -> V {
    // SAFETY: 16 readable floats (caller).
    unsafe {
        [
            vld1q_f32(p),
            vld1q_f32(p.add(4)),
            vld1q_f32(p.add(8)),
            vld1q_f32(p.add(12)),
        ]
    }
}

/// Canonical dot product with four 4-lane registers.
///
/// # Safety
/// The CPU must support NEON; `a.len() == b.len()`.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let full = n & !15;
    let z = vdupq_n_f32(0.0);
    let mut acc = [z; 4];
    let mut c = 0;
    while c < full {
        // SAFETY: c + 16 <= full <= n for both slices.
        let (x, y) = unsafe { (load16(a.as_ptr().add(c)), load16(b.as_ptr().add(c))) };
        acc = fma4(acc, x, y);
        c += 16;
    }
    if full < n {
        // Zero padding is the canonical tail.
        let mut ta = [0.0f32; 16];
        let mut tb = [0.0f32; 16];
        ta[..n - full].copy_from_slice(&a[full..]);
        tb[..n - full].copy_from_slice(&b[full..]);
        // SAFETY: local 16-float buffers.
        let (x, y) = unsafe { (load16(ta.as_ptr()), load16(tb.as_ptr())) };
        acc = fma4(acc, x, y);
    }
    fold(acc)
}

/// Reads `n <= N` bytes at `p` into a zeroed `N`-byte buffer (the ragged end of a row).
///
/// # Safety
/// `p` is valid for `n` reads.
#[inline(always)]
unsafe fn tail_bytes<const N: usize>(p: *const u8, n: usize) -> [u8; N] {
    let mut t = [0u8; N];
    // SAFETY: `n <= N` bytes, source valid by contract, destination is local.
    unsafe { std::ptr::copy_nonoverlapping(p, t.as_mut_ptr(), n.min(N)) };
    t
}

/// Keeps lanes `< n` of a step and makes the rest +0.
#[inline]
#[target_feature(enable = "neon")]
fn keep_first(v: V, n: usize) -> V {
    // SAFETY: IOTA holds 4 u32.
    let iota = unsafe { vld1q_u32(IOTA.as_ptr()) };
    let mut out = v;
    for (k, o) in out.iter_mut().enumerate() {
        let lane = vaddq_u32(iota, vdupq_n_u32(4 * k as u32));
        let m = vcltq_u32(lane, vdupq_n_u32(n as u32));
        *o = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(*o), m));
    }
    out
}

trait Dec {
    type S: Copy;
    fn mat(&self) -> &MatRef<'_>;
    /// Columns per scale segment (a multiple of 16).
    fn seg(&self) -> usize;
    unsafe fn state(&self, row: usize, si: usize) -> Self::S;
    /// Weights of columns `c..c + 16` of the row starting at `p`.
    unsafe fn load(&self, p: *const u8, c: usize, s: Self::S) -> V;
    /// Weights of columns `c..c + n` (n < 16); the other lanes are +0.
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, s: Self::S) -> V;
}

struct F32D<'a>(MatRef<'a>);
impl Dec for F32D<'_> {
    type S = ();
    fn mat(&self) -> &MatRef<'_> {
        &self.0
    }
    fn seg(&self) -> usize {
        WHOLE_ROW
    }
    unsafe fn state(&self, _: usize, _: usize) {}
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load(&self, p: *const u8, c: usize, _: ()) -> V {
        // SAFETY: columns c..c + 16 lie in the row (caller).
        unsafe { load16(p.add(4 * c).cast()) }
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, _: ()) -> V {
        // SAFETY: 4n bytes remain in the row; zero bytes are +0.
        let t = unsafe { tail_bytes::<64>(p.add(4 * c), 4 * n) };
        // SAFETY: local 64-byte buffer.
        unsafe { self.load(t.as_ptr(), 0, ()) }
    }
}

struct Bf16D<'a>(MatRef<'a>);
impl Dec for Bf16D<'_> {
    type S = ();
    fn mat(&self) -> &MatRef<'_> {
        &self.0
    }
    fn seg(&self) -> usize {
        WHOLE_ROW
    }
    unsafe fn state(&self, _: usize, _: usize) {}
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load(&self, p: *const u8, c: usize, _: ()) -> V {
        // SAFETY: 32 bytes of columns c..c + 16 lie in the row (caller).
        let (a, b) = unsafe {
            let p = p.add(2 * c).cast::<u16>();
            (vld1q_u16(p), vld1q_u16(p.add(8)))
        };
        // bf16 → f32 is the bit pattern shifted into the high half.
        [
            vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(a))),
            vreinterpretq_f32_u32(vshll_high_n_u16::<16>(a)),
            vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(b))),
            vreinterpretq_f32_u32(vshll_high_n_u16::<16>(b)),
        ]
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, _: ()) -> V {
        // SAFETY: 2n bytes remain in the row; zero bytes decode to +0.
        let t = unsafe { tail_bytes::<32>(p.add(2 * c), 2 * n) };
        // SAFETY: local 32-byte buffer.
        unsafe { self.load(t.as_ptr(), 0, ()) }
    }
}

struct Int8D<'a>(MatRef<'a>);
impl Dec for Int8D<'_> {
    type S = float32x4_t;
    fn mat(&self) -> &MatRef<'_> {
        &self.0
    }
    fn seg(&self) -> usize {
        WHOLE_ROW
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn state(&self, row: usize, _: usize) -> float32x4_t {
        vdupq_n_f32(self.0.scales[row])
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load(&self, p: *const u8, c: usize, s: float32x4_t) -> V {
        // SAFETY: 16 bytes of columns c..c + 16 lie in the row (caller).
        let q = unsafe { vld1q_s8(p.add(c).cast()) };
        let lo = vmovl_s8(vget_low_s8(q));
        let hi = vmovl_high_s8(q);
        let f = |v: int32x4_t| vmulq_f32(vcvtq_f32_s32(v), s);
        [
            f(vmovl_s16(vget_low_s16(lo))),
            f(vmovl_high_s16(lo)),
            f(vmovl_s16(vget_low_s16(hi))),
            f(vmovl_high_s16(hi)),
        ]
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, s: float32x4_t) -> V {
        // SAFETY: n bytes remain in the row.
        let t = unsafe { tail_bytes::<16>(p.add(c), n) };
        // SAFETY: local 16-byte buffer; padded lanes forced to +0 (0 * scale may be -0).
        keep_first(unsafe { self.load(t.as_ptr(), 0, s) }, n)
    }
}

/// int4, per row or any group size; state = per-lane scales of one segment.
struct Int4D<'a> {
    w: MatRef<'a>,
    seg: usize,
    /// Columns per scale (`usize::MAX` for per-row scales).
    group: usize,
    scales_per_row: usize,
}

impl Dec for Int4D<'_> {
    type S = V;
    fn mat(&self) -> &MatRef<'_> {
        &self.w
    }
    fn seg(&self) -> usize {
        self.seg
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn state(&self, row: usize, si: usize) -> V {
        let sc = &self.w.scales[row * self.scales_per_row..(row + 1) * self.scales_per_row];
        if self.group == usize::MAX {
            return [vdupq_n_f32(sc[0]); 4];
        }
        let c = si * self.seg;
        let first = c / self.group;
        let last = (c + 15).min(self.w.cols - 1) / self.group;
        let mut v = [vdupq_n_f32(sc[first]); 4];
        if last > first {
            // SAFETY: IOTA holds 4 u32.
            let iota = unsafe { vld1q_u32(IOTA.as_ptr()) };
            for (g, &s) in sc.iter().enumerate().take(last + 1).skip(first + 1) {
                let start = vdupq_n_u32((g * self.group) as u32);
                for (k, vk) in v.iter_mut().enumerate() {
                    let col = vaddq_u32(iota, vdupq_n_u32((c + 4 * k) as u32));
                    *vk = vbslq_f32(vcgeq_u32(col, start), vdupq_n_f32(s), *vk);
                }
            }
        }
        v
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load(&self, p: *const u8, c: usize, s: V) -> V {
        // SAFETY: 8 bytes of columns c..c + 16 lie in the row (caller).
        let b = unsafe { vld1_u8(p.add(c / 2)) };
        // Even column in the low nibble: zip low and high nibbles back into column order.
        let lo = vand_u8(b, vdup_n_u8(15));
        let hi = vshr_n_u8::<4>(b);
        let a = vmovl_u8(vzip1_u8(lo, hi)); // columns 0..8
        let bb = vmovl_u8(vzip2_u8(lo, hi)); // columns 8..16
        let eight = vdupq_n_f32(8.0);
        // Small integers: the subtraction is exact, so this is `(n - 8) as f32 * scale`.
        let f = |v: uint32x4_t, s: float32x4_t| vmulq_f32(vsubq_f32(vcvtq_f32_u32(v), eight), s);
        [
            f(vmovl_u16(vget_low_u16(a)), s[0]),
            f(vmovl_high_u16(a), s[1]),
            f(vmovl_u16(vget_low_u16(bb)), s[2]),
            f(vmovl_high_u16(bb), s[3]),
        ]
    }
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, s: V) -> V {
        // SAFETY: ceil(n / 2) bytes remain in the row.
        let t = unsafe { tail_bytes::<8>(p.add(c / 2), n.div_ceil(2)) };
        // SAFETY: local 8-byte buffer; padded lanes forced to +0.
        keep_first(unsafe { self.load(t.as_ptr(), 0, s) }, n)
    }
}

/// One 16-column step (at column `c`) of every row of a register block against every
/// activation row: decode the row's weights once, then one FMA per activation row.
///
/// # Safety
/// `c + 16 <= cols` for rows `rp`, and the packed activations hold `c + 16` columns.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn step<D: Dec, const R: usize, const MB: usize>(
    d: &D,
    rp: &[*const u8; R],
    st: &[D::S; R],
    xp: *const f32,
    xs: usize,
    c: usize,
    acc: &mut [[V; MB]; R],
) {
    for k in 0..R {
        // SAFETY: c + 16 <= full: a whole step of row r0 + k.
        let wv = unsafe { d.load(rp[k], c, st[k]) };
        for (i, a) in acc[k].iter_mut().enumerate() {
            // SAFETY: the packed activations hold c + 16 columns (caller).
            let xv = unsafe { load16(xp.add(i * xs + c)) };
            *a = fma4(*a, wv, xv);
        }
    }
}

/// The register-blocked kernel over one decoder.
struct K<D>(D);

impl<D: Dec> Block for K<D> {
    const WIDE: bool = false;

    #[target_feature(enable = "neon")]
    unsafe fn block<const R: usize, const MB: usize>(
        &self,
        r0: usize,
        x: &XPack,
        i0: usize,
        out: *mut f32,
        stride: usize,
    ) {
        let d = &self.0;
        let w = d.mat();
        let cols = w.cols;
        let full = cols & !15;
        let rb = w.format.row_bytes(cols);
        let mut rp = [w.data.as_ptr(); R];
        for (k, p) in rp.iter_mut().enumerate() {
            // SAFETY: row r0 + k exists (caller).
            *p = unsafe { p.add((r0 + k) * rb) };
        }
        let xs = x.stride;
        // SAFETY: activation rows i0..i0 + MB exist (caller).
        let xp = unsafe { x.ptr().add(i0 * xs) };
        let z = vdupq_n_f32(0.0);
        let mut acc = [[[z; 4]; MB]; R];
        let seg = d.seg();
        let mut pf = Prefetch::new(w, r0 + R, R);
        prefetch_scales(w, r0 + R, R);
        let (mut c, mut si) = (0, 0);
        while c < full {
            let end = c + seg.min(full - c);
            // SAFETY: rows exist; segment si starts at c < cols.
            let mut st = [unsafe { d.state(r0, si) }; R];
            for (k, s) in st.iter_mut().enumerate().skip(1) {
                // SAFETY: as above.
                *s = unsafe { d.state(r0 + k, si) };
            }
            // Two steps per iteration halve the loop and prefetch overhead per step. Not for
            // blocks of 8 activation rows: two steps' activations would not fit in registers
            // beside 16 accumulators, and the spills cost more than the loop (measured).
            while MB <= 4 && c + 32 <= end {
                // SAFETY: c + 32 <= end <= full: two whole steps of every row.
                unsafe {
                    step(d, &rp, &st, xp, xs, c, &mut acc);
                    step(d, &rp, &st, xp, xs, c + 16, &mut acc);
                }
                pf.steps(2);
                c += 32;
            }
            while c < end {
                // SAFETY: c + 16 <= end <= full: a whole step of every row.
                unsafe { step(d, &rp, &st, xp, xs, c, &mut acc) };
                pf.steps(1);
                c += 16;
            }
            si += 1;
        }
        if full < cols {
            for k in 0..R {
                // SAFETY: the ragged step of row r0 + k; activations are zero-padded.
                let wv = unsafe {
                    let s = d.state(r0 + k, full / seg);
                    d.tail(rp[k], full, cols - full, s)
                };
                for (i, a) in acc[k].iter_mut().enumerate() {
                    // SAFETY: full + 16 <= stride.
                    let xv = unsafe { load16(xp.add(i * xs + full)) };
                    *a = fma4(*a, wv, xv);
                }
            }
        }
        for (k, row) in acc.iter().enumerate() {
            for (i, a) in row.iter().enumerate() {
                // SAFETY: inside the caller's output region.
                unsafe { *out.add(i * stride + k) = fold(*a) };
            }
        }
    }
}

/// NEON [`crate::driver::tile`].
///
/// # Safety
/// As [`crate::driver::tile`], with the CPU supporting NEON.
pub(crate) unsafe fn tile(
    w: &MatRef<'_>,
    rows: Range<usize>,
    x: &XPack,
    out: *mut f32,
    stride: usize,
) {
    let spr = w.format.row_scales(w.cols);
    // SAFETY (all arms): forwarded from this function's contract.
    unsafe {
        match w.format {
            WeightFormat::F32 => run(&K(F32D(*w)), rows, x, out, stride),
            WeightFormat::Bf16 => run(&K(Bf16D(*w)), rows, x, out, stride),
            WeightFormat::F16 => crate::scalar::tile(w, rows, x, out, stride),
            WeightFormat::Int8Row => run(&K(Int8D(*w)), rows, x, out, stride),
            WeightFormat::Int4Row => {
                let d = Int4D {
                    w: *w,
                    seg: WHOLE_ROW,
                    group: usize::MAX,
                    scales_per_row: spr,
                };
                run(&K(d), rows, x, out, stride)
            }
            WeightFormat::Int4Group { group } => {
                let d = Int4D {
                    w: *w,
                    seg: if group % 16 == 0 { group } else { 16 },
                    group,
                    scales_per_row: spr,
                };
                run(&K(d), rows, x, out, stride)
            }
        }
    }
}
