//! Where each routed expert's bytes are: per (layer, expert) the extents of gate, up and down
//! and of their scales, and whether one coalesced read serves the three weight tensors.
//!
//! Contiguity is checked, never assumed: Python's safetensors writer happens to place
//! `down`, `gate`, `up` of one expert next to each other (names sort that way within a dtype),
//! but experts can straddle shard boundaries (86 of them do in the per-row GLM-5.2 artifact).
use crate::catalog::{Catalog, TensorEntry};
use crate::error::{Error, Result};
use crate::quant::{self, QuantFormat};

/// A byte range of one shard file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Shard index in the catalog.
    pub shard: usize,
    /// Absolute file offset.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Segment {
    fn of(e: &TensorEntry) -> Segment {
        Segment {
            shard: e.shard,
            offset: e.offset,
            len: e.len,
        }
    }

    fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// One projection of an expert.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertPart {
    /// Logical rows.
    pub rows: usize,
    /// Logical columns.
    pub cols: usize,
    /// Storage format.
    pub format: QuantFormat,
    /// Float dtype of the weights when `format` is `Float`.
    pub dtype: crate::DType,
    /// The weight bytes.
    pub weight: Segment,
    /// The `.qs` scales (quantised formats).
    pub scales: Option<Segment>,
}

/// Everything needed to read one routed expert.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertExtent {
    /// Layer index.
    pub layer: usize,
    /// Expert index.
    pub expert: usize,
    /// gate, up, down.
    pub parts: [ExpertPart; 3],
    /// One read covering the three weight tensors, when they are adjacent in one shard.
    pub coalesced: Option<Segment>,
    /// One read covering the three scale tensors, when they are adjacent in one shard.
    pub coalesced_scales: Option<Segment>,
}

impl ExpertExtent {
    /// Bytes of weights and scales.
    pub fn bytes(&self) -> u64 {
        self.parts
            .iter()
            .map(|p| p.weight.len + p.scales.map_or(0, |s| s.len))
            .sum()
    }

    /// The reads that fetch this expert: coalesced where possible, otherwise one per tensor.
    pub fn reads(&self) -> Vec<Segment> {
        let mut r = match self.coalesced {
            Some(c) => vec![c],
            None => self.parts.iter().map(|p| p.weight).collect(),
        };
        match self.coalesced_scales {
            Some(c) => r.push(c),
            None => r.extend(self.parts.iter().filter_map(|p| p.scales)),
        }
        r
    }
}

/// A single segment covering `segs` when they tile one contiguous range of one shard.
fn coalesce(mut segs: Vec<Segment>) -> Option<Segment> {
    segs.sort_by_key(|s| (s.shard, s.offset));
    let first = *segs.first()?;
    let mut end = first.end();
    for s in &segs[1..] {
        if s.shard != first.shard || s.offset != end {
            return None;
        }
        end = s.end();
    }
    Some(Segment {
        shard: first.shard,
        offset: first.offset,
        len: end - first.offset,
    })
}

/// The extent of expert `expert` of `layer`, whose gate/up are `[inter, hidden]` and down is
/// `[hidden, inter]`. Fails naming the tensor when one is missing or has an unusable format.
pub fn expert_extent(
    cat: &Catalog,
    layer: usize,
    expert: usize,
    hidden: usize,
    inter: usize,
) -> Result<ExpertExtent> {
    let part = |proj: &str, rows: usize, cols: usize| -> Result<ExpertPart> {
        let name = format!("model.layers.{layer}.mlp.experts.{expert}.{proj}.weight");
        let e = cat.require(&name)?;
        let qs = cat.get(&format!("{name}.qs"));
        let format = match qs {
            None => {
                if !matches!(
                    e.dtype,
                    crate::DType::F32 | crate::DType::BF16 | crate::DType::F16
                ) || e.len != (rows * cols * e.dtype.size()) as u64
                {
                    return Err(cat.tensor_error(
                        e,
                        format!(
                            "expected a [{rows}, {cols}] float tensor or codes with `.qs` scales"
                        ),
                    ));
                }
                QuantFormat::Float
            }
            Some(q) => {
                if q.dtype != crate::DType::F32 {
                    return Err(
                        cat.tensor_error(q, format!("scales must be F32, found {}", q.dtype))
                    );
                }
                quant::resolve(
                    rows,
                    cols,
                    e.len as usize,
                    (q.len / 4) as usize,
                    cat.stamp(&name),
                )
                .map_err(|m| cat.tensor_error(e, m))?
            }
        };
        Ok(ExpertPart {
            rows,
            cols,
            format,
            dtype: e.dtype,
            weight: Segment::of(e),
            scales: qs.map(Segment::of),
        })
    };
    let parts = [
        part("gate_proj", inter, hidden)?,
        part("up_proj", inter, hidden)?,
        part("down_proj", hidden, inter)?,
    ];
    let coalesced = coalesce(parts.iter().map(|p| p.weight).collect());
    let scales: Option<Vec<Segment>> = parts.iter().map(|p| p.scales).collect();
    let coalesced_scales = scales.and_then(coalesce);
    Ok(ExpertExtent {
        layer,
        expert,
        parts,
        coalesced,
        coalesced_scales,
    })
}

/// Extents of all `n_experts` of `layer`.
pub fn layer_extents(
    cat: &Catalog,
    layer: usize,
    n_experts: usize,
    hidden: usize,
    inter: usize,
) -> Result<Vec<ExpertExtent>> {
    let v: Vec<ExpertExtent> = (0..n_experts)
        .map(|e| expert_extent(cat, layer, e, hidden, inter))
        .collect::<Result<_>>()?;
    if let Some(first) = v.first() {
        if let Some(odd) = v.iter().find(|x| {
            x.parts
                .iter()
                .zip(&first.parts)
                .any(|(a, b)| a.format != b.format)
        }) {
            return Err(Error::Header {
                path: cat.dir().to_path_buf(),
                msg: format!(
                    "layer {layer}: expert {} is stored in a different format than expert 0 (slots need one width per layer)",
                    odd.expert
                ),
            });
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalescing_requires_adjacency_in_one_shard() {
        let s = |shard, offset, len| Segment { shard, offset, len };
        assert_eq!(
            coalesce(vec![s(0, 20, 10), s(0, 0, 10), s(0, 10, 10)]),
            Some(s(0, 0, 30))
        );
        assert_eq!(coalesce(vec![s(0, 0, 10), s(0, 11, 10)]), None);
        assert_eq!(coalesce(vec![s(0, 0, 10), s(1, 10, 10)]), None);
    }
}
