//! The memory cgroup this process runs in (v1 or v2): its limit, what it uses and what of that
//! the kernel can reclaim, so a plan starts from what the cgroup leaves, not from the host's
//! MemAvailable (which a container cannot see past).
//!
//! The cgroup is found from `/proc/self/cgroup` (v1: the line whose controllers include
//! `memory`; v2: the `0::` line) and `/proc/self/mountinfo` (where that hierarchy is mounted and
//! which of its paths the mount shows). Limits are hierarchical, so the smallest limit from the
//! process's cgroup up to the mount's root applies.
use std::path::{Path, PathBuf};

/// v1 writes "no limit" as a page-rounded `i64::MAX`; anything this large is unlimited.
const V1_UNLIMITED: u64 = 1 << 62;

/// A memory cgroup's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMemory {
    /// 1 or 2.
    pub version: u8,
    /// The cgroup's directory.
    pub dir: PathBuf,
    /// The smallest limit on the way to the root (None: unlimited).
    pub limit: Option<u64>,
    /// Bytes charged to the cgroup now (page cache included).
    pub usage: Option<u64>,
    /// File cache among `usage` that no process maps (or, where that is not reported, the
    /// inactive file cache): the kernel drops it before it OOM-kills, and nothing waits on it.
    /// A process that read its model through the page cache is charged for those pages.
    pub reclaimable: u64,
}

impl CgroupMemory {
    /// What the cgroup still lets this process allocate: limit − (usage − reclaimable).
    pub fn headroom(&self) -> Option<u64> {
        let used = self.usage?.saturating_sub(self.reclaimable);
        self.limit.map(|l| l.saturating_sub(used))
    }
}

/// One cgroup mount of `/proc/self/mountinfo`: its root within the hierarchy, where it is
/// mounted, its filesystem type and super options.
struct Mount<'a> {
    root: &'a str,
    point: &'a str,
    fstype: &'a str,
    opts: &'a str,
}

fn mounts(mountinfo: &str) -> Vec<Mount<'_>> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split_whitespace().collect();
            let mut post = post.split_whitespace();
            let fstype = post.next()?;
            let _source = post.next()?;
            Some(Mount {
                root: pre.get(3)?,
                point: pre.get(4)?,
                fstype,
                opts: post.next().unwrap_or(""),
            })
        })
        .filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2")
        .collect()
}

/// The cgroup's directory under a mount: its path relative to the mount's root (a namespaced
/// container mounts its own cgroup as root and may still see the host path).
fn cgroup_dir(m: &Mount<'_>, path: &str) -> PathBuf {
    let rel = path.strip_prefix(m.root).unwrap_or(path);
    let dir = Path::new(m.point).join(rel.trim_start_matches('/'));
    if dir.is_dir() {
        dir
    } else {
        PathBuf::from(m.point)
    }
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// A `memory.stat` field.
fn stat_field(dir: &Path, field: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join("memory.stat"))
        .ok()?
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == field).then(|| v.trim().parse().ok())?
        })
}

/// `memory.stat`'s file cache less its mapped and shared-memory parts (`None` when a field
/// is missing).
fn unmapped_cache(dir: &Path, cache: &str, mapped: &str, shmem: &str) -> Option<u64> {
    let c = stat_field(dir, cache)?;
    let m = stat_field(dir, mapped)?;
    let s = stat_field(dir, shmem).unwrap_or(0);
    Some(c.saturating_sub(m).saturating_sub(s))
}

/// The smallest limit from `dir` up to `top` (inclusive), reading `file` with `parse`.
fn min_limit(
    dir: &Path,
    top: &Path,
    file: &str,
    parse: impl Fn(&str) -> Option<u64>,
) -> Option<u64> {
    let mut best: Option<u64> = None;
    let mut d = Some(dir);
    while let Some(x) = d {
        if let Some(v) = std::fs::read_to_string(x.join(file))
            .ok()
            .and_then(|t| parse(t.trim()))
        {
            best = Some(best.map_or(v, |b| b.min(v)));
        }
        if x == top {
            break;
        }
        d = x.parent().filter(|p| p.starts_with(top));
    }
    best
}

/// Where a memory cgroup is: its version, its directory, and the top of its hierarchy as this
/// process sees it (limits are read from `dir` up to `top`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Location {
    version: u8,
    dir: PathBuf,
    top: PathBuf,
}

/// The memory cgroup named by a `/proc/self/cgroup` and a `/proc/self/mountinfo` text. v1's
/// memory controller wins when both are mounted: it is the one that enforces then.
fn locate(proc_cgroup: &str, mountinfo: &str) -> Option<Location> {
    let ms = mounts(mountinfo);
    let mut v1_path = None;
    let mut v2_path = None;
    for l in proc_cgroup.lines() {
        let mut f = l.splitn(3, ':');
        let (Some(id), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if id == "0" && ctrl.is_empty() {
            v2_path = Some(path);
        } else if ctrl.split(',').any(|c| c == "memory") {
            v1_path = Some(path);
        }
    }
    if let Some(path) = v1_path {
        if let Some(m) = ms
            .iter()
            .find(|m| m.fstype == "cgroup" && m.opts.split(',').any(|o| o == "memory"))
        {
            return Some(Location {
                version: 1,
                dir: cgroup_dir(m, path),
                top: PathBuf::from(m.point),
            });
        }
    }
    let path = v2_path?;
    let m = ms.iter().find(|m| m.fstype == "cgroup2")?;
    Some(Location {
        version: 2,
        dir: cgroup_dir(m, path),
        top: PathBuf::from(m.point),
    })
}

/// The figures of the cgroup at `loc` now.
fn read_at(loc: &Location) -> CgroupMemory {
    let dir = &loc.dir;
    if loc.version == 1 {
        let limit = min_limit(dir, &loc.top, "memory.limit_in_bytes", |t| {
            t.parse::<u64>().ok().filter(|&v| v < V1_UNLIMITED)
        });
        CgroupMemory {
            version: 1,
            limit,
            usage: read_u64(&dir.join("memory.usage_in_bytes")),
            reclaimable: unmapped_cache(dir, "total_cache", "total_mapped_file", "total_shmem")
                .or_else(|| stat_field(dir, "total_inactive_file"))
                .or_else(|| stat_field(dir, "inactive_file"))
                .unwrap_or(0),
            dir: dir.clone(),
        }
    } else {
        CgroupMemory {
            version: 2,
            limit: min_limit(dir, &loc.top, "memory.max", |t| t.parse().ok()),
            usage: read_u64(&dir.join("memory.current")),
            reclaimable: unmapped_cache(dir, "file", "file_mapped", "shmem")
                .or_else(|| stat_field(dir, "inactive_file"))
                .unwrap_or(0),
            dir: dir.clone(),
        }
    }
}

/// The memory cgroup described by a `/proc/self/cgroup` and a `/proc/self/mountinfo` text
/// (files are read from the mount points these name).
pub fn from_texts(proc_cgroup: &str, mountinfo: &str) -> Option<CgroupMemory> {
    locate(proc_cgroup, mountinfo).map(|l| read_at(&l))
}

/// Times this process located its cgroup (parsed `/proc/self/cgroup` and `mountinfo`).
static LOCATED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// This process's memory cgroup (None: not Linux, or no memory controller mounted). The
/// cgroup is located once per process — the guard reads memory many times a second, and a
/// process does not change cgroups under a running model — then only its figures are read.
pub fn current() -> Option<CgroupMemory> {
    static LOCATION: std::sync::OnceLock<Option<Location>> = std::sync::OnceLock::new();
    LOCATION
        .get_or_init(|| {
            LOCATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let c = std::fs::read_to_string("/proc/self/cgroup").ok()?;
            let m = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
            locate(&c, &m)
        })
        .as_ref()
        .map(read_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(p: &Path, s: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    }

    #[test]
    fn v2_limit_is_the_smallest_on_the_way_up() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("cg2");
        write(&root.join("memory.max"), "max\n");
        write(&root.join("user/memory.max"), "8589934592\n");
        write(&root.join("user/job/memory.max"), "max\n");
        write(&root.join("user/job/memory.current"), "3221225472\n");
        write(
            &root.join("user/job/memory.stat"),
            "anon 2147483648\ninactive_file 1073741824\nactive_file 5\n",
        );
        let mi = format!(
            "30 23 0:26 / {} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n\
             31 23 0:27 / /proc rw - proc proc rw\n",
            root.display()
        );
        let c = from_texts("0::/user/job\n", &mi).unwrap();
        assert_eq!(c.version, 2);
        assert_eq!(c.limit, Some(8 << 30));
        assert_eq!(c.usage, Some(3 << 30));
        assert_eq!(c.reclaimable, 1 << 30);
        // 8 GiB − (3 GiB used − 1 GiB reclaimable).
        assert_eq!(c.headroom(), Some(6 << 30));
    }

    /// File cache no process maps is reclaimable whether the kernel has aged it to the
    /// inactive list or not: a model read through the page cache must not shrink the plan.
    #[test]
    fn unmapped_file_cache_is_reclaimable() {
        let d = tempfile::tempdir().unwrap();
        write(&d.path().join("memory.max"), "40000000\n");
        write(&d.path().join("memory.current"), "30000000\n");
        write(
            &d.path().join("memory.stat"),
            "anon 12000000\nfile 18000000\nfile_mapped 8000000\nshmem 1000000\ninactive_file 2000000\n",
        );
        let mi = format!(
            "30 23 0:26 / {} rw - cgroup2 cgroup2 rw\n",
            d.path().display()
        );
        let c = from_texts("0::/\n", &mi).unwrap();
        assert_eq!(c.reclaimable, 9_000_000);
        assert_eq!(c.headroom(), Some(19_000_000));
    }

    #[test]
    fn v2_unlimited_has_no_headroom_figure() {
        let d = tempfile::tempdir().unwrap();
        write(&d.path().join("memory.max"), "max\n");
        write(&d.path().join("memory.current"), "100\n");
        let mi = format!(
            "30 23 0:26 / {} rw - cgroup2 cgroup2 rw\n",
            d.path().display()
        );
        let c = from_texts("0::/\n", &mi).unwrap();
        assert_eq!((c.limit, c.headroom()), (None, None));
    }

    #[test]
    fn v1_memory_controller_wins_and_its_unlimited_marker_is_no_limit() {
        let d = tempfile::tempdir().unwrap();
        let mem = d.path().join("memory");
        write(&mem.join("memory.limit_in_bytes"), "9223372036854771712\n");
        write(
            &mem.join("docker/abc/memory.limit_in_bytes"),
            "4294967296\n",
        );
        write(
            &mem.join("docker/abc/memory.usage_in_bytes"),
            "1073741824\n",
        );
        write(
            &mem.join("docker/abc/memory.stat"),
            "cache 5\ntotal_inactive_file 536870912\n",
        );
        let v2 = d.path().join("unified");
        write(&v2.join("memory.max"), "1\n");
        let mi = format!(
            "35 31 0:32 / {} rw,relatime - cgroup cgroup rw,memory\n\
             36 31 0:33 / {}/cpu rw,relatime - cgroup cgroup rw,cpu\n\
             41 31 0:38 / {} rw,relatime - cgroup2 cgroup2 rw\n",
            mem.display(),
            d.path().display(),
            v2.display()
        );
        let pc = "4:memory:/docker/abc\n1:cpu:/\n0::/\n";
        let c = from_texts(pc, &mi).unwrap();
        assert_eq!(c.version, 1);
        assert_eq!(c.limit, Some(4 << 30));
        assert_eq!(c.headroom(), Some((4 << 30) - (1 << 30) + (512 << 20)));
        // The host's "unlimited" marker alone is no limit.
        let c = from_texts("4:memory:/\n", &mi).unwrap();
        assert_eq!(c.limit, None);
    }

    #[test]
    fn a_namespaced_mount_maps_the_host_path_to_its_root() {
        // The container's mount shows /docker/abc as its root: the process's path is the root.
        let d = tempfile::tempdir().unwrap();
        write(&d.path().join("memory.max"), "1048576\n");
        write(&d.path().join("memory.current"), "0\n");
        let mi = format!(
            "30 23 0:26 /docker/abc {} rw - cgroup2 cgroup2 rw\n",
            d.path().display()
        );
        let c = from_texts("0::/docker/abc\n", &mi).unwrap();
        assert_eq!(c.dir, d.path());
        assert_eq!(c.headroom(), Some(1 << 20));
    }

    /// The guard reads memory every few milliseconds: the cgroup is located once, its
    /// figures are read each time.
    #[test]
    fn the_cgroup_is_located_once() {
        let first = current();
        for _ in 0..5 {
            assert_eq!(
                current().map(|c| c.dir),
                first.as_ref().map(|c| c.dir.clone())
            );
        }
        assert_eq!(LOCATED.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[test]
    fn no_cgroup_mounts_means_none() {
        assert_eq!(
            from_texts("0::/\n", "31 23 0:27 / /proc rw - proc proc rw\n"),
            None
        );
        assert_eq!(from_texts("", ""), None);
    }
}
