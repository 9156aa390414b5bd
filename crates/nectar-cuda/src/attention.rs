//! MLA attention of a prefill chunk on the GPU, in the reconstructed form (`attention.cu`): per
//! head, each query row's scores against the keys it may see — causal, and within its DSA
//! selection when it has one — softmax in f32, times V.
//!
//! The caller (the model's `Attention`) reconstructs K/V with `kv_b` (on the GPU when it is
//! placed there), writes them into an [`MlaKeys`] block by block so that no full host copy is
//! needed, and asks for the chunk's outputs. Results equal the CPU's within f32 reordering
//! error: the products run on the tensor cores with every f32 operand split into two tf32
//! parts, and the softmax runs online over tiles of 32 keys (`attention.cu` states the order).
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::gemv::{GpuMat, Kernel};
use crate::rows::GpuRows;
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

/// Largest `dn + dr` (query/key width per head) and `dv` the kernel takes: `dv` fills at most
/// `FA_NT` 8-column output tiles per half block, and `dn + dr` ≤ 256 keeps the shared memory at
/// two blocks per SM (`shared_bytes`).
pub const MLA_MAX_DIM: usize = 256;
/// Query rows per block (`FA_R`).
const TILE_ROWS: usize = 64;
/// Keys per tile (`FA_K`).
const TILE_KEYS: usize = 32;
/// Threads per block (`FA_THREADS`).
const BLOCK_THREADS: u32 = 256;

/// Bytes of dynamic shared memory the kernel carves for `s` (its own layout, `attention.cu`):
/// the block's queries, one key-or-value tile, the probabilities and five words per row.
fn shared_bytes(s: MlaShape) -> usize {
    let ldq = (s.dn + s.dr).next_multiple_of(8) + 4;
    let ldv = s.dv.next_multiple_of(16) + 8;
    4 * (TILE_ROWS * ldq + TILE_KEYS * ldq.max(ldv) + TILE_ROWS * (TILE_KEYS + 4) + 5 * TILE_ROWS)
}

/// The per-head geometry of an MLA layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaShape {
    /// Attention heads.
    pub heads: usize,
    /// Non-rotary query/key dims per head (`qk_nope_head_dim`).
    pub dn: usize,
    /// Rotary dims (`qk_rope_head_dim`), shared by every head's key.
    pub dr: usize,
    /// Value dims per head (`v_head_dim`).
    pub dv: usize,
}

impl MlaShape {
    /// Whether the kernel takes this geometry (GLM-5.x: 192 + 64 and 256; the fixtures' are
    /// smaller). Callers stay on the CPU otherwise.
    pub fn supported(&self) -> bool {
        let dq = self.dn + self.dr;
        self.heads > 0
            && self.heads <= 65535
            && dq > 0
            && dq <= MLA_MAX_DIM
            && self.dv > 0
            && self.dv <= MLA_MAX_DIM
    }

    /// f32 per key of the reconstructed K/V: `heads × (dn + dv)` (kv_b's output row).
    pub fn kv_width(&self) -> usize {
        self.heads * (self.dn + self.dv)
    }
}

/// One sequence's keys in VRAM: the reconstructed K/V (`keys × kv_width`) and the rope keys
/// (`keys × dr`).
pub struct MlaKeys {
    kv: CudaSlice<f32>,
    kpe: CudaSlice<f32>,
    keys: usize,
    shape: MlaShape,
}

impl std::fmt::Debug for MlaKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MlaKeys")
            .field("keys", &self.keys)
            .field("shape", &self.shape)
            .finish()
    }
}

impl MlaKeys {
    /// Keys held.
    pub fn keys(&self) -> usize {
        self.keys
    }
}

impl Gpu {
    /// Allocates the K/V of `keys` keys (zeroed; fill it with [`Gpu::mla_write_kv`]) and uploads
    /// their rope keys `k_pe` (`keys × dr`).
    pub fn mla_keys(&self, shape: MlaShape, keys: usize, k_pe: &[f32]) -> Result<MlaKeys> {
        if !shape.supported() {
            return Err(Error::Shape(format!(
                "MLA attention: unsupported {shape:?}"
            )));
        }
        if keys == 0 || k_pe.len() != keys * shape.dr {
            return Err(Error::Shape(format!(
                "MLA attention: {keys} keys with {} rope values (dr = {})",
                k_pe.len(),
                shape.dr
            )));
        }
        let kv = self.stream.alloc_zeros(keys * shape.kv_width())?;
        // A zero-length allocation is refused (dr = 0 has no rope keys).
        let kpe = if k_pe.is_empty() {
            self.stream.alloc_zeros(1)?
        } else {
            self.stream.clone_htod(k_pe)?
        };
        Ok(MlaKeys {
            kv,
            kpe,
            keys,
            shape,
        })
    }

    /// Writes the reconstructed K/V of keys `first ..` (`rows × kv_width`, kv_b's output).
    pub fn mla_write_kv(&self, keys: &mut MlaKeys, first: usize, kv: &[f32]) -> Result<()> {
        let w = keys.shape.kv_width();
        if !kv.len().is_multiple_of(w) || first + kv.len() / w > keys.keys {
            return Err(Error::Shape(format!(
                "MLA attention: {} values at key {first} do not fit {} keys of {w}",
                kv.len(),
                keys.keys
            )));
        }
        let mut dst = keys.kv.slice_mut(first * w..first * w + kv.len());
        self.stream.memcpy_htod(kv, &mut dst)?;
        Ok(())
    }

    /// Rebuilds keys `first .. first + m` of `keys` in VRAM: kv_b (`w`, `kv_width × rank`) times
    /// their latents (`latent`, `m × rank`), written straight into the K/V, so no key crosses
    /// PCIe (the host form, [`Gpu::mla_write_kv`], downloads kv_b's output and uploads it
    /// again). The kernel is the one `w`'s products get everywhere (`use_gemm`), so the bits
    /// equal that path's. Enqueued on the compute stream; [`Gpu::mla_prefill`] runs after it.
    pub fn mla_rebuild_kv(
        &self,
        keys: &mut MlaKeys,
        first: usize,
        w: &GpuMat,
        latent: &[f32],
    ) -> Result<()> {
        let width = keys.shape.kv_width();
        let m = latent.len().checked_div(w.cols).unwrap_or(0);
        if w.rows != width || w.cols == 0 || m * w.cols != latent.len() || first + m > keys.keys {
            return Err(Error::Shape(format!(
                "MLA attention: a {}x{} kv_b and {} latent values at key {first} do not fit {} \
                 keys of {width}",
                w.rows,
                w.cols,
                latent.len(),
                keys.keys
            )));
        }
        if m == 0 {
            return Ok(());
        }
        let kernel = Kernel::model(w.format, w.rows, w.cols, m);
        let dst = keys.kv.slice_mut(first * width..(first + m) * width);
        let (yp, _sync) = dst.device_ptr(&self.stream);
        // SAFETY: `w.view()` is an uploaded matrix borrowed for this call; `yp` addresses the
        // m × width floats of keys first .. first + m, which `keys` (borrowed mutably) lends
        // to no one else; the kernels run on this stream before anything that reads them.
        unsafe { self.launch_views(&[(w.view(&self.stream), latent)], m, kernel, yp) }
    }

    /// The attention output (`m × heads × dv`) of `m` query rows `q` (`m × heads × (dn + dr)`,
    /// RoPE applied) at positions `pos`, each over keys `0 ..= pos` of `keys` — only those in
    /// `sel[i]` when it is `Some` (the DSA selection; positions beyond `pos` are ignored, as the
    /// CPU ignores them). Synchronous.
    pub fn mla_prefill(
        &self,
        keys: &MlaKeys,
        scale: f32,
        q: &[f32],
        pos: &[u32],
        sel: &[Option<&[u32]>],
    ) -> Result<Vec<f32>> {
        let out = self.mla_attention(keys, scale, q, pos, sel)?;
        self.mla_download(&out)
    }

    /// An attention output of [`Gpu::mla_attention`], downloaded (`rows × heads × dv`).
    pub fn mla_download(&self, attn: &MlaOutput) -> Result<Vec<f32>> {
        match &attn.out {
            Some(o) => self.to_host(o),
            None => Ok(Vec::new()),
        }
    }

    /// [`Gpu::mla_prefill`]'s output left in VRAM, for [`Gpu::mla_project`]. Waits for the
    /// kernel, so a caller's clock sees the attention's own time.
    pub fn mla_attention(
        &self,
        keys: &MlaKeys,
        scale: f32,
        q: &[f32],
        pos: &[u32],
        sel: &[Option<&[u32]>],
    ) -> Result<MlaOutput> {
        let out = self.mla_attend(keys, scale, q, pos, sel)?;
        self.stream.synchronize()?;
        Ok(MlaOutput {
            out,
            rows: pos.len(),
            width: keys.shape.heads * keys.shape.dv,
        })
    }

    /// The attention output `attn` (`rows × heads·dv`, in VRAM) multiplied by `o` (the layer's
    /// o_proj: `hidden × heads·dv`): returns `rows × hidden`. The product runs the kernel every
    /// product of that many rows with `o` gets ([`Kernel::model`]), so the bits are those of
    /// downloading the attention output and multiplying it by `o` (tested); what it saves is
    /// that round trip (`rows × heads × dv` f32 each way: 268 MB at 4,096 rows of GLM-5.2).
    pub fn mla_project(&self, attn: &MlaOutput, o: &GpuMat) -> Result<Vec<f32>> {
        if o.cols != attn.width {
            return Err(Error::Shape(format!(
                "MLA attention: o_proj takes {} features, the heads give {}",
                o.cols, attn.width
            )));
        }
        let Some(x) = &attn.out else {
            return Ok(Vec::new());
        };
        let (xp, _x_sync) = x.device_ptr(&self.stream);
        // SAFETY: xp is the attention output, rows × width f32, borrowed for this call.
        let y = unsafe { self.model_product(o, xp, attn.rows)? };
        self.to_host(&y)
    }

    /// [`Gpu::mla_attention`] over queries already in VRAM (`rows × heads × (dn + dr)`, RoPE
    /// applied: [`Gpu::matmul_keep`] and [`Gpu::rope_heads`]): the same launch, so the same bits
    /// as the same queries uploaded.
    pub fn mla_attention_rows(
        &self,
        keys: &MlaKeys,
        scale: f32,
        q: &GpuRows,
        pos: &[u32],
        sel: &[Option<&[u32]>],
    ) -> Result<MlaOutput> {
        let (qp, _q_sync) = q.buf.device_ptr(&self.stream);
        let out = self.mla_launch(keys, scale, (qp, q.len()), pos, sel)?;
        self.stream.synchronize()?;
        Ok(MlaOutput {
            out,
            rows: pos.len(),
            width: keys.shape.heads * keys.shape.dv,
        })
    }

    /// The launch of [`Gpu::mla_prefill`]: its output in VRAM (`None` for no rows).
    fn mla_attend(
        &self,
        keys: &MlaKeys,
        scale: f32,
        q: &[f32],
        pos: &[u32],
        sel: &[Option<&[u32]>],
    ) -> Result<Option<CudaSlice<f32>>> {
        if q.is_empty() {
            return self.mla_launch(keys, scale, (0, 0), pos, sel);
        }
        let q_dev = self.to_device(q)?;
        let (qp, _q_sync) = q_dev.device_ptr(&self.stream);
        self.mla_launch(keys, scale, (qp, q.len()), pos, sel)
    }

    /// The attention kernel over queries at device address `q.0` (`q.1` f32).
    fn mla_launch(
        &self,
        keys: &MlaKeys,
        scale: f32,
        (qp, q_len): (u64, usize),
        pos: &[u32],
        sel: &[Option<&[u32]>],
    ) -> Result<Option<CudaSlice<f32>>> {
        let s = keys.shape;
        let m = pos.len();
        if q_len != m * s.heads * (s.dn + s.dr) || sel.len() != m {
            return Err(Error::Shape(format!(
                "MLA attention: {} query values and {} selections for {m} rows of {s:?}",
                q_len,
                sel.len()
            )));
        }
        if m == 0 {
            return Ok(None);
        }
        if let Some(&p) = pos.iter().find(|&&p| p as usize >= keys.keys) {
            return Err(Error::Shape(format!(
                "MLA attention: a row at position {p} with {} keys",
                keys.keys
            )));
        }
        let (moff, bits) = selection_bitmaps(sel, keys.keys)?;
        let pos_i: Vec<i32> = pos.iter().map(|&p| p as i32).collect();
        let pos_dev = self.stream.clone_htod(&pos_i)?;
        let moff_dev = self.stream.clone_htod(&moff)?;
        let bits_dev = self.stream.clone_htod(&bits)?;
        let mut out = self.stream.alloc_zeros::<f32>(m * s.heads * s.dv)?;
        let func = self.function("mla_prefill_attn")?;
        let shared = shared_bytes(s);
        // Above 48 KiB a kernel must ask for its dynamic shared memory (110 KiB at GLM-5.2's
        // 256-dim heads: two blocks per SM on Hopper).
        func.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            shared as i32,
        )?;
        let cfg = LaunchConfig {
            grid_dim: (m.div_ceil(TILE_ROWS) as u32, s.heads as u32, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        let dims = [m, s.heads, s.dn, s.dr, s.dv].map(|d| d as i32);
        let mut b = self.stream.launch_builder(&func);
        b.arg(&qp)
            .arg(&keys.kv)
            .arg(&keys.kpe)
            .arg(&pos_dev)
            .arg(&moff_dev)
            .arg(&bits_dev)
            .arg(&mut out);
        for d in &dims {
            b.arg(d);
        }
        b.arg(&scale);
        // SAFETY: every buffer is a live allocation of this context of the size the kernel
        // indexes: q m × heads × (dn + dr), kv keys × kv_width, kpe keys × dr (or one unused
        // float), pos/moff m, bits every offset in moff plus ⌈keys/32⌉ words, out m × heads × dv;
        // every pos < keys (checked above) and the shape is `supported` (checked at allocation);
        // the dynamic shared memory is `shared_bytes` of this shape, which the kernel's carving
        // of it (from the same dims) does not exceed.
        unsafe { b.launch(cfg) }?;
        Ok(Some(out))
    }
}

/// An MLA attention output kept in VRAM ([`Gpu::mla_attention`]): `rows × heads·dv` f32.
#[derive(Debug)]
pub struct MlaOutput {
    /// `None` for no rows.
    out: Option<CudaSlice<f32>>,
    rows: usize,
    width: usize,
}

impl MlaOutput {
    pub(crate) fn new(out: Option<CudaSlice<f32>>, rows: usize, width: usize) -> MlaOutput {
        MlaOutput { out, rows, width }
    }
}

/// Per row, the word offset of its selection bitmap (−1: every key up to its position) and the
/// bitmaps, ⌈keys/32⌉ words each. One word at least, since a zero-length upload is refused.
fn selection_bitmaps(sel: &[Option<&[u32]>], keys: usize) -> Result<(Vec<i32>, Vec<u32>)> {
    let words = keys.div_ceil(32);
    let mut moff = Vec::with_capacity(sel.len());
    let mut bits = Vec::new();
    for s in sel {
        match s {
            None => moff.push(-1),
            Some(ts) => {
                let off = i32::try_from(bits.len()).map_err(|_| {
                    Error::Shape("MLA attention: selection bitmaps beyond 2³¹ words".into())
                })?;
                moff.push(off);
                let base = bits.len();
                bits.resize(base + words, 0);
                for &t in *ts {
                    let t = t as usize;
                    if t < keys {
                        bits[base + t / 32] |= 1 << (t % 32);
                    }
                }
            }
        }
    }
    if bits.is_empty() {
        bits.push(0);
    }
    Ok((moff, bits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmaps_mark_the_selected_keys_only() {
        let a = [0u32, 31, 32, 69];
        let (moff, bits) = selection_bitmaps(&[None, Some(&a), Some(&[5])], 70).unwrap();
        assert_eq!(moff, [-1, 0, 3]);
        assert_eq!(bits, [1 | 1 << 31, 1, 1 << 5, 1 << 5, 0, 0]);
        // Keys beyond the sequence are dropped, and an all-dense batch still uploads a word.
        let (moff, bits) = selection_bitmaps(&[Some(&[70, 2])], 70).unwrap();
        assert_eq!((moff, bits), (vec![0], vec![4, 0, 0]));
        assert_eq!(selection_bitmaps(&[None], 10).unwrap().1, [0]);
    }

    #[test]
    fn the_kernel_takes_glm5_geometry_not_wider() {
        let glm = MlaShape {
            heads: 64,
            dn: 192,
            dr: 64,
            dv: 256,
        };
        assert!(glm.supported());
        assert_eq!(glm.kv_width(), 64 * 448);
        assert!(!MlaShape { dn: 193, ..glm }.supported());
        assert!(!MlaShape { dv: 257, ..glm }.supported());
        assert!(!MlaShape { heads: 0, ..glm }.supported());
    }
}
