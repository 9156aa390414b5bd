//! RMSNorm and LayerNorm.
//!
//! Reduction precision (fixed, documented in the README): the sum of squares (and for LayerNorm
//! the mean and variance) is accumulated in **f64**, sequentially; the inverse root is rounded to
//! f32 once; the output is `w ⊙ (x · inv)` in f32 — HF's order (normalise, then weight). f64
//! reductions keep the MTP recurrence close to Colibri's (which also sums in double; see
//! `specs/glm5-architecture.md` §6.4) and cost one pass per norm.

/// `out = w ⊙ (x / sqrt(mean(x²) + eps))`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        x.len() == w.len() && x.len() == out.len(),
        "rms_norm: length mismatch"
    );
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let inv = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = g * (v * inv);
    }
}

/// Mean-centred LayerNorm with affine weight and bias (population variance).
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        x.len() == w.len() && x.len() == b.len() && x.len() == out.len(),
        "layer_norm: length mismatch"
    );
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = x
        .iter()
        .map(|&v| (v as f64 - mean) * (v as f64 - mean))
        .sum::<f64>()
        / n;
    let inv = (1.0 / (var + eps as f64).sqrt()) as f32;
    let mean = mean as f32;
    for (((o, &v), &g), &bb) in out.iter_mut().zip(x).zip(w).zip(b) {
        *o = g * ((v - mean) * inv) + bb;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_vector() {
        let mut out = [0.0; 4];
        rms_norm(
            &[1.0, -1.0, 1.0, -1.0],
            &[1.0, 2.0, 3.0, 4.0],
            0.0,
            &mut out,
        );
        assert_eq!(out, [1.0, -2.0, 3.0, -4.0]);
    }

    #[test]
    fn zero_input_stays_zero() {
        let mut out = [9.0; 3];
        rms_norm(&[0.0; 3], &[1.0; 3], 1e-5, &mut out);
        assert_eq!(out, [0.0; 3]);
    }

    #[test]
    fn layer_norm_centres_and_scales() {
        let mut out = [0.0; 4];
        layer_norm(&[1.0, 2.0, 3.0, 4.0], &[1.0; 4], &[0.5; 4], 0.0, &mut out);
        let m: f32 = out.iter().sum::<f32>() / 4.0;
        assert!((m - 0.5).abs() < 1e-6);
        let v: f32 = out.iter().map(|o| (o - 0.5) * (o - 0.5)).sum::<f32>() / 4.0;
        assert!((v - 1.0).abs() < 1e-5);
    }
}
