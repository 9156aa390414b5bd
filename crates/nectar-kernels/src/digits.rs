//! **Opt-in** (`set_int4_order("digits")`, the CLI's `--int4-order digits`): int4 products as
//! exact integer dot products over activations split into three 8-bit digits.
//!
//! Why: the default path dequantises every weight to f32 (a shift, a 16-entry permute and an
//! FMA per 16 weights on AVX-512), which on cores that run 512-bit operations in two halves
//! computes int4-g64 slower than one core reads DRAM (`benchmarks/RESULTS.md`: 17 GB/s hot in
//! L2 against a 27 GB/s read). `vpdpbusd` multiplies 64 codes by 64 digits per instruction:
//! about two thirds of the operations per weight, so the stream, not the arithmetic, bounds M = 1.
//! On AVX2 the exact order takes six operations per 8 weights; `vpmaddubsw` and `vpmaddwd`
//! take the digits' products at about 22 operations per 64.
//!
//! It is not the default because its bits differ from the canonical order's (`dot.rs`) — not
//! its accuracy, which is that of f32 arithmetic: an activation block's values are represented
//! to within 2⁻²² of the block's largest magnitude (f32 itself rounds each value to 2⁻²⁴ of
//! its own; a block whose values are all below 2⁻¹⁰⁵ is represented to within 2⁻¹²⁷), and
//! every code × digit product and its sum over a lane is exact. The order is the
//! GPU's integer GEMV's (`nectar-cuda`'s `gemv_q.cu`) with CPU-sized digits.
//!
//! The order (the scalar definition [`row_scalar`] and the VNNI kernel agree bit for bit, and
//! a row's result depends only on its weights and its own activation row):
//! - Activations, per row and 64-column block: `E` with `max|x| < 2^E` (at least −104), and
//!   `v = round_half_even(x · 2^(22−E))` (`|v| ≤ 2^22`, exact scaling by a power of two),
//!   written as balanced base-256 digits `v = d₂·2¹⁶ + d₁·2⁸ + d₀`, `dₚ ∈ [−128, 127]`. A block
//!   holding a NaN or an infinity gets a NaN scale (its rows' outputs are NaN, as the exact
//!   sums would be NaN or infinite).
//! - Columns in 128-column chunks (zero-padded); lane `l` (0..16) covers columns `8l..8l+8` of
//!   its chunk. Per lane, exactly in i32: `P = Σ n·v − 8·Σ v` over the lane's columns, `n` the
//!   stored code (`code + 8`, 0..15).
//! - `acc_l = fma(P as f32, s_w · 2^(E−22), acc_l)`, chunks in increasing order, where `s_w` is
//!   the weight scale of the lane's columns (groups are multiples of 64, so a lane never
//!   straddles two) and the product is one f32 multiply; then the 16 lanes are folded as in
//!   `dot.rs`.
//!
//! Formats: int4 per row and int4 in groups of a multiple of 64 columns ([`supports`]); other
//! formats keep the canonical order whatever the setting. It runs on AVX-512 VNNI
//! (`x86/digits.rs`) or AVX2, with AVX-VNNI where the CPU has it (`x86/digits_avx2.rs`), the
//! same bits; elsewhere (the scalar or NEON path) [`set_int4_order`] refuses it.
use crate::dot::{fold16, LANES};
use crate::driver::{par_rows, SharedOut};
use crate::error::{Error, Result};
use crate::format::{MatRef, WeightFormat};
use crate::int8_act::vnni_available;
use std::sync::atomic::{AtomicBool, Ordering};

/// Columns per chunk.
pub(crate) const CHUNK: usize = 128;
/// Columns per activation block (one exponent).
const BLOCK: usize = 64;
/// Bytes of one (chunk, activation row) record of [`DPack::packed`]: the six digit planes
/// (`d₂`, `d₁`, `d₀`, each for the chunk's even columns then its odd ones, 64 bytes each), the
/// 16 lanes' `8·Σ v` (i32), the 16 lanes' `2^(E−22)` (f32).
pub(crate) const RECORD: usize = 6 * 64 + 64 + 64;
/// Offset of the lanes' `8·Σ v` in a record.
pub(crate) const OFF: usize = 6 * 64;
/// Offset of the lanes' `2^(E−22)` in a record.
pub(crate) const POW: usize = OFF + 64;

static DIGITS: AtomicBool = AtomicBool::new(false);

/// Which kernel computes this order: the scalar definition, or a SIMD path with its bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum Kernel {
    Scalar,
    /// AVX2 (`x86/digits_avx2.rs`).
    Avx2,
    /// AVX2 with AVX-VNNI's 256-bit `vpdpbusd` (`x86/digits_avx2.rs`).
    AvxVnni,
    /// AVX-512 VNNI (`x86/digits.rs`).
    Vnni,
}

impl Kernel {
    /// The fastest kernel on the kernel path in use (`--isa`): VNNI where AVX-512 with VNNI is
    /// in use, else on any x86 path but the scalar one AVX2, with AVX-VNNI where the CPU has
    /// it; else none.
    pub(crate) fn detect() -> Option<Kernel> {
        if vnni_available() {
            return Some(Kernel::Vnni);
        }
        #[cfg(target_arch = "x86_64")]
        if crate::dot::isa_detect() != crate::dot::Isa::Scalar {
            return Some(match std::arch::is_x86_feature_detected!("avxvnni") {
                true => Kernel::AvxVnni,
                false => Kernel::Avx2,
            });
        }
        None
    }
}

/// Selects how int4 products are computed, process-wide: `"exact"` (the default: dequantise
/// each weight to f32, the canonical order) or `"digits"` (this module's order; needs AVX2 or
/// AVX-512 VNNI on the kernel path in use). Returns the name set. Call it before the first
/// product: switching while products run changes which order later ones use.
pub fn set_int4_order(name: &str) -> Result<&'static str> {
    match name {
        "exact" => {
            DIGITS.store(false, Ordering::Relaxed);
            Ok("exact")
        }
        "digits" if Kernel::detect().is_some() => {
            DIGITS.store(true, Ordering::Relaxed);
            Ok("digits")
        }
        "digits" => Err(Error::Isa(
            "int4 order `digits` needs AVX2 or AVX-512 VNNI, which this CPU (or the forced \
             --isa) lacks"
                .into(),
        )),
        other => Err(Error::Isa(format!(
            "unknown int4 order `{other}` (want exact or digits)"
        ))),
    }
}

/// Whether [`set_int4_order`] accepts `"digits"` here (AVX2 or AVX-512 VNNI on the kernel path
/// in use).
pub fn int4_digits_available() -> bool {
    Kernel::detect().is_some()
}

/// The int4 order in use: `"exact"` or `"digits"`.
pub fn int4_order() -> &'static str {
    match DIGITS.load(Ordering::Relaxed) {
        true => "digits",
        false => "exact",
    }
}

/// Whether products of `format` weights take the `digits` order under the current setting.
pub fn int4_order_covers(format: WeightFormat) -> bool {
    DIGITS.load(Ordering::Relaxed) && supports(format)
}

/// Formats this order covers.
pub(crate) fn supports(format: WeightFormat) -> bool {
    match format {
        WeightFormat::Int4Row => true,
        WeightFormat::Int4Group { group } => group > 0 && group.is_multiple_of(BLOCK),
        _ => false,
    }
}

/// Activation rows in digits, one [`RECORD`] per (chunk k, activation row i) at
/// `(k·m + i)·RECORD`, so a block of activation rows is contiguous per chunk.
pub(crate) struct DPack {
    /// Activation rows.
    pub m: usize,
    /// Chunks per row.
    pub chunks: usize,
    /// The records.
    pub packed: Vec<u8>,
    /// Per chunk, the weight scale index of its lanes 0–7 and 8–15 ([`chunk_groups`]), so the
    /// kernel divides nothing per chunk.
    pub groups: Vec<[u32; 2]>,
}

impl DPack {
    /// Packs `m` activation rows for products with `w` on `kernel` (the bytes are the same
    /// whichever packs them: [`pack_chunk`] defines them).
    pub(crate) fn new(x: &[f32], m: usize, w: &MatRef<'_>, kernel: Kernel) -> DPack {
        let cols = w.cols;
        let chunks = cols.div_ceil(CHUNK);
        let mut packed = vec![0u8; chunks * m * RECORD];
        for i in 0..m {
            let xr = &x[i * cols..(i + 1) * cols];
            for k in 0..chunks {
                let rec = &mut packed[(k * m + i) * RECORD..(k * m + i + 1) * RECORD];
                let xc = &xr[k * CHUNK..((k + 1) * CHUNK).min(cols)];
                // SAFETY (both): the caller checked the CPU runs `kernel` (VNNI implies
                // AVX-512F/BW); `rec` holds RECORD bytes.
                #[cfg(target_arch = "x86_64")]
                match kernel {
                    Kernel::Vnni if unsafe { crate::x86::digits::pack_chunk(xc, rec) } => continue,
                    Kernel::Vnni | Kernel::Avx2 | Kernel::AvxVnni => {
                        unsafe { crate::x86::digits_avx2::pack_chunk(xc, rec) };
                        continue;
                    }
                    Kernel::Scalar => {}
                }
                let _ = kernel;
                pack_chunk(xc, rec);
            }
        }
        let groups = (0..chunks)
            .map(|k| chunk_groups(w.format, cols, k).map(|g| g as u32))
            .collect();
        DPack {
            m,
            chunks,
            packed,
            groups,
        }
    }

    /// The integer value `v` of activation row `i`, column `c` (the scalar definition's input).
    fn value(&self, i: usize, c: usize) -> i32 {
        let (k, j) = (c / CHUNK, c % CHUNK);
        let rec = &self.packed[(k * self.m + i) * RECORD..];
        let at = (j % 2) * 64 + j / 2;
        ((rec[at] as i8 as i32) << 16)
            + ((rec[128 + at] as i8 as i32) << 8)
            + rec[256 + at] as i8 as i32
    }

    fn lane(&self, i: usize, k: usize, l: usize, base: usize) -> [u8; 4] {
        let at = (k * self.m + i) * RECORD + base + 4 * l;
        self.packed[at..at + 4].try_into().expect("4 bytes")
    }
}

/// The definition of one record: the activations `xc` of one chunk (at most [`CHUNK`]; the
/// rest are zero columns) into `rec` ([`RECORD`] bytes, zeroed).
#[inline(always)]
pub(crate) fn pack_chunk(xc: &[f32], rec: &mut [u8]) {
    let mut v = [0i32; CHUNK];
    let mut pw = [1.0f32; 2];
    for (b, p) in pw.iter_mut().enumerate() {
        let c0 = b * BLOCK;
        if c0 >= xc.len() {
            break;
        }
        let xb = &xc[c0..(c0 + BLOCK).min(xc.len())];
        *p = block_digits(xb, &mut v[c0..c0 + xb.len()]);
    }
    for (j, &val) in v.iter().enumerate() {
        // Even columns fill the first half of each digit plane, odd ones the second.
        let at = (j % 2) * 64 + j / 2;
        let [d2, d1, d0] = split(val);
        rec[at] = d2 as u8;
        rec[128 + at] = d1 as u8;
        rec[256 + at] = d0 as u8;
    }
    for l in 0..LANES {
        let s: i32 = v[8 * l..8 * l + 8].iter().sum();
        rec[OFF + 4 * l..OFF + 4 * l + 4].copy_from_slice(&(8 * s).to_le_bytes());
        rec[POW + 4 * l..POW + 4 * l + 4].copy_from_slice(&pw[l / 8].to_le_bytes());
    }
}

/// `v` (|v| ≤ 2²²) as balanced base-256 digits `[d₂, d₁, d₀]`.
#[inline(always)]
fn split(v: i32) -> [i8; 3] {
    let d0 = v as i8;
    let r1 = (v - d0 as i32) >> 8;
    let d1 = r1 as i8;
    [((r1 - d1 as i32) >> 8) as i8, d1, d0]
}

/// A block's `E` (the least with `max|x| < 2^E`, at least −104) from its largest magnitude:
/// for a normal `mx` with biased exponent e, `mx < 2^(e − 126)`; smaller blocks (denormal or
/// zero) take −104, which keeps `2^(22−E)` a normal f32.
pub(crate) fn block_exponent(mx: f32) -> i32 {
    ((mx.to_bits() >> 23) as i32 - 126).max(-104)
}

/// `2^p` for `p` in −126..=127.
pub(crate) fn pow2(p: i32) -> f32 {
    f32::from_bits(((p + 127) as u32) << 23)
}

/// Writes one block's integer values into `v` and returns its `2^(E−22)`.
#[inline(always)]
fn block_digits(xb: &[f32], v: &mut [i32]) -> f32 {
    if xb.iter().any(|a| !a.is_finite()) {
        return f32::NAN;
    }
    let e = block_exponent(xb.iter().fold(0.0f32, |a, b| a.max(b.abs())));
    let up = pow2(22 - e);
    for (d, &a) in v.iter_mut().zip(xb) {
        *d = (a * up).round_ties_even() as i32;
    }
    pow2(e - 22)
}

/// The weight scale index of chunk `k`'s lanes 0–7 and 8–15.
pub(crate) fn chunk_groups(format: WeightFormat, cols: usize, k: usize) -> [usize; 2] {
    match format {
        WeightFormat::Int4Group { group } => {
            let last = format.row_scales(cols).max(1) - 1;
            let c0 = k * CHUNK;
            [(c0 / group).min(last), ((c0 + BLOCK) / group).min(last)]
        }
        _ => [0, 0],
    }
}

/// The stored code `n` (0..15) of column `c` of row `r`; 0 past the row's end.
fn stored(w: &MatRef<'_>, r: usize, c: usize) -> i32 {
    if c >= w.cols {
        return 0;
    }
    let b = w.row_data(r)[c / 2];
    (if c.is_multiple_of(2) { b & 15 } else { b >> 4 }) as i32
}

/// The scalar definition of the order in the module docs.
pub(crate) fn row_scalar(w: &MatRef<'_>, r: usize, dp: &DPack, i: usize) -> f32 {
    let ng = w.format.row_scales(w.cols);
    let mut acc = [0.0f32; LANES];
    for k in 0..dp.chunks {
        let g = dp.groups[k].map(|g| g as usize);
        for (l, a) in acc.iter_mut().enumerate() {
            let c0 = k * CHUNK + 8 * l;
            let mut p = 0i32;
            for c in c0..c0 + 8 {
                let v = if c < w.cols { dp.value(i, c) } else { 0 };
                p = p.wrapping_add(stored(w, r, c).wrapping_mul(v));
            }
            p = p.wrapping_sub(i32::from_le_bytes(dp.lane(i, k, l, OFF)));
            let pw = f32::from_le_bytes(dp.lane(i, k, l, POW));
            let s = w.scales[r * ng + g[l / 8]] * pw;
            *a = (p as f32).mul_add(s, *a);
        }
    }
    fold16(acc)
}

/// `y[i] = W · x[i]` in this order for `m` activation rows, over output rows `rows` (y holds
/// `m × rows.len()`), on `kernel`, which the caller checked this CPU runs.
pub(crate) fn matmul_digits_with(
    kernel: Kernel,
    w: &MatRef<'_>,
    rows: std::ops::Range<usize>,
    x: &[f32],
    m: usize,
    y: &mut [f32],
) {
    debug_assert!(supports(w.format) && x.len() == m * w.cols);
    let n = rows.len();
    debug_assert!(y.len() == m * n && rows.end <= w.rows);
    if n == 0 || m == 0 {
        return;
    }
    let dp = DPack::new(x, m, w, kernel);
    let out = SharedOut(y.as_mut_ptr());
    let base = rows.start;
    par_rows(rows, w.format.row_bytes(w.cols), m, |t| {
        #[cfg(target_arch = "x86_64")]
        {
            type Rows = unsafe fn(&MatRef<'_>, std::ops::Range<usize>, &DPack, *mut f32, usize);
            let simd: Option<Rows> = match kernel {
                Kernel::Vnni => Some(crate::x86::digits::rows),
                Kernel::Avx2 => Some(crate::x86::digits_avx2::rows),
                Kernel::AvxVnni => Some(crate::x86::digits_avx2::rows_vnni),
                Kernel::Scalar => None,
            };
            if let Some(rows) = simd {
                // SAFETY: the caller checked the CPU runs `kernel` (`Kernel::detect`); `w` is
                // validated and int4 of a supported layout; rows t exist; the task owns the
                // output elements (i, r − base) for r in t, inside y's m × n.
                unsafe { rows(w, t.clone(), &dp, out.get().add(t.start - base), n) };
                return;
            }
        }
        for r in t {
            for i in 0..m {
                // SAFETY: this task owns output elements (i, r − base) for r in its rows.
                unsafe { *out.get().add(i * n + r - base) = row_scalar(w, r, &dp, i) };
            }
        }
    });
}

/// [`matmul_digits_with`] on the fastest kernel here (the scalar definition where none).
pub(crate) fn matmul_digits(
    w: &MatRef<'_>,
    rows: std::ops::Range<usize>,
    x: &[f32],
    m: usize,
    y: &mut [f32],
) {
    let kernel = Kernel::detect().unwrap_or(Kernel::Scalar);
    matmul_digits_with(kernel, w, rows, x, m, y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::matmul_with;
    use crate::matmul::tests::{activations, random_matrix};
    use proptest::prelude::*;

    /// Every SIMD kernel this CPU runs (AVX2 on an AVX-512 machine too).
    fn simd_kernels() -> Vec<Kernel> {
        let mut k = Vec::new();
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            k.push(Kernel::Avx2);
            if std::arch::is_x86_feature_detected!("avxvnni") {
                k.push(Kernel::AvxVnni);
            }
        }
        if vnni_available() {
            k.push(Kernel::Vnni);
        }
        k
    }

    fn formats() -> [WeightFormat; 4] {
        [
            WeightFormat::Int4Row,
            WeightFormat::Int4Group { group: 64 },
            WeightFormat::Int4Group { group: 128 },
            WeightFormat::Int4Group { group: 192 },
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn simd_kernels_match_the_scalar_definition_bitwise(
            rows in 1usize..30, cols in 1usize..700, m in 1usize..11, f in 0usize..4,
            seed in any::<u64>(), r0 in 0usize..8
        ) {
            let format = formats()[f];
            let (data, scales) = random_matrix(format, rows, cols, seed);
            let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
            let x = activations(m, cols, seed);
            let r = r0.min(rows - 1)..rows;
            let mut scalar = vec![0.0; m * r.len()];
            matmul_digits_with(Kernel::Scalar, &w, r.clone(), &x, m, &mut scalar);
            for kernel in simd_kernels() {
                let mut fast = vec![0.0; m * r.len()];
                matmul_digits_with(kernel, &w, r.clone(), &x, m, &mut fast);
                for (a, b) in fast.iter().zip(&scalar) {
                    prop_assert_eq!(a.to_bits(), b.to_bits(), "{:?}", kernel);
                }
            }
        }

        #[test]
        fn the_simd_pack_writes_the_definitions_bytes(
            bits in proptest::collection::vec(any::<u32>(), CHUNK), scale in -140i32..120,
            ties in any::<bool>()
        ) {
            // Any finite values (wide exponents), or exact ties of the rounding grid.
            let xc: Vec<f32> = bits
                .iter()
                .enumerate()
                .map(|(j, &b)| match ties {
                    false => f32::from_bits(b & 0x807f_ffff | (((b >> 23) % 254) << 23)),
                    true if j % 64 == 0 => 1.0,
                    true => (b % 4096) as f32 * 2f32.powi(-22) - 2f32.powi(-11),
                } * pow2(scale.clamp(-126, 127)))
                .filter(|v| v.is_finite())
                .collect();
            prop_assume!(xc.len() == CHUNK);
            let mut want = vec![0u8; RECORD];
            pack_chunk(&xc, &mut want);
            #[cfg(target_arch = "x86_64")]
            for kernel in simd_kernels() {
                let mut got = vec![0u8; RECORD];
                // SAFETY: the kernel's instructions were detected; RECORD bytes.
                match kernel {
                    Kernel::Vnni => {
                        let packed = unsafe { crate::x86::digits::pack_chunk(&xc, &mut got) };
                        prop_assert!(packed);
                    }
                    _ => unsafe { crate::x86::digits_avx2::pack_chunk(&xc, &mut got) },
                }
                prop_assert_eq!(&got, &want, "{:?}", kernel);
            }
        }

        #[test]
        fn a_row_does_not_depend_on_the_others(
            rows in 1usize..20, cols in 1usize..400, m in 2usize..9, seed in any::<u64>()
        ) {
            let format = WeightFormat::Int4Group { group: 64 };
            let (data, scales) = random_matrix(format, rows, cols, seed);
            let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
            let x = activations(m, cols, seed);
            let mut all = vec![0.0; m * rows];
            matmul_digits(&w, 0..rows, &x, m, &mut all);
            for i in 0..m {
                let mut one = vec![0.0; rows];
                matmul_digits(&w, 0..rows, &x[i * cols..(i + 1) * cols], 1, &mut one);
                for (a, b) in one.iter().zip(&all[i * rows..(i + 1) * rows]) {
                    prop_assert_eq!(a.to_bits(), b.to_bits());
                }
            }
        }
    }

    /// The values the digits stand for: within 2⁻²² of each block's largest magnitude (2⁻¹²⁷
    /// for blocks of tiny values), near f32's limits too.
    #[test]
    fn digits_represent_the_activations() {
        let cols = 300;
        let mut x = activations(1, cols, 3);
        x[5] = 1e-30; // a tiny value beside normal ones
        x[70] = -3.0e38; // near f32's limit
        x[256..300].fill(1e-41); // a block of denormals: flushed, within 2^-127
        let (data, scales) = random_matrix(WeightFormat::Int4Row, 1, cols, 4);
        let w = MatRef::new(WeightFormat::Int4Row, 1, cols, &data, &scales).unwrap();
        let dp = DPack::new(&x, 1, &w, Kernel::Scalar);
        for kernel in simd_kernels() {
            assert_eq!(
                dp.packed,
                DPack::new(&x, 1, &w, kernel).packed,
                "{kernel:?}"
            );
        }
        for b in 0..cols.div_ceil(BLOCK) {
            let xb = &x[b * BLOCK..((b + 1) * BLOCK).min(cols)];
            let mx = xb.iter().fold(0.0f32, |a, v| a.max(v.abs())) as f64;
            let pw = f32::from_le_bytes(dp.lane(0, b / 2, (b % 2) * 8, POW)) as f64;
            for (j, &a) in xb.iter().enumerate() {
                let got = dp.value(0, b * BLOCK + j) as f64 * pw;
                let bound = (mx * 2f64.powi(-22)).max(2f64.powi(-127));
                assert!((got - a as f64).abs() <= bound, "{b} {j}: {a} vs {got}");
            }
        }
        let mut y = [0.0f32; 1];
        x[9] = f32::NAN;
        matmul_digits(&w, 0..1, &x, 1, &mut y);
        assert!(y[0].is_nan());
    }

    /// The order's error against the exact path is that of f32 arithmetic.
    #[test]
    fn close_to_the_exact_path() {
        let (rows, cols, m) = (64, 2048, 3);
        for format in formats() {
            let (data, scales) = random_matrix(format, rows, cols, 5);
            let w = MatRef::new(format, rows, cols, &data, &scales).unwrap();
            let x = activations(m, cols, 6);
            let mut exact = vec![0.0; m * rows];
            matmul_with(crate::dot::isa_detect(), &w, &x, m, &mut exact).unwrap();
            let mut d = vec![0.0; m * rows];
            matmul_digits(&w, 0..rows, &x, m, &mut d);
            for (i, (a, b)) in exact.iter().zip(&d).enumerate() {
                // Σ|w·x| bounds both paths' rounding; a few ulps of it is f32's accuracy.
                let r = i % rows;
                let mag: f32 = (0..cols)
                    .map(|c| {
                        (crate::int8_act::weight_scale(&w, r, c) * 8.0 * x[(i / rows) * cols + c])
                            .abs()
                    })
                    .sum();
                assert!(
                    (a - b).abs() <= mag * 1e-6,
                    "{}: {a} vs {b} (Σ {mag})",
                    format.name()
                );
            }
        }
    }

    #[test]
    fn the_setting_names_itself_and_refuses_unknown_orders() {
        assert!(set_int4_order("fast").is_err());
        assert_eq!(int4_order(), "exact");
        // Under the default order nothing takes this one, int4 included.
        assert!(!int4_order_covers(WeightFormat::Int8Row));
        assert!(!int4_order_covers(WeightFormat::Int4Group { group: 64 }));
        assert!(supports(WeightFormat::Int4Group { group: 128 }));
        assert!(!supports(WeightFormat::Int4Group { group: 32 }));
    }
}
