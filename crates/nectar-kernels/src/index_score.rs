//! The DSA lightning indexer's score of one (query row, key) pair (`specs/glm5-architecture.md`
//! §5.8), in one stated order: the model's indexer and the GPU kernel (`nectar-cuda`'s
//! `index.cu`, which reproduces it bit for bit) both use it, so their top-k selections agree.
use crate::dot::dot;

/// `Σ_h w[h] · max((q_h · key) · qk_scale, 0)` over the heads `q_h` (`q` is `heads × dim`,
/// `dim = key.len()`), `w` the head weights (already scaled). Order: each `q_h · key` is the
/// canonical [`dot`]; then `× qk_scale`, `max(·, 0)` (NaN → 0), `× w[h]`, added to a running sum
/// from +0 in increasing `h`, every step a separately rounded f32 operation.
#[inline]
pub fn index_score(q: &[f32], w: &[f32], key: &[f32], qk_scale: f32) -> f32 {
    let mut s = 0.0f32;
    for (hq, &wh) in q.chunks_exact(key.len()).zip(w) {
        s += wh * (dot(hq, key) * qk_scale).max(0.0);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_head_scores_are_clipped_and_weighted() {
        let key = [1.0, 2.0];
        // Head 0: 1·1 + 1·2 = 3; head 1: −(1 + 2) = −3 → 0 after the ReLU.
        let q = [1.0, 1.0, -1.0, -1.0];
        assert_eq!(index_score(&q, &[2.0, 5.0], &key, 0.5), 2.0 * 1.5);
        assert_eq!(index_score(&q, &[0.0, 5.0], &key, 0.5), 0.0);
    }
}
