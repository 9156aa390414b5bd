//! What memory this process may still take: `MemAvailable` and, when the process runs in a
//! memory cgroup (v1 or v2), that cgroup's limit minus its usage. Containers and systemd units
//! set `memory.max` far below the machine's free memory; planning from `MemAvailable` alone is
//! a known cause of OOM kills in peers, so every reader here answers with the smaller.
//!
//! The parsers take file text, so they are tested on crafted files; [`MemoryView::read`]
//! wires them to `/proc` and `/sys/fs/cgroup`.
use std::path::{Path, PathBuf};

/// A memory cgroup's accounting, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupMemory {
    /// The limit (`memory.max` / `memory.limit_in_bytes`).
    pub limit: u64,
    /// Current usage, page cache included (`memory.current` / `memory.usage_in_bytes`).
    pub usage: u64,
    /// Inactive file pages: page cache the kernel reclaims before it kills anything.
    pub inactive_file: u64,
}

impl CgroupMemory {
    /// Bytes the cgroup can still give before its limit: free plus reclaimable cache.
    pub fn headroom(&self) -> u64 {
        self.limit
            .saturating_sub(self.usage)
            .saturating_add(self.inactive_file)
            .min(self.limit)
    }
}

/// The machine's and the cgroup's view of free memory at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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
            cgroup: own_cgroup(Path::new("/")),
        }
    }

    /// Bytes the process may still take: the smaller of `MemAvailable` and the cgroup's
    /// headroom (`None` when neither is known).
    pub fn headroom(&self) -> Option<u64> {
        match (self.available, self.cgroup.map(|c| c.headroom())) {
            (Some(a), Some(c)) => Some(a.min(c)),
            (a, c) => a.or(c),
        }
    }

    /// The memory the machine has for this process at most: the smaller of `MemTotal` and the
    /// cgroup limit.
    pub fn ceiling(&self) -> Option<u64> {
        match (self.total, self.cgroup.map(|c| c.limit)) {
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

/// A limit file's value: a byte count, or `None` for "max" and for v1's "unlimited" (a value
/// near `i64::MAX` rounded down to a page).
pub fn parse_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    let v: u64 = t.parse().ok()?;
    (v < 1 << 62).then_some(v)
}

/// A `memory.stat` field (v2 `inactive_file`, v1 `total_inactive_file`).
pub fn stat_field(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Where the process's memory cgroup lives, from `/proc/self/cgroup` and
/// `/proc/self/mountinfo`: the v2 directory (`0::/path` under a cgroup2 mount) or the v1
/// memory controller's (`N:memory:/path` under a cgroup mount with the `memory` option).
/// Each candidate as (directory, its mount point, version 2 or 1), v2 first.
pub fn cgroup_dirs(proc_cgroup: &str, mountinfo: &str) -> Vec<(PathBuf, PathBuf, u8)> {
    let mut out = Vec::new();
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let v2 = ctrl.is_empty();
        if !v2 && !ctrl.split(',').any(|c| c == "memory") {
            continue;
        }
        for m in mountinfo.lines() {
            // `id parent maj:min root mountpoint opts [optional...] - fstype source superopts`
            let Some((pre, post)) = m.split_once(" - ") else {
                continue;
            };
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            let (Some(&root), Some(&mnt), Some(&fstype)) = (pre.get(3), pre.get(4), post.first())
            else {
                continue;
            };
            let matches = if v2 {
                fstype == "cgroup2"
            } else {
                fstype == "cgroup"
                    && post
                        .get(2)
                        .is_some_and(|o| o.split(',').any(|c| c == "memory"))
            };
            if !matches {
                continue;
            }
            // The mount shows `root` of the hierarchy; the process's path is relative to it.
            let rel = path
                .strip_prefix(root)
                .unwrap_or(path)
                .trim_start_matches('/');
            out.push((Path::new(mnt).join(rel), mnt.into(), if v2 { 2 } else { 1 }));
        }
    }
    out.sort_by_key(|(_, _, v)| std::cmp::Reverse(*v));
    out
}

/// The accounting of the innermost limited cgroup at `dir` or above it (up to the `mount`
/// point): a limit on a parent binds the child too.
pub fn read_cgroup(dir: &Path, mount: &Path, version: u8) -> Option<CgroupMemory> {
    let (limit_f, usage_f, inactive_key) = match version {
        2 => ("memory.max", "memory.current", "inactive_file"),
        _ => (
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
            "total_inactive_file",
        ),
    };
    let read = |d: &Path, f: &str| std::fs::read_to_string(d.join(f)).ok();
    let mut d = dir.to_path_buf();
    while d.starts_with(mount) {
        if let Some(limit) = read(&d, limit_f).as_deref().and_then(parse_limit) {
            let usage = read(&d, usage_f)?.trim().parse().ok()?;
            let inactive_file = read(&d, "memory.stat")
                .as_deref()
                .and_then(|s| stat_field(s, inactive_key))
                .unwrap_or(0);
            return Some(CgroupMemory {
                limit,
                usage,
                inactive_file,
            });
        }
        if !d.pop() {
            break;
        }
    }
    None
}

/// The process's limited memory cgroup, reading `/proc/self/*` under `root` (tests pass a
/// crafted tree).
fn own_cgroup(root: &Path) -> Option<CgroupMemory> {
    let text = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_default();
    let dirs = cgroup_dirs(&text("proc/self/cgroup"), &text("proc/self/mountinfo"));
    let under = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    dirs.into_iter()
        .find_map(|(dir, mount, v)| read_cgroup(&under(&dir), &under(&mount), v))
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
    fn limits_parse_and_unlimited_is_none() {
        assert_eq!(parse_limit("1073741824\n"), Some(1 << 30));
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712"), None, "v1 unlimited");
        assert_eq!(parse_limit("garbage"), None);
    }

    #[test]
    fn stat_fields_match_whole_keys() {
        let s = "active_file 5\ninactive_file 7\ntotal_inactive_file 9\n";
        assert_eq!(stat_field(s, "inactive_file"), Some(7));
        assert_eq!(stat_field(s, "total_inactive_file"), Some(9));
        assert_eq!(stat_field(s, "file"), None);
    }

    #[test]
    fn cgroup_dirs_follow_the_mount_table() {
        let v1 = "4:memory:/process_api/abc\n3:cpuset:/\n0::/\n";
        let mounts = "\
30 25 0:26 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 25 0:30 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        let d = cgroup_dirs(v1, mounts);
        assert_eq!(
            d,
            vec![
                (
                    PathBuf::from("/sys/fs/cgroup/unified"),
                    PathBuf::from("/sys/fs/cgroup/unified"),
                    2
                ),
                (
                    PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"),
                    PathBuf::from("/sys/fs/cgroup/memory"),
                    1
                ),
            ]
        );
        // A container whose cgroup namespace root is the mount's root.
        let v2 = "0::/user.slice/app.scope\n";
        let m2 = "50 1 0:40 /user.slice /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup_dirs(v2, m2),
            vec![(
                PathBuf::from("/sys/fs/cgroup/app.scope"),
                PathBuf::from("/sys/fs/cgroup"),
                2
            )]
        );
    }

    #[test]
    fn the_innermost_limited_cgroup_wins_and_parents_bind() {
        let root = tempfile::tempdir().unwrap();
        let put = |p: &str, s: &str| {
            let p = root.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, s).unwrap();
        };
        put("proc/self/cgroup", "0::/app/worker\n");
        put(
            "proc/self/mountinfo",
            "50 1 0:40 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        );
        // The worker has no limit of its own; its parent does.
        put("sys/fs/cgroup/app/worker/memory.max", "max\n");
        put("sys/fs/cgroup/app/memory.max", "1000000\n");
        put("sys/fs/cgroup/app/memory.current", "900000\n");
        put(
            "sys/fs/cgroup/app/memory.stat",
            "anon 1\ninactive_file 50000\n",
        );
        let c = own_cgroup(root.path()).expect("the parent's limit binds");
        assert_eq!(
            c,
            CgroupMemory {
                limit: 1_000_000,
                usage: 900_000,
                inactive_file: 50_000
            }
        );
        assert_eq!(c.headroom(), 150_000);
        // With a limit on the worker itself, that one is read.
        put("sys/fs/cgroup/app/worker/memory.max", "500000\n");
        put("sys/fs/cgroup/app/worker/memory.current", "100000\n");
        assert_eq!(own_cgroup(root.path()).unwrap().headroom(), 400_000);
    }

    #[test]
    fn headroom_is_the_smaller_view() {
        let v = MemoryView {
            total: Some(100),
            available: Some(80),
            cgroup: Some(CgroupMemory {
                limit: 50,
                usage: 40,
                inactive_file: 5,
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
