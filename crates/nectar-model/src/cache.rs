//! Compressed per-sequence caches (`specs/glm5-architecture.md` §5.7): per layer and token only
//! the normalised MLA latent, the rotated rope key and (on full-indexer layers) the indexer key.
//! Never full K/V. Kept in f32 so that decode reproduces the reference exactly.

use crate::error::{Error, Result};

/// One layer's cache for one sequence.
#[derive(Debug, Clone, Default)]
pub struct LayerCache {
    /// (len, kv_lora_rank) post-`kv_a_layernorm` latents.
    pub latent: Vec<f32>,
    /// (len, qk_rope_head_dim) rotated rope keys (de-interleaved layout, as HF stores them).
    pub k_pe: Vec<f32>,
    /// (len, index_head_dim) indexer keys; empty on layers without an indexer.
    pub index_k: Vec<f32>,
    len: usize,
    /// Where the cache skips positions (only the MTP layer's does: its drafter drops rows it
    /// would absorb only to draft later, `nectar-engine`'s `spec/mtp.rs`): `(index, position)`
    /// of every row that follows a gap, in increasing order. Rows between two entries sit at
    /// consecutive positions; without entries, row i sits at position i.
    gaps: Vec<(usize, usize)>,
    /// Its copy in VRAM for the GPU's decode attention (`--features cuda`), made and synced by
    /// the attention on first use; never cloned (a clone syncs its own).
    #[cfg(feature = "cuda")]
    device: DeviceMirror,
}

/// A [`LayerCache`]'s VRAM mirror (`nectar_cuda::KvMirror`), if it has one. Cloning a cache
/// leaves the clone without one: the copy would share nothing but its VRAM bill.
#[cfg(feature = "cuda")]
#[derive(Debug, Default)]
struct DeviceMirror(Option<nectar_cuda::KvMirror>);

#[cfg(feature = "cuda")]
impl Clone for DeviceMirror {
    fn clone(&self) -> Self {
        DeviceMirror(None)
    }
}

impl LayerCache {
    /// Cached tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends one token's latent, rope key and (optional) indexer key.
    pub fn push(&mut self, latent: &[f32], k_pe: &[f32], index_k: Option<&[f32]>) {
        self.latent.extend_from_slice(latent);
        self.k_pe.extend_from_slice(k_pe);
        if let Some(k) = index_k {
            self.index_k.extend_from_slice(k);
        }
        self.len += 1;
    }

    /// The absolute position of the next row: one past the last row's (`len` without gaps).
    pub fn end(&self) -> usize {
        match self.gaps.last() {
            Some(&(i, p)) => p + (self.len - i),
            None => self.len,
        }
    }

    /// Rows before the first gap: the prefix whose index is its position.
    pub fn contiguous(&self) -> usize {
        self.gaps.first().map_or(self.len, |&(i, _)| i)
    }

    /// Where the cache skips positions: `(row index, position)` of every row that follows a
    /// gap, as [`Self::skip_to`] made them (what a saved session stores).
    pub fn gaps(&self) -> &[(usize, usize)] {
        &self.gaps
    }

    /// The same rows placed at the positions `gaps` describes (a restored session): refused
    /// unless [`Self::skip_to`] could have made them — indices in order and at most the rows
    /// held, each position past the end of the rows before it.
    pub fn with_gaps(mut self, gaps: Vec<(usize, usize)>) -> Result<Self> {
        let (mut index, mut end) = (0usize, 0usize);
        for (k, &(i, p)) in gaps.iter().enumerate() {
            // The rows before entry k sit at end - (i - index) .. ; the entry must skip ahead.
            let before = end.checked_add(i.saturating_sub(index));
            if i < index || i > self.len || before.is_none_or(|b| p <= b) {
                return Err(Error::Input(format!(
                    "cache gap {k}: row {i} at position {p} does not follow row {index} at \
                     position {end} ({} rows)",
                    self.len
                )));
            }
            (index, end) = (i, p);
        }
        self.gaps = gaps;
        Ok(self)
    }

    /// Places the next row at absolute position `pos`, leaving positions `end()..pos` out
    /// (their rows are never computed; attention sees only the rows that are). Refused when
    /// `pos` lies before [`Self::end`]: positions only increase.
    pub fn skip_to(&mut self, pos: usize) -> Result<()> {
        let end = self.end();
        if pos < end {
            return Err(Error::Input(format!(
                "cache: the next row cannot sit at position {pos}, before the cache's end {end}"
            )));
        }
        if pos > end {
            self.gaps.push((self.len, pos));
        }
        Ok(())
    }

    /// Drops every row at an absolute position ≥ `pos` (see [`Self::truncate`]).
    pub fn truncate_to_position(&mut self, pos: usize) {
        // The first row at a position ≥ pos: inside the segment that holds pos, or the first
        // row of the segment that starts after it.
        let mut keep = pos.min(self.contiguous());
        for (k, &(i, p)) in self.gaps.iter().enumerate() {
            if p >= pos {
                break;
            }
            let seg_end = self.gaps.get(k + 1).map_or(self.len, |&(j, _)| j);
            keep = (i + (pos - p)).min(seg_end);
        }
        self.truncate(keep);
    }

    /// A cache rebuilt from its parts (a restored session): `len` tokens of `latent_dim` latent,
    /// `rope_dim` rope-key and `index_dim` (0: no indexer) indexer-key values each. Refused
    /// when a buffer's length disagrees, so a restored cache is as well-formed as a computed one.
    pub fn from_parts(
        len: usize,
        [latent_dim, rope_dim, index_dim]: [usize; 3],
        latent: Vec<f32>,
        k_pe: Vec<f32>,
        index_k: Vec<f32>,
    ) -> Result<Self> {
        for (what, v, d) in [
            ("latent", &latent, latent_dim),
            ("k_pe", &k_pe, rope_dim),
            ("index_k", &index_k, index_dim),
        ] {
            if Some(v.len()) != len.checked_mul(d) {
                return Err(Error::Input(format!(
                    "cache {what}: {} values for {len} tokens of width {d}",
                    v.len()
                )));
            }
        }
        Ok(LayerCache {
            latent,
            k_pe,
            index_k,
            len,
            gaps: Vec::new(),
            #[cfg(feature = "cuda")]
            device: DeviceMirror::default(),
        })
    }

    /// Drops every token at position ≥ `len` (speculative rollback), releasing memory when the
    /// cache shrinks to less than half of its capacity.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let per = |v: &Vec<f32>| v.len().checked_div(self.len).unwrap_or(0);
        let (a, b, c) = (per(&self.latent), per(&self.k_pe), per(&self.index_k));
        for (v, w) in [
            (&mut self.latent, a),
            (&mut self.k_pe, b),
            (&mut self.index_k, c),
        ] {
            v.truncate(len * w);
            if v.capacity() > 2 * v.len() + 4096 {
                v.shrink_to_fit();
            }
        }
        self.gaps.retain(|&(i, _)| i < len);
        self.len = len;
        #[cfg(feature = "cuda")]
        if let Some(m) = &mut self.device.0 {
            m.truncate(len);
        }
    }

    /// Brings its VRAM mirror (made on first use) up to its rows: latents, rope keys and, on
    /// layers with an indexer, indexer keys (`nectar_cuda::Gpu::kv_mirror_sync`). Call it where
    /// every row has all its parts. `Ok(false)`: the mirrors' cap refused it (no mirror now).
    #[cfg(feature = "cuda")]
    pub(crate) fn sync_device(&mut self, gpu: &nectar_cuda::Gpu) -> Result<bool> {
        let n = self.len.max(1);
        let widths = [self.latent.len(), self.k_pe.len(), self.index_k.len()].map(|l| l / n);
        gpu.kv_mirror_sync(
            &mut self.device.0,
            widths,
            [&self.latent, &self.k_pe, &self.index_k],
        )
        .map_err(|e| Error::Gpu(e.to_string()))
    }

    /// Its VRAM mirror, once [`Self::sync_device`] made it.
    #[cfg(feature = "cuda")]
    pub(crate) fn device(&self) -> Option<&nectar_cuda::KvMirror> {
        self.device.0.as_ref()
    }

    /// Frees its VRAM mirror, if any (a cache put aside: the next use on the GPU uploads it
    /// again).
    pub fn release_device(&mut self) {
        #[cfg(feature = "cuda")]
        {
            self.device.0 = None;
        }
    }

    /// Bytes held by the cache's buffers.
    pub fn bytes(&self) -> usize {
        (self.latent.capacity() + self.k_pe.capacity() + self.index_k.capacity()) * 4
            + self.gaps.capacity() * std::mem::size_of::<(usize, usize)>()
    }
}

/// The width of every cache a model keeps per token: what a saved cache must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheDims {
    /// `kv_lora_rank`: the latent width.
    pub latent: usize,
    /// `qk_rope_head_dim`: the rope-key width.
    pub rope: usize,
    /// Per main layer, the indexer-key width (0 on layers that reuse another layer's selection).
    pub index: Vec<usize>,
    /// The MTP layer's indexer-key width (0 without an indexer); `None` without an MTP layer.
    pub mtp_index: Option<usize>,
}

/// All caches of one sequence: the main layers and the MTP layer.
#[derive(Debug)]
pub struct SeqCache {
    /// One per main decoder layer.
    pub layers: Vec<LayerCache>,
    /// The MTP layer's own cache.
    pub mtp: LayerCache,
    /// This sequence's id in the process, unique per cache (a clone is another sequence): the
    /// expert cache's predictor learns each sequence's tokens as its own stream.
    id: u64,
}

/// The next [`SeqCache::id`].
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Default for SeqCache {
    fn default() -> Self {
        SeqCache::new(0)
    }
}

impl Clone for SeqCache {
    fn clone(&self) -> Self {
        SeqCache {
            layers: self.layers.clone(),
            mtp: self.mtp.clone(),
            id: next_id(),
        }
    }
}

impl SeqCache {
    /// An empty cache for a model with `n_layers` main layers.
    pub fn new(n_layers: usize) -> Self {
        SeqCache {
            layers: vec![LayerCache::default(); n_layers],
            mtp: LayerCache::default(),
            id: next_id(),
        }
    }

    /// This sequence's id (unique in the process; a clone gets its own).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Tokens in the main cache (the next position).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    /// True when the main cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rolls the main cache back to `len` tokens.
    pub fn truncate(&mut self, len: usize) {
        for l in &mut self.layers {
            l.truncate(len);
        }
    }

    /// Bytes held by all buffers.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(LayerCache::bytes).sum::<usize>() + self.mtp.bytes()
    }

    /// Frees every layer's VRAM mirror ([`LayerCache::release_device`]): the cache is put aside
    /// (a kept prefix), so its VRAM goes to the sequences that run.
    pub fn release_device(&mut self) {
        self.layers
            .iter_mut()
            .chain(std::iter::once(&mut self.mtp))
            .for_each(LayerCache::release_device);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_keeps_prefix_and_releases_memory() {
        let mut c = LayerCache::default();
        for i in 0..5000 {
            let v = i as f32;
            c.push(&[v, v], &[v], Some(&[v, v, v]));
        }
        let before = c.bytes();
        c.truncate(3);
        assert_eq!(c.len(), 3);
        assert_eq!(c.latent, [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]);
        assert_eq!(c.index_k.len(), 9);
        assert!(c.bytes() < before / 10);
        c.truncate(10);
        assert_eq!(c.len(), 3);
    }

    fn push_n(c: &mut LayerCache, n: usize) {
        for _ in 0..n {
            let v = c.len() as f32;
            c.push(&[v], &[v], None);
        }
    }

    #[test]
    fn gaps_keep_positions_through_truncation() {
        let mut c = LayerCache::default();
        push_n(&mut c, 3); // positions 0..3
        c.skip_to(3).unwrap(); // no gap
        assert_eq!((c.end(), c.contiguous()), (3, 3));
        c.skip_to(10).unwrap();
        push_n(&mut c, 2); // positions 10, 11 at rows 3, 4
        c.skip_to(20).unwrap();
        push_n(&mut c, 2); // positions 20, 21 at rows 5, 6
        assert_eq!((c.len(), c.end(), c.contiguous()), (7, 22, 3));
        assert!(c.skip_to(21).is_err());
        let mut t = c.clone();
        t.truncate_to_position(21); // keeps position 20
        assert_eq!((t.len(), t.end()), (6, 21));
        let mut t = c.clone();
        t.truncate_to_position(15); // inside the second gap: positions 10, 11 stay
        assert_eq!((t.len(), t.end()), (5, 12));
        let mut t = c.clone();
        t.truncate_to_position(11);
        assert_eq!((t.len(), t.end()), (4, 11));
        let mut t = c.clone();
        t.truncate_to_position(5); // inside the first gap
        assert_eq!((t.len(), t.end(), t.contiguous()), (3, 3, 3));
        t.truncate_to_position(2);
        assert_eq!((t.len(), t.end()), (2, 2));
        // Index truncation (a round's chained rows) forgets gaps past the new length.
        c.truncate(4);
        assert_eq!((c.len(), c.end()), (4, 11));
        c.truncate(3);
        assert_eq!((c.len(), c.end()), (3, 3));
    }

    #[test]
    fn from_parts_checks_every_buffer() {
        let c = LayerCache::from_parts(2, [2, 1, 0], vec![0.0; 4], vec![1.0; 2], vec![]).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c.k_pe, [1.0, 1.0]);
        let e = LayerCache::from_parts(2, [2, 1, 3], vec![0.0; 4], vec![1.0; 2], vec![0.0; 5]);
        assert!(e.unwrap_err().to_string().contains("index_k"));
    }

    #[test]
    fn gaps_restore_exactly_what_skip_to_made_and_nothing_else() {
        let mut c = LayerCache::default();
        push_n(&mut c, 3);
        c.skip_to(10).unwrap();
        c.skip_to(12).unwrap(); // two skips before a row: one index, two entries
        push_n(&mut c, 2);
        c.skip_to(20).unwrap(); // a trailing skip: no row after it yet
        let parts = |c: &LayerCache| {
            LayerCache::from_parts(c.len(), [1, 1, 0], c.latent.clone(), c.k_pe.clone(), vec![])
                .unwrap()
        };
        let r = parts(&c).with_gaps(c.gaps().to_vec()).unwrap();
        assert_eq!(r.gaps(), [(3, 10), (3, 12), (5, 20)]);
        assert_eq!((r.len(), r.end(), r.contiguous()), (5, 20, 3));
        let mut t = r.clone();
        t.truncate_to_position(13); // positions 12 stays, 13 goes
        assert_eq!((t.len(), t.end()), (4, 13));
        // Entries skip_to could not have made: backwards, onto or behind a held row, past the
        // rows held.
        for bad in [
            vec![(3, 10), (2, 15)],
            vec![(3, 3)],
            vec![(3, 10), (4, 11)],
            vec![(0, 0)],
            vec![(6, 30)],
        ] {
            let e = parts(&c).with_gaps(bad.clone()).unwrap_err();
            assert!(e.to_string().contains("cache gap"), "{bad:?}: {e}");
        }
        assert_eq!(parts(&c).with_gaps(vec![]).unwrap().end(), 5);
    }
}
