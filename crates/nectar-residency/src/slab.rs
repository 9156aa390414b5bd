//! One fixed allocation of equally sized, 4 KiB-aligned slots (O_DIRECT needs aligned
//! buffers), made once at startup and never grown.
//!
//! A slab of 2 MiB or more is 2 MiB-aligned and asks for transparent huge pages
//! (`madvise(MADV_HUGEPAGE)`, before its pages are first touched): a direct read into
//! physically contiguous memory leaves as a few large requests, while a buffer of scattered
//! 4 KiB pages is split by the block layer (a virtio disk with 254 segments per request gets
//! 1 MiB requests: 1.1–1.2 GB/s instead of 3.1 GB/s measured by `nectar bench io`).
use std::alloc::{alloc, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment of every slot (and of O_DIRECT transfers).
pub const ALIGN: usize = 4096;

/// Alignment (and huge-page size) of slabs of at least this many bytes.
pub const HUGE_PAGE: usize = 2 << 20;

/// Bytes of `[start, start + len)` that transparent huge pages back (`AnonHugePages` of the
/// mappings it overlaps in `/proc/self/smaps`); `None` where that is not known (not Linux, an
/// unreadable smaps). Whether the kernel granted the advice decides the read speed.
pub fn huge_page_bytes(start: *const u8, len: usize) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    anon_huge_bytes(&smaps, start as u64, len as u64)
}

/// [`huge_page_bytes`] on the text of an smaps file. smaps counts whole mappings, so a range
/// sharing its mapping is credited at most its own length.
fn anon_huge_bytes(smaps: &str, start: u64, len: u64) -> Option<u64> {
    let end = start + len;
    let (mut total, mut inside) = (0u64, false);
    for line in smaps.lines() {
        let range = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = range.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                inside = a < end && b > start;
                continue;
            }
        }
        if let (true, Some(kb)) = (inside, line.strip_prefix("AnonHugePages:")) {
            total += kb
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()?
                << 10;
        }
    }
    Some(total.min(len))
}

/// A slab of `n` slots of `slot_bytes` each.
#[derive(Debug)]
pub struct Slab {
    ptr: NonNull<u8>,
    layout: Layout,
    slot_bytes: usize,
    n: usize,
}

// SAFETY: the slab is a plain byte buffer. Concurrent access to distinct slots is coordinated by
// the residency manager (a slot is written only by the one I/O job that owns it while no lease
// exists, and read only under leases), so sharing the pointer across threads is sound.
unsafe impl Send for Slab {}
// SAFETY: see `Send`; `&Slab` only hands out raw slot pointers, never references.
unsafe impl Sync for Slab {}

impl Slab {
    /// Allocates `n` slots of at least `slot_bytes` (rounded up to [`ALIGN`]).
    pub fn new(n: usize, slot_bytes: usize) -> Option<Slab> {
        let slot_bytes = slot_bytes.max(1).div_ceil(ALIGN) * ALIGN;
        let total = slot_bytes.checked_mul(n.max(1))?;
        let align = if total >= HUGE_PAGE { HUGE_PAGE } else { ALIGN };
        let layout = Layout::from_size_align(total, align).ok()?;
        // SAFETY: `layout` has a non-zero size (n.max(1) × slot_bytes ≥ 4096).
        let ptr = NonNull::new(unsafe { alloc(layout) })?;
        #[cfg(target_os = "linux")]
        if align == HUGE_PAGE {
            // SAFETY: advice on memory this function owns and has not touched yet; a refusal
            // (THP off, old kernel) leaves ordinary pages and is harmless.
            unsafe {
                libc::madvise(
                    ptr.as_ptr() as *mut libc::c_void,
                    total,
                    libc::MADV_HUGEPAGE,
                )
            };
        }
        // SAFETY: `ptr` is valid for `total` bytes and not shared yet. Zeroing touches every
        // page now (after the advice), so the slab is resident from the start, as budgeted.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, total) };
        Some(Slab {
            ptr,
            layout,
            slot_bytes,
            n,
        })
    }

    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.n
    }

    /// True when the slab has no slot.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Total bytes allocated.
    pub fn bytes(&self) -> usize {
        self.layout.size()
    }

    /// Bytes of the slab on transparent huge pages (see [`huge_page_bytes`]).
    pub fn huge_page_bytes(&self) -> Option<u64> {
        huge_page_bytes(self.ptr.as_ptr(), self.layout.size())
    }

    /// Raw pointer to the start of the allocation (slot 0's, when there is one).
    pub fn base_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Raw pointer to the start of slot `i`.
    ///
    /// # Panics
    /// If `i` is out of range (a caller bug).
    pub fn slot_ptr(&self, i: usize) -> *mut u8 {
        assert!(i < self.n, "slot {i} out of range ({} slots)", self.n);
        // SAFETY: i < n, so the offset stays inside the allocation.
        unsafe { self.ptr.as_ptr().add(i * self.slot_bytes) }
    }

    /// Slot `i` as a shared slice.
    ///
    /// # Safety
    /// No one may write slot `i` while the returned slice is alive (the manager guarantees it
    /// with leases: a slot with a live lease is never handed to an I/O job).
    pub unsafe fn slot(&self, i: usize) -> &[u8] {
        // SAFETY: in bounds by `slot_ptr`; aliasing per the caller's contract.
        unsafe { std::slice::from_raw_parts(self.slot_ptr(i), self.slot_bytes) }
    }

    /// Slot `i` as a mutable slice.
    ///
    /// # Safety
    /// The caller must be the only one accessing slot `i` (an I/O job owning a working slot).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slot_mut(&self, i: usize) -> &mut [u8] {
        // SAFETY: in bounds by `slot_ptr`; exclusivity per the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.slot_ptr(i), self.slot_bytes) }
    }

    /// Gives slot `i`'s pages back to the operating system, so the resident set falls now
    /// (Linux `MADV_DONTNEED`; macOS `MADV_FREE`, reclaimed under pressure). The slot stays
    /// valid: the next write (an I/O job filling it) faults fresh zeroed pages in. A locked slab
    /// is unlocked over the slot first (locked pages cannot be dropped). Returns whether the OS
    /// took the advice; `false` costs nothing but the memory.
    ///
    /// Call only for a slot nobody reads or writes (the residency manager releases slots it has
    /// just taken out of service, at a safe point).
    pub fn release(&self, i: usize) -> bool {
        let (ptr, len) = (self.slot_ptr(i), self.slot_bytes);
        #[cfg(target_os = "linux")]
        {
            // SAFETY: `[ptr, ptr + len)` lies inside this allocation and is page-aligned
            // (slots are ALIGN-sized multiples of 4 KiB); nobody accesses the slot (caller's
            // contract), and DONTNEED only replaces its contents with zero pages. munlock of an
            // unlocked range is a no-op.
            unsafe {
                libc::munlock(ptr as *const libc::c_void, len);
                libc::madvise(ptr as *mut libc::c_void, len, libc::MADV_DONTNEED) == 0
            }
        }
        #[cfg(target_os = "macos")]
        {
            // SAFETY: as on Linux; MADV_FREE lets the kernel take the pages lazily.
            unsafe {
                libc::munlock(ptr as *const libc::c_void, len);
                libc::madvise(ptr as *mut libc::c_void, len, libc::MADV_FREE) == 0
            }
        }
        #[cfg(not(any(target_os = "linux", target_os = "macos")))]
        {
            let _ = (ptr, len);
            false
        }
    }

    /// Locks every slot in RAM (`mlock`), so the OS can neither swap nor compress them.
    #[cfg(unix)]
    pub fn mlock(&self) -> std::io::Result<()> {
        // SAFETY: the range is exactly this allocation.
        let rc =
            unsafe { libc::mlock(self.ptr.as_ptr() as *const libc::c_void, self.layout.size()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_aligned_disjoint_and_zeroed() {
        let s = Slab::new(3, 5000).unwrap();
        assert_eq!(s.slot_bytes(), 8192);
        for i in 0..3 {
            assert_eq!(s.slot_ptr(i) as usize % ALIGN, 0);
            // SAFETY: single-threaded test, no other access.
            unsafe {
                assert!(s.slot(i).iter().all(|b| *b == 0));
                s.slot_mut(i).fill(i as u8 + 1);
            }
        }
        // SAFETY: as above.
        unsafe {
            assert!(s.slot(1).iter().all(|b| *b == 2));
        }
    }

    #[test]
    fn smaps_huge_pages_are_summed_over_the_overlapping_mappings() {
        let smaps = "\
7f0000000000-7f0000400000 rw-p 00000000 00:00 0
Size:               4096 kB
AnonHugePages:      2048 kB
7f0000400000-7f0000800000 rw-p 00000000 00:00 0
AnonHugePages:      4096 kB
7f0000800000-7f0000a00000 rw-p 00000000 00:00 0 [heap]
AnonHugePages:      2048 kB
";
        let (base, mib) = (0x7f00_0000_0000u64, 1u64 << 20);
        // The first two mappings overlap [base + 1 MiB, base + 6 MiB); the third does not.
        assert_eq!(anon_huge_bytes(smaps, base + mib, 5 * mib), Some(5 * mib));
        assert_eq!(anon_huge_bytes(smaps, base, 8 * mib), Some(6 * mib));
        assert_eq!(anon_huge_bytes(smaps, base + 8 * mib, mib), Some(mib));
        assert_eq!(anon_huge_bytes(smaps, base + 16 * mib, mib), Some(0));
        assert_eq!(
            anon_huge_bytes("1000-2000 r\nAnonHugePages: x kB\n", 0x1000, 1),
            None
        );
    }

    /// Released slots leave the resident set and come back zeroed and writable.
    #[test]
    #[cfg(target_os = "linux")]
    fn released_slots_leave_the_resident_set() {
        let s = Slab::new(8, 4 << 20).unwrap();
        // SAFETY: single-threaded test, no other access.
        unsafe { (0..8).for_each(|i| s.slot_mut(i).fill(7)) };
        let before = crate::rss::rss_bytes().unwrap();
        assert!((0..6).all(|i| s.release(i)));
        let after = crate::rss::rss_bytes().unwrap();
        // 24 MiB released; other test threads allocate meanwhile, so ask for most of it.
        assert!(
            before >= after + (16 << 20),
            "RSS {before} -> {after} after releasing 24 MiB"
        );
        // SAFETY: as above.
        unsafe {
            assert!(
                s.slot(0).iter().all(|b| *b == 0),
                "released pages read as zeros"
            );
            assert!(
                s.slot(7).iter().all(|b| *b == 7),
                "other slots keep their bytes"
            );
            s.slot_mut(0).fill(3);
            assert!(
                s.slot(0).iter().all(|b| *b == 3),
                "a released slot is writable"
            );
        }
    }

    #[test]
    fn large_slabs_are_huge_page_aligned_and_zeroed() {
        let s = Slab::new(3, 3 << 20).unwrap();
        assert_eq!(s.slot_ptr(0) as usize % HUGE_PAGE, 0);
        assert_eq!(s.bytes(), 9 << 20);
        // On Linux the process's own smaps is read (the kernel may grant none of it).
        assert_eq!(s.huge_page_bytes().is_some(), cfg!(target_os = "linux"));
        // SAFETY: single-threaded test, no other access.
        unsafe {
            assert!((0..3).all(|i| s.slot(i).iter().all(|b| *b == 0)));
        }
    }
}
