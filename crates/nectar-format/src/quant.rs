//! Quantised weight formats of Colibri-layout containers: detection by byte arithmetic, format
//! stamps (trust-verify-refuse), and the exact quantisation maths of the converter
//! (`specs/colibri-format.md` §4–5).
use nectar_kernels::WeightFormat;

/// Group sizes probed by detection, finest first (Colibri's order).
pub const GROUP_SIZES: [usize; 8] = [16, 32, 48, 64, 96, 128, 192, 256];

/// Smallest scale (the f32 nearest 1e-8), so an all-zero row or group never divides by zero.
pub const SCALE_FLOOR: f32 = 1e-8;

/// How a stored tensor encodes its `[O, I]` weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantFormat {
    /// A float tensor without scales (f32, bf16, f16).
    Float,
    /// fmt 1: int8 per row.
    Int8Row,
    /// fmt 2: int4 per row.
    Int4Row,
    /// fmt 3: int2 per row (detected, not runnable).
    Int2Row,
    /// fmt 4: int4 with one scale per `group` columns.
    Int4Group(usize),
    /// fmt 8: fp8 e4m3 with 128 × 128 block scales (`weight_scale_inv`, multiplied).
    Fp8Block,
}

impl QuantFormat {
    /// The kernel layout, for formats the kernels run directly.
    pub fn weight_format(self) -> Option<WeightFormat> {
        match self {
            QuantFormat::Int8Row => Some(WeightFormat::Int8Row),
            QuantFormat::Int4Row => Some(WeightFormat::Int4Row),
            QuantFormat::Int4Group(g) => Some(WeightFormat::Int4Group { group: g }),
            _ => None,
        }
    }

    /// The stamp name used in `__metadata__["colibri.fmt"]` and in reports.
    pub fn name(self) -> String {
        match self {
            QuantFormat::Float => "float".into(),
            QuantFormat::Int8Row => "int8".into(),
            QuantFormat::Int4Row => "int4".into(),
            QuantFormat::Int2Row => "int2".into(),
            QuantFormat::Int4Group(g) => format!("int4-g{g}"),
            QuantFormat::Fp8Block => "fp8-e4m3-b128".into(),
        }
    }

    /// Parses a stamp name (accepting the spellings Nectar writes and common aliases).
    pub fn parse(s: &str) -> Option<QuantFormat> {
        let s = s.to_ascii_lowercase();
        Some(match s.as_str() {
            "float" | "f32" | "bf16" | "f16" | "fmt0" => QuantFormat::Float,
            "int8" | "int8-row" | "i8" | "fmt1" => QuantFormat::Int8Row,
            "int4" | "int4-row" | "i4" | "fmt2" => QuantFormat::Int4Row,
            "int2" | "int2-row" | "fmt3" => QuantFormat::Int2Row,
            "fp8" | "fp8-e4m3-b128" | "fmt8" => QuantFormat::Fp8Block,
            _ => {
                let g = s
                    .strip_prefix("int4-g")
                    .or_else(|| s.strip_prefix("int4-gs"))?;
                QuantFormat::Int4Group(g.parse().ok().filter(|&g: &usize| g > 0)?)
            }
        })
    }
}

/// Resolves the format of a quantised tensor of logical shape `[o, i]` from its data byte count
/// and its scale count (`specs/colibri-format.md` §4). Returns a message on failure; callers
/// attach the file and tensor name.
pub fn detect(o: usize, i: usize, data_bytes: usize, scales: usize) -> Result<QuantFormat, String> {
    let blocks = o.div_ceil(128) * i.div_ceil(128);
    let half = o * i.div_ceil(2);
    if data_bytes == o * i {
        if scales == o {
            return Ok(QuantFormat::Int8Row); // also the fmt-8 count when equal: int8 by default
        }
        if scales == blocks {
            return Ok(QuantFormat::Fp8Block);
        }
    }
    if data_bytes == half {
        if scales == o {
            return Ok(QuantFormat::Int4Row);
        }
        for g in GROUP_SIZES {
            if g < i && o * i.div_ceil(g) == scales {
                return Ok(QuantFormat::Int4Group(g));
            }
        }
    }
    if data_bytes == o * i.div_ceil(4) && scales == o {
        return Ok(QuantFormat::Int2Row);
    }
    Err(format!(
        "no known format has {data_bytes} data bytes and {scales} scales for a [{o}, {i}] tensor"
    ))
}

/// Resolves a tensor's format with its stamp, if any (trust-verify-refuse): a stamp is used only
/// when its byte and scale counts match the tensor exactly (it may settle an ambiguity that byte
/// arithmetic alone cannot, e.g. int8 vs fp8 blocks, or g48 vs g64 on 96 columns); a stamp that
/// contradicts the bytes, or an unknown stamp, is an error.
pub fn resolve(
    o: usize,
    i: usize,
    data_bytes: usize,
    scales: usize,
    stamp: Option<&str>,
) -> Result<QuantFormat, String> {
    let detected = detect(o, i, data_bytes, scales);
    let Some(s) = stamp else { return detected };
    let f = QuantFormat::parse(s).ok_or_else(|| format!("unknown format stamp `{s}`"))?;
    let (want_bytes, want_scales) = match f {
        QuantFormat::Float => return Err(format!("format stamp `{s}` on a tensor with scales")),
        QuantFormat::Int8Row => (o * i, o),
        QuantFormat::Int4Row => (o * i.div_ceil(2), o),
        QuantFormat::Int2Row => (o * i.div_ceil(4), o),
        QuantFormat::Int4Group(g) => (o * i.div_ceil(2), o * i.div_ceil(g)),
        QuantFormat::Fp8Block => (o * i, o.div_ceil(128) * i.div_ceil(128)),
    };
    if (want_bytes, want_scales) != (data_bytes, scales) {
        let bytes_say = detected.map(|d| d.name()).unwrap_or_else(|e| e);
        return Err(format!(
            "format stamp `{}` contradicts the bytes, which say `{bytes_say}`",
            f.name()
        ));
    }
    Ok(f)
}

/// Round half to even on an f32 quotient (numpy `rint`).
#[inline]
fn rint(x: f32) -> f32 {
    x.round_ties_even()
}

/// int4 scale of a row or group: `max(amax / 7, 1e-8)` (an IEEE f32 division).
pub fn int4_scale(w: &[f32]) -> f32 {
    (amax(w) / 7.0).max(SCALE_FLOOR)
}

/// int8 scale of a row: `max(amax / 127, 1e-8)`.
pub fn int8_scale(w: &[f32]) -> f32 {
    (amax(w) / 127.0).max(SCALE_FLOOR)
}

fn amax(w: &[f32]) -> f32 {
    w.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// int4 code of `w` with scale `s`: `clip(rint(w / s), -8, 7)`.
#[inline]
pub fn int4_code(w: f32, s: f32) -> i8 {
    rint(w / s).clamp(-8.0, 7.0) as i8
}

/// int8 code: `clip(rint(w / s), -127, 127)`.
#[inline]
pub fn int8_code(w: f32, s: f32) -> i8 {
    rint(w / s).clamp(-127.0, 127.0) as i8
}

/// Quantises one row to int4 with groups of `group` columns (`group >= row.len()` or 0 means
/// per-row). Appends `ceil(len/2)` packed bytes (even column in the low nibble, codes + 8; an
/// odd row's last high nibble holds code 0) and one scale per group.
pub fn quantize_int4_row(row: &[f32], group: usize, bytes: &mut Vec<u8>, scales: &mut Vec<f32>) {
    let g = if group == 0 || group >= row.len() {
        row.len().max(1)
    } else {
        group
    };
    let mut codes = Vec::with_capacity(row.len() + 1);
    for chunk in row.chunks(g) {
        let s = int4_scale(chunk);
        scales.push(s);
        codes.extend(chunk.iter().map(|&w| int4_code(w, s)));
    }
    if codes.len() % 2 == 1 {
        codes.push(0);
    }
    bytes.extend(
        codes
            .chunks_exact(2)
            .map(|p| ((p[0] + 8) as u8) | (((p[1] + 8) as u8) << 4)),
    );
}

/// Quantises one row to int8 per-row: appends `len` bytes (two's complement) and one scale.
pub fn quantize_int8_row(row: &[f32], bytes: &mut Vec<u8>, scales: &mut Vec<f32>) {
    let s = int8_scale(row);
    scales.push(s);
    bytes.extend(row.iter().map(|&w| int8_code(w, s) as u8));
}

/// Decodes an fp8 e4m3 (FN) byte: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits, no
/// infinities, S.1111.111 is NaN, max finite 448.
pub fn fp8_e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = ((b >> 3) & 0x0f) as i32;
    let m = (b & 0x07) as f32;
    if e == 0x0f && (b & 0x07) == 0x07 {
        return f32::NAN;
    }
    if e == 0 {
        sign * m / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_by_byte_arithmetic() {
        // GLM-5.2 routed expert gate [2048, 6144].
        assert_eq!(
            detect(2048, 6144, 2048 * 3072, 2048),
            Ok(QuantFormat::Int4Row)
        );
        assert_eq!(
            detect(2048, 6144, 2048 * 3072, 2048 * 96),
            Ok(QuantFormat::Int4Group(64))
        );
        assert_eq!(
            detect(6144, 2048, 6144 * 1024, 6144 * 32),
            Ok(QuantFormat::Int4Group(64))
        );
        assert_eq!(
            detect(2048, 6144, 2048 * 6144, 2048),
            Ok(QuantFormat::Int8Row)
        );
        assert_eq!(
            detect(2048, 6144, 2048 * 6144, 16 * 48),
            Ok(QuantFormat::Fp8Block)
        );
        // o_proj [6144, 16384]: block count 48 × 128 = 6144 = O → int8 unless stamped fp8.
        assert_eq!(
            detect(6144, 16384, 6144 * 16384, 6144),
            Ok(QuantFormat::Int8Row)
        );
        let o_proj = (6144, 16384, 6144 * 16384, 6144);
        let stamped = resolve(
            o_proj.0,
            o_proj.1,
            o_proj.2,
            o_proj.3,
            Some("fp8-e4m3-b128"),
        );
        assert_eq!(stamped, Ok(QuantFormat::Fp8Block));
        assert_eq!(detect(4, 10, 4 * 3, 4), Ok(QuantFormat::Int2Row));
        // Partial last group: I = 40, g = 32 → 2 groups per row.
        assert_eq!(detect(3, 40, 3 * 20, 6), Ok(QuantFormat::Int4Group(32)));
        assert!(detect(3, 40, 3 * 20, 7).unwrap_err().contains("[3, 40]"));
        assert!(resolve(4, 8, 16, 4, Some("int8"))
            .unwrap_err()
            .contains("contradicts"));
        assert!(resolve(4, 8, 16, 4, Some("int5"))
            .unwrap_err()
            .contains("unknown"));
        // 96 columns: g48 and g64 both give 2 groups; bytes say g48, a g64 stamp settles it.
        assert_eq!(
            resolve(64, 96, 64 * 48, 128, None),
            Ok(QuantFormat::Int4Group(48))
        );
        let g64 = resolve(64, 96, 64 * 48, 128, Some("int4-g64"));
        assert_eq!(g64, Ok(QuantFormat::Int4Group(64)));
    }

    #[test]
    fn int4_packing_rounding_and_floor() {
        let mut b = Vec::new();
        let mut s = Vec::new();
        // amax 7 → s = 1; 2.5 rounds to 2 (ties to even), -3.5 to -4, odd length pads code 0.
        quantize_int4_row(&[7.0, 2.5, -3.5, 0.0, -7.0], 0, &mut b, &mut s);
        assert_eq!(s, [1.0]);
        assert_eq!(b, [15 | (10 << 4), 4 | (8 << 4), 1 | (8 << 4)]);
        let (mut b, mut s) = (Vec::new(), Vec::new());
        quantize_int4_row(&[0.0; 4], 2, &mut b, &mut s);
        assert_eq!(s, [SCALE_FLOOR, SCALE_FLOOR]);
        assert_eq!(b, [0x88, 0x88]);
    }

    #[test]
    fn fp8_values() {
        assert_eq!(fp8_e4m3_to_f32(0x00), 0.0);
        assert_eq!(fp8_e4m3_to_f32(0x38), 1.0);
        assert_eq!(fp8_e4m3_to_f32(0x7e), 448.0);
        assert_eq!(fp8_e4m3_to_f32(0xb8), -1.0);
        assert_eq!(fp8_e4m3_to_f32(0x01), 2f32.powi(-9));
        assert!(fp8_e4m3_to_f32(0x7f).is_nan());
    }
}
