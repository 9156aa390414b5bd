//! Copying weights from ordinary (pageable) host memory into a small VRAM staging area,
//! asynchronously, on a copy stream of its own: what lets a routed expert that is not in VRAM be
//! computed on the GPU from its RAM slot.
//!
//! Two routes. **Direct** ([`Staging::copy_direct`]): the source lies in host memory
//! registered with the driver ([`HostRegistry`], `cuMemHostRegister`: the RAM cache's slots,
//! each registered on its first copy), and each part is one DMA straight from it — no host copy;
//! the source must stay untouched until the DMA has landed ([`Staging::wait_ready`]), so the
//! caller keeps the slot's lease until then. Pinned pages are neither freed by the RSS guard's
//! `madvise(MADV_DONTNEED)` nor the pages the process sees after it, so a slot is unregistered
//! before the guard releases it (the residency manager's slab hook) and registered again on its
//! next copy. Measured (`nectar bench gpu`, RESULTS 2026-12-02 11:10): GLM-5.2 experts by this
//! route reach 0.95 of the pinned reference end to end (the ring: 0.36).
//!
//! **Ring** ([`Staging::copy`], the fallback when registration fails): the bytes go through a
//! pinned bounce ring of [`RING_CHUNKS`] page-locked chunks of [`CHUNK_BYTES`]; the host copies
//! a chunk of the expert into a free chunk of the ring ([`STAGE_THREADS`] threads of a pool the
//! area keeps), then queues its DMA to the staging slot, so the host copy of chunk i + 1
//! overlaps the DMA of chunk i; the source may be dropped as soon as the call returns. The ring
//! costs `RING_CHUNKS × CHUNK_BYTES` of host memory, whatever the expert size; while the host
//! fills it its DMAs reach only about 0.5–0.6 of the pinned reference, end to end 0.3–0.46.
//!
//! Ordering across the two streams is explicit (the context runs with cudarc's event tracking
//! off): a slot's DMA waits for the event recorded after the last kernel that read the slot
//! ([`Staging::release`]), and the kernels wait for the event recorded after its DMA
//! ([`Staging::wait_ready`]).
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::view::MatView;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice};
use nectar_kernels::MatRef;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Ranges of ordinary host memory registered with the driver (`cuMemHostRegister`), so that
/// [`Staging::copy_direct`] DMAs straight from them. Each range is registered once
/// ([`HostRegistry::register`]) and stays so until [`HostRegistry::unregister_within`] covers it
/// or the registry drops.
pub struct HostRegistry {
    gpu: Arc<Gpu>,
    /// Start address → length of each registered range.
    ranges: Mutex<BTreeMap<usize, usize>>,
}

impl std::fmt::Debug for HostRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRegistry")
            .field("bytes", &self.registered_bytes())
            .finish()
    }
}

impl HostRegistry {
    /// An empty registry for `gpu`'s context.
    pub fn new(gpu: &Arc<Gpu>) -> HostRegistry {
        HostRegistry {
            gpu: gpu.clone(),
            ranges: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, usize>> {
        self.ranges.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `[start, start + len)` unless exactly that range already is; returns whether
    /// this call registered it. A driver refusal (a locked-memory limit, a range overlapping
    /// another registration, …) is [`Error::Register`].
    ///
    /// # Safety
    /// The range must be memory of this process that stays mapped until it is unregistered
    /// ([`HostRegistry::unregister_within`]) or this registry is dropped, and must not be given
    /// back to the OS (`munmap`, `madvise(MADV_DONTNEED)`) while registered.
    pub unsafe fn register(&self, start: *const u8, len: usize) -> Result<bool> {
        let mut ranges = self.lock();
        if ranges.get(&(start as usize)) == Some(&len) {
            return Ok(false);
        }
        if len == 0 {
            return Err(Error::Shape("registering 0 bytes of host memory".into()));
        }
        self.gpu.ctx.bind_to_thread()?;
        // SAFETY: the caller keeps the range mapped while registered (this fn's contract); the
        // driver only pins its pages and maps them for DMA.
        unsafe {
            cudarc::driver::sys::cuMemHostRegister_v2(start as *mut std::ffi::c_void, len, 0)
                .result()
        }
        .map_err(|source| Error::Register { bytes: len, source })?;
        ranges.insert(start as usize, len);
        Ok(true)
    }

    /// Whether `[start, start + len)` lies inside one registered range.
    pub fn contains(&self, start: *const u8, len: usize) -> bool {
        let a = start as usize;
        self.lock()
            .range(..=a)
            .next_back()
            .is_some_and(|(s, l)| a + len <= s + l)
    }

    /// Unregisters every registered range that starts inside `[start, start + len)` (the
    /// residency manager's slab hook calls this before a slot's pages go back to the OS); no DMA
    /// may read them any more. Returns the bytes unregistered; a driver refusal is reported
    /// after the others are done.
    pub fn unregister_within(&self, start: *const u8, len: usize) -> Result<usize> {
        let a = start as usize;
        let mut ranges = self.lock();
        let inside: Vec<(usize, usize)> = ranges
            .range(a..a.saturating_add(len))
            .map(|(s, l)| (*s, *l))
            .collect();
        if inside.is_empty() {
            return Ok(0);
        }
        self.gpu.ctx.bind_to_thread()?;
        let (mut bytes, mut failed) = (0, None);
        for (s, l) in inside {
            ranges.remove(&s);
            // SAFETY: `s` was registered by `register` and not unregistered since (it was in
            // the map); the caller guarantees no DMA reads it any more.
            match unsafe { cudarc::driver::sys::cuMemHostUnregister(s as *mut std::ffi::c_void) }
                .result()
            {
                Ok(()) => bytes += l,
                Err(e) => failed = Some(e),
            }
        }
        match failed {
            None => Ok(bytes),
            Some(e) => Err(Error::Driver(e)),
        }
    }

    /// Bytes registered now.
    pub fn registered_bytes(&self) -> usize {
        self.lock().values().sum()
    }
}

impl Drop for HostRegistry {
    fn drop(&mut self) {
        // A failure leaves pages pinned until the context goes; nothing else can be done here.
        let _ = self.unregister_within(std::ptr::null(), usize::MAX);
    }
}

/// Bytes of one chunk of the pinned bounce ring ([`StageConfig::DEFAULT`]).
pub const CHUNK_BYTES: usize = 8 << 20;
/// Chunks in the ring.
pub const RING_CHUNKS: usize = 8;
/// Threads that copy one chunk into the ring together (a pool kept for the area's life).
pub const STAGE_THREADS: usize = 8;

/// How the pinned bounce ring is laid out and filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageConfig {
    /// Bytes of one chunk.
    pub chunk_bytes: usize,
    /// Chunks in the ring.
    pub ring_chunks: usize,
    /// Threads of the staging pool (kept for the area's life) that copy a chunk together.
    pub threads: usize,
    /// Write-combined pinned memory (`CU_MEMHOSTALLOC_WRITECOMBINED`) instead of cached.
    pub write_combined: bool,
}

impl StageConfig {
    /// What [`Staging::new`] uses: the best of eight layouts measured on the H200 host
    /// (RESULTS, 2026-12-02: 24 expert copies of 21.2 MB from pageable memory, no other load):
    /// 8 × 8 MiB of cached pinned memory filled by 8 threads, DMA 0.59 and end to end 0.46 of
    /// the pinned reference, against 0.51 / 0.30 for the former layout (4 × 4 MiB
    /// write-combined, 4 threads; same pool, same run). Write-combining made no difference;
    /// more threads (12, 16) or smaller chunks were slower.
    pub const DEFAULT: StageConfig = StageConfig {
        chunk_bytes: CHUNK_BYTES,
        ring_chunks: RING_CHUNKS,
        threads: STAGE_THREADS,
        write_combined: false,
    };

    /// `4x4MiB/4t/wc` etc.
    pub fn name(&self) -> String {
        format!(
            "{}x{}MiB/{}t/{}",
            self.ring_chunks,
            self.chunk_bytes >> 20,
            self.threads,
            if self.write_combined { "wc" } else { "cached" }
        )
    }
}
/// Alignment of each part inside a slot (the kernels' vector paths need 16 bytes).
pub const PART_ALIGN: usize = 256;

/// Slot bytes that hold `parts` of these lengths, each aligned to [`PART_ALIGN`].
pub fn slot_bytes_for(parts: &[usize]) -> usize {
    parts
        .iter()
        .map(|p| p.div_ceil(PART_ALIGN) * PART_ALIGN)
        .sum()
}

/// The pinned ring, the events around each chunk's last DMA, and the link time of the DMAs
/// completed so far.
struct Ring {
    buf: PinnedHostSlice<u8>,
    /// Recorded before each chunk's DMA (timing).
    start: Vec<CudaEvent>,
    /// Recorded after it (timing; the host waits on it before rewriting the chunk).
    done: Vec<CudaEvent>,
    /// Bytes of the chunk's DMA not yet added to the totals.
    pending: Vec<usize>,
    next: usize,
    /// Bytes and seconds of the DMAs accounted (each timed by its own events).
    link_bytes: u64,
    link_s: f64,
}

impl Ring {
    /// Waits for chunk `c`'s last DMA and adds its time to the totals.
    fn reclaim(&mut self, c: usize) -> Result<()> {
        self.done[c].synchronize()?;
        if self.pending[c] > 0 {
            self.link_s += f64::from(self.start[c].elapsed_ms(&self.done[c])?) / 1e3;
            self.link_bytes += self.pending[c] as u64;
            self.pending[c] = 0;
        }
        Ok(())
    }
}

/// Copies `src` into `dst` (same length) with up to `pool`'s threads.
fn parallel_copy(pool: &rayon::ThreadPool, src: &[u8], dst: &mut [u8]) {
    let piece = src
        .len()
        .div_ceil(pool.current_num_threads().max(1))
        .max(1 << 18);
    if src.len() <= piece {
        dst.copy_from_slice(src);
        return;
    }
    pool.scope(|s| {
        for (d, c) in dst.chunks_mut(piece).zip(src.chunks(piece)) {
            s.spawn(move |_| d.copy_from_slice(c));
        }
    });
}

/// One slot's events: DMA done, kernels done, and the DMA's start and end for its timing.
struct SlotEvents {
    ready: CudaEvent,
    free: CudaEvent,
    t0: CudaEvent,
    t1: CudaEvent,
}

/// What one staged copy took.
#[derive(Debug, Clone, Copy, Default)]
pub struct CopyTiming {
    /// Bytes copied.
    pub bytes: u64,
    /// Host seconds spent copying into the pinned ring (including waits for a free chunk).
    pub stage_s: f64,
}

/// A VRAM staging area of `slots` equal slots and the machinery that fills them.
pub struct Staging {
    gpu: Arc<Gpu>,
    copy: Arc<CudaStream>,
    area: CudaSlice<u8>,
    slot_bytes: usize,
    slots: usize,
    ring: Mutex<Ring>,
    events: Vec<SlotEvents>,
    config: StageConfig,
    pool: rayon::ThreadPool,
    direct: Mutex<Direct>,
}

/// Bytes of each slot's direct copy in flight, and the totals of those landed.
struct Direct {
    pending: Vec<u64>,
    bytes: u64,
    s: f64,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("slots", &self.slots)
            .field("slot_bytes", &self.slot_bytes)
            .finish()
    }
}

impl Staging {
    /// Allocates `slots` slots of `slot_bytes` in VRAM, the pinned ring and a copy stream.
    pub fn new(gpu: &Arc<Gpu>, slots: usize, slot_bytes: usize) -> Result<Staging> {
        Staging::with_config(gpu, slots, slot_bytes, StageConfig::DEFAULT)
    }

    /// [`Staging::new`] with another ring layout.
    pub fn with_config(
        gpu: &Arc<Gpu>,
        slots: usize,
        slot_bytes: usize,
        config: StageConfig,
    ) -> Result<Staging> {
        let (chunk_bytes, ring_chunks) = (config.chunk_bytes, config.ring_chunks);
        if chunk_bytes == 0 || ring_chunks == 0 || config.threads == 0 {
            return Err(Error::Shape(format!("staging ring {}", config.name())));
        }
        if slots == 0 || slot_bytes == 0 {
            return Err(Error::Shape(format!(
                "staging: {slots} slots of {slot_bytes} bytes"
            )));
        }
        let ctx = &gpu.ctx;
        let copy = ctx.new_stream()?;
        let total = slots
            .checked_mul(slot_bytes)
            .ok_or_else(|| Error::Shape("staging area overflows".into()))?;
        // SAFETY: a slot is only read by kernels after its DMA wrote it (`wait_ready`).
        let area = unsafe { gpu.stream.alloc::<u8>(total)? };
        let flags = if config.write_combined {
            cudarc::driver::sys::CU_MEMHOSTALLOC_WRITECOMBINED
        } else {
            0
        };
        // SAFETY: the ring is written by the host before each DMA reads it.
        let buf = unsafe { ctx.alloc_pinned_with_flags::<u8>(chunk_bytes * ring_chunks, flags)? };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(config.threads)
            .thread_name(|i| format!("nectar-stage-{i}"))
            .build()
            .map_err(|e| Error::Shape(format!("staging threads: {e}")))?;
        let event = |timing: bool| {
            ctx.new_event(Some(if timing {
                CUevent_flags::CU_EVENT_DEFAULT
            } else {
                CUevent_flags::CU_EVENT_DISABLE_TIMING
            }))
        };
        let ring_events = || {
            (0..ring_chunks)
                .map(|_| event(true))
                .collect::<std::result::Result<Vec<_>, _>>()
        };
        let (start, done) = (ring_events()?, ring_events()?);
        let mut events = Vec::with_capacity(slots);
        for _ in 0..slots {
            events.push(SlotEvents {
                ready: event(false)?,
                free: event(false)?,
                t0: event(true)?,
                t1: event(true)?,
            });
        }
        // Unrecorded events count as complete, so the first use of each chunk and slot waits
        // for nothing.
        Ok(Staging {
            gpu: gpu.clone(),
            copy,
            area,
            slot_bytes,
            slots,
            ring: Mutex::new(Ring {
                buf,
                start,
                done,
                pending: vec![0; ring_chunks],
                next: 0,
                link_bytes: 0,
                link_s: 0.0,
            }),
            events,
            config,
            pool,
            direct: Mutex::new(Direct {
                pending: vec![0; slots],
                bytes: 0,
                s: 0.0,
            }),
        })
    }

    /// Slots in the area.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes of one slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Device bytes of the area.
    pub fn device_bytes(&self) -> usize {
        self.slots * self.slot_bytes
    }

    /// Host bytes of the pinned ring.
    pub fn pinned_bytes(&self) -> usize {
        self.config.chunk_bytes * self.config.ring_chunks
    }

    /// The ring's layout.
    pub fn config(&self) -> StageConfig {
        self.config
    }

    /// The GPU the area lives on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    fn slot_base(&self, slot: usize) -> Result<u64> {
        if slot >= self.slots {
            return Err(Error::Shape(format!(
                "staging slot {slot} of {}",
                self.slots
            )));
        }
        let (base, _sync) = self.area.device_ptr(&self.gpu.stream);
        Ok(base + (slot * self.slot_bytes) as u64)
    }

    /// Queues the copy of `parts` (back to back, each at a [`PART_ALIGN`] boundary) into
    /// `slot` through the pinned ring, once the kernels released by the slot's last
    /// [`Staging::release`] are done. Returns each part's device address and the host time
    /// spent; when this returns the host bytes have been taken (the caller may drop them) and
    /// the DMA may still be in flight.
    pub fn copy(&self, slot: usize, parts: &[&[u8]]) -> Result<(Vec<u64>, CopyTiming)> {
        self.queue(slot, parts, false)
    }

    /// [`Staging::copy`] with each part one DMA straight from its host bytes: no ring, no host
    /// copy. From memory registered with the driver ([`HostRegistry`]) the DMA is asynchronous
    /// at the link's full rate; from other pageable memory the driver stages it itself (still
    /// correct, but slow and synchronous).
    ///
    /// # Safety
    /// Every part must stay allocated and unchanged until [`Staging::wait_ready`] for `slot`
    /// has returned (the DMA reads it until then): the caller holds the slot's lease that long.
    pub unsafe fn copy_direct(
        &self,
        slot: usize,
        parts: &[&[u8]],
    ) -> Result<(Vec<u64>, CopyTiming)> {
        self.queue(slot, parts, true)
    }

    fn queue(&self, slot: usize, parts: &[&[u8]], direct: bool) -> Result<(Vec<u64>, CopyTiming)> {
        let base = self.slot_base(slot)?;
        let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        if slot_bytes_for(&lens) > self.slot_bytes {
            return Err(Error::Shape(format!(
                "staging: {} bytes do not fit a slot of {}",
                slot_bytes_for(&lens),
                self.slot_bytes
            )));
        }
        let started = Instant::now();
        // The raw copies below need the context current on this thread (the caller's may be a
        // fresh one).
        self.gpu.ctx.bind_to_thread()?;
        let ev = &self.events[slot];
        self.copy.wait(&ev.free)?;
        ev.t0.record(&self.copy)?;
        let mut addrs = Vec::with_capacity(parts.len());
        let (mut off, mut bytes) = (0usize, 0u64);
        if direct {
            for part in parts {
                let dst = base + off as u64;
                addrs.push(dst);
                if !part.is_empty() {
                    // SAFETY: `dst .. dst + part.len()` lies inside this slot (the fit was
                    // checked above); the source stays untouched until `wait_ready` (the
                    // caller's contract, `copy_direct`).
                    unsafe {
                        cudarc::driver::result::memcpy_htod_async(dst, part, self.copy.cu_stream())?
                    };
                }
                off += part.len().div_ceil(PART_ALIGN) * PART_ALIGN;
                bytes += part.len() as u64;
            }
            let mut d = self.direct.lock().unwrap_or_else(|p| p.into_inner());
            d.pending[slot] = bytes;
        } else {
            let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
            let (chunk_bytes, ring_chunks) = (self.config.chunk_bytes, self.config.ring_chunks);
            for part in parts {
                addrs.push(base + off as u64);
                for (i, chunk) in part.chunks(chunk_bytes).enumerate() {
                    let c = ring.next;
                    ring.next = (c + 1) % ring_chunks;
                    // The chunk's previous DMA must have read it before the host overwrites it.
                    ring.reclaim(c)?;
                    let dst = base + (off + i * chunk_bytes) as u64;
                    // SAFETY: the ring holds ring_chunks × chunk_bytes bytes, chunk c is not
                    // read by any DMA (its event completed), and `chunk` is at most chunk_bytes.
                    let pinned = unsafe {
                        let p = ring.buf.as_mut_ptr()?.add(c * chunk_bytes);
                        parallel_copy(
                            &self.pool,
                            chunk,
                            std::slice::from_raw_parts_mut(p, chunk.len()),
                        );
                        std::slice::from_raw_parts(p as *const u8, chunk.len())
                    };
                    ring.start[c].record(&self.copy)?;
                    // SAFETY: `dst .. dst + chunk.len()` lies inside this slot (the fit was
                    // checked above), and the pinned source stays untouched until `done[c]`
                    // completes.
                    unsafe {
                        cudarc::driver::result::memcpy_htod_async(
                            dst,
                            pinned,
                            self.copy.cu_stream(),
                        )?
                    };
                    ring.done[c].record(&self.copy)?;
                    ring.pending[c] = chunk.len();
                }
                off += part.len().div_ceil(PART_ALIGN) * PART_ALIGN;
                bytes += part.len() as u64;
            }
        }
        ev.t1.record(&self.copy)?;
        ev.ready.record(&self.copy)?;
        Ok((
            addrs,
            CopyTiming {
                bytes,
                stage_s: started.elapsed().as_secs_f64(),
            },
        ))
    }

    /// [`Staging::copy`] of whole weight matrices (weights, then f32 scales, of each): returns
    /// their views in the slot, ready for [`Gpu::matmul_views`] once [`Staging::wait_ready`].
    pub fn copy_mats(
        &self,
        slot: usize,
        mats: &[MatRef<'_>],
    ) -> Result<(Vec<MatView>, CopyTiming)> {
        self.queue_mats(slot, mats, false)
    }

    /// [`Staging::copy_mats`] by [`Staging::copy_direct`].
    ///
    /// # Safety
    /// As [`Staging::copy_direct`]: the matrices' bytes stay unchanged until
    /// [`Staging::wait_ready`] for `slot` has returned.
    pub unsafe fn copy_mats_direct(
        &self,
        slot: usize,
        mats: &[MatRef<'_>],
    ) -> Result<(Vec<MatView>, CopyTiming)> {
        self.queue_mats(slot, mats, true)
    }

    fn queue_mats(
        &self,
        slot: usize,
        mats: &[MatRef<'_>],
        direct: bool,
    ) -> Result<(Vec<MatView>, CopyTiming)> {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * mats.len());
        for m in mats {
            m.validate()?;
            parts.push(m.data);
            // SAFETY: f32 has no padding and every byte pattern is a valid u8; the view covers
            // exactly the scales' bytes and lives as long as `m.scales`.
            parts.push(unsafe {
                std::slice::from_raw_parts(m.scales.as_ptr().cast::<u8>(), 4 * m.scales.len())
            });
        }
        let (addrs, t) = self.queue(slot, &parts, direct)?;
        let views = mats
            .iter()
            .enumerate()
            .map(|(k, m)| MatView {
                format: m.format,
                rows: m.rows,
                cols: m.cols,
                w: addrs[2 * k],
                s: addrs[2 * k + 1],
                // As in RAM: the int4 GEMV reads the stored layout to the same bits.
                packed: false,
            })
            .collect();
        Ok((views, t))
    }

    /// Blocks the host until `slot`'s DMA is done, then returns the DMA's own duration in
    /// seconds (CUDA events on the copy stream: the copy's link time, not the host's).
    pub fn wait_ready(&self, slot: usize) -> Result<f64> {
        self.slot_base(slot)?;
        let ev = &self.events[slot];
        ev.ready.synchronize()?;
        let s = f64::from(ev.t0.elapsed_ms(&ev.t1)?) / 1e3;
        let mut d = self.direct.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = std::mem::take(&mut d.pending[slot]);
        if bytes > 0 {
            d.bytes += bytes;
            d.s += s;
        }
        Ok(s)
    }

    /// Marks `slot` free once every kernel queued so far on the compute stream is done: the
    /// next copy into it waits for that, not for the host.
    pub fn release(&self, slot: usize) -> Result<()> {
        self.slot_base(slot)?;
        self.events[slot].free.record(&self.gpu.stream)?;
        Ok(())
    }

    /// Bytes and seconds of the DMAs of copies completed so far, each ring chunk timed by its
    /// own events on the copy stream, each direct copy by its slot's (counted once
    /// [`Staging::wait_ready`] saw it land): the link's rate for these copies, without the
    /// host's staging between them.
    pub fn link(&self) -> (u64, f64) {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        for c in 0..self.config.ring_chunks {
            // A failed wait leaves that chunk out of the totals; the next copy reports it.
            let _ = ring.reclaim(c);
        }
        let d = self.direct.lock().unwrap_or_else(|p| p.into_inner());
        (ring.link_bytes + d.bytes, ring.link_s + d.s)
    }

    /// Pinned host→device bandwidth of this machine in bytes per second: `reps` copies of the
    /// whole ring, pinned source, one DMA each, timed by events on the copy stream — the
    /// reference the staged copies are divided by (measured in the same process).
    pub fn pinned_reference(&self, reps: usize) -> Result<f64> {
        let len = self.pinned_bytes().min(self.device_bytes());
        let base = self.slot_base(0)?;
        self.gpu.ctx.bind_to_thread()?;
        let t0 = self
            .gpu
            .ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let t1 = self
            .gpu
            .ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        for c in 0..self.config.ring_chunks {
            ring.reclaim(c)?;
        }
        self.copy.wait(&self.events[0].free)?;
        // SAFETY: the ring holds at least `len` bytes and no DMA reads it (all chunk events
        // completed); the bytes' values do not matter.
        let src = unsafe { std::slice::from_raw_parts(ring.buf.as_mut_ptr()? as *const u8, len) };
        // One warm-up copy, then the timed ones.
        for r in 0..=reps.max(1) {
            if r == 1 {
                t0.record(&self.copy)?;
            }
            // SAFETY: `base .. base + len` lies inside the area (len ≤ device bytes); the
            // source is pinned and not written while the copies run (the ring lock is held and
            // the stream is synchronised below).
            unsafe { cudarc::driver::result::memcpy_htod_async(base, src, self.copy.cu_stream())? };
        }
        t1.record(&self.copy)?;
        self.copy.synchronize()?;
        for d in &ring.done {
            d.record(&self.copy)?;
        }
        ring.next = 0;
        let s = f64::from(t0.elapsed_ms(&t1)?) / 1e3;
        Ok((reps.max(1) * len) as f64 / s.max(1e-12))
    }
}
