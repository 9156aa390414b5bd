//! Routed experts copied from their RAM slot to the GPU and computed there (`--gpu-memory` with
//! `--memory-budget`): the staging area of VRAM (`nectar_cuda::copy::Staging`, its size in the
//! VRAM plan) and the pipeline that fills it while the GPU computes.
//!
//! A copied expert computes `down(silu(gate·x) ⊙ up·x)` as a VRAM expert does (`vram.rs`): the
//! same kernels on the same stored bytes (gate and up in one launch, SwiGLU on the host, then
//! down), so its result is the VRAM expert's, within the kernels' tolerance of the CPU's.
//!
//! Two threads per batch of copies: a producer waits for each expert's lease (a hit, or a read
//! in flight) and queues its bytes' DMA into a free staging slot; the caller's thread computes
//! each staged expert as its DMA completes and frees the slot. With two slots per routed expert
//! of a token, the copy of the next experts overlaps the products of the current ones.
//!
//! The DMA reads the expert's **RAM slot itself**: the slot is registered with the driver on its
//! first copy (`nectar_cuda::copy::HostRegistry`), the lease travels with the staged expert and
//! is dropped only once its DMA has landed, and the residency manager's slab hook
//! ([`Unregister`]) unregisters a slot before the RSS guard gives its pages back (it is
//! registered again on its next copy) and the whole slab before it is freed. Where registration
//! fails (at load: the load line says so; or for one slot later) the bytes go through the
//! staging area's pinned ring instead, and the lease is dropped once they are in the ring.
use super::gpu_combine::GpuCombine;
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
    /// The RAM slots registered for direct DMA; `None` when registration failed at load.
    registry: Option<Arc<nectar_cuda::copy::HostRegistry>>,
    /// How copies travel, for the load line.
    route: String,
    /// Set once a slot's registration failed after load (reported once).
    warned: std::sync::atomic::AtomicBool,
}

/// The residency manager's slab hook: unregisters slots before their pages go back to the OS.
#[cfg(feature = "cuda")]
struct Unregister(Arc<nectar_cuda::copy::HostRegistry>);

#[cfg(feature = "cuda")]
impl nectar_residency::SlabHook for Unregister {
    fn releasing(&self, start: *const u8, len: usize) {
        if let Err(e) = self.0.unregister_within(start, len) {
            // The range left the registry anyway: its next copy registers it again or, if the
            // driver still holds it, goes through the ring.
            eprintln!("warning: unregistering a RAM expert slot from the GPU driver: {e}");
        }
    }
}

/// Host bytes registered once at load to learn whether this driver and process may register
/// memory at all (a page-locking limit, a driver without the call, …).
#[cfg(feature = "cuda")]
const PROBE_BYTES: usize = 2 << 20;

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

    pub fn run(
        &self,
        _jobs: Vec<(Pending, Vec<u32>, usize)>,
        _x: &super::moe::LayerInput<'_>,
        _dest: Option<&GpuCombine>,
    ) -> Result<Vec<Vec<f32>>> {
        match *self {}
    }
}

/// A lease whose slot a direct DMA may still read: dropping it first waits for that DMA (so an
/// error that drops staged experts unread never lets a slot be refilled, released or
/// unregistered under a DMA).
#[cfg(feature = "cuda")]
struct InFlight<'a> {
    staging: &'a nectar_cuda::copy::Staging,
    slot: usize,
    lease: Option<nectar_residency::Lease>,
}

#[cfg(feature = "cuda")]
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.lease.is_some() {
            // Cheap when the DMA already landed; a failed wait (a broken context) leaves
            // nothing better to do than to let the lease go.
            let _ = self.staging.wait_ready(self.slot);
        }
        self.lease.take();
    }
}

/// A staged expert handed from the producer to the GPU side.
#[cfg(feature = "cuda")]
struct Staged<'a> {
    job: usize,
    slot: usize,
    views: [nectar_cuda::MatView; 3],
    /// The expert's lease while a direct DMA reads its slot (dropped once the DMA landed).
    lease: InFlight<'a>,
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
    /// Allocates `slots` staging slots of `slot_bytes` on `gpu`, measures the pinned
    /// reference bandwidth the copies are compared with, and learns whether RAM slots can be
    /// registered (a probe registration; on failure every copy takes the pinned ring).
    pub fn new(gpu: &Arc<nectar_cuda::Gpu>, slots: usize, slot_bytes: usize) -> Result<CopyTier> {
        let staging = nectar_cuda::copy::Staging::new(gpu, slots, slot_bytes).map_err(gpu_err)?;
        let pinned = staging.pinned_reference(8).map_err(gpu_err)?;
        let registry = Arc::new(nectar_cuda::copy::HostRegistry::new(gpu));
        let probe = vec![0u8; PROBE_BYTES];
        // SAFETY: `probe` stays allocated until it is unregistered right below.
        let probed = unsafe { registry.register(probe.as_ptr(), probe.len()) };
        let unregistered = registry.unregister_within(probe.as_ptr(), probe.len());
        drop(probe);
        let (registry, route) = match probed.and(unregistered) {
            Ok(_) => (
                Some(registry),
                "copied by DMA from their registered RAM slots".to_string(),
            ),
            Err(e) => (
                None,
                format!("copied through a pinned ring (registering RAM slots failed: {e})"),
            ),
        };
        Ok(CopyTier {
            staging,
            offload: Offload::new(pinned),
            registry,
            route,
            warned: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Lets `res` tell the registry before it gives slot memory back (no-op on the ring route).
    pub fn attach(&self, res: &nectar_residency::Residency) {
        if let Some(r) = &self.registry {
            res.set_slab_hook(Arc::new(Unregister(r.clone())));
        }
    }

    /// How the experts travel (for the load line).
    pub fn route(&self) -> &str {
        &self.route
    }

    /// Registers the lease's slot if needed; `Ok(None)` when it was registered already,
    /// `Ok(Some(seconds))` when this call registered it, `Err` (reported once) when the driver
    /// refused: the copy then takes the ring.
    fn register(&self, lease: &nectar_residency::Lease) -> Result<Option<f64>> {
        let Some(reg) = &self.registry else {
            return Err(Error::Gpu("no registration".into()));
        };
        let mem = lease.slot_memory()?;
        let t = Instant::now();
        // SAFETY: the slot is part of the residency manager's slab, which stays mapped until
        // its hook (`Unregister`, installed by `attach` before any copy) unregisters it: before
        // a slot's pages are released and before the slab is freed.
        match unsafe { reg.register(mem.as_ptr(), mem.len()) } {
            Ok(true) => Ok(Some(t.elapsed().as_secs_f64())),
            Ok(false) => Ok(None),
            Err(e) => {
                if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    eprintln!(
                        "warning: a RAM expert slot could not be registered with the GPU driver \
                         ({e}); such copies go through the pinned ring"
                    );
                }
                Err(gpu_err(e))
            }
        }
    }

    /// The GPU the copies go to.
    pub fn gpu(&self) -> &Arc<nectar_cuda::Gpu> {
        self.staging.gpu()
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

    /// Copies and computes each `(lease to come, its rows of the layer's input x, its first
    /// pair)` on the GPU. With `dest` each output stays in the step's outputs in VRAM at its
    /// first pair and nothing is returned; without, the outputs come back in the order given.
    /// Every lease is dropped when this returns.
    pub fn run(
        &self,
        jobs: Vec<(Pending, Vec<u32>, usize)>,
        x: &super::moe::LayerInput<'_>,
        dest: Option<&GpuCombine>,
    ) -> Result<Vec<Vec<f32>>> {
        let n = jobs.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let slots = self.staging.slots();
        let (free_tx, free_rx) = mpsc::channel::<usize>();
        for s in 0..slots.min(n) {
            let _ = free_tx.send(s);
        }
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Staged<'_>>(slots);
        let mut inputs: Vec<Vec<u32>> = Vec::with_capacity(n);
        let mut pendings = Vec::with_capacity(n);
        let mut firsts = Vec::with_capacity(n);
        for (p, rows, first) in jobs {
            pendings.push(p);
            inputs.push(rows);
            firsts.push(first);
        }
        // Copied experts whose outputs stay in VRAM: their GPU time is read from stream marks
        // once they are done (their products are queued, not waited for).
        let mut queued = Vec::new();
        let x = x.on(self.staging.gpu())?;
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
                    let registered = self.register(&lease);
                    let mats = lease.mats()?;
                    let (views, t) = match registered {
                        Ok(reg_s) => {
                            self.offload.direct_sample(reg_s);
                            // SAFETY: the slot's bytes stay unchanged until the DMA landed: the
                            // lease goes with the staged expert (`InFlight`), which waits for
                            // the slot's DMA before it lets the lease go, on every path.
                            unsafe { self.staging.copy_mats_direct(slot, &mats) }
                        }
                        Err(_) => self.staging.copy_mats(slot, &mats),
                    }
                    .map_err(gpu_err)?;
                    let direct = registered.is_ok();
                    let staged = Staged {
                        job,
                        slot,
                        views: [views[0], views[1], views[2]],
                        lease: InFlight {
                            staging: &self.staging,
                            slot,
                            lease: direct.then_some(lease),
                        },
                        bytes: t.bytes,
                        stage_s: t.stage_s,
                        lease_s,
                    };
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
                    // The DMA has read the RAM slot: its lease may go.
                    drop(st.lease);
                    // Time waited beyond the lease's own (a read is not the copy's).
                    let exposed_s = (waited.elapsed().as_secs_f64() - st.lease_s).max(0.0);
                    let started = Instant::now();
                    let rows = &inputs[st.job];
                    if let Some(d) = dest {
                        let t0 = gpu.mark().map_err(gpu_err)?;
                        // SAFETY: as below; the products are queued before `release`.
                        unsafe {
                            gpu.swiglu_rows_into(
                                &[st.views],
                                x,
                                &[rows],
                                d.out(),
                                &[firsts[st.job]],
                            )
                        }
                        .map_err(gpu_err)?;
                        let t1 = gpu.mark().map_err(gpu_err)?;
                        self.staging.release(st.slot).map_err(gpu_err)?;
                        let _ = free_tx.send(st.slot);
                        queued.push((rows.len(), st.bytes, st.stage_s, dma_s, exposed_s, t0, t1));
                        continue;
                    }
                    // SAFETY: the views address the slot's parts, written by the DMA this
                    // thread just waited for; the slot is not refilled before `release` below
                    // is queued after this MLP (the producer takes it from `free_tx`).
                    let y = unsafe { gpu.swiglu_rows(&[st.views], x, &[rows]) }
                        .map_err(gpu_err)?
                        .pop()
                        .unwrap_or_default();
                    self.staging.release(st.slot).map_err(gpu_err)?;
                    let _ = free_tx.send(st.slot);
                    self.offload.copy_sample(
                        rows.len(),
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
            if dest.is_some() {
                for (rows, bytes, stage_s, dma_s, exposed_s, t0, t1) in queued {
                    let gpu_s = t1.seconds_since(&t0).map_err(gpu_err)?;
                    self.offload
                        .copy_sample(rows, bytes, gpu_s, stage_s, dma_s, exposed_s);
                }
                return Ok(Vec::new());
            }
            out.into_iter()
                .enumerate()
                .map(|(i, y)| {
                    y.ok_or_else(|| Error::Gpu(format!("copied expert {i} was not computed")))
                })
                .collect()
        })
    }
}
