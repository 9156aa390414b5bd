//! Pointwise activations and softmax.

/// SiLU(z) = z · sigmoid(z), in f32.
#[inline]
pub fn silu(z: f32) -> f32 {
    z / (1.0 + (-z).exp())
}

/// `gate[i] = silu(gate[i]) * up[i]` — the SwiGLU combine of a GLM MLP.
pub fn swiglu_in_place(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: length mismatch");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// Numerically stable softmax in f32 (max-subtracted; the sum is accumulated sequentially).
/// Entries equal to `-inf` get probability 0; an all-`-inf` input becomes all zeros.
pub fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_handles_masks() {
        let mut x = [1.0, 2.0, f32::NEG_INFINITY, 3.0];
        softmax_in_place(&mut x);
        assert_eq!(x[2], 0.0);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let mut y = [f32::NEG_INFINITY; 2];
        softmax_in_place(&mut y);
        assert_eq!(y, [0.0, 0.0]);
    }

    #[test]
    fn silu_values() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        let mut g = [1.0, -1.0];
        swiglu_in_place(&mut g, &[2.0, 2.0]);
        assert!((g[0] - 1.462_117_2).abs() < 1e-6);
    }
}
