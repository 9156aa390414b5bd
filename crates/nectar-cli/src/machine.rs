//! What this machine is: its last-level cache, its free memory and how fast it reads memory —
//! one place for the figures every benchmark and `fit --project` judge themselves against.
use nectar_kernels::{read_sum, ReadMode};
use std::time::Instant;

/// Last-level cache assumed when sysfs says nothing.
const LLC_FALLBACK: usize = 32 << 20;

/// The read reference on `pool`'s threads: `buf` cut into one contiguous, page-aligned part
/// per thread, every thread reading its part with [`read_sum`]; the best of `passes` passes of
/// each mode (modes alternate pass by pass). Returns GB/s and the fastest mode.
pub fn read_reference(pool: &rayon::ThreadPool, buf: &[u8], passes: usize) -> (f64, ReadMode) {
    let threads = pool.current_num_threads().max(1);
    let part = (buf.len() / threads) & !4095;
    let mut best = (0.0f64, ReadMode::Plain);
    for _ in 0..passes {
        for mode in ReadMode::ALL {
            let t = Instant::now();
            pool.broadcast(|ctx| {
                let p = &buf[ctx.index() * part..(ctx.index() + 1) * part];
                std::hint::black_box(read_sum(std::hint::black_box(p), mode));
            });
            let gbps = (part * threads) as f64 / t.elapsed().as_secs_f64() / 1e9;
            if gbps > best.0 {
                best = (gbps, mode);
            }
        }
    }
    best
}

/// Last-level cache in bytes and where the figure came from: the largest cache level in
/// sysfs, summed over its distinct instances (as lscpu reports it), or a fallback.
pub fn llc_bytes() -> (usize, String) {
    let mut top = (0u32, std::collections::BTreeMap::<String, usize>::new());
    let cpus = std::fs::read_dir("/sys/devices/system/cpu")
        .into_iter()
        .flatten();
    for cpu in cpus.flatten() {
        let name = cpu.file_name().to_string_lossy().into_owned();
        if !name.starts_with("cpu") || !name[3..].chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let idx = std::fs::read_dir(cpu.path().join("cache"))
            .into_iter()
            .flatten();
        for ix in idx.flatten() {
            let read = |f: &str| std::fs::read_to_string(ix.path().join(f)).ok();
            let (Some(level), Some(size)) = (read("level"), read("size")) else {
                continue;
            };
            if read("type").is_some_and(|t| t.trim() == "Instruction") {
                continue;
            }
            let (Ok(level), Some(size)) = (level.trim().parse::<u32>(), parse_size(&size)) else {
                continue;
            };
            let shared = read("shared_cpu_list").unwrap_or_else(|| name.clone());
            if level > top.0 {
                top = (level, Default::default());
            }
            if level == top.0 {
                top.1.insert(shared.trim().to_string(), size);
            }
        }
    }
    let total: usize = top.1.values().sum();
    if total == 0 {
        (LLC_FALLBACK, "fallback (no cache sizes in sysfs)".into())
    } else {
        let n = top.1.len();
        (total, format!("sysfs: L{} × {n} instance(s)", top.0))
    }
}

/// `32768K`, `1M`, `512` (bytes) as sysfs writes cache sizes.
fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mul) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<usize>().ok().map(|n| n * mul)
}

/// A `/proc/meminfo` field (`MemAvailable`, `MemTotal`), in bytes.
pub fn meminfo(field: &str) -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    nectar_residency::memory::meminfo_bytes(&text, field).map(|b| b as usize)
}

/// Memory a process here may use: the smaller of `MemAvailable` and the cgroup's headroom. A
/// container's limit is invisible in /proc/meminfo (it shows the host's), and planning from
/// MemAvailable alone gets the process OOM-killed by the cgroup.
#[derive(Debug, Clone)]
pub struct Usable {
    /// `MemAvailable`, bytes.
    pub available: Option<u64>,
    /// The process's memory cgroup, if it has a limit or usage to read.
    pub cgroup: Option<nectar_residency::cgroup::CgroupMemory>,
    /// The smaller of the two (None: neither could be read).
    pub bytes: Option<u64>,
}

/// This process's [`Usable`] memory (the memory guard's view: `nectar_residency::memory`).
pub fn usable_memory() -> Usable {
    let v = nectar_residency::memory::MemoryView::read();
    Usable {
        bytes: v.headroom(),
        available: v.available,
        cgroup: v.cgroup,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn usable_memory_is_at_most_mem_available() {
        let u = usable_memory();
        assert!(u.bytes <= u.available.or(u.bytes));
        assert_eq!(meminfo("MemAvailable").is_some(), cfg!(target_os = "linux"));
    }

    #[test]
    fn llc_is_a_plausible_size() {
        let (llc, source) = llc_bytes();
        assert!((64 << 10..=64 << 30).contains(&llc), "{llc} from {source}");
    }

    #[test]
    fn read_reference_reads_every_part() {
        // Two threads over a buffer that does not split evenly: parts are page-aligned and a
        // positive rate comes back.
        let buf = vec![1u8; (3 << 20) + 123];
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let (gbps, _) = read_reference(&pool, &buf, 2);
        assert!(gbps > 0.0 && gbps.is_finite());
    }
}
