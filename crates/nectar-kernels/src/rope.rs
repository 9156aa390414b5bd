//! Partial, interleaved rotary position embedding (GLM-5: `specs/glm5-architecture.md` §5.4).

/// Inverse frequencies for one rotary width, computed in f32 exactly as the reference does.
#[derive(Debug, Clone)]
pub struct RopeTable {
    inv_freq: Vec<f32>,
}

impl RopeTable {
    /// `inv_freq[i] = 1 / theta^(2i/dim)` in f32, for `i < dim/2`.
    pub fn new(dim: usize, theta: f32) -> Self {
        assert!(
            dim.is_multiple_of(2) && dim > 0,
            "rope dim must be even and positive"
        );
        let inv_freq = (0..dim / 2)
            .map(|i| 1.0f32 / theta.powf((2 * i) as f32 / dim as f32))
            .collect();
        RopeTable { inv_freq }
    }

    /// Rotary width.
    pub fn dim(&self) -> usize {
        self.inv_freq.len() * 2
    }

    /// Rotates `x` (length `dim`) in place for absolute position `pos`.
    ///
    /// Input pairs are interleaved `(x[2i], x[2i+1])`; the output is written de-interleaved
    /// (rotated pair i lands at `i` and `dim/2 + i`), as HF and Colibri store it. The angle is the
    /// f32 product `pos · inv_freq[i]`.
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        Self::rotate(x, &self.sin_cos(pos));
    }

    /// `(sin, cos)` of each pair's angle `pos · inv_freq[i]` (f32): what [`RopeTable::apply`]
    /// rotates by, computed once for all the heads of a row.
    pub fn sin_cos(&self, pos: usize) -> Vec<(f32, f32)> {
        self.inv_freq
            .iter()
            .map(|&f| (pos as f32 * f).sin_cos())
            .collect()
    }

    /// Rotates `x` (length `2 · sc.len()`) by the angles of [`RopeTable::sin_cos`]: the bits of
    /// [`RopeTable::apply`] at that position.
    pub fn rotate(x: &mut [f32], sc: &[(f32, f32)]) {
        let half = sc.len();
        assert_eq!(x.len(), 2 * half, "rope: slice length");
        let mut stack = [0.0f32; 256];
        let mut heap = Vec::new();
        let tmp = if 2 * half <= stack.len() {
            &mut stack[..2 * half]
        } else {
            heap.resize(2 * half, 0.0);
            &mut heap[..]
        };
        for (i, &(s, c)) in sc.iter().enumerate() {
            let (e, o) = (x[2 * i], x[2 * i + 1]);
            tmp[i] = e * c - o * s;
            tmp[half + i] = o * c + e * s;
        }
        x.copy_from_slice(tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_only_deinterleaves() {
        let t = RopeTable::new(4, 10000.0);
        let mut x = [1.0, 2.0, 3.0, 4.0];
        t.apply(&mut x, 0);
        assert_eq!(x, [1.0, 3.0, 2.0, 4.0]);
    }

    #[test]
    fn rotation_preserves_pair_norms_and_relative_angle() {
        let t = RopeTable::new(8, 10000.0);
        let q = [0.3, -1.2, 0.7, 0.1, -0.5, 0.9, 1.1, -0.4];
        let k = [0.2, 0.4, -0.6, 1.3, 0.8, -0.2, 0.05, 0.6];
        let score = |pq: usize, pk: usize| {
            let (mut a, mut b) = (q, k);
            t.apply(&mut a, pq);
            t.apply(&mut b, pk);
            a.iter().zip(&b).map(|(x, y)| x * y).sum::<f32>()
        };
        // Scores depend on the position difference only.
        assert!((score(5, 2) - score(13, 10)).abs() < 1e-5);
    }
}
