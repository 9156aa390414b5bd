//! What memory this process may still take: `MemAvailable` and, when the process runs in a
//! memory cgroup (v1 or v2), that cgroup's limit minus its usage. Containers and systemd units
//! set `memory.max` far below the machine's free memory; planning from `MemAvailable` alone is
//! a known cause of OOM kills in peers, so every reader here answers with the smaller.
//!
//! The cgroup side lives in [`crate::cgroup`]; this module combines it with `/proc/meminfo`.
pub use crate::cgroup::CgroupMemory;

/// The machine's and the cgroup's view of free memory at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryView {
    /// `MemTotal` (bytes).
    pub total: Option<u64>,
    /// `MemAvailable` (bytes).
    pub available: Option<u64>,
    /// The process's memory cgroup, when it has a limit.
    pub cgroup: Option<CgroupMemory>,
}

impl MemoryView {
    /// Reads `/proc/meminfo` and the process's memory cgroup (Linux; empty elsewhere).
    pub fn read() -> MemoryView {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        MemoryView {
            total: meminfo_bytes(&meminfo, "MemTotal"),
            available: meminfo_bytes(&meminfo, "MemAvailable"),
            cgroup: crate::cgroup::current(),
        }
    }

    /// Bytes the process may still take: the smaller of `MemAvailable` and the cgroup's
    /// headroom (`None` when neither is known).
    pub fn headroom(&self) -> Option<u64> {
        match (
            self.available,
            self.cgroup.as_ref().and_then(|c| c.headroom()),
        ) {
            (Some(a), Some(c)) => Some(a.min(c)),
            (a, c) => a.or(c),
        }
    }

    /// The memory the machine has for this process at most: the smaller of `MemTotal` and the
    /// cgroup limit.
    pub fn ceiling(&self) -> Option<u64> {
        match (self.total, self.cgroup.as_ref().and_then(|c| c.limit)) {
            (Some(t), Some(c)) => Some(t.min(c)),
            (t, c) => t.or(c),
        }
    }
}

/// A `Key:   123 kB` line of /proc/meminfo, in bytes.
pub fn meminfo_bytes(meminfo: &str, key: &str) -> Option<u64> {
    let rest = meminfo.lines().find_map(|l| {
        l.strip_prefix(key)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::trim)
    })?;
    let kib: u64 = rest.trim_end_matches("kB").trim().parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_lines_parse_to_bytes() {
        let m = "MemTotal:       24000000 kB\nMemFree: 1 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(meminfo_bytes(m, "MemTotal"), Some(24_000_000 * 1024));
        assert_eq!(meminfo_bytes(m, "MemAvailable"), Some(20_000_000 * 1024));
        assert_eq!(meminfo_bytes(m, "Mem"), None, "a prefix is not a key");
        assert_eq!(meminfo_bytes("MemTotal: x kB", "MemTotal"), None);
    }

    #[test]
    fn headroom_is_the_smaller_view() {
        let v = MemoryView {
            total: Some(100),
            available: Some(80),
            cgroup: Some(CgroupMemory {
                version: 2,
                dir: "/sys/fs/cgroup/app".into(),
                limit: Some(50),
                usage: Some(40),
                reclaimable: 5,
            }),
        };
        assert_eq!(v.headroom(), Some(15));
        assert_eq!(v.ceiling(), Some(50));
        let none = MemoryView::default();
        assert_eq!(none.headroom(), None);
    }

    #[test]
    fn this_machine_reads() {
        // On Linux MemAvailable always exists; the cgroup may or may not have a limit.
        #[cfg(target_os = "linux")]
        {
            let v = MemoryView::read();
            assert!(v.available.is_some() && v.total.is_some(), "{v:?}");
            assert!(v.headroom().unwrap() <= v.total.unwrap());
        }
    }
}
