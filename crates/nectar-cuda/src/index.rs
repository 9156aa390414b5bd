//! The DSA indexer's scores of a prefill chunk on the GPU (`index.cu`): every (row, visible key)
//! pair of `Σ_h w_h · relu((q_h · key) · qk_scale)`, bit for bit what the CPU computes
//! (`nectar_kernels::index_score`), so a top-k taken from these scores is the CPU's selection.
//! The caller takes the top-k on the host from the downloaded scores.
use crate::absorbed::KvMirror;
use crate::device::Gpu;
use crate::error::{Error, Result};
use cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};

/// Largest `index_head_dim` the kernel takes (`IX_DMAX`).
pub const INDEX_MAX_DIM: usize = 256;
/// Query rows and keys per block (`IX_R`, `IX_K`).
const TILE: usize = 16;
/// Rows up to which `dsa_index_scores_few` scores, and its keys per
/// block (`IX_FK`; its 8 warps × 32 lanes are `BLOCK_THREADS`).
const FEW_ROWS: usize = 4;
const FEW_KEYS: usize = 8;
/// Threads per block (`IX_THREADS`).
const BLOCK_THREADS: u32 = 256;

/// The query side of an indexer-score launch: `m = pos.len()` rows, row `i` with queries `q[i]`
/// (`heads × dim`, RoPE applied) and head weights `w[i]` (`heads`, already scaled), at position
/// `pos[i]`, scored against keys `0 ..= pos[i]` with `qk_scale`.
#[derive(Debug, Clone, Copy)]
pub struct IndexRows<'a> {
    /// Indexer heads.
    pub heads: usize,
    /// `m × heads × dim` queries.
    pub q: &'a [f32],
    /// `m × heads` head weights.
    pub w: &'a [f32],
    /// Each row's position.
    pub pos: &'a [u32],
    /// `index_head_dim^-½`.
    pub qk_scale: f32,
}

impl Gpu {
    /// The indexer scores (`m × T`, row-major) of `m` rows against the `T` keys `keys`
    /// (`T × dim`): row `i` (queries `q[i]`, `heads × dim`; head weights `w[i]`, `heads`, already
    /// scaled) at position `pos[i]` is scored against keys `0 ..= pos[i]`; the entries beyond
    /// are 0. Synchronous.
    #[allow(clippy::too_many_arguments)]
    pub fn index_scores(
        &self,
        keys: &[f32],
        dim: usize,
        heads: usize,
        q: &[f32],
        w: &[f32],
        pos: &[u32],
        qk_scale: f32,
    ) -> Result<Vec<f32>> {
        if dim == 0 || !keys.len().is_multiple_of(dim) {
            return Err(Error::Shape(format!(
                "indexer scores: {} key values of {dim} dims",
                keys.len()
            )));
        }
        let keys_dev = self.to_device(keys)?;
        let (kp, _sync) = keys_dev.device_ptr(&self.stream);
        let rows = IndexRows {
            heads,
            q,
            w,
            pos,
            qk_scale,
        };
        // SAFETY: kp holds the keys.len() / dim keys of dim f32 just uploaded, alive for the
        // call.
        unsafe { self.index_launch((kp, keys.len() / dim), dim, rows) }
    }

    /// [`Gpu::index_scores`] over the indexer keys of a sequence's cache mirrored in VRAM
    /// ([`KvMirror`], synced past every row's position): only the queries, weights and
    /// positions go up. The same kernel, so the same bits.
    pub fn index_scores_mirrored(
        &self,
        mirror: &KvMirror,
        rows: IndexRows<'_>,
    ) -> Result<Vec<f32>> {
        let (kp, _sync) = mirror.index.device_ptr(&self.stream);
        // SAFETY: the mirror holds `synced` rows of `di` indexer-key f32 at kp, alive for the
        // call (borrowed); index_launch checks every position against that count.
        unsafe { self.index_launch((kp, mirror.synced()), mirror.di, rows) }
    }

    /// The scores' launch over `keys.1` keys of `dim` f32 at device address `keys.0`.
    ///
    /// # Safety
    /// `keys.0` must address at least `keys.1 × dim` f32 of this context, unchanged until the
    /// call returns.
    unsafe fn index_launch(
        &self,
        (kp, t): (u64, usize),
        dim: usize,
        rows: IndexRows<'_>,
    ) -> Result<Vec<f32>> {
        let IndexRows {
            heads,
            q,
            w,
            pos,
            qk_scale,
        } = rows;
        let m = pos.len();
        if dim == 0 || dim > INDEX_MAX_DIM || heads == 0 {
            return Err(Error::Shape(format!(
                "indexer scores: unsupported {heads} heads of {dim} dims"
            )));
        }
        if q.len() != m * heads * dim || w.len() != m * heads {
            return Err(Error::Shape(format!(
                "indexer scores: {} query values and {} weights for {m} rows of {heads} × {dim}",
                q.len(),
                w.len()
            )));
        }
        if let Some(&p) = pos.iter().find(|&&p| p as usize >= t) {
            return Err(Error::Shape(format!(
                "indexer scores: a row at position {p} with {t} keys"
            )));
        }
        if m == 0 {
            return Ok(Vec::new());
        }
        let (ti, mi, hi, di) = (
            i32::try_from(t),
            i32::try_from(m),
            i32::try_from(heads),
            i32::try_from(dim),
        );
        let (Ok(ti), Ok(mi), Ok(hi), Ok(di)) = (ti, mi, hi, di) else {
            return Err(Error::Shape(
                "indexer scores: a dimension beyond 2³¹".into(),
            ));
        };
        let pos_i: Vec<i32> = pos.iter().map(|&p| p as i32).collect();
        let q_dev = self.to_device(q)?;
        let w_dev = self.to_device(w)?;
        let pos_dev = self.stream.clone_htod(&pos_i)?;
        let mut out = self.stream.alloc_zeros::<f32>(m * t)?;
        // Few rows (decode, MTP, verify): a warp per key, a lane per head (index.cu).
        let (func, cfg) = if m <= FEW_ROWS {
            let cfg = LaunchConfig {
                grid_dim: (t.div_ceil(FEW_KEYS) as u32, 1, 1),
                block_dim: (BLOCK_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            (self.function("dsa_index_scores_few")?, cfg)
        } else {
            let cfg = LaunchConfig {
                grid_dim: (t.div_ceil(TILE) as u32, m.div_ceil(TILE) as u32, 1),
                block_dim: (BLOCK_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            (self.function("dsa_index_scores")?, cfg)
        };
        let mut b = self.stream.launch_builder(&func);
        b.arg(&q_dev)
            .arg(&w_dev)
            .arg(&kp)
            .arg(&pos_dev)
            .arg(&mut out)
            .arg(&mi)
            .arg(&hi)
            .arg(&di)
            .arg(&ti)
            .arg(&qk_scale);
        // SAFETY: every buffer is a live allocation of this context of the size the kernel
        // indexes: q m × heads × dim, w m × heads, keys T × dim (the caller's contract), pos m,
        // out m × T; every pos < T and 0 < dim ≤ IX_DMAX (checked above), so no index leaves
        // its buffer.
        unsafe { b.launch(cfg) }?;
        self.to_host(&out)
    }
}
