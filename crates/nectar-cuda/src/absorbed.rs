//! The absorbed MLA form on the GPU (`absorbed.cu`): decode, MTP and verify rows attend over
//! their sequence's cached latents **mirrored in VRAM** ([`KvMirror`]), with kv_b's W_UK folded
//! into the query and W_UV into the output, read in kv_b's stored bytes.
//!
//! The host cache stays the truth (sessions, rollback and the CPU form read it); a mirror holds
//! a copy of its leading rows and is brought up to date before each use by uploading only the
//! rows added since ([`Gpu::kv_mirror_sync`]): one latent and rope key per layer and decode
//! step. Rolling the host cache back ([`KvMirror::truncate`]) shortens what the mirror counts as
//! synced. All mirrors of a [`Gpu`] share one byte cap ([`Gpu::set_kv_mirror_cap`]); a sync the
//! cap refuses drops the mirror and says so, and the caller computes the rows on the CPU.
//!
//! The DSA indexer's keys ride along (`di` per row), so decode rows score them in VRAM too
//! ([`Gpu::index_scores_mirrored`], `index.rs`).
//!
//! Equal to the CPU form within reordering error (`absorbed.cu` states the order); tested
//! against an f64 reference (`tests/absorbed_parity.rs`).
use crate::attention::{MlaOutput, MlaShape};
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::gemv::{format_base, GpuMat, RowLayout};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Largest latent width (`kv_lora_rank`) the score kernel stages (`ABS_MAX_RANK`).
pub const ABSORBED_MAX_RANK: usize = 512;
/// Largest rope width the score kernel stages (`ABS_MAX_DR`).
pub const ABSORBED_MAX_DR: usize = 128;
/// Keys per score block (`ABS_KEYS`).
const SCORE_KEYS: usize = 16;
/// Latent columns, heads and key slices per weighted-sum block (`ABS_COLS`, `ABS_HEADS`,
/// `ABS_SLICES`).
const WEIGHTED: (usize, usize, usize) = (32, 8, 8);

/// The bytes every mirror of one GPU holds, and their cap.
#[derive(Debug)]
pub(crate) struct MirrorLedger {
    used: AtomicU64,
    cap: AtomicU64,
}

impl Default for MirrorLedger {
    fn default() -> Self {
        MirrorLedger {
            used: AtomicU64::new(0),
            cap: AtomicU64::new(u64::MAX),
        }
    }
}

impl MirrorLedger {
    /// Takes `add` bytes (releasing `give` at the same time) if the cap allows it.
    fn take(&self, give: u64, add: u64) -> bool {
        let cap = self.cap.load(Ordering::Relaxed);
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                let next = u.saturating_sub(give).checked_add(add)?;
                (next <= cap).then_some(next)
            })
            .is_ok()
    }

    fn give(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(bytes))
            });
    }
}

/// One sequence's layer cache mirrored in VRAM: latents (`rows × rank`), rope keys
/// (`rows × dr`) and DSA indexer keys (`rows × di`; `di = 0` on layers without an indexer), of
/// which the first [`KvMirror::synced`] rows equal the host's.
pub struct KvMirror {
    latent: CudaSlice<f32>,
    kpe: CudaSlice<f32>,
    pub(crate) index: CudaSlice<f32>,
    cap: usize,
    synced: usize,
    rank: usize,
    dr: usize,
    pub(crate) di: usize,
    bytes: u64,
    ledger: Arc<MirrorLedger>,
}

impl std::fmt::Debug for KvMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvMirror")
            .field("cap", &self.cap)
            .field("synced", &self.synced)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Drop for KvMirror {
    fn drop(&mut self) {
        self.ledger.give(self.bytes);
    }
}

impl KvMirror {
    /// Leading rows equal to the host cache's.
    pub fn synced(&self) -> usize {
        self.synced
    }

    /// VRAM bytes it holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The host cache was cut to `len` rows (speculative rollback): rows from `len` on must be
    /// uploaded again before they are read.
    pub fn truncate(&mut self, len: usize) {
        self.synced = self.synced.min(len);
    }
}

/// The keys one row attends, as cache rows of its mirror.
#[derive(Debug, Clone, Copy)]
pub enum AbsorbedKeys<'a> {
    /// Rows `0 .. n`.
    Upto(usize),
    /// These rows, in this order (the DSA selection it can see).
    List(&'a [u32]),
}

impl AbsorbedKeys<'_> {
    fn len(&self) -> usize {
        match self {
            AbsorbedKeys::Upto(n) => *n,
            AbsorbedKeys::List(l) => l.len(),
        }
    }

    fn max(&self) -> Option<usize> {
        match self {
            AbsorbedKeys::Upto(0) => None,
            AbsorbedKeys::Upto(n) => Some(n - 1),
            AbsorbedKeys::List(l) => l.iter().max().map(|&t| t as usize),
        }
    }
}

/// One row of [`Gpu::mla_absorbed`].
#[derive(Debug, Clone, Copy)]
pub struct AbsorbedRow<'a> {
    /// Its rotated queries, `heads × (dn + dr)`.
    pub q: &'a [f32],
    /// Its sequence's mirror, synced past every key it attends.
    pub mirror: &'a KvMirror,
    /// The keys it attends.
    pub keys: AbsorbedKeys<'a>,
}

/// `struct AbsRow` of `absorbed.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct AbsRow {
    latent: u64,
    kpe: u64,
    nkeys: i32,
    list: i32,
}

// SAFETY: `AbsRow` is `repr(C)` plain data laid out as `struct AbsRow` in `absorbed.cu` (two
// u64, two i32: 24 bytes, 8-aligned on both sides).
unsafe impl DeviceRepr for AbsRow {}

/// Every kernel [`Gpu::mla_absorbed`] launches (for the compile test).
#[cfg(test)]
pub(crate) fn kernel_names() -> Vec<String> {
    let mut v: Vec<String> = ["f32", "bf16", "f16", "i8", "i4"]
        .iter()
        .flat_map(|s| [format!("absorbed_qlat_{s}"), format!("absorbed_uv_{s}")])
        .collect();
    v.extend(["absorbed_scores", "absorbed_softmax", "absorbed_weighted"].map(String::from));
    v
}

impl Gpu {
    /// Caps the VRAM all [`KvMirror`]s of this GPU may hold together (default: no cap).
    pub fn set_kv_mirror_cap(&self, bytes: u64) {
        self.mirrors.cap.store(bytes, Ordering::Relaxed);
    }

    /// VRAM the mirrors hold now.
    pub fn kv_mirror_bytes(&self) -> u64 {
        self.mirrors.used.load(Ordering::Relaxed)
    }

    /// Brings `mirror` (made when `None`) up to the host cache `[latent, k_pe, index_k]`
    /// (`rows ×` the widths `[rank, dr, di]`): uploads the rows past [`KvMirror::synced`], or all
    /// of them into a larger buffer (capacity doubles) when it is full. `Ok(false)`: the mirrors'
    /// cap (or the device) refused the space — the mirror is dropped and the caller computes on
    /// the CPU.
    pub fn kv_mirror_sync(
        &self,
        mirror: &mut Option<KvMirror>,
        [rank, dr, di]: [usize; 3],
        [latent, k_pe, index_k]: [&[f32]; 3],
    ) -> Result<bool> {
        let rows = latent.len().checked_div(rank).unwrap_or(0);
        if rank == 0
            || rows * rank != latent.len()
            || rows * dr != k_pe.len()
            || rows * di != index_k.len()
        {
            return Err(Error::Shape(format!(
                "KV mirror: {} latent, {} rope and {} indexer values for widths {rank} / {dr} / \
                 {di}",
                latent.len(),
                k_pe.len(),
                index_k.len()
            )));
        }
        if mirror
            .as_ref()
            .is_some_and(|m| (m.rank, m.dr, m.di) != (rank, dr, di))
        {
            *mirror = None;
        }
        let full = mirror.as_ref().is_none_or(|m| m.cap < rows);
        if full {
            let old = mirror.as_ref().map_or(0, |m| m.cap);
            let give = mirror.as_ref().map_or(0, |m| m.bytes);
            let bytes_of = |cap: usize| (cap * (rank + dr.max(1) + di.max(1)) * 4) as u64;
            // Double; near the cap, an eighth more than needed, so that a mirror the cap cannot
            // double still grows (and uploads everything again) only every rows/8 steps.
            let Some((cap, bytes)) = [rows.max(2 * old), rows + rows / 8]
                .into_iter()
                .map(|c| (c.max(64), bytes_of(c.max(64))))
                .find(|&(_, b)| self.mirrors.take(give, b))
            else {
                *mirror = None;
                return Ok(false);
            };
            // The old mirror's bytes moved into the new one's above: forget it without giving
            // them back twice.
            if let Some(mut m) = mirror.take() {
                m.bytes = 0;
            }
            let alloc = |n: usize| self.stream.alloc_zeros::<f32>(n.max(1));
            let bufs = (alloc(cap * rank), alloc(cap * dr), alloc(cap * di));
            let (latent_buf, kpe_buf, index_buf) = match bufs {
                (Ok(a), Ok(b), Ok(c)) => (a, b, c),
                _ => {
                    self.mirrors.give(bytes);
                    return Ok(false);
                }
            };
            *mirror = Some(KvMirror {
                latent: latent_buf,
                kpe: kpe_buf,
                index: index_buf,
                cap,
                synced: 0,
                rank,
                dr,
                di,
                bytes,
                ledger: self.mirrors.clone(),
            });
        }
        let m = mirror.as_mut().expect("made above");
        let from = m.synced.min(rows);
        if from < rows {
            let mut dst = m.latent.slice_mut(from * rank..rows * rank);
            self.stream.memcpy_htod(&latent[from * rank..], &mut dst)?;
            if dr > 0 {
                let mut dst = m.kpe.slice_mut(from * dr..rows * dr);
                self.stream.memcpy_htod(&k_pe[from * dr..], &mut dst)?;
            }
            if di > 0 {
                let mut dst = m.index.slice_mut(from * di..rows * di);
                self.stream.memcpy_htod(&index_k[from * di..], &mut dst)?;
            }
        }
        m.synced = rows;
        Ok(true)
    }

    /// The absorbed form of `rows` (`rows × heads × dv`, left in VRAM): per row and head,
    /// softmax over its keys of `(q_lat · latent + q_pe · k_pe) · scale` with
    /// `q_lat = W_UKᵀ q_nope`, then `W_UV · Σ p · latent`. `kv_b` is the layer's
    /// (`heads·(dn + dv) × rank`, W_UK rows then W_UV rows per head).
    pub fn mla_absorbed(
        &self,
        shape: MlaShape,
        scale: f32,
        kv_b: &GpuMat,
        rows: &[AbsorbedRow<'_>],
    ) -> Result<MlaOutput> {
        let MlaShape { heads, dn, dr, dv } = shape;
        let (dq, rank, m) = (dn + dr, kv_b.cols, rows.len());
        let width = heads * dv;
        if !shape.supported()
            || rank == 0
            || rank > ABSORBED_MAX_RANK
            || dr > ABSORBED_MAX_DR
            || kv_b.rows != heads * (dn + dv)
        {
            return Err(Error::Shape(format!(
                "MLA absorbed: {shape:?} with a {}x{} kv_b (rank ≤ {ABSORBED_MAX_RANK}, dr ≤ \
                 {ABSORBED_MAX_DR})",
                kv_b.rows, kv_b.cols
            )));
        }
        if m == 0 {
            return Ok(MlaOutput::new(None, 0, width));
        }
        let mut table = Vec::with_capacity(m);
        let (mut list, mut q) = (Vec::<i32>::new(), Vec::with_capacity(m * heads * dq));
        for (i, r) in rows.iter().enumerate() {
            let ok = r.q.len() == heads * dq
                && (r.mirror.rank, r.mirror.dr) == (rank, dr)
                && r.keys.max().is_none_or(|t| t < r.mirror.synced);
            if !ok {
                return Err(Error::Shape(format!(
                    "MLA absorbed: row {i} has {} query values (want {}), a mirror of rank {} / \
                     dr {} (want {rank} / {dr}) or keys beyond its {} synced rows",
                    r.q.len(),
                    heads * dq,
                    r.mirror.rank,
                    r.mirror.dr,
                    r.mirror.synced
                )));
            }
            q.extend_from_slice(r.q);
            let offset = match r.keys {
                AbsorbedKeys::Upto(_) => -1,
                AbsorbedKeys::List(l) => {
                    let off = i32::try_from(list.len())
                        .map_err(|_| Error::Shape("MLA absorbed: key lists beyond 2³¹".into()))?;
                    list.extend(l.iter().map(|&t| t as i32));
                    off
                }
            };
            // The guards are dropped at once: with event tracking off they record nothing, and
            // the mirrors are borrowed (so not freed or written) until this call returns.
            let (lp, _) = DevicePtr::device_ptr(&r.mirror.latent, &self.stream);
            let (pp, _) = DevicePtr::device_ptr(&r.mirror.kpe, &self.stream);
            table.push(AbsRow {
                latent: lp,
                kpe: pp,
                nkeys: i32::try_from(r.keys.len())
                    .map_err(|_| Error::Shape("MLA absorbed: keys beyond 2³¹".into()))?,
                list: offset,
            });
        }
        if list.is_empty() {
            list.push(0);
        }
        let stride = rows.iter().map(|r| r.keys.len()).max().unwrap_or(0).max(1);
        if kv_b.packed() {
            // The absorbed kernels read single weights where rows are stored.
            return Err(Error::Shape(
                "MLA absorbed: kv_b must be uploaded in its stored layout (Gpu::upload_stored)"
                    .into(),
            ));
        }
        let lay = RowLayout::new(kv_b.format, kv_b.rows, kv_b.cols)?;
        let view = kv_b.view(&self.stream);
        let table_dev = self.stream.clone_htod(&table)?;
        let list_dev = self.stream.clone_htod(&list)?;
        let q_dev = self.stream.clone_htod(&q)?;
        let mut q_lat = self.stream.alloc_zeros::<f32>(m * heads * rank)?;
        let mut scores = self.stream.alloc_zeros::<f32>(m * heads * stride)?;
        let mut o_lat = self.stream.alloc_zeros::<f32>(m * heads * rank)?;
        let mut out = self.stream.alloc_zeros::<f32>(m * width)?;
        let [h_, dn_, dr_, dv_, rank_, stride_] =
            [heads, dn, dr, dv, rank, stride].map(|d| d as i32);
        let sfx = format_base(kv_b.format);
        let cfg = |grid: (usize, usize, usize), block: usize| LaunchConfig {
            grid_dim: (grid.0 as u32, grid.1 as u32, grid.2 as u32),
            block_dim: (block as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY (all five launches): every buffer is a live allocation of this context sized
        // as the kernels index it — q m × heads × dq, q_lat and o_lat m × heads × rank, scores
        // m × heads × stride (stride ≥ every row's key count), out m × heads × dv, the table m
        // rows whose latent / kpe point at mirrors of ≥ synced × rank / dr floats, the list
        // every offset + count; every key index is below its mirror's synced rows (checked
        // above); kv_b's view is `heads·(dn + dv) × rank` in its format with `lay`'s numbers;
        // rank ≤ ABS_MAX_RANK and dr ≤ ABS_MAX_DR (checked above) bound the staged tiles.
        unsafe {
            let f = self.function(&format!("absorbed_qlat_{sfx}"))?;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&q_dev).arg(&view.w).arg(&view.s).arg(&mut q_lat);
            for d in [
                &h_,
                &dn_,
                &dr_,
                &dv_,
                &rank_,
                &lay.row_bytes,
                &lay.row_scales,
            ] {
                b.arg(d);
            }
            b.arg(&lay.gmagic).arg(&lay.gshift);
            b.launch(cfg((rank.div_ceil(128), heads, m), 128))?;

            let f = self.function("absorbed_scores")?;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&table_dev)
                .arg(&list_dev)
                .arg(&q_dev)
                .arg(&q_lat)
                .arg(&mut scores);
            for d in [&h_, &dn_, &dr_, &rank_, &stride_] {
                b.arg(d);
            }
            b.arg(&scale);
            b.launch(cfg((stride.div_ceil(SCORE_KEYS), m, 1), 256))?;

            let f = self.function("absorbed_softmax")?;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&table_dev).arg(&mut scores).arg(&h_).arg(&stride_);
            b.launch(cfg((heads, m, 1), 256))?;

            let f = self.function("absorbed_weighted")?;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&table_dev)
                .arg(&list_dev)
                .arg(&scores)
                .arg(&mut o_lat)
                .arg(&h_)
                .arg(&rank_)
                .arg(&stride_);
            let (cols, hb, slices) = WEIGHTED;
            b.launch(cfg(
                (rank.div_ceil(cols), heads.div_ceil(hb), m),
                cols * slices,
            ))?;

            let f = self.function(&format!("absorbed_uv_{sfx}"))?;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&o_lat).arg(&view.w).arg(&view.s).arg(&mut out);
            for d in [&h_, &dn_, &dv_, &rank_, &lay.row_bytes, &lay.row_scales] {
                b.arg(d);
            }
            b.arg(&lay.gmagic).arg(&lay.gshift);
            b.launch(cfg(((heads * dv).div_ceil(4), m, 1), 128))?;
        }
        Ok(MlaOutput::new(Some(out), m, width))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_refuses_past_its_cap_and_moves_bytes_on_growth() {
        let l = MirrorLedger::default();
        l.cap.store(100, Ordering::Relaxed);
        assert!(l.take(0, 60));
        assert!(!l.take(0, 50), "60 + 50 > 100");
        // Growing a 60-byte mirror to 90 gives its 60 back in the same step.
        assert!(l.take(60, 90));
        assert_eq!(l.used.load(Ordering::Relaxed), 90);
        l.give(90);
        assert_eq!(l.used.load(Ordering::Relaxed), 0);
        l.give(5);
        assert_eq!(l.used.load(Ordering::Relaxed), 0, "never below zero");
    }

    #[test]
    fn key_lists_report_their_largest_row() {
        assert_eq!(AbsorbedKeys::Upto(0).max(), None);
        assert_eq!(AbsorbedKeys::Upto(7).max(), Some(6));
        assert_eq!(AbsorbedKeys::List(&[3, 9, 1]).max(), Some(9));
        assert_eq!(AbsorbedKeys::List(&[3, 9, 1]).len(), 3);
    }
}
