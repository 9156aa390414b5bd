//! GEMV products with host activations and host outputs (`Gpu::matmul`, `matmul_batch`,
//! `matmul_views` at M ≤ 8: decode and MTP verify) through buffers kept between calls.
//!
//! Why: such a product used to allocate, fill and free device buffers for its activations,
//! outputs, job table and activation digits, and copy through pageable memory — about fourteen
//! driver calls around two kernels of 10–25 µs, paid by every attention projection and expert
//! batch of every layer of a decode step. Here the activations and the job table go up in one
//! copy from page-locked memory into one device region that also holds the digits and the
//! outputs, and the outputs come back in one copy: six driver calls and the wait. Measured on
//! the H200 (RESULTS, "A product's round trip"): 6–8 µs less per product (q_a 45.6 → 39.8 µs,
//! o_proj 62.8 → 55.2); about 30 µs per product stay (launches, copies, the wait). Products of
//! one hidden state (a layer's q_a and kv_a: `Gpu::matmul_each`) share one round trip: 60–65 µs
//! for the pair against 75–81 one by one. The kernels, their launch order and so the bits are
//! those of the general path (`Gpu::launch_jobs`).
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::gemv::{Job, Order, QSrc};
use crate::view::MatView;
use cudarc::driver::{CudaSlice, DevicePtr, PinnedHostSlice};

/// Page-locked host memory and device memory reused by every round trip of one [`Gpu`] (under
/// its lock); each only grows, to the largest product seen (a few MB: the LM head's outputs).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    host: Option<PinnedHostSlice<u8>>,
    dev: Option<CudaSlice<u8>>,
}

/// Section alignment in both regions (the kernels' vector loads want 16 bytes).
const ALIGN: usize = 256;

fn aligned(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN) * ALIGN
}

/// Products of one shape in a round trip: `items` (weights, `m × cols` activations each) and
/// where item j's `m × rows` outputs go, at `y[j·m·rows ..]`.
pub(crate) struct Group<'a, 'x> {
    pub items: &'a [(MatView, &'x [f32])],
    pub order: Order,
    pub y: &'a mut [f32],
}

/// Where one group's sections lie in the regions, bytes from their starts.
struct Sections {
    x: usize,
    table: usize,
    digits: usize,
    y: usize,
}

impl Gpu {
    /// Groups of GEMV products, each of its own shape, `m ≤ MAX_M` rows each, in one round
    /// trip: one upload, the groups' launches in order, one download, one wait (each group's
    /// shapes already checked, nothing empty). [`Gpu::run_views_into`] sends one group,
    /// [`Gpu::matmul_each`] one per matrix. Each product's kernels are those it gets alone, so
    /// its bits too.
    ///
    /// # Safety
    /// As [`Gpu::run_views`], for every group's items.
    pub(crate) unsafe fn gemv_round_trip(
        &self,
        groups: &mut [Group<'_, '_>],
        m: usize,
    ) -> Result<()> {
        let mut plans = Vec::with_capacity(groups.len());
        for g in groups.iter() {
            let (first, _) = g.items[0];
            let order = g.order.for_packed(g.items.iter().any(|(v, _)| v.packed));
            plans.push(self.gemv_plan(first.format, first.rows, first.cols, m, order)?);
        }
        // Device region: every group's x and table (jobs, then the split's sources) | their
        // digits | their outputs. The host region mirrors the first part (what goes up), then
        // holds the outputs (what comes back).
        let table_bytes = std::mem::size_of::<Job>() + std::mem::size_of::<QSrc>();
        let mut at = 0;
        let mut sections: Vec<Sections> = Vec::with_capacity(groups.len());
        for g in groups.iter() {
            let n = g.items.len();
            let x = at;
            let table = x + aligned(n * m * g.items[0].0.cols * 4);
            at = table + aligned(n * table_bytes);
            sections.push(Sections {
                x,
                table,
                digits: 0,
                y: 0,
            });
        }
        let up_bytes = at;
        for ((g, plan), sec) in groups.iter().zip(&plans).zip(&mut sections) {
            sec.digits = at;
            at += aligned(g.items.len() * plan.digit_bytes());
        }
        let y_start = at;
        for (g, sec) in groups.iter().zip(&mut sections) {
            sec.y = at;
            at += aligned(g.y.len() * 4);
        }
        let (dev_bytes, y_bytes) = (at, at - y_start);
        let host_bytes = up_bytes + y_bytes;

        let mut scratch = self
            .scratch
            .lock()
            .map_err(|_| Error::Shape("round trip: a previous product panicked".into()))?;
        let s = &mut *scratch;
        if s.dev.as_ref().is_none_or(|d| d.len() < dev_bytes) {
            s.dev = None;
            // SAFETY: every byte a product reads is written before it (the upload, the split,
            // the GEMV), and the NaN fill below covers the outputs.
            s.dev = Some(unsafe { self.stream.alloc::<u8>(dev_bytes.next_power_of_two())? });
        }
        if s.host.as_ref().is_none_or(|h| h.len() < host_bytes) {
            s.host = None;
            // SAFETY: as above (not write-combined: the outputs are read back from it).
            s.host = Some(unsafe {
                self.ctx
                    .alloc_pinned_with_flags::<u8>(host_bytes.next_power_of_two(), 0)?
            });
        }
        let (Some(dev), Some(host)) = (s.dev.as_ref(), s.host.as_mut()) else {
            unreachable!("both regions were just made large enough");
        };
        let (base, _dev_sync) = dev.device_ptr(&self.stream);
        let h = host.as_mut_slice()?;
        // Each group's jobs and digit sources, its activations and table written for the upload.
        let mut launches = Vec::with_capacity(groups.len());
        for ((g, plan), sec) in groups.iter().zip(&plans).zip(&sections) {
            let (first, _) = g.items[0];
            let (rows, cols, n) = (first.rows, first.cols, g.items.len());
            let (x_len, y_len, digit_bytes) = (m * cols, m * rows, plan.digit_bytes());
            let mut jobs: Vec<Job> = g
                .items
                .iter()
                .enumerate()
                .map(|(j, (v, _))| {
                    v.job(
                        base + (sec.x + j * x_len * 4) as u64,
                        base + (sec.y + j * y_len * 4) as u64,
                    )
                })
                .collect();
            let vector = plan.vector_ok(&jobs);
            plan.takes_packed(g.items.iter().any(|(v, _)| v.packed), vector)?;
            // The int4 GEMV reads digits of each item's activations (`launch_jobs`: one split
            // per distinct x; here every item has its own).
            let srcs: Vec<QSrc> = match vector && digit_bytes > 0 {
                true => jobs
                    .iter_mut()
                    .enumerate()
                    .map(|(j, job)| {
                        let q = base + (sec.digits + j * digit_bytes) as u64;
                        let src = QSrc { x: job.x, q };
                        job.x = q;
                        src
                    })
                    .collect(),
                false => Vec::new(),
            };
            let xs = as_words::<f32>(&mut h[sec.x..sec.table]);
            for (j, (_, x)) in g.items.iter().enumerate() {
                xs[j * x_len..(j + 1) * x_len].copy_from_slice(x);
            }
            let words = jobs
                .iter()
                .flat_map(Job::words)
                .chain(srcs.iter().flat_map(QSrc::words));
            let table = &mut h[sec.table..sec.table + aligned(n * table_bytes)];
            for (slot, w) in as_words::<u64>(table).iter_mut().zip(words) {
                *slot = w;
            }
            launches.push((n, vector, !srcs.is_empty()));
        }
        let stream = self.stream.cu_stream();
        // SAFETY: the host region is page-locked and holds `up_bytes`; the device region holds
        // `dev_bytes` ≥ `up_bytes`; both stay alive and untouched until the wait below.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(base, &h[..up_bytes], stream)?;
            // 0xff bytes are a NaN: an output a GEMV failed to write comes back NaN.
            cudarc::driver::result::memset_d8_async(base + y_start as u64, 0xff, y_bytes, stream)?;
        }
        for ((plan, sec), (n, vector, split)) in plans.iter().zip(&sections).zip(launches) {
            let tp = base + sec.table as u64;
            if split {
                let sp = tp + (n * std::mem::size_of::<Job>()) as u64;
                // SAFETY: the sources point at the uploaded activations and the digits' room.
                unsafe { self.q_split(plan, sp, n)? };
            }
            // SAFETY: every job holds the plan's shape, its x (or digits) and y in the region;
            // `vector_ok` checked the alignment.
            unsafe { self.gemv_launch(plan, tp, n, vector)? };
        }
        let down = &mut h[up_bytes..host_bytes];
        // SAFETY: the outputs' bytes in the device region, into page-locked memory; waited for
        // before they are read.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(down, base + y_start as u64, stream)?;
        }
        self.stream.synchronize()?;
        for (g, sec) in groups.iter_mut().zip(&sections) {
            let at = sec.y - y_start;
            let len = g.y.len();
            g.y.copy_from_slice(&as_words::<f32>(&mut down[at..at + len * 4])[..len]);
        }
        Ok(())
    }
}

/// `bytes` as plain words (`f32` or `u64`): the regions' sections start 256-aligned in a
/// page-aligned allocation, so the cast never has a misaligned head.
fn as_words<T: Copy>(bytes: &mut [u8]) -> &mut [T] {
    // SAFETY: f32 and u64 are valid for every bit pattern; `align_to_mut` only reinterprets
    // the aligned middle, and the assertion rejects a misaligned start.
    let (head, words, _) = unsafe { bytes.align_to_mut::<T>() };
    assert!(head.is_empty(), "scratch sections are word-aligned");
    words
}
