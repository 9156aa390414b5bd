//! The RSS guard: measured memory is the final word on the budget. Above
//! `budget × 1.02 + 300 MB` the coldest LRU slots are evicted and every layer's capacity is
//! lowered for the life of the process (a guard whose reductions refill would not be a guard).
use crate::error::Result;
use crate::residency::Residency;

/// Slack over the budget before the guard acts: 2 % plus 300 MB.
pub fn threshold(budget: u64) -> u64 {
    budget + budget / 50 + 300_000_000
}

/// The process's resident set size in bytes (Linux: `/proc/self/statm`; macOS:
/// `proc_pid_rusage`; `None` elsewhere or when unreadable).
pub fn rss_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let s = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
        // SAFETY: sysconf with a valid name has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Some(pages * page.max(4096) as u64)
    }
    #[cfg(target_os = "macos")]
    {
        // `proc_pid_rusage` rather than `task_info(mach_task_self())`: libc deprecates its Mach
        // task port accessor, and the rusage record carries the same resident size.
        let mut info = std::mem::MaybeUninit::<libc::rusage_info_v2>::zeroed();
        // SAFETY: `info` is a writable rusage_info_v2, the record RUSAGE_INFO_V2 asks the
        // kernel to fill; the call writes at most that many bytes and only reads our pid.
        let rc = unsafe {
            libc::proc_pid_rusage(
                libc::getpid(),
                libc::RUSAGE_INFO_V2,
                info.as_mut_ptr().cast::<libc::rusage_info_t>(),
            )
        };
        // SAFETY: rc == 0 means the kernel filled the record; zeroed bytes are a valid value
        // of this plain-integer struct either way.
        (rc == 0).then(|| unsafe { info.assume_init() }.ri_resident_size)
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        None
    }
}

/// Watches RSS against a budget and shrinks the expert cache when it is exceeded.
pub struct RssGuard {
    budget: u64,
    sample: Box<dyn Fn() -> Option<u64> + Send + Sync>,
    /// Times the guard shrank the cache.
    pub events: u64,
}

impl std::fmt::Debug for RssGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RssGuard(budget {}, events {})",
            self.budget, self.events
        )
    }
}

impl RssGuard {
    /// A guard for `budget` bytes using the process RSS.
    pub fn new(budget: u64) -> Self {
        Self::with_sampler(budget, Box::new(rss_bytes))
    }

    /// A guard with a custom sampler (tests inject readings).
    pub fn with_sampler(budget: u64, sample: Box<dyn Fn() -> Option<u64> + Send + Sync>) -> Self {
        RssGuard {
            budget,
            sample,
            events: 0,
        }
    }

    /// Checks at a safe point (no leases alive). When RSS is above the threshold, evicts enough
    /// LRU slots to cover the excess (at least one per layer), lowering capacity permanently.
    /// Returns the number of experts evicted.
    pub fn check(&mut self, res: &Residency, layers: usize) -> Result<usize> {
        let Some(rss) = (self.sample)() else {
            return Ok(0);
        };
        let limit = threshold(self.budget);
        if rss <= limit {
            return Ok(0);
        }
        let excess = rss - limit;
        let per_slot_row = (res.slot_bytes() as u64).max(1) * layers.max(1) as u64;
        let drop = excess.div_ceil(per_slot_row).max(1) as usize;
        let cap = (0..layers).map(|l| res.capacity(l)).max().unwrap_or(0);
        let n = res.shrink_all(cap.saturating_sub(drop))?;
        self.events += 1;
        eprintln!(
            "warning: RSS {} MB is above the budget threshold {} MB: evicted {n} experts, LRU capacity now {} per layer",
            rss / 1_000_000,
            limit / 1_000_000,
            cap.saturating_sub(drop)
        );
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real sampler sees memory we touch: 64 MiB written page by page raises RSS by about
    /// that much (where the platform has a sampler).
    #[test]
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    fn rss_sampler_sees_touched_memory() {
        let before = rss_bytes().expect("RSS is readable on this platform");
        assert!(
            before > 1 << 20,
            "a running test process holds more than 1 MiB"
        );
        let mut buf = vec![0u8; 64 << 20];
        for i in (0..buf.len()).step_by(4096) {
            buf[i] = 1;
        }
        let after = rss_bytes().unwrap();
        std::hint::black_box(&buf);
        // Other test threads may free memory meanwhile: ask for most of the 64 MiB, not all.
        assert!(
            after >= before + (48 << 20),
            "RSS {before} -> {after} after touching 64 MiB"
        );
    }
}
