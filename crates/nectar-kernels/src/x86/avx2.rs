//! AVX2 + FMA (+ F16C) kernels: a canonical 16-lane accumulator is two 8-lane registers
//! (lanes 0..8 and 8..16), see `dot.rs` for the order they keep.
//!
//! Weights are dequantised in registers exactly as `decode_row` does (`(code as f32) * scale`;
//! int4 codes via a per-lane variable shift of the broadcast bytes) and fed straight into the
//! fused multiply-add.
use crate::driver::{prefetch_scales, run, Block, Prefetch};
use crate::format::{MatRef, WeightFormat};
use crate::xpack::XPack;
use std::arch::x86_64::*;
use std::ops::Range;

/// Segment length meaning "the whole row".
const WHOLE_ROW: usize = usize::MAX & !15;

/// Canonical dot product with two 8-lane accumulators (lanes 0..8 and 8..16).
///
/// # Safety
/// The CPU must support AVX2 and FMA; `a.len() == b.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let full = n / 16 * 16;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut lo = _mm256_setzero_ps();
    let mut hi = _mm256_setzero_ps();
    let mut c = 0;
    while c < full {
        // SAFETY: c + 16 <= full <= n, so both 8-wide loads are in bounds.
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(c)), _mm256_loadu_ps(pb.add(c)), lo);
        hi = _mm256_fmadd_ps(
            _mm256_loadu_ps(pa.add(c + 8)),
            _mm256_loadu_ps(pb.add(c + 8)),
            hi,
        );
        c += 16;
    }
    if full < n {
        let mut ta = [0.0f32; 16];
        let mut tb = [0.0f32; 16];
        ta[..n - full].copy_from_slice(&a[full..]);
        tb[..n - full].copy_from_slice(&b[full..]);
        lo = _mm256_fmadd_ps(
            _mm256_loadu_ps(ta.as_ptr()),
            _mm256_loadu_ps(tb.as_ptr()),
            lo,
        );
        hi = _mm256_fmadd_ps(
            _mm256_loadu_ps(ta.as_ptr().add(8)),
            _mm256_loadu_ps(tb.as_ptr().add(8)),
            hi,
        );
    }
    fold(lo, hi)
}

/// Four canonical dot products against one `b` ([`crate::dot::dot4`]): four (lo, hi) pairs,
/// each fed exactly as [`dot`] feeds its one.
///
/// # Safety
/// The CPU must support AVX2 and FMA; every `a[i].len() == b.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot4(a: [&[f32]; 4], b: &[f32]) -> [f32; 4] {
    let n = b.len();
    let full = n / 16 * 16;
    let pb = b.as_ptr();
    let pa = a.map(<[f32]>::as_ptr);
    let mut lo = [_mm256_setzero_ps(); 4];
    let mut hi = [_mm256_setzero_ps(); 4];
    let mut c = 0;
    while c < full {
        // SAFETY: c + 16 <= full <= n, so every 8-wide load is in bounds.
        unsafe {
            let (yl, yh) = (_mm256_loadu_ps(pb.add(c)), _mm256_loadu_ps(pb.add(c + 8)));
            for i in 0..4 {
                lo[i] = _mm256_fmadd_ps(_mm256_loadu_ps(pa[i].add(c)), yl, lo[i]);
                hi[i] = _mm256_fmadd_ps(_mm256_loadu_ps(pa[i].add(c + 8)), yh, hi[i]);
            }
        }
        c += 16;
    }
    if full < n {
        let mut tb = [0.0f32; 16];
        tb[..n - full].copy_from_slice(&b[full..]);
        for i in 0..4 {
            let mut ta = [0.0f32; 16];
            ta[..n - full].copy_from_slice(&a[i][full..]);
            lo[i] = _mm256_fmadd_ps(
                _mm256_loadu_ps(ta.as_ptr()),
                _mm256_loadu_ps(tb.as_ptr()),
                lo[i],
            );
            hi[i] = _mm256_fmadd_ps(
                _mm256_loadu_ps(ta.as_ptr().add(8)),
                _mm256_loadu_ps(tb.as_ptr().add(8)),
                hi[i],
            );
        }
    }
    [
        fold(lo[0], hi[0]),
        fold(lo[1], hi[1]),
        fold(lo[2], hi[2]),
        fold(lo[3], hi[3]),
    ]
}

/// Folds (lo, hi) = lanes 0..16 in the canonical order.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn fold(lo: __m256, hi: __m256) -> f32 {
    let s8 = _mm256_add_ps(lo, hi); // l[j] + l[j+8]
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)); // + l[j+4]
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4)); // + l[j+2]
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)); // l0 + l1
    _mm_cvtss_f32(s1)
}

/// Widens 8 bf16 values (as u16) to f32.
///
/// # Safety
/// AVX2 must be available; `p` must point at 8 readable u16.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn load_bf16x8(p: *const u8) -> __m256 {
    let h = _mm_loadu_si128(p as *const __m128i);
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
}

/// Decodes a bf16 row (little-endian bytes) to f32.
///
/// # Safety
/// AVX2 must be available; `src.len() == 2 * dst.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn decode_bf16_avx2(src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let full = n / 8 * 8;
    let mut c = 0;
    while c < full {
        // SAFETY: c + 8 <= n, so 16 source bytes and 8 destination floats are in bounds.
        _mm256_storeu_ps(
            dst.as_mut_ptr().add(c),
            load_bf16x8(src.as_ptr().add(2 * c)),
        );
        c += 8;
    }
    for i in full..n {
        dst[i] = f32::from_bits((u16::from_le_bytes([src[2 * i], src[2 * i + 1]]) as u32) << 16);
    }
}

static IOTA: [i32; 8] = [0, 1, 2, 3, 4, 5, 6, 7];
/// Right shift of dword lane k: 4k bits (nibble k of a little-endian u32).
static NIB_SHIFTS: [i32; 8] = [0, 4, 8, 12, 16, 20, 24, 28];

/// All-ones in lanes `< n` of each half (the first `n` columns of a 16-column step).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lane_mask(n: usize) -> [__m256; 2] {
    // SAFETY: IOTA holds 8 dwords.
    let iota = unsafe { _mm256_loadu_si256(IOTA.as_ptr().cast()) };
    let n = n as i32;
    [
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), iota)),
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - 8), iota)),
    ]
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

type V = [__m256; 2];

/// Dequantisation of one weight format, 16 columns (two halves) at a time.
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
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(&self, p: *const u8, c: usize, _: ()) -> V {
        // SAFETY: columns c..c + 16 lie in the row (caller).
        unsafe {
            let p = p.add(4 * c).cast::<f32>();
            [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))]
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, _: ()) -> V {
        // SAFETY: 4n bytes remain in the row; zero bytes decode to +0.
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
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(&self, p: *const u8, c: usize, _: ()) -> V {
        // SAFETY: 32 bytes of columns c..c + 16 lie in the row (caller).
        unsafe { [load_bf16x8(p.add(2 * c)), load_bf16x8(p.add(2 * c + 16))] }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, _: ()) -> V {
        // SAFETY: 2n bytes remain in the row; zero bytes decode to +0.
        let t = unsafe { tail_bytes::<32>(p.add(2 * c), 2 * n) };
        // SAFETY: local 32-byte buffer.
        unsafe { self.load(t.as_ptr(), 0, ()) }
    }
}

struct F16D<'a>(MatRef<'a>);
impl Dec for F16D<'_> {
    type S = ();
    fn mat(&self) -> &MatRef<'_> {
        &self.0
    }
    fn seg(&self) -> usize {
        WHOLE_ROW
    }
    unsafe fn state(&self, _: usize, _: usize) {}
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(&self, p: *const u8, c: usize, _: ()) -> V {
        // SAFETY: 32 bytes of columns c..c + 16 lie in the row (caller).
        unsafe {
            let p = p.add(2 * c);
            [
                _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast())),
            ]
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, _: ()) -> V {
        // SAFETY: 2n bytes remain in the row; zero bytes decode to +0.
        let t = unsafe { tail_bytes::<32>(p.add(2 * c), 2 * n) };
        // SAFETY: local 32-byte buffer.
        unsafe { self.load(t.as_ptr(), 0, ()) }
    }
}

struct Int8D<'a>(MatRef<'a>);
impl Dec for Int8D<'_> {
    type S = __m256;
    fn mat(&self) -> &MatRef<'_> {
        &self.0
    }
    fn seg(&self) -> usize {
        WHOLE_ROW
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn state(&self, row: usize, _: usize) -> __m256 {
        _mm256_set1_ps(self.0.scales[row])
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(&self, p: *const u8, c: usize, s: __m256) -> V {
        // SAFETY: 16 bytes of columns c..c + 16 lie in the row (caller).
        let (a, b) = unsafe {
            (
                _mm_loadl_epi64(p.add(c).cast()),
                _mm_loadl_epi64(p.add(c + 8).cast()),
            )
        };
        [
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)), s),
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s),
        ]
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, s: __m256) -> V {
        // SAFETY: n bytes remain in the row.
        let t = unsafe { tail_bytes::<16>(p.add(c), n) };
        // SAFETY: local 16-byte buffer; padded lanes forced to +0 (0 * scale may be -0).
        let v = unsafe { self.load(t.as_ptr(), 0, s) };
        let m = lane_mask(n);
        [_mm256_and_ps(v[0], m[0]), _mm256_and_ps(v[1], m[1])]
    }
}

/// int4 per row, or in groups that are not a multiple of 16 ([`Int4S`] takes the others).
/// State: the per-lane scales of one segment (the row, or one 16-column step, which may
/// straddle group boundaries).
struct Int4D<'a> {
    w: MatRef<'a>,
    seg: usize,
    /// Columns per scale (`usize::MAX` for per-row scales).
    group: usize,
    scales_per_row: usize,
}

/// Codes (as f32, `nibble - 8`) of the 8 columns whose nibbles are the u32 at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn codes8(p: *const u8) -> __m256 {
    // SAFETY: 4 readable bytes (caller).
    let b = _mm256_set1_epi32(unsafe { std::ptr::read_unaligned(p.cast::<i32>()) });
    // SAFETY: NIB_SHIFTS holds 8 dwords.
    let sh = unsafe { _mm256_loadu_si256(NIB_SHIFTS.as_ptr().cast()) };
    let n = _mm256_and_si256(_mm256_srlv_epi32(b, sh), _mm256_set1_epi32(15));
    // Small integers: the subtraction is exact, so this is `(n - 8) as f32`.
    _mm256_sub_ps(_mm256_cvtepi32_ps(n), _mm256_set1_ps(8.0))
}

/// Weights of int4 columns `c..c + 16` of the row at `p`: codes times the two halves' scales.
///
/// # Safety
/// 8 bytes of columns `c..c + 16` lie in the row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn int4_load(p: *const u8, c: usize, s: V) -> V {
    // SAFETY: 8 bytes of columns c..c + 16 lie in the row (caller).
    let (a, b) = unsafe { (codes8(p.add(c / 2)), codes8(p.add(c / 2 + 4))) };
    [_mm256_mul_ps(a, s[0]), _mm256_mul_ps(b, s[1])]
}

/// [`int4_load`] of the ragged end, `n < 16` columns; the other lanes are +0.
///
/// # Safety
/// `ceil(n / 2)` bytes from column `c` lie in the row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn int4_tail(p: *const u8, c: usize, n: usize, s: V) -> V {
    // SAFETY: ceil(n / 2) bytes remain in the row.
    let t = unsafe { tail_bytes::<8>(p.add(c / 2), n.div_ceil(2)) };
    // SAFETY: local 8-byte buffer; padded lanes forced to +0.
    let v = unsafe { int4_load(t.as_ptr(), 0, s) };
    let m = lane_mask(n);
    [_mm256_and_ps(v[0], m[0]), _mm256_and_ps(v[1], m[1])]
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
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn state(&self, row: usize, si: usize) -> V {
        let sc = &self.w.scales[row * self.scales_per_row..(row + 1) * self.scales_per_row];
        if self.group == usize::MAX {
            let s = _mm256_set1_ps(sc[0]);
            return [s, s];
        }
        let c = si * self.seg;
        let first = c / self.group;
        let last = (c + 15).min(self.w.cols - 1) / self.group;
        let mut v = [_mm256_set1_ps(sc[first]); 2];
        if last > first {
            // SAFETY: IOTA holds 8 dwords.
            let iota = unsafe { _mm256_loadu_si256(IOTA.as_ptr().cast()) };
            let col0 = _mm256_add_epi32(_mm256_set1_epi32(c as i32), iota);
            let col1 = _mm256_add_epi32(col0, _mm256_set1_epi32(8));
            for (g, &s) in sc.iter().enumerate().take(last + 1).skip(first + 1) {
                // Lanes whose column is >= the group start (columns < 2^31: checked at entry).
                let b = _mm256_set1_epi32((g * self.group) as i32 - 1);
                let s = _mm256_set1_ps(s);
                let m0 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(col0, b));
                let m1 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(col1, b));
                v = [_mm256_blendv_ps(v[0], s, m0), _mm256_blendv_ps(v[1], s, m1)];
            }
        }
        v
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(&self, p: *const u8, c: usize, s: V) -> V {
        // SAFETY: forwarded (8 bytes of columns c..c + 16 lie in the row).
        unsafe { int4_load(p, c, s) }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, s: V) -> V {
        // SAFETY: forwarded (ceil(n / 2) bytes remain in the row).
        unsafe { int4_tail(p, c, n, s) }
    }
}

/// int4 in groups of a multiple of 16 columns: one scale register per row. [`Int4D`]'s two per
/// row (its segments may straddle groups) spilled a 4-row block's scales and accumulators to
/// the stack on AVX2's 16 registers: int4-g64 products ran at 0.6 of int4-row ones
/// (`benchmarks/RESULTS.md`).
struct Int4S<'a> {
    w: MatRef<'a>,
    /// Columns per scale.
    seg: usize,
    scales_per_row: usize,
}

impl Dec for Int4S<'_> {
    type S = __m256;
    fn mat(&self) -> &MatRef<'_> {
        &self.w
    }
    fn seg(&self) -> usize {
        self.seg
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn state(&self, row: usize, si: usize) -> __m256 {
        _mm256_set1_ps(self.w.scales[row * self.scales_per_row + si])
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(&self, p: *const u8, c: usize, s: __m256) -> V {
        // SAFETY: forwarded (8 bytes of columns c..c + 16 lie in the row).
        unsafe { int4_load(p, c, [s, s]) }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, s: __m256) -> V {
        // SAFETY: forwarded (ceil(n / 2) bytes remain in the row).
        unsafe { int4_tail(p, c, n, [s, s]) }
    }
}

/// One 16-column step (at column `c`) of every row of a register block against every
/// activation row: decode the row's weights once, then one FMA per activation row.
///
/// # Safety
/// `c + 16 <= cols` for rows `rp`, and the packed activations hold `c + 16` columns.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
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
            let (x0, x1) = unsafe {
                let p = xp.add(i * xs + c);
                (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
            };
            a[0] = _mm256_fmadd_ps(wv[0], x0, a[0]);
            a[1] = _mm256_fmadd_ps(wv[1], x1, a[1]);
        }
    }
}

/// The register-blocked kernel over one decoder.
struct K<D>(D);

impl<D: Dec> Block for K<D> {
    const WIDE: bool = false;

    #[target_feature(enable = "avx2,fma,f16c")]
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
        let z = _mm256_setzero_ps();
        let mut acc = [[[z, z]; MB]; R];
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
                    let (x0, x1) = unsafe {
                        let p = xp.add(i * xs + full);
                        (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
                    };
                    a[0] = _mm256_fmadd_ps(wv[0], x0, a[0]);
                    a[1] = _mm256_fmadd_ps(wv[1], x1, a[1]);
                }
            }
        }
        for (k, row) in acc.iter().enumerate() {
            for (i, a) in row.iter().enumerate() {
                // SAFETY: inside the caller's output region.
                unsafe { *out.add(i * stride + k) = fold(a[0], a[1]) };
            }
        }
    }
}

/// AVX2 [`crate::driver::tile`].
///
/// # Safety
/// As [`crate::driver::tile`], with the CPU supporting AVX2, FMA and F16C.
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
            WeightFormat::F16 => run(&K(F16D(*w)), rows, x, out, stride),
            WeightFormat::Int8Row => run(&K(Int8D(*w)), rows, x, out, stride),
            // Per row `Int4D` stays: `Int4S` measured 0.97× of it at one thread and 0.75× at
            // two (RESULTS).
            WeightFormat::Int4Row => {
                let d = Int4D {
                    w: *w,
                    seg: WHOLE_ROW,
                    group: usize::MAX,
                    scales_per_row: spr,
                };
                run(&K(d), rows, x, out, stride)
            }
            WeightFormat::Int4Group { group } if group % 16 == 0 => {
                let d = Int4S {
                    w: *w,
                    seg: group,
                    scales_per_row: spr,
                };
                run(&K(d), rows, x, out, stride)
            }
            WeightFormat::Int4Group { group } => {
                let d = Int4D {
                    w: *w,
                    seg: 16,
                    group,
                    scales_per_row: spr,
                };
                run(&K(d), rows, x, out, stride)
            }
        }
    }
}
