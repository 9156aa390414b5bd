//! Routed experts copied from their RAM slot to the GPU and computed there (`--gpu-memory` with
//! `--memory-budget`): the staging area of VRAM (`nectar_cuda::copy::Staging`, its size in the
//! VRAM plan) and the pipeline that fills it while the GPU computes.
//!
//! A copied expert computes `down(silu(gate·x) ⊙ up·x)` as a VRAM expert does (`vram.rs`): the
//! same kernels on the same stored bytes (gate and up in one launch, SwiGLU on the host, then
//! down), so its result is the VRAM expert's, within the kernels' tolerance of the CPU's.
//!
//! Two threads per batch of copies: a producer waits for each expert's lease (a hit, or a read
//! in flight), stages its bytes into a free slot (host copy into the pinned ring, DMA on the copy
//! stream) and drops the lease; the caller's thread computes each staged expert as its DMA
//! completes and frees the slot. With two slots per routed expert of a token, the copy of the
//! next experts overlaps the products of the current ones.
use super::offload::Offload;
#[cfg(feature = "cuda")]
use crate::error::Error;
use crate::error::Result;
use nectar_residency::Pending;
#[cfg(feature = "cuda")]
use std::{sync::mpsc, sync::Arc, time::Instant};

/// The copy route of every streamed MoE layer: one staging area, one set of measured costs.
#[cfg(feature = "cuda")]
#[derive(Debug)]
pub(crate) struct CopyTier {
    staging: nectar_cuda::copy::Staging,
    offload: Offload,
}

/// Never constructed: a build without the CUDA tier copies nothing.
#[cfg(not(feature = "cuda"))]
#[derive(Debug)]
pub(crate) enum CopyTier {}

#[cfg(not(feature = "cuda"))]
impl CopyTier {
    pub fn offload(&self) -> &Offload {
        match *self {}
    }

    pub fn stats(&self) -> super::offload::CopyStats {
        match *self {}
    }

    pub fn run(&self, _jobs: Vec<(Pending, Vec<f32>, usize)>) -> Result<Vec<Vec<f32>>> {
        match *self {}
    }
}

/// A staged expert handed from the producer to the GPU side.
#[cfg(feature = "cuda")]
struct Staged {
    job: usize,
    slot: usize,
    views: [nectar_cuda::MatView; 3],
    bytes: u64,
    stage_s: f64,
    /// Seconds the producer waited for the lease (a read from disk, not the copy's time).
    lease_s: f64,
}

#[cfg(feature = "cuda")]
fn gpu_err(e: nectar_cuda::Error) -> Error {
    Error::Gpu(e.to_string())
}

#[cfg(feature = "cuda")]
impl CopyTier {
    /// Allocates `slots` staging slots of `slot_bytes` on `gpu` and measures the pinned
    /// reference bandwidth the copies are compared with.
    pub fn new(gpu: &Arc<nectar_cuda::Gpu>, slots: usize, slot_bytes: usize) -> Result<CopyTier> {
        let staging = nectar_cuda::copy::Staging::new(gpu, slots, slot_bytes).map_err(gpu_err)?;
        let pinned = staging.pinned_reference(8).map_err(gpu_err)?;
        Ok(CopyTier {
            staging,
            offload: Offload::new(pinned),
        })
    }

    /// Device bytes of the staging area.
    pub fn device_bytes(&self) -> usize {
        self.staging.device_bytes()
    }

    /// Slots of the staging area.
    pub fn slots(&self) -> usize {
        self.staging.slots()
    }

    /// The costs and totals.
    pub fn offload(&self) -> &Offload {
        &self.offload
    }

    /// Totals of the copies since load, with the link's own time.
    pub fn stats(&self) -> super::offload::CopyStats {
        let mut s = self.offload.stats();
        (s.link_bytes, s.link_s) = self.staging.link();
        s
    }

    /// Copies and computes each `(lease to come, rows × hidden input, rows)` on the GPU;
    /// outputs in the order given. Every lease is dropped when this returns.
    pub fn run(&self, jobs: Vec<(Pending, Vec<f32>, usize)>) -> Result<Vec<Vec<f32>>> {
        let n = jobs.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let slots = self.staging.slots();
        let (free_tx, free_rx) = mpsc::channel::<usize>();
        for s in 0..slots.min(n) {
            let _ = free_tx.send(s);
        }
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Staged>(slots);
        let mut inputs: Vec<(Vec<f32>, usize)> = Vec::with_capacity(n);
        let mut pendings = Vec::with_capacity(n);
        for (p, x, rows) in jobs {
            pendings.push(p);
            inputs.push((x, rows));
        }
        std::thread::scope(|s| {
            let producer = s.spawn(move || -> Result<()> {
                for (job, p) in pendings.into_iter().enumerate() {
                    // The GPU side hung up (it failed): stop; its error is reported.
                    let Ok(slot) = free_rx.recv() else {
                        return Ok(());
                    };
                    let t = Instant::now();
                    let lease = p.wait()?;
                    let lease_s = t.elapsed().as_secs_f64();
                    let mats = lease.mats()?;
                    let (views, t) = self.staging.copy_mats(slot, &mats).map_err(gpu_err)?;
                    let staged = Staged {
                        job,
                        slot,
                        views: [views[0], views[1], views[2]],
                        bytes: t.bytes,
                        stage_s: t.stage_s,
                        lease_s,
                    };
                    drop(lease);
                    if ready_tx.send(staged).is_err() {
                        return Ok(());
                    }
                }
                Ok(())
            });
            let mut out: Vec<Option<Vec<f32>>> = vec![None; n];
            let consumed = (|| -> Result<()> {
                let gpu = self.staging.gpu();
                loop {
                    let waited = Instant::now();
                    let Ok(st) = ready_rx.recv() else {
                        return Ok(());
                    };
                    let dma_s = self.staging.wait_ready(st.slot).map_err(gpu_err)?;
                    // Time waited beyond the lease's own (a read is not the copy's).
                    let exposed_s = (waited.elapsed().as_secs_f64() - st.lease_s).max(0.0);
                    let started = Instant::now();
                    let (x, rows) = &inputs[st.job];
                    // SAFETY: the views address the slot's parts, written by the DMA this
                    // thread just waited for; the slot is not refilled before `release` below
                    // is queued after these products (the producer takes it from `free_tx`).
                    let mut gu =
                        unsafe { gpu.matmul_views(&[(st.views[0], x), (st.views[1], x)], *rows) }
                            .map_err(gpu_err)?;
                    let u = gu.pop().unwrap_or_default();
                    let mut g = gu.pop().unwrap_or_default();
                    nectar_kernels::swiglu_in_place(&mut g, &u);
                    // SAFETY: as above.
                    let y = unsafe { gpu.matmul_views(&[(st.views[2], &g)], *rows) }
                        .map_err(gpu_err)?
                        .pop()
                        .unwrap_or_default();
                    self.staging.release(st.slot).map_err(gpu_err)?;
                    let _ = free_tx.send(st.slot);
                    self.offload.copy_sample(
                        *rows,
                        st.bytes,
                        started.elapsed().as_secs_f64(),
                        st.stage_s,
                        dma_s,
                        exposed_s,
                    );
                    out[st.job] = Some(y);
                }
            })();
            // Unblock the producer if the GPU side stopped early, then collect its result.
            drop(ready_rx);
            drop(free_tx);
            let produced = producer
                .join()
                .map_err(|_| Error::Gpu("the expert copy thread panicked".into()))?;
            consumed?;
            produced?;
            out.into_iter()
                .enumerate()
                .map(|(i, y)| {
                    y.ok_or_else(|| Error::Gpu(format!("copied expert {i} was not computed")))
                })
                .collect()
        })
    }
}
