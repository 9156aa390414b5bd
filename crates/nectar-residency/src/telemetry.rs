//! Counters the server exposes: per-layer hits, misses, evictions; bytes read; disk service
//! time vs foreground wait; in-flight depth; occupancy by tier.
use serde::Serialize;

/// Per-layer counters.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct LayerStats {
    /// Requests served from a resident or loading slot.
    pub hits: u64,
    /// Of the hits, those served by a pinned slot.
    pub pinned_hits: u64,
    /// Requests that needed a read.
    pub misses: u64,
    /// Experts evicted to admit another.
    pub evictions: u64,
    /// Misses not admitted to the cache.
    pub bypasses: u64,
    /// Prefetch reads started.
    pub prefetched: u64,
    /// Requests served by a prefetch (also counted in `hits`: no demand read was needed).
    pub prefetch_hits: u64,
    /// Prefetches nobody requested (a wasted read; nothing was evicted for them).
    pub prefetch_dropped: u64,
    /// Prefetches cancelled before their read started: the layer's router chose other experts
    /// (nothing was read).
    pub prefetch_cancelled: u64,
}

impl LayerStats {
    /// Prefetch reads that started (a prefetch cancelled before its read read nothing).
    pub fn read_ahead(&self) -> u64 {
        self.prefetched - self.prefetch_cancelled
    }
}

/// A snapshot of the residency counters.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Telemetry {
    /// Per layer (index = layer).
    pub layers: Vec<LayerStats>,
    /// Expert payload bytes read from disk.
    pub bytes_read: u64,
    /// Expert reads completed.
    pub reads: u64,
    /// Failed reads.
    pub read_errors: u64,
    /// Seconds the I/O workers spent reading (summed over workers).
    pub disk_seconds: f64,
    /// Seconds some thread waited for a miss's read (once however many waited together, so it
    /// never exceeds the wall time: the decode's waits on one thread, or the CPU's experts and a
    /// GPU copy thread side by side).
    pub wait_seconds: f64,
    /// Seconds some read was in flight (the device's busy time; `disk_seconds` sums workers).
    pub disk_busy_seconds: f64,
    /// The look-ahead controller's threshold and history (look-ahead prefetch only; see
    /// `policy/control.rs`).
    pub lookahead: Option<crate::policy::ControlStats>,
    /// Largest number of loads in flight at once.
    pub max_in_flight: usize,
    /// Loads in flight now.
    pub in_flight: usize,
    /// Slots by role: pinned, LRU (occupied), working, free, disabled.
    pub occupancy: Occupancy,
    /// RSS-guard shrink events.
    pub rss_shrinks: u64,
    /// RSS-guard regrowth events (capacity given back after pressure stayed low).
    pub rss_regrows: u64,
    /// Slot bytes the guard returned to the OS (summed over shrinks).
    pub released_bytes: u64,
    /// LRU slots in service now, summed over the layers (below `lru_planned` while the memory
    /// guard holds capacity back).
    pub lru_capacity: usize,
    /// LRU slots the memory plan of the moment gives, summed over the layers (a server's plan
    /// follows its sequences in use: `Residency::set_plan`).
    pub lru_planned: usize,
}

/// Slots by role.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Occupancy {
    /// Pinned slots.
    pub pinned: usize,
    /// Occupied LRU slots.
    pub lru: usize,
    /// Working slots holding a miss.
    pub working: usize,
    /// Free slots.
    pub free: usize,
    /// Disabled by capacity reductions.
    pub disabled: usize,
}

impl Telemetry {
    /// One counter of [`LayerStats`] summed over every layer.
    pub fn layer_sum(&self, f: fn(&LayerStats) -> u64) -> u64 {
        self.layers.iter().map(f).sum()
    }

    /// Hits / (hits + misses) over all layers.
    pub fn hit_rate(&self) -> f64 {
        let (h, m) = self
            .layers
            .iter()
            .fold((0, 0), |(h, m), l| (h + l.hits, m + l.misses));
        if h + m == 0 {
            0.0
        } else {
            h as f64 / (h + m) as f64
        }
    }
}

/// Where a routed expert is, when it is not only on disk. Every expert absent from
/// [`crate::Residency::placements`] is on disk only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// A demand read is in flight into a working slot.
    Loading,
    /// In its layer's LRU slots.
    Lru,
    /// In a pinned slot (never evicted).
    Pinned,
    /// A miss of the current wave, read and waiting in a working slot for its layer's safe
    /// point (promotion into the LRU, or a bypass).
    Working,
    /// A predicted read (in flight or done) nobody has requested yet.
    Prefetched,
}

/// One expert that is not only on disk, and where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The expert.
    pub key: crate::ExpertKey,
    /// Its tier.
    pub tier: Tier,
}

/// One eviction: `evicted` left its slot so that `admitted` could enter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eviction {
    /// Position in the cache's eviction history (1 for the first eviction ever).
    pub seq: u64,
    /// The expert that left.
    pub evicted: crate::ExpertKey,
    /// The expert that took its place.
    pub admitted: crate::ExpertKey,
}
