//! Large activation copies between host memory and VRAM through a kept page-locked bounce
//! buffer.
//!
//! Why: on the H200's host the driver's own copies of pageable memory ran at 5.6 GB/s up and
//! 12.8 GB/s down into memory already touched, and at about 2 GB/s down into a fresh
//! allocation (the copy faults its pages in one at a time), against 52–55 GB/s from and to
//! page-locked memory (`benchmarks/RESULTS.md`, "GPU prefill 1.7–3.0×").
//! A prompt's products move hundreds of MB per layer each way (a 8,192-row residual stream of
//! GLM-5.2 is 201 MB), so a copy of at least [`BOUNCE_MIN`] bytes goes in [`CHUNK`]-byte
//! pieces through two halves of one page-locked buffer: the DMA of one piece runs while the
//! host's threads copy the previous one between the other half and the caller's memory. A
//! copy moves bytes unchanged, so every result keeps its bits.
use crate::device::Gpu;
use crate::error::{Error, Result};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, DevicePtr, PinnedHostSlice};
use nectar_kernels::team;

/// Bytes from which a copy goes through the bounce buffer (smaller ones, a decode step's, take
/// the driver's copy: one call, no host copy).
pub(crate) const BOUNCE_MIN: usize = 1 << 20;
/// Bytes of each half of the bounce buffer.
const CHUNK: usize = 8 << 20;
/// Bytes per task of the host's copy between a half and the caller's memory.
const HOST_TASK: usize = 256 << 10;

/// The page-locked buffer, made on the first large copy and kept.
#[derive(Default)]
pub(crate) struct Bounce {
    host: Option<PinnedHostSlice<u8>>,
}

/// One copy's hold on the buffer: the lock, the address of its halves (`half h` starts at
/// `at + h · CHUNK`), and each half's event, recorded after the DMA that uses it. Dropping it
/// waits for both events before the lock goes, so no DMA still reads or writes a half once its
/// copy returns — on an error too — and the next copy may reuse it.
struct Held<'a> {
    at: *mut u8,
    events: [cudarc::driver::CudaEvent; 2],
    _lock: std::sync::MutexGuard<'a, Bounce>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        for e in &self.events {
            // An event never recorded is complete; a failed wait (a broken context) leaves
            // nothing better to do.
            let _ = e.synchronize();
        }
    }
}

/// `dst ← src` on the compute team, [`HOST_TASK`] bytes per task.
fn host_copy(dst: &mut [u8], src: &[u8]) {
    team::for_each_chunk_mut(dst, HOST_TASK, |k, d| {
        d.copy_from_slice(&src[k * HOST_TASK..][..d.len()]);
    });
}

impl Gpu {
    /// The bounce buffer (made on first use), held for one copy.
    fn bounce(&self) -> Result<Held<'_>> {
        let mut lock = self
            .bounce
            .lock()
            .map_err(|_| Error::Shape("bounce: a previous copy panicked".into()))?;
        let host = match &mut lock.host {
            Some(h) => h,
            // SAFETY: the buffer is plain bytes, each written (by a DMA or the host) before it
            // is read. Not write-combined: downloads are read back from it.
            none => none.insert(unsafe { self.ctx.alloc_pinned_with_flags::<u8>(2 * CHUNK, 0)? }),
        };
        let at = host.as_mut_slice()?.as_mut_ptr();
        let flag = Some(CUevent_flags::CU_EVENT_DISABLE_TIMING);
        Ok(Held {
            at,
            events: [self.ctx.new_event(flag)?, self.ctx.new_event(flag)?],
            _lock: lock,
        })
    }

    /// `src` uploaded into a new device buffer ([`Gpu::upload_at`]).
    pub(crate) fn to_device(&self, src: &[f32]) -> Result<CudaSlice<f32>> {
        if std::mem::size_of_val(src) < BOUNCE_MIN {
            return Ok(self.stream.clone_htod(src)?);
        }
        // SAFETY: every element is written by the copy below before anything reads it.
        let dst: CudaSlice<f32> = unsafe { self.stream.alloc(src.len())? };
        let (base, sync) = dst.device_ptr(&self.stream);
        // SAFETY: `dst` holds `src.len()` f32 from `base` and nothing else uses it.
        unsafe { self.upload_at(base, src)? };
        drop(sync);
        Ok(dst)
    }

    /// `src` copied to the device address `base`: through the bounce buffer from
    /// [`BOUNCE_MIN`] bytes, the driver's copy below. Queued on the stream, so the kernels
    /// queued after it read it; `src` may be reused when this returns.
    ///
    /// # Safety
    /// `base` addresses `src.len()` f32 of this context that nothing reads or writes until
    /// the stream has passed this copy.
    pub(crate) unsafe fn upload_at(&self, base: u64, src: &[f32]) -> Result<()> {
        let stream = self.stream.cu_stream();
        if std::mem::size_of_val(src) < BOUNCE_MIN {
            // SAFETY: the contract; a pageable source is staged by the driver before the call
            // returns.
            unsafe { cudarc::driver::result::memcpy_htod_async(base, src, stream)? };
            return Ok(());
        }
        let held = self.bounce()?;
        let src: &[u8] = bytemuck::cast_slice(src);
        for (c, piece) in src.chunks(CHUNK).enumerate() {
            let h = c % 2;
            // The DMA that last read this half (piece c − 2) has finished.
            if c >= 2 {
                held.events[h].synchronize()?;
            }
            // SAFETY: half `h` is CHUNK bytes of the page-locked buffer, which this call holds
            // (the lock), and no DMA reads it now (just waited for).
            let half =
                unsafe { std::slice::from_raw_parts_mut(held.at.add(h * CHUNK), piece.len()) };
            host_copy(half, piece);
            // SAFETY: the device region holds the bytes from `base` (the contract); the half
            // stays untouched until its event says the DMA has read it (waited for before its
            // next use, and by `Held` before this call lets the buffer go).
            unsafe {
                cudarc::driver::result::memcpy_htod_async(
                    base + (c * CHUNK) as u64,
                    &*half,
                    stream,
                )?
            };
            held.events[h].record(&self.stream)?;
        }
        drop(held);
        Ok(())
    }

    /// The first `dst.len()` values of `src` into `dst`: through the bounce buffer from
    /// [`BOUNCE_MIN`] bytes, the driver's copy below. Waits for the work queued before it.
    pub(crate) fn to_host_into(&self, src: &CudaSlice<f32>, dst: &mut [f32]) -> Result<()> {
        if dst.len() > src.len() {
            return Err(Error::Shape(format!(
                "download: {} values wanted from {}",
                dst.len(),
                src.len()
            )));
        }
        let bytes = std::mem::size_of_val(dst);
        if bytes < BOUNCE_MIN {
            self.stream.memcpy_dtoh(&src.slice(..dst.len()), dst)?;
            return Ok(());
        }
        let (base, _sync) = src.device_ptr(&self.stream);
        let held = self.bounce()?;
        let dst: &mut [u8] = bytemuck::cast_slice_mut(dst);
        let stream = self.stream.cu_stream();
        let pieces = bytes.div_ceil(CHUNK);
        let len = |c: usize| CHUNK.min(bytes - c * CHUNK);
        // Piece c's DMA is queued before the host copies piece c − 1 out of the other half.
        for c in 0..=pieces {
            if c < pieces {
                // SAFETY: half c % 2 is CHUNK bytes of the page-locked buffer this call holds;
                // the host finished reading it (piece c − 2) in the previous iteration.
                let half =
                    unsafe { std::slice::from_raw_parts_mut(held.at.add(c % 2 * CHUNK), len(c)) };
                // SAFETY: `src` holds `bytes` from `base`; the half is not read until
                // its event says the DMA has written it (and `Held` waits for it on every
                // return).
                unsafe {
                    cudarc::driver::result::memcpy_dtoh_async(
                        half,
                        base + (c * CHUNK) as u64,
                        stream,
                    )?
                };
                held.events[c % 2].record(&self.stream)?;
            }
            if let Some(p) = c.checked_sub(1) {
                held.events[p % 2].synchronize()?;
                // SAFETY: piece p's bytes in half p % 2, written by the DMA just waited for;
                // no DMA writes this half until the next iteration queues one.
                let half =
                    unsafe { std::slice::from_raw_parts(held.at.add(p % 2 * CHUNK), len(p)) };
                host_copy(&mut dst[p * CHUNK..][..len(p)], half);
            }
        }
        drop(held);
        drop(_sync);
        Ok(())
    }

    /// `src` downloaded ([`Gpu::to_host_into`]).
    pub(crate) fn to_host(&self, src: &CudaSlice<f32>) -> Result<Vec<f32>> {
        let mut out = vec![0.0f32; src.len()];
        self.to_host_into(src, &mut out)?;
        Ok(out)
    }
}
