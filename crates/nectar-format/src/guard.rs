//! Memory-mapped shards whose truncation becomes an error instead of SIGBUS.
//!
//! A process that reads a mapped file past its (new) end gets SIGBUS, which kills it without a
//! word. That happens when a shard is truncated or rewritten while `nectar run` or `nectar serve`
//! runs. Every [`GuardedMap`] registers its address range in a fixed table that a SIGBUS handler
//! consults: a fault inside a registered range is answered by mapping a zero page over the
//! faulting page (so the instruction completes) and recording the offset; the caller turns the
//! record into an error after its computation ([`GuardedMap::take_fault`]) and discards the
//! result. Once the file is back at its length, [`GuardedMap::restore`] maps it over the same
//! addresses again, so views borrowed from the map stay valid. A fault outside every registered
//! range goes to the handler that was installed before (Rust's stack-overflow reporter, or the
//! default action), so behaviour elsewhere is unchanged.
use std::fs::File;
use std::path::Path;

/// Most maps guarded at once (each open shard is one; `Catalog` allows 512 per directory).
#[cfg(unix)]
const SLOTS: usize = 4096;

#[cfg(unix)]
mod table {
    use super::SLOTS;
    use std::sync::atomic::{AtomicUsize, Ordering};

    // One entry per slot: start address (0 = free), length, and the first faulting offset + 1
    // (0 = none). Plain atomics, because the signal handler may only do async-signal-safe work.
    #[allow(clippy::declare_interior_mutable_const)]
    const ZERO: AtomicUsize = AtomicUsize::new(0);
    pub static START: [AtomicUsize; SLOTS] = [ZERO; SLOTS];
    pub static LEN: [AtomicUsize; SLOTS] = [ZERO; SLOTS];
    pub static FAULT: [AtomicUsize; SLOTS] = [ZERO; SLOTS];
    pub static PAGE: AtomicUsize = AtomicUsize::new(4096);

    /// Claims a free slot for `[start, start + len)`.
    pub fn register(start: usize, len: usize) -> Option<usize> {
        for i in 0..SLOTS {
            // Length first: the handler reads START, then LEN, of a slot it matched.
            if START[i].load(Ordering::Acquire) == 0 {
                LEN[i].store(len, Ordering::Release);
                FAULT[i].store(0, Ordering::Release);
                if START[i]
                    .compare_exchange(0, start, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return Some(i);
                }
            }
        }
        None
    }

    pub fn release(slot: usize) {
        START[slot].store(0, Ordering::Release);
    }

    /// The slot containing `addr`, if any (async-signal-safe: atomic loads only).
    pub fn find(addr: usize) -> Option<usize> {
        (0..SLOTS).find(|&i| {
            let s = START[i].load(Ordering::Acquire);
            s != 0 && addr >= s && addr - s < LEN[i].load(Ordering::Acquire)
        })
    }
}

#[cfg(unix)]
mod handler {
    use super::table;
    use std::sync::atomic::Ordering;
    use std::sync::OnceLock;

    /// The SIGBUS action in place before ours (chained for faults that are not ours).
    static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

    /// Installs the handler once per process.
    pub fn install() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: sysconf has no preconditions.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            if page > 0 {
                table::PAGE.store(page as usize, Ordering::Release);
            }
            // SAFETY: a zeroed sigaction is a valid "default" value; sigaction only writes
            // through the pointers we pass, and `on_sigbus` has the SA_SIGINFO signature.
            unsafe {
                let mut prev: libc::sigaction = std::mem::zeroed();
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
                act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut act.sa_mask);
                libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut prev);
                let _ = PREVIOUS.set(prev);
                libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut());
            }
        });
    }

    extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
        let addr = unsafe { (*info).si_addr() } as usize;
        if let Some(slot) = table::find(addr) {
            let page = table::PAGE.load(Ordering::Acquire);
            let at = addr & !(page - 1);
            // SAFETY: `at` is a page inside a read-only private mapping this process owns
            // (registered above); replacing that page with an anonymous zero page changes no
            // other memory. mmap is a plain system call, safe in a signal handler.
            let r = unsafe {
                libc::mmap(
                    at as *mut libc::c_void,
                    page,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if r != libc::MAP_FAILED {
                let off = addr - table::START[slot].load(Ordering::Acquire);
                let _ = table::FAULT[slot].compare_exchange(
                    0,
                    off + 1,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                return; // the faulting read is retried and now sees zeros
            }
        }
        chain(sig, info, ctx);
    }

    /// Hands a fault that is not ours to the previous action (default: terminate).
    fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        let prev = PREVIOUS.get();
        match prev {
            Some(p)
                if p.sa_sigaction != libc::SIG_DFL
                    && p.sa_sigaction != libc::SIG_IGN
                    && p.sa_flags & libc::SA_SIGINFO != 0 =>
            {
                // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this
                // signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig, info, ctx);
            }
            Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
                // SAFETY: a plain handler installed without SA_SIGINFO takes the signal number.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig);
            }
            _ => {
                // SAFETY: restoring the default action; returning re-executes the faulting
                // instruction, which then terminates the process as it would have without us.
                unsafe {
                    libc::signal(libc::SIGBUS, libc::SIG_DFL);
                }
            }
        }
    }
}

/// A read-only memory map of a whole file, guarded against truncation (see the module docs).
pub struct GuardedMap {
    map: memmap2::Mmap,
    #[cfg(unix)]
    slot: Option<usize>,
}

impl GuardedMap {
    /// Maps `file` read-only and registers the range with the SIGBUS guard.
    pub fn new(file: &File) -> std::io::Result<GuardedMap> {
        // SAFETY: the map is read-only and private to this process and Nectar never writes
        // model files it has open. A concurrent external truncation faults; the guard turns
        // that fault into a recorded error instead of a crash.
        let map = unsafe { memmap2::Mmap::map(file) }?;
        #[cfg(unix)]
        {
            handler::install();
            let slot = if map.is_empty() {
                None
            } else {
                table::register(map.as_ptr() as usize, map.len())
            };
            Ok(GuardedMap { map, slot })
        }
        #[cfg(not(unix))]
        Ok(GuardedMap { map })
    }

    /// The byte offset of the first read that found the file shorter than when it was mapped,
    /// clearing the record. Data read from this map since then was zeros and must be discarded.
    pub fn take_fault(&self) -> Option<u64> {
        #[cfg(unix)]
        if let Some(s) = self.slot {
            let f = table::FAULT[s].swap(0, std::sync::atomic::Ordering::AcqRel);
            return (f != 0).then(|| (f - 1) as u64);
        }
        None
    }

    /// Maps `path` again over this map's addresses, after a fault, once the file is back. The
    /// caller checks the file first (length and header); views borrowed from this map stay
    /// valid and see the file's bytes again.
    #[cfg(unix)]
    pub fn restore(&self, path: &Path) -> std::io::Result<()> {
        use std::os::unix::io::AsRawFd;
        let f = File::open(path)?;
        let len = f.metadata()?.len();
        if len < self.map.len() as u64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("file is {len} bytes, shorter than {}", self.map.len()),
            ));
        }
        // SAFETY: remaps exactly this map's own range (MAP_FIXED over memory we own), read-only
        // and private, from a file at least that long. No reference observes the swap as
        // anything but the same bytes the file held at load.
        let r = unsafe {
            libc::mmap(
                self.map.as_ptr() as *mut libc::c_void,
                self.map.len(),
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_FIXED,
                f.as_raw_fd(),
                0,
            )
        };
        if r == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Without a guard, nothing to restore.
    #[cfg(not(unix))]
    pub fn restore(&self, _path: &Path) -> std::io::Result<()> {
        Ok(())
    }
}

impl std::ops::Deref for GuardedMap {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for GuardedMap {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(s) = self.slot {
            table::release(s);
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn truncation_is_recorded_then_restored() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.bin");
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let data: Vec<u8> = (0..3 * page).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
        let map = GuardedMap::new(&File::open(&p).unwrap()).unwrap();
        assert_eq!(map.take_fault(), None);
        assert_eq!(map[2 * page + 7], data[2 * page + 7]);
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(page as u64)
            .unwrap();
        // Without the guard this read is SIGBUS; with it, zeros and a recorded offset.
        let v = std::hint::black_box(&map[..])[2 * page + 7];
        assert_eq!(v, 0);
        assert_eq!(map.take_fault(), Some(2 * page as u64 + 7));
        assert_eq!(map.take_fault(), None, "taking clears the record");
        assert!(map.restore(&p).is_err(), "still short");
        std::fs::write(&p, &data).unwrap();
        map.restore(&p).unwrap();
        assert_eq!(&map[..], &data[..]);
        assert_eq!(map.take_fault(), None);
    }
}
