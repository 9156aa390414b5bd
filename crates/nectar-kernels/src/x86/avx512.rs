//! AVX-512F kernels: one 16-lane register is exactly one canonical accumulator (`dot.rs`).
//!
//! Weights are dequantised in registers, `(code as f32) * scale` exactly as `decode_row` does,
//! and fed straight into the fused multiply-add; nothing is written back to memory.
//!
//! int4 uses a trick worth explaining. For a 16-column step, the 8 weight bytes are broadcast to
//! all eight 64-bit lanes and lane k is shifted right by 4k bits, so the low 4 bits of dword 2k
//! hold the code of column k and those of dword 2k + 1 the code of column k + 8. `vpermps`
//! reads only the low 4 bits of each index, so one permute through a 16-entry table
//! `(n - 8) * scale` (built once per scale group) turns those dwords into dequantised weights:
//! three instructions per 16 weights. Lanes then hold columns in the order 0, 8, 1, 9, ...
//! (`Layout::Nib16`), so the activations are packed in that order too and the lanes are put
//! back in canonical order before the fold. Each lane still sees its columns in increasing
//! order, so the bits are the reference's.
//!
//! That is also about the least work the canonical order allows: each FMA must cover 16
//! consecutive columns of one row (one per lane), so every 8 bytes of codes need one spread
//! into 16 dwords (`vpsrlvq`), one table lookup (`vpermps`) and one FMA, plus a table multiply
//! per row and scale group. On Zen 5 (measured, `benchmarks/RESULTS.md`) the triple issues at
//! ≈ 0.8 cycles, so one core decodes at most ≈ 37 GB/s of int4 at 3.75 GHz whatever the memory
//! does. The int4 block ([`int4_block`]) is written for that budget: tables and accumulators in
//! registers, nothing else in the loop.
use crate::driver::{prefetch, run, Block, Prefetch};
use crate::format::{MatRef, WeightFormat};
use crate::xpack::{Layout, XPack};
use std::arch::x86_64::*;
use std::ops::Range;

/// Segment length meaning "the whole row" (a multiple of 16 that never limits a row).
const WHOLE_ROW: usize = usize::MAX & !15;

/// Codes of the 16 nibbles (`n - 8`).
static CODES: [f32; 16] = [
    -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0,
];
/// Right shift of 64-bit lane k: 4k bits (nibble k lands in the low dword, k + 8 in the high).
static NIB_SHIFTS: [u64; 8] = [0, 4, 8, 12, 16, 20, 24, 28];
/// For the fold: canonical lane j is Nib16 position `UNPERM[j]`.
static UNPERM: [i32; 16] = [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15];
/// For scale vectors: Nib16 position p holds canonical lane `PERM[p]`.
static PERM: [i32; 16] = [0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15];
static IOTA: [i32; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

/// Nib16 lane mask of the first `n` columns of a step.
fn nib_mask(n: usize) -> u16 {
    let mut m = 0u16;
    for j in 0..n.min(16) {
        m |= 1 << Layout::Nib16.pos(j);
    }
    m
}

/// Natural lane mask of the first `n` columns of a step.
fn mask(n: usize) -> u16 {
    ((1u32 << n.min(16)) - 1) as u16
}

/// Canonical dot product, one 16-lane accumulator.
///
/// # Safety
/// The CPU must support AVX-512F; `a.len() == b.len()`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let full = n & !15;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = _mm512_setzero_ps();
    let mut c = 0;
    while c < full {
        // SAFETY: c + 16 <= full <= n for both slices.
        acc =
            unsafe { _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(c)), _mm512_loadu_ps(pb.add(c)), acc) };
        c += 16;
    }
    if full < n {
        let m = mask(n - full);
        // SAFETY: masked-off lanes are neither read nor faulted; they load as +0, which is the
        // canonical zero padding.
        acc = unsafe {
            _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(m, pa.add(full)),
                _mm512_maskz_loadu_ps(m, pb.add(full)),
                acc,
            )
        };
    }
    fold(acc)
}

/// Four canonical dot products against one `b` ([`crate::dot::dot4`]): four accumulators,
/// each fed exactly as [`dot`] feeds its one.
///
/// # Safety
/// The CPU must support AVX-512F; every `a[i].len() == b.len()`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn dot4(a: [&[f32]; 4], b: &[f32]) -> [f32; 4] {
    let n = b.len();
    let full = n & !15;
    let pb = b.as_ptr();
    let pa = a.map(<[f32]>::as_ptr);
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut c = 0;
    while c < full {
        // SAFETY: c + 16 <= full <= n for every slice.
        unsafe {
            let y = _mm512_loadu_ps(pb.add(c));
            for (s, p) in acc.iter_mut().zip(pa) {
                *s = _mm512_fmadd_ps(_mm512_loadu_ps(p.add(c)), y, *s);
            }
        }
        c += 16;
    }
    if full < n {
        let m = mask(n - full);
        // SAFETY: masked-off lanes are neither read nor faulted; they load as +0, as in `dot`.
        unsafe {
            let y = _mm512_maskz_loadu_ps(m, pb.add(full));
            for (s, p) in acc.iter_mut().zip(pa) {
                *s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, p.add(full)), y, *s);
            }
        }
    }
    [fold(acc[0]), fold(acc[1]), fold(acc[2]), fold(acc[3])]
}

/// Folds 16 canonical lanes: l[j] += l[j+8], l[j] += l[j+4], l[j] += l[j+2], l[0] + l[1].
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn fold(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    let s8 = _mm256_add_ps(lo, hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    _mm_cvtss_f32(s1)
}

/// Loads 16 constants.
#[inline]
#[target_feature(enable = "avx512f")]
fn cf(t: &[f32; 16]) -> __m512 {
    // SAFETY: the array holds exactly 16 floats.
    unsafe { _mm512_loadu_ps(t.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn ci(t: &[i32; 16]) -> __m512i {
    // SAFETY: the array holds exactly 16 dwords.
    unsafe { _mm512_loadu_si512(t.as_ptr().cast()) }
}

/// Reads `n <= N` bytes at `p` into a zeroed `N`-byte buffer (the ragged end of a row, which
/// must not be over-read: the row may end the buffer).
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

/// Dequantisation of one weight format, 16 columns at a time.
trait Dec {
    /// Per-row state for one scale segment (a scale, a table or a scale vector).
    type S: Copy;
    /// Activations are in `Layout::Nib16` (else natural).
    const NIB: bool;
    /// See [`Block::PAIR8`].
    const PAIR8: bool = false;
    /// See [`Block::narrow4`].
    fn narrow4(&self) -> bool {
        false
    }
    fn mat(&self) -> &MatRef<'_>;
    /// Columns per scale segment (a multiple of 16).
    fn seg(&self) -> usize;
    /// State of row `row`, segment `si`.
    ///
    /// # Safety
    /// `row` is a row of the matrix and `si` one of its segments (`si * seg() < cols`).
    unsafe fn state(&self, row: usize, si: usize) -> Self::S;
    /// Weights of columns `c..c + 16` of the row starting at `p`.
    unsafe fn load(&self, p: *const u8, c: usize, s: Self::S) -> __m512;
    /// Weights of columns `c..c + n` (n < 16); the other lanes are +0.
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, s: Self::S) -> __m512;
}

struct Plain<'a> {
    w: MatRef<'a>,
}

struct F32D<'a>(Plain<'a>);
impl Dec for F32D<'_> {
    type S = ();
    const NIB: bool = false;
    fn mat(&self) -> &MatRef<'_> {
        &self.0.w
    }
    fn seg(&self) -> usize {
        WHOLE_ROW
    }
    unsafe fn state(&self, _: usize, _: usize) {}
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(&self, p: *const u8, c: usize, _: ()) -> __m512 {
        // SAFETY: columns c..c + 16 lie in the row (caller).
        unsafe { _mm512_loadu_ps(p.add(4 * c).cast()) }
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, _: ()) -> __m512 {
        // SAFETY: masked-off lanes are not read, so only the row's n last floats are touched.
        unsafe { _mm512_maskz_loadu_ps(mask(n), p.add(4 * c).cast()) }
    }
}

struct Bf16D<'a>(Plain<'a>);
impl Dec for Bf16D<'_> {
    type S = ();
    const NIB: bool = false;
    fn mat(&self) -> &MatRef<'_> {
        &self.0.w
    }
    fn seg(&self) -> usize {
        WHOLE_ROW
    }
    unsafe fn state(&self, _: usize, _: usize) {}
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(&self, p: *const u8, c: usize, _: ()) -> __m512 {
        // SAFETY: 32 bytes of columns c..c + 16 lie in the row (caller).
        let h = unsafe { _mm256_loadu_si256(p.add(2 * c).cast()) };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, _: ()) -> __m512 {
        // SAFETY: 2n bytes remain in the row; the zeroed rest decodes to +0.
        let t = unsafe { tail_bytes::<32>(p.add(2 * c), 2 * n) };
        // SAFETY: `t` is a local 32-byte buffer.
        unsafe { self.load(t.as_ptr(), 0, ()) }
    }
}

struct F16D<'a>(Plain<'a>);
impl Dec for F16D<'_> {
    type S = ();
    const NIB: bool = false;
    fn mat(&self) -> &MatRef<'_> {
        &self.0.w
    }
    fn seg(&self) -> usize {
        WHOLE_ROW
    }
    unsafe fn state(&self, _: usize, _: usize) {}
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(&self, p: *const u8, c: usize, _: ()) -> __m512 {
        // SAFETY: 32 bytes of columns c..c + 16 lie in the row (caller).
        _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.add(2 * c).cast()) })
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, _: ()) -> __m512 {
        // SAFETY: 2n bytes remain in the row; the zeroed rest decodes to +0.
        let t = unsafe { tail_bytes::<32>(p.add(2 * c), 2 * n) };
        // SAFETY: `t` is a local 32-byte buffer.
        unsafe { self.load(t.as_ptr(), 0, ()) }
    }
}

struct Int8D<'a>(Plain<'a>);
impl Dec for Int8D<'_> {
    type S = __m512;
    const NIB: bool = false;
    const PAIR8: bool = true;
    fn narrow4(&self) -> bool {
        true
    }
    fn mat(&self) -> &MatRef<'_> {
        &self.0.w
    }
    fn seg(&self) -> usize {
        WHOLE_ROW
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn state(&self, row: usize, _: usize) -> __m512 {
        _mm512_set1_ps(self.0.w.scales[row])
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(&self, p: *const u8, c: usize, s: __m512) -> __m512 {
        // SAFETY: 16 bytes of columns c..c + 16 lie in the row (caller).
        let q = unsafe { _mm_loadu_si128(p.add(c).cast()) };
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), s)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, s: __m512) -> __m512 {
        // SAFETY: n bytes remain in the row.
        let t = unsafe { tail_bytes::<16>(p.add(c), n) };
        // SAFETY: `t` is a local 16-byte buffer. Padded lanes are forced to +0 (0 * scale could
        // be -0 or NaN).
        _mm512_maskz_mov_ps(mask(n), unsafe { self.load(t.as_ptr(), 0, s) })
    }
}

/// int4 whose scale segments are whole 16-column steps (per row, or groups that are multiples
/// of 16: every group size Colibri detects). State: the 16-entry table `(n - 8) * scale`.
#[derive(Clone, Copy)]
struct Int4T<'a> {
    w: MatRef<'a>,
    seg: usize,
    scales_per_row: usize,
}

/// Nib16-ordered indices of the 16 codes of columns `c..c + 16` (low 4 bits of each dword).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn nib_idx(p: *const u8, c: usize) -> __m512i {
    // SAFETY: 8 bytes of columns c..c + 16 lie in the row (caller).
    let q = unsafe { std::ptr::read_unaligned(p.add(c / 2).cast::<i64>()) };
    // SAFETY: NIB_SHIFTS holds exactly 8 qwords.
    let sh = unsafe { _mm512_loadu_si512(NIB_SHIFTS.as_ptr().cast()) };
    _mm512_srlv_epi64(_mm512_set1_epi64(q), sh)
}

/// As [`nib_idx`] for the ragged end of a row (`n < 16` columns from `c`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn nib_idx_tail(p: *const u8, c: usize, n: usize) -> __m512i {
    // SAFETY: ceil(n / 2) bytes remain in the row.
    let t = unsafe { tail_bytes::<8>(p.add(c / 2), n.div_ceil(2)) };
    // SAFETY: `t` is a local 8-byte buffer.
    unsafe { nib_idx(t.as_ptr(), 0) }
}

impl Dec for Int4T<'_> {
    type S = __m512;
    const NIB: bool = true;
    fn mat(&self) -> &MatRef<'_> {
        &self.w
    }
    fn seg(&self) -> usize {
        self.seg
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn state(&self, row: usize, si: usize) -> __m512 {
        // Exactly the reference's `(n - 8) as f32 * scale`, once per nibble value.
        debug_assert!(si < self.scales_per_row && row < self.w.rows);
        // SAFETY: row < rows and si < scales_per_row (callers), and a validated view holds
        // rows × scales_per_row scales.
        let s = unsafe { *self.w.scales.get_unchecked(row * self.scales_per_row + si) };
        _mm512_mul_ps(cf(&CODES), _mm512_set1_ps(s))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(&self, p: *const u8, c: usize, t: __m512) -> __m512 {
        // SAFETY: forwarded (caller).
        _mm512_permutexvar_ps(unsafe { nib_idx(p, c) }, t)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, t: __m512) -> __m512 {
        // SAFETY: forwarded (caller); padded lanes forced to +0.
        _mm512_maskz_mov_ps(
            nib_mask(n),
            _mm512_permutexvar_ps(unsafe { nib_idx_tail(p, c, n) }, t),
        )
    }
}

/// int4 with any other group size (a step may straddle groups). State: a per-lane scale vector
/// for one step, built by masked blends at the group boundaries inside the step.
struct Int4Any<'a> {
    w: MatRef<'a>,
    group: usize,
    ngroups: usize,
}

impl Dec for Int4Any<'_> {
    type S = __m512;
    const NIB: bool = true;
    fn mat(&self) -> &MatRef<'_> {
        &self.w
    }
    fn seg(&self) -> usize {
        16
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn state(&self, row: usize, si: usize) -> __m512 {
        let sc = &self.w.scales[row * self.ngroups..(row + 1) * self.ngroups];
        let c = si * 16;
        let first = c / self.group;
        let last = (c + 15).min(self.w.cols - 1) / self.group;
        let mut v = _mm512_set1_ps(sc[first]);
        if last > first {
            let col = _mm512_add_epi32(_mm512_set1_epi32(c as i32), ci(&IOTA));
            for (g, &s) in sc.iter().enumerate().take(last + 1).skip(first + 1) {
                let m = _mm512_cmpge_epu32_mask(col, _mm512_set1_epi32((g * self.group) as i32));
                v = _mm512_mask_mov_ps(v, m, _mm512_set1_ps(s));
            }
        }
        _mm512_permutexvar_ps(ci(&PERM), v)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(&self, p: *const u8, c: usize, s: __m512) -> __m512 {
        // SAFETY: forwarded (caller).
        _mm512_mul_ps(
            _mm512_permutexvar_ps(unsafe { nib_idx(p, c) }, cf(&CODES)),
            s,
        )
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tail(&self, p: *const u8, c: usize, n: usize, s: __m512) -> __m512 {
        // SAFETY: forwarded (caller); padded lanes forced to +0.
        let code = _mm512_permutexvar_ps(unsafe { nib_idx_tail(p, c, n) }, cf(&CODES));
        _mm512_maskz_mov_ps(nib_mask(n), _mm512_mul_ps(code, s))
    }
}

/// One 16-column step (at column `c`) of every row of a register block against every
/// activation row: decode the row's weights once, then one FMA per activation row.
///
/// # Safety
/// `c + 16 <= cols` for rows `rp`, and the packed activations hold `c + 16` columns.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn step<D: Dec, const R: usize, const MB: usize>(
    d: &D,
    rp: &[*const u8; R],
    st: &[D::S; R],
    xp: *const f32,
    xs: usize,
    c: usize,
    acc: &mut [[__m512; MB]; R],
) {
    for k in 0..R {
        // SAFETY: c + 16 <= cols (caller): a whole step of row k.
        let wv = unsafe { d.load(rp[k], c, st[k]) };
        for (i, a) in acc[k].iter_mut().enumerate() {
            // SAFETY: the packed activations hold c + 16 columns (caller).
            let xv = unsafe { _mm512_loadu_ps(xp.add(i * xs + c)) };
            *a = _mm512_fmadd_ps(wv, xv, *a);
        }
    }
}

/// The register-blocked kernel over one decoder.
struct K<D>(D);

impl<D: Dec> Block for K<D> {
    const WIDE: bool = true;
    const PAIR8: bool = D::PAIR8;

    fn narrow4(&self) -> bool {
        self.0.narrow4()
    }

    #[target_feature(enable = "avx512f")]
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
            // SAFETY: row r0 + k exists (caller), so its start is inside `data`.
            *p = unsafe { p.add((r0 + k) * rb) };
        }
        let xs = x.stride;
        // SAFETY: activation rows i0..i0 + MB exist (caller).
        let xp = unsafe { x.ptr().add(i0 * xs) };
        let mut acc = [[_mm512_setzero_ps(); MB]; R];
        let seg = d.seg();
        let mut pf = Prefetch::new(w, r0 + R, R);
        let spr = w.format.row_scales(cols);
        // The next block's scales, all at once: one prefetch per line (a per-row, per-group
        // prefetch cost ≈ 12 % of the int4-g64 compute rate, measured).
        let sp = w.scales.as_ptr().wrapping_add((r0 + R) * spr).cast::<u8>();
        let mut o = 0;
        while o < R * spr * 4 {
            prefetch(sp.wrapping_add(o));
            o += 64;
        }
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
            // blocks of 4 or 8 activation rows: two steps' activations would not fit in
            // registers beside 16 accumulators, and the spills cost more than the loop
            // (measured: int8 at M = 4 2× faster without, int4 unchanged).
            while MB <= 2 && c + 32 <= end {
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
                // SAFETY: the ragged step of row r0 + k, n = cols - full < 16 columns; the
                // packed activations are zero-padded to `stride >= full + 16`.
                let wv = unsafe {
                    let s = d.state(r0 + k, full / seg);
                    d.tail(rp[k], full, cols - full, s)
                };
                for (i, a) in acc[k].iter_mut().enumerate() {
                    // SAFETY: as above.
                    let xv = unsafe { _mm512_loadu_ps(xp.add(i * xs + full)) };
                    *a = _mm512_fmadd_ps(wv, xv, *a);
                }
            }
        }
        for (k, row) in acc.iter().enumerate() {
            for (i, &a) in row.iter().enumerate() {
                let a = if D::NIB {
                    _mm512_permutexvar_ps(ci(&UNPERM), a)
                } else {
                    a
                };
                // SAFETY: inside the caller's output region.
                unsafe { *out.add(i * stride + k) = fold(a) };
            }
        }
    }
}

/// [`Int4T`] through the dedicated int4 kernel [`int4_block`] for every block shape.
struct Int4Fast<'a>(Int4T<'a>);

impl Block for Int4Fast<'_> {
    const WIDE: bool = true;
    const PAIR8: bool = PAIR8_INT4;

    fn narrow4(&self) -> bool {
        NARROW4_INT4
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn block<const R: usize, const MB: usize>(
        &self,
        r0: usize,
        x: &XPack,
        i0: usize,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY: forwarded from the caller (`Block::block`'s contract).
        unsafe { int4_block::<R, MB>(&self.0, r0, x, i0, out, stride) }
    }
}

/// Block shapes of [`Int4Fast`] for 2–3 and 4–7 activation rows (see [`Block::PAIR8`],
/// [`Block::narrow4`]). Measured L2-hot as in [`int4_block`], one 8-row block: M = 2 as 8 × 2
/// 23.8–24.2 GB/s vs 21.1–21.7 as 2 × (4 × 2); M = 4 as 2 × (4 × 4) 11.8–12.3 GB/s vs 9.0–9.5
/// as 4 × (2 × 4).
const PAIR8_INT4: bool = true;
const NARROW4_INT4: bool = false;

/// One 16-column step of R int4 rows against MB activation rows: per row one 8-byte broadcast
/// load, `vpsrlvq` (nibbles to dword indices), `vpermps` through the row's table, then one FMA
/// per activation row. The same operations as [`step`] for [`Int4T`].
///
/// # Safety
/// Columns `c..c + 16` lie inside each of the R rows starting at `p + k * rb`, and each of the
/// MB packed activation rows at `xp + i * xs` holds `c + 16` floats.
#[inline]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn int4_step<const R: usize, const MB: usize>(
    p: *const u8,
    rb: usize,
    c: usize,
    xp: *const f32,
    xs: usize,
    sh: __m512i,
    t: &[__m512; R],
    acc: &mut [[__m512; MB]; R],
) {
    let mut xv = [_mm512_setzero_ps(); MB];
    for (i, v) in xv.iter_mut().enumerate() {
        // SAFETY: c + 16 <= the packed row's length (caller).
        *v = unsafe { _mm512_loadu_ps(xp.add(i * xs + c)) };
    }
    for k in 0..R {
        // SAFETY: the 8 bytes of columns c..c + 16 of row k (caller).
        let q = unsafe { std::ptr::read_unaligned(p.add(k * rb + c / 2).cast::<i64>()) };
        let wv = _mm512_permutexvar_ps(_mm512_srlv_epi64(_mm512_set1_epi64(q), sh), t[k]);
        for i in 0..MB {
            acc[k][i] = _mm512_fmadd_ps(wv, xv[i], acc[k][i]);
        }
    }
}

/// The int4 kernel for scale segments of whole steps: weight rows `r0..r0 + R` against packed
/// activation rows `i0..i0 + MB`, writing row `r0 + k`, activation `i0 + i` to
/// `*out.add(i * stride + k)`.
///
/// Same values in the same order as the generic [`K`] block (each lane sees its columns in
/// increasing order, one FMA each, tables `(n - 8) * scale` as `decode_row` computes them), so
/// the bits are the reference's. What differs is mechanical: the R tables are built once per
/// scale segment straight into registers, the loop over a segment has no other bookkeeping,
/// and the next block is prefetched one 64-byte line per step. Measured compute rate at M = 1
/// (8 × 1 blocks; a 512 × 2048 int4-g64 matrix hot in L2, best call of 20,000, one thread):
/// 33.0–33.4 GB/s against 27.7–28.9 for the generic block, whose accumulators and tables
/// partly lived on the stack. Four steps per iteration were slower (15 GB/s at M = 1): the
/// compiler hoisted all 32 weight loads and spilled the tables.
///
/// # Safety
/// Rows `r0..r0 + R` and activation rows `i0..i0 + MB` exist; `x` is packed `Layout::Nib16`;
/// `out` is valid for those writes; the CPU supports AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn int4_block<const R: usize, const MB: usize>(
    d: &Int4T<'_>,
    r0: usize,
    x: &XPack,
    i0: usize,
    out: *mut f32,
    stride: usize,
) {
    let w = &d.w;
    let cols = w.cols;
    let full = cols & !15;
    let rb = w.format.row_bytes(cols);
    let spr = d.scales_per_row;
    debug_assert!(r0 + R <= w.rows && i0 + MB <= x.m && spr == w.format.row_scales(cols));
    // SAFETY: row r0 exists, so its start is inside `data` (and its scales inside `scales`).
    let p = unsafe { w.data.as_ptr().add(r0 * rb) };
    // SAFETY: as above.
    let sp = unsafe { w.scales.as_ptr().add(r0 * spr) };
    let xs = x.stride;
    // SAFETY: activation row i0 exists.
    let xp = unsafe { x.ptr().add(i0 * xs) };
    // SAFETY: NIB_SHIFTS holds exactly 8 qwords.
    let sh = unsafe { _mm512_loadu_si512(NIB_SHIFTS.as_ptr().cast()) };
    let codes = cf(&CODES);
    let mut acc = [[_mm512_setzero_ps(); MB]; R];
    let mut pf = Prefetch::new(w, r0 + R, R);
    // The next block's scales, as the generic block does.
    let nsp = sp.wrapping_add(R * spr).cast::<u8>();
    let mut o = 0;
    while o < R * spr * 4 {
        prefetch(nsp.wrapping_add(o));
        o += 64;
    }
    let seg = d.seg;
    let (mut c, mut si) = (0, 0);
    while c < full {
        let end = c + seg.min(full - c);
        let mut t = [codes; R];
        for (k, tk) in t.iter_mut().enumerate() {
            // SAFETY: segment si < spr of row r0 + k, inside a validated view's scales.
            let s = unsafe { *sp.add(k * spr + si) };
            // Exactly the reference's `(n - 8) as f32 * scale`, once per nibble value.
            *tk = _mm512_mul_ps(codes, _mm512_set1_ps(s));
        }
        // Two steps per iteration while the block's registers allow it.
        while R * (MB + 1) <= 16 && c + 32 <= end {
            // SAFETY: c + 32 <= end <= full: two whole steps of every row.
            unsafe {
                int4_step(p, rb, c, xp, xs, sh, &t, &mut acc);
                int4_step(p, rb, c + 16, xp, xs, sh, &t, &mut acc);
            }
            pf.steps(2);
            c += 32;
        }
        while c < end {
            // SAFETY: c + 16 <= end <= full: a whole step of every row.
            unsafe { int4_step(p, rb, c, xp, xs, sh, &t, &mut acc) };
            pf.steps(1);
            c += 16;
        }
        si += 1;
    }
    if full < cols {
        for (k, row) in acc.iter_mut().enumerate() {
            // SAFETY: the ragged step of row r0 + k, n = cols - full < 16 columns; the packed
            // activations are zero-padded to `stride >= full + 16`.
            unsafe {
                let t = d.state(r0 + k, full / seg);
                let wv = d.tail(p.add(k * rb), full, cols - full, t);
                for (i, a) in row.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xp.add(i * xs + full)), *a);
                }
            }
        }
    }
    for (k, row) in acc.iter().enumerate() {
        for (i, &a) in row.iter().enumerate() {
            // SAFETY: inside the caller's output region.
            unsafe { *out.add(i * stride + k) = fold(_mm512_permutexvar_ps(ci(&UNPERM), a)) };
        }
    }
}

/// AVX-512 [`crate::driver::tile`].
///
/// # Safety
/// As [`crate::driver::tile`], with the CPU supporting AVX-512F.
pub(crate) unsafe fn tile(
    w: &MatRef<'_>,
    rows: Range<usize>,
    x: &XPack,
    out: *mut f32,
    stride: usize,
) {
    let p = Plain { w: *w };
    let spr = w.format.row_scales(w.cols);
    // SAFETY (all arms): forwarded from this function's contract.
    unsafe {
        match w.format {
            WeightFormat::F32 => run(&K(F32D(p)), rows, x, out, stride),
            WeightFormat::Bf16 => run(&K(Bf16D(p)), rows, x, out, stride),
            WeightFormat::F16 => run(&K(F16D(p)), rows, x, out, stride),
            WeightFormat::Int8Row => run(&K(Int8D(p)), rows, x, out, stride),
            WeightFormat::Int4Row => {
                let d = Int4T {
                    w: *w,
                    seg: WHOLE_ROW,
                    scales_per_row: spr,
                };
                run(&Int4Fast(d), rows, x, out, stride)
            }
            WeightFormat::Int4Group { group } if group % 16 == 0 => {
                let d = Int4T {
                    w: *w,
                    seg: group,
                    scales_per_row: spr,
                };
                run(&Int4Fast(d), rows, x, out, stride)
            }
            WeightFormat::Int4Group { group } => {
                let d = Int4Any {
                    w: *w,
                    group,
                    ngroups: spr,
                };
                run(&K(d), rows, x, out, stride)
            }
        }
    }
}

/// [`crate::scaled_add_rows`] for int4 weights whose scales cover whole 64-column groups (`seg`
/// columns each, a multiple of 64; `usize::MAX`: one per row).
///
/// Same values in the same order as the definition: each weight is the table's
/// `(n - 8) · scale` (what `decode_row` computes), each output element gets `a[j] · w` added
/// row by row in ascending order, a multiply then an add. Columns go in chunks of up to 256 (16
/// registers of 16 outputs, held in the Nib16 lane order of the int4 step and permuted back at
/// the end — lanes never mix, so the order does not change a bit); a chunk's rows are walked
/// once, one 16-entry table per row and 64-column group. Columns past the last whole group take
/// the definition's scalar arithmetic.
///
/// # Safety
/// The CPU supports AVX-512F; rows `r0..r0 + a.len()` of `m` exist; `y.len() == m.cols`;
/// `seg` is a multiple of 64 or `usize::MAX`, and `m` is int4 with those segments.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn scaled_add_rows_int4(
    m: &MatRef<'_>,
    r0: usize,
    a: &[f32],
    y: &mut [f32],
    seg: usize,
) {
    let cols = m.cols;
    let full = cols & !63;
    let mut c0 = 0;
    while c0 < full {
        let groups = match (full - c0) / 64 {
            4.. => 4,
            2 | 3 => 2,
            _ => 1,
        };
        // SAFETY (all three): columns c0 .. c0 + 64 · groups lie in whole groups of the row; the
        // rest is forwarded from this function's contract.
        unsafe {
            match groups {
                4 => add_rows_chunk::<4, 16>(m, r0, a, y, seg, c0),
                2 => add_rows_chunk::<2, 8>(m, r0, a, y, seg, c0),
                _ => add_rows_chunk::<1, 4>(m, r0, a, y, seg, c0),
            }
        }
        c0 += 64 * groups;
    }
    let rb = m.format.row_bytes(cols);
    let spr = m.format.row_scales(cols);
    for (j, &aj) in a.iter().enumerate() {
        let row = r0 + j;
        for (c, v) in y.iter_mut().enumerate().skip(full) {
            let s = m.scales[row * spr + if seg == usize::MAX { 0 } else { c / seg }];
            let w = crate::decode::int4_code(m.data[row * rb + c / 2], c % 2 == 1) * s;
            *v += aj * w;
        }
    }
}

/// One chunk of [`scaled_add_rows_int4`]: `G` groups of 64 columns from `c0`, `S = 4·G` steps.
///
/// # Safety
/// As [`scaled_add_rows_int4`], with columns `c0 .. c0 + 64·G` inside the row.
#[target_feature(enable = "avx512f")]
unsafe fn add_rows_chunk<const G: usize, const S: usize>(
    m: &MatRef<'_>,
    r0: usize,
    a: &[f32],
    y: &mut [f32],
    seg: usize,
    c0: usize,
) {
    debug_assert_eq!(S, 4 * G, "four steps per group");
    let rb = m.format.row_bytes(m.cols);
    let spr = m.format.row_scales(m.cols);
    // The scale of each group of the chunk, as an index into a row's scales.
    let si: [usize; G] = std::array::from_fn(|g| {
        if seg == usize::MAX {
            0
        } else {
            (c0 + 64 * g) / seg
        }
    });
    // SAFETY: NIB_SHIFTS holds exactly 8 qwords.
    let sh = unsafe { _mm512_loadu_si512(NIB_SHIFTS.as_ptr().cast()) };
    let codes = cf(&CODES);
    let mut acc = [_mm512_setzero_ps(); S];
    for (k, v) in acc.iter_mut().enumerate() {
        // SAFETY: columns c0 + 16k .. + 16 lie in `y` (caller).
        let yv = unsafe { _mm512_loadu_ps(y.as_ptr().add(c0 + 16 * k)) };
        *v = _mm512_permutexvar_ps(ci(&PERM), yv);
    }
    for (j, &aj) in a.iter().enumerate() {
        let row = r0 + j;
        // SAFETY: row `row` exists (caller), so its bytes from c0 / 2 are inside `data`.
        let p = unsafe { m.data.as_ptr().add(row * rb + c0 / 2) };
        let av = _mm512_set1_ps(aj);
        for (g, (&s, group)) in si.iter().zip(acc.chunks_exact_mut(4)).enumerate() {
            let t = _mm512_mul_ps(codes, _mm512_set1_ps(m.scales[row * spr + s]));
            for (i, v) in group.iter_mut().enumerate() {
                // SAFETY: the 8 bytes of columns c0 + 16k .. + 16 (k = 4g + i) of the row
                // (caller).
                let q = unsafe { std::ptr::read_unaligned(p.add(8 * (4 * g + i)).cast::<i64>()) };
                let w = _mm512_permutexvar_ps(_mm512_srlv_epi64(_mm512_set1_epi64(q), sh), t);
                *v = _mm512_add_ps(*v, _mm512_mul_ps(av, w));
            }
        }
    }
    for (k, v) in acc.iter().enumerate() {
        // SAFETY: as the loads above.
        unsafe {
            _mm512_storeu_ps(
                y.as_mut_ptr().add(c0 + 16 * k),
                _mm512_permutexvar_ps(ci(&UNPERM), *v),
            )
        };
    }
}
