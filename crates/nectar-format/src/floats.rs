//! F32 tensors (quantisation scales, mostly) as `&[f32]`: a view of the mapped file where its
//! bytes allow it, else a copy.
//!
//! A resident model's weights are views of the memory maps, and its scales used to be copied
//! out of them: GLM-5.2's g64 conversion carries 4 bytes of scale per 32 of int4 codes, so a
//! model loaded without a budget held an eighth of its size twice (1.2 GB for the 2-layer
//! synth, read at every start).
use crate::catalog::Bytes;
use std::sync::Arc;

/// Little-endian f32 values: a view of stored bytes, or an owned vector (private, so that a
/// view exists only where [`Floats::view`] checked it).
#[derive(Clone)]
pub struct Floats(Repr);

#[derive(Clone)]
enum Repr {
    /// Bytes whose address is 4-aligned and whose length is a multiple of 4, on a
    /// little-endian target.
    View(Bytes),
    /// Values in process memory.
    Owned(Arc<Vec<f32>>),
}

impl Floats {
    /// `bytes` as f32 values without a copy when they are aligned (a map is page-aligned, so
    /// any tensor at a 4-aligned file offset is) and the target is little-endian; else `None`.
    pub fn view(bytes: Bytes) -> Option<Floats> {
        let ok =
            cfg!(target_endian = "little") && bytemuck::try_cast_slice::<u8, f32>(&bytes).is_ok();
        ok.then_some(Floats(Repr::View(bytes)))
    }

    /// `bytes` decoded from little-endian into process memory.
    pub fn copied(bytes: &[u8]) -> Floats {
        Floats(Repr::Owned(Arc::new(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )))
    }

    /// Whether the values are a view of a file's map (not counted as process memory).
    pub fn is_mapped(&self) -> bool {
        matches!(self.0, Repr::View(Bytes::Mapped { .. }))
    }
}

impl From<Vec<f32>> for Floats {
    fn from(v: Vec<f32>) -> Self {
        Floats(Repr::Owned(Arc::new(v)))
    }
}

impl std::ops::Deref for Floats {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match &self.0 {
            // Checked when the view was made, and the bytes of a `Bytes` never move.
            Repr::View(b) => bytemuck::cast_slice(b),
            Repr::Owned(v) => v,
        }
    }
}

impl std::fmt::Debug for Floats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_mapped() { "mapped" } else { "owned" };
        write!(f, "Floats({} {kind})", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_decode_little_endian_and_partial_floats_never_view() {
        let vals = [1.5f32, -0.0, f32::MIN_POSITIVE, f32::NAN];
        let le: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let copied = Floats::copied(&le);
        let bits: Vec<u32> = copied.iter().map(|x| x.to_bits()).collect();
        assert_eq!(bits, vals.map(f32::to_bits));
        assert!(!copied.is_mapped());
        // Whole floats view (when the buffer is aligned, as an allocation is); 15 bytes never.
        let owned = Bytes::Owned(Arc::new(le.clone()));
        if (owned.as_ptr() as usize).is_multiple_of(4) {
            let v = Floats::view(owned).expect("aligned whole floats view");
            assert_eq!(v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), bits);
        }
        assert!(Floats::view(Bytes::Owned(Arc::new(le[..15].to_vec()))).is_none());
    }
}
