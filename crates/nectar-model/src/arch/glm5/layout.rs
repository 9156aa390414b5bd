//! Where each row of a batch comes from: its sequence and absolute position.
use std::ops::Range;

/// One row of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowInfo {
    /// Index of the row's sequence in the batch.
    pub seq: usize,
    /// Absolute 0-based position.
    pub pos: usize,
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
        let mut l = Layout::default();
        for (seq, (&s, &c)) in starts.iter().zip(counts).enumerate() {
            let r0 = l.rows.len();
            l.rows.extend((0..c).map(|j| RowInfo { seq, pos: s + j }));
            l.seqs.push(r0..r0 + c);
        }
        l
    }
}
