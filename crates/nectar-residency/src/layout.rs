//! Where an expert's bytes land inside a slot, and which file ranges fill them.
//!
//! Every read is widened to 4 KiB boundaries (O_DIRECT's rule) and placed at a 4 KiB-aligned
//! position of the slot; each tensor then starts at its offset within that aligned window.
use crate::slab::ALIGN;
use nectar_format::experts::{ExpertExtent, Segment};
use nectar_format::quant::QuantFormat;
use nectar_format::DType;
use nectar_kernels::{MatRef, WeightFormat};

/// One read: the aligned file range and where it goes in the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOp {
    /// Shard index.
    pub shard: usize,
    /// 4 KiB-aligned file offset.
    pub file_offset: u64,
    /// 4 KiB-multiple length.
    pub len: usize,
    /// Bytes of the range that must be read (the rest may lie past the end of the file).
    pub needed: usize,
    /// 4 KiB-aligned position in the slot.
    pub slot_offset: usize,
}

/// A projection's place in the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartPlace {
    /// Kernel format.
    pub format: WeightFormat,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Weight bytes: offset and length in the slot.
    pub weight: (usize, usize),
    /// Scales: offset and count (f32) in the slot.
    pub scales: Option<(usize, usize)>,
}

/// How one expert occupies a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotLayout {
    /// Reads that fill the slot.
    pub reads: Vec<ReadOp>,
    /// gate, up, down.
    pub parts: [PartPlace; 3],
    /// Bytes of the slot used.
    pub bytes: usize,
    /// Payload bytes (what the model file holds for this expert).
    pub payload: u64,
}

/// Plans the slot layout of an expert. Fails (with a message) for formats the kernels cannot
/// run or scales that are not 4-byte aligned in the file.
pub fn plan(ext: &ExpertExtent) -> Result<SlotLayout, String> {
    let segs = ext.reads();
    let mut reads = Vec::with_capacity(segs.len());
    let mut cursor = 0usize;
    for s in &segs {
        let a0 = s.offset / ALIGN as u64 * ALIGN as u64;
        let a1 = (s.offset + s.len).div_ceil(ALIGN as u64) * ALIGN as u64;
        reads.push(ReadOp {
            shard: s.shard,
            file_offset: a0,
            len: (a1 - a0) as usize,
            needed: (s.offset + s.len - a0) as usize,
            slot_offset: cursor,
        });
        cursor += (a1 - a0) as usize;
    }
    let place = |seg: Segment| -> usize {
        let (r, s) = reads
            .iter()
            .zip(&segs)
            .find(|(_, s)| {
                s.shard == seg.shard
                    && s.offset <= seg.offset
                    && seg.offset + seg.len <= s.offset + s.len
            })
            .expect("every tensor lies inside one of its expert's reads");
        let _ = s;
        r.slot_offset + (seg.offset - r.file_offset) as usize
    };
    let mut parts = Vec::with_capacity(3);
    for p in &ext.parts {
        let format = match p.format {
            QuantFormat::Float => match p.dtype {
                DType::F32 => WeightFormat::F32,
                DType::BF16 => WeightFormat::Bf16,
                DType::F16 => WeightFormat::F16,
                d => return Err(format!("expert weights of dtype {d} cannot be streamed")),
            },
            f => f
                .weight_format()
                .ok_or_else(|| format!("format {} cannot be streamed", f.name()))?,
        };
        let scales = match p.scales {
            Some(s) => {
                let off = place(s);
                if off % 4 != 0 {
                    return Err(format!(
                        "scales at file offset {} are not 4-byte aligned",
                        s.offset
                    ));
                }
                Some((off, (s.len / 4) as usize))
            }
            None => None,
        };
        parts.push(PartPlace {
            format,
            rows: p.rows,
            cols: p.cols,
            weight: (place(p.weight), p.weight.len as usize),
            scales,
        });
    }
    Ok(SlotLayout {
        reads,
        parts: [parts[0], parts[1], parts[2]],
        bytes: cursor,
        payload: ext.bytes(),
    })
}

impl SlotLayout {
    /// Kernel views of gate, up and down over a filled slot.
    pub fn mats<'a>(&self, slot: &'a [u8]) -> [MatRef<'a>; 3] {
        self.parts.map(|p| {
            let data = &slot[p.weight.0..p.weight.0 + p.weight.1];
            let scales: &[f32] = match p.scales {
                Some((off, n)) => bytemuck::cast_slice(&slot[off..off + 4 * n]),
                None => &[],
            };
            MatRef {
                format: p.format,
                rows: p.rows,
                cols: p.cols,
                data,
                scales,
            }
        })
    }
}
