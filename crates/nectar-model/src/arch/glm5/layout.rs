//! Where each row of a batch comes from: its sequence, its cache slot and its position.
use std::ops::Range;

/// One row of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowInfo {
    /// Index of the row's sequence in the batch.
    pub seq: usize,
    /// The row's 0-based index in its sequence's cache: the causal bound of its attention
    /// (it sees cache rows `0..=pos`). The absolute position on main layers.
    pub pos: usize,
    /// The absolute position its RoPE rotates by: `pos` except on the MTP layer after a gap
    /// in its cache ([`crate::LayerCache::skip_to`]), where cache index and position part.
    pub rope: usize,
}

/// The rows of a batch; rows of one sequence are contiguous and in increasing position.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// Every row.
    pub rows: Vec<RowInfo>,
    /// Row range of each sequence.
    pub seqs: Vec<Range<usize>>,
}

impl Layout {
    /// A layout for sequences that start at `starts[i]` and add `counts[i]` rows.
    pub fn new(starts: &[usize], counts: &[usize]) -> Layout {
        Layout::at(starts, starts, counts)
    }

    /// [`Layout::new`] for caches whose next row sits at absolute position `positions[i]`
    /// (≥ `starts[i]`: the MTP layer's cache may skip positions).
    pub fn at(starts: &[usize], positions: &[usize], counts: &[usize]) -> Layout {
        let mut l = Layout::default();
        for (seq, ((&s, &p), &c)) in starts.iter().zip(positions).zip(counts).enumerate() {
            let r0 = l.rows.len();
            l.rows.extend((0..c).map(|j| RowInfo {
                seq,
                pos: s + j,
                rope: p + j,
            }));
            l.seqs.push(r0..r0 + c);
        }
        l
    }
}
