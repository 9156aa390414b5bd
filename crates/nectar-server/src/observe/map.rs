//! The packed expert map of `GET /experts/map`: one byte per routed expert (its tier and a
//! log-bucketed usage count), the per-turn hit bitmap, and a sequence number, in a small binary
//! frame; and the same snapshot as Colibri's `EMAP`/`HITS` telemetry lines
//! (`docs/colibri-format.md` §12.1) for tools that read those.
//!
//! Frame (`application/octet-stream`, integers little-endian):
//!
//! ```text
//! 0   4 B        magic "NXM1"
//! 4   u16        rows: the MoE layers, then the MTP layer when the model has one
//! 6   u16        cols: routed experts per layer
//! 8   u64        seq: routing steps seen since start (changes whenever a cell can have changed)
//! 16  u64        turn: the turn whose hits the HITS plane holds (0: none yet)
//! 24  u16 × rows the layer index of each row (the MTP layer is num_hidden_layers)
//! ..  rows × cols cells, row-major: byte = (tier << 5) | heat
//! ..  ⌈rows × cols / 8⌉ HITS: cell i = row·cols + col is bit (i & 7) of byte (i >> 3)
//! ```
//!
//! `heat = bit_length(selections since the server started)`, capped at 31 (0: never used),
//! Colibri's heat with one bit less (a cell reaches 31 after 2^30 selections of one expert).
//! `tier` (3 bits) refines Colibri's disk/RAM: see [`TierCode`]. At GLM-5.2's 76 × 256 cells a
//! frame is 22,064 bytes.

use nectar_residency::Tier;

/// The frame's magic bytes.
pub const MAGIC: &[u8; 4] = b"NXM1";

/// Bytes before the layer list.
pub const HEADER: usize = 24;

/// Where an expert is, as the map's 3-bit tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TierCode {
    /// Only on disk (streamed experts not in any slot).
    Disk = 0,
    /// A demand read is in flight.
    Loading = 1,
    /// In its layer's LRU slots.
    Lru = 2,
    /// Pinned (never evicted).
    Pinned = 3,
    /// A miss of the current wave in a working slot, before its layer's safe point.
    Working = 4,
    /// A predicted read nobody has requested yet.
    Prefetched = 5,
    /// No memory budget: every expert is memory-mapped and the OS page cache decides.
    Mapped = 6,
    /// In VRAM (`--gpu-memory`): computed on the GPU, never read into RAM.
    Vram = 7,
}

impl TierCode {
    /// Every code, in order (the page's legend).
    pub const ALL: [TierCode; 8] = [
        TierCode::Disk,
        TierCode::Loading,
        TierCode::Lru,
        TierCode::Pinned,
        TierCode::Working,
        TierCode::Prefetched,
        TierCode::Mapped,
        TierCode::Vram,
    ];

    /// The code of a residency tier.
    pub fn of(t: Tier) -> TierCode {
        match t {
            Tier::Loading => TierCode::Loading,
            Tier::Lru => TierCode::Lru,
            Tier::Pinned => TierCode::Pinned,
            Tier::Working => TierCode::Working,
            Tier::Prefetched => TierCode::Prefetched,
        }
    }

    /// Colibri's `EMAP` tier: 0 disk, 1 RAM (2, VRAM, never). A read in flight or an unrequested
    /// prefetch is not in the cache yet: disk.
    pub fn colibri(self) -> u8 {
        match self {
            TierCode::Disk | TierCode::Loading | TierCode::Prefetched => 0,
            TierCode::Lru | TierCode::Pinned | TierCode::Working | TierCode::Mapped => 1,
            TierCode::Vram => 2,
        }
    }

    /// The lowercase name (JSON, the page's legend).
    pub fn name(self) -> &'static str {
        match self {
            TierCode::Disk => "disk",
            TierCode::Loading => "loading",
            TierCode::Lru => "lru",
            TierCode::Pinned => "pinned",
            TierCode::Working => "working",
            TierCode::Prefetched => "prefetched",
            TierCode::Mapped => "mapped",
            TierCode::Vram => "vram",
        }
    }
}

/// `bit_length(count)` capped at `max`: 0 for 0, 1 for 1, 2 for 2–3, 3 for 4–7, …
pub fn heat(count: u64, max: u8) -> u8 {
    ((64 - count.leading_zeros()) as u8).min(max)
}

/// One map cell.
pub fn cell(tier: TierCode, count: u64) -> u8 {
    ((tier as u8) << 5) | heat(count, 31)
}

/// A snapshot to encode.
#[derive(Debug, Clone)]
pub struct Snapshot<'a> {
    /// Layer index of each row.
    pub layers: &'a [u32],
    /// Experts per row.
    pub cols: usize,
    /// Steps seen.
    pub seq: u64,
    /// Turn of the hits.
    pub turn: u64,
    /// Selections per cell, row-major.
    pub counts: &'a [u64],
    /// Tier per cell, row-major.
    pub tiers: &'a [TierCode],
    /// The hit bitmap (see the module docs).
    pub hits: &'a [u8],
}

/// Bytes of a HITS bitmap of `cells` cells.
pub fn hits_len(cells: usize) -> usize {
    cells.div_ceil(8)
}

/// Sets cell `i` of a HITS bitmap.
pub fn set_hit(hits: &mut [u8], i: usize) {
    hits[i >> 3] |= 1 << (i & 7);
}

/// Whether cell `i` of a HITS bitmap is set.
pub fn is_hit(hits: &[u8], i: usize) -> bool {
    hits[i >> 3] & (1 << (i & 7)) != 0
}

/// The binary frame (see the module docs).
pub fn encode(s: &Snapshot<'_>) -> Vec<u8> {
    let cells = s.layers.len() * s.cols;
    let mut out = Vec::with_capacity(HEADER + 2 * s.layers.len() + cells + hits_len(cells));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(s.layers.len() as u16).to_le_bytes());
    out.extend_from_slice(&(s.cols as u16).to_le_bytes());
    out.extend_from_slice(&s.seq.to_le_bytes());
    out.extend_from_slice(&s.turn.to_le_bytes());
    for &l in s.layers {
        out.extend_from_slice(&(l as u16).to_le_bytes());
    }
    out.extend(s.tiers.iter().zip(s.counts).map(|(&t, &c)| cell(t, c)));
    out.extend_from_slice(&s.hits[..hits_len(cells)]);
    out
}

/// The same snapshot as Colibri's telemetry lines: `EMAP <rows> <cols> <hex>` with
/// `byte = (tier << 6) | heat` (heat capped at 63) and `HITS <rows> <cols> <hex>`, lowercase hex.
pub fn encode_emap(s: &Snapshot<'_>) -> String {
    let rows = s.layers.len();
    let cells = rows * s.cols;
    let mut out = String::with_capacity(2 * cells + cells / 4 + 40);
    let hex = |out: &mut String, b: u8| {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    };
    out.push_str(&format!("EMAP {rows} {} ", s.cols));
    for (&t, &c) in s.tiers.iter().zip(s.counts) {
        hex(&mut out, (t.colibri() << 6) | heat(c, 63));
    }
    out.push_str(&format!("\nHITS {rows} {} ", s.cols));
    for &b in &s.hits[..hits_len(cells)] {
        hex(&mut out, b);
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heat_is_the_bit_length_capped() {
        assert_eq!(
            [0, 1, 2, 3, 4, 7, 8, 1000].map(|c| heat(c, 31)),
            [0, 1, 2, 2, 3, 3, 4, 10]
        );
        assert_eq!(heat(u64::MAX, 31), 31);
        assert_eq!(heat(u64::MAX, 63), 63);
        assert_eq!(heat(1 << 40, 63), 41);
    }

    fn sample() -> (Vec<u32>, Vec<u64>, Vec<TierCode>, Vec<u8>) {
        let layers = vec![1, 2, 8];
        let counts: Vec<u64> = (0..12).map(|i| i * i).collect();
        let tiers: Vec<TierCode> = (0..12).map(|i| TierCode::ALL[i % 7]).collect();
        let mut hits = vec![0u8; hits_len(12)];
        set_hit(&mut hits, 0);
        set_hit(&mut hits, 9);
        (layers, counts, tiers, hits)
    }

    #[test]
    fn frame_layout_is_as_documented() {
        let (layers, counts, tiers, hits) = sample();
        let s = Snapshot {
            layers: &layers,
            cols: 4,
            seq: 0x0102,
            turn: 7,
            counts: &counts,
            tiers: &tiers,
            hits: &hits,
        };
        let f = encode(&s);
        assert_eq!(f.len(), HEADER + 6 + 12 + 2);
        assert_eq!(&f[..4], b"NXM1");
        assert_eq!(u16::from_le_bytes([f[4], f[5]]), 3);
        assert_eq!(u16::from_le_bytes([f[6], f[7]]), 4);
        assert_eq!(u64::from_le_bytes(f[8..16].try_into().unwrap()), 0x0102);
        assert_eq!(u64::from_le_bytes(f[16..24].try_into().unwrap()), 7);
        assert_eq!(u16::from_le_bytes([f[28], f[29]]), 8);
        let cells = &f[30..42];
        // Cell 5: tier 5 (prefetched), 25 selections → heat 5.
        assert_eq!(cells[5], (5 << 5) | 5);
        assert_eq!(cells[5] >> 5, TierCode::Prefetched as u8);
        // Cell 0: disk, never used.
        assert_eq!(cells[0], 0);
        let h = &f[42..];
        assert_eq!(h, &[0b0000_0001, 0b0000_0010]);
        assert!(is_hit(h, 9) && !is_hit(h, 8));
    }

    #[test]
    fn emap_lines_use_colibri_tiers_and_heat() {
        let (layers, counts, tiers, hits) = sample();
        let s = Snapshot {
            layers: &layers,
            cols: 4,
            seq: 1,
            turn: 1,
            counts: &counts,
            tiers: &tiers,
            hits: &hits,
        };
        let text = encode_emap(&s);
        let mut lines = text.lines();
        let emap: Vec<&str> = lines.next().unwrap().split(' ').collect();
        assert_eq!(&emap[..3], &["EMAP", "3", "4"]);
        let bytes: Vec<u8> = (0..12)
            .map(|i| u8::from_str_radix(&emap[3][2 * i..2 * i + 2], 16).unwrap())
            .collect();
        // Cell 2: LRU (RAM, tier 1), 4 selections → heat 3; cell 1: loading (disk), heat 1.
        assert_eq!(bytes[2], (1 << 6) | 3);
        assert_eq!(bytes[1], 1);
        // Cell 11: 121 selections (heat 7), tier ALL[4] = working → RAM.
        assert_eq!(bytes[11], (1 << 6) | 7);
        assert_eq!(lines.next().unwrap(), "HITS 3 4 0102");
    }

    #[test]
    fn vram_is_the_last_code_and_colibris_tier_2() {
        assert_eq!(TierCode::Vram as u8, 7);
        assert_eq!(TierCode::ALL[7], TierCode::Vram);
        assert_eq!(TierCode::Vram.colibri(), 2);
        assert_eq!(cell(TierCode::Vram, 3) >> 5, 7);
    }
}
