//! The io_uring backend (Linux, feature `io-uring`).
//!
//! A `pread` of one expert range is one request that the kernel splits into bios of at most
//! `max_sectors_kb`; the thread then sleeps until all of them are done. Here the range is cut
//! into `chunk`-byte reads (4 KiB multiples, so each keeps O_DIRECT's alignment) that are
//! submitted together, up to `depth` in flight, so one I/O thread can keep the device queue as
//! full as several pread threads. Everything else — the buffered handle of a filesystem that
//! refuses O_DIRECT, the EINVAL fallback, the buffered resume of a tail, the truncation error —
//! is [`FileIo`]'s, shared through `FileIo::read_via`, so both backends keep one contract.
//!
//! Rings are not shared between threads: each concurrent reader takes one from a pool (the pool
//! grows to the number of I/O threads) and gives it back with no read in flight.
use super::{ExpertIo, FileIo};
use crate::layout::ReadOp;
use crate::slab::ALIGN;
use io_uring::{opcode, types, IoUring};
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// Default bytes per submitted read. With one I/O thread on the reference VM's virtio disk,
/// 256 KiB × 32 in flight beat pread by about 9% where 1 MiB × 16 and 128 KiB × 64 only tied it
/// (`benchmarks/RESULTS.md`).
pub const DEFAULT_CHUNK: usize = 256 << 10;
/// Default reads in flight per ring.
pub const DEFAULT_DEPTH: u32 = 32;

/// Reads shard files through io_uring, several aligned chunks of a range in flight at once.
pub struct UringIo {
    files: FileIo,
    rings: Mutex<Vec<IoUring>>,
    chunk: usize,
    depth: u32,
}

impl std::fmt::Debug for UringIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "UringIo({:?}, chunk {} B, depth {})",
            self.files, self.chunk, self.depth
        )
    }
}

impl UringIo {
    /// Opens every shard (as [`FileIo::open`]) with the default chunk and depth. Fails, with
    /// the reason, where io_uring is unavailable.
    pub fn open(paths: &[PathBuf], direct: bool) -> io::Result<UringIo> {
        Self::open_with(paths, direct, DEFAULT_CHUNK, DEFAULT_DEPTH)
    }

    /// As [`UringIo::open`] with `chunk` bytes per read (rounded down to 4 KiB, at least 4 KiB)
    /// and `depth` reads in flight per reading thread.
    pub fn open_with(
        paths: &[PathBuf],
        direct: bool,
        chunk: usize,
        depth: u32,
    ) -> io::Result<UringIo> {
        let depth = depth.max(1);
        // The first ring doubles as the probe: a refusal shows at open, not at the first read.
        let ring = new_ring(depth)?;
        Ok(UringIo {
            files: FileIo::open(paths, direct)?,
            rings: Mutex::new(vec![ring]),
            chunk: (chunk.min(1 << 30) / ALIGN).max(1) * ALIGN,
            depth,
        })
    }

    /// Whether this process may create an io_uring (tests skip with the returned reason).
    pub fn probe() -> io::Result<()> {
        new_ring(1).map(drop)
    }

    /// Shards opened with direct I/O.
    pub fn direct_count(&self) -> usize {
        self.files.direct_count()
    }

    fn take_ring(&self) -> io::Result<IoUring> {
        let pooled = self
            .rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match pooled {
            Some(r) => Ok(r),
            None => new_ring(self.depth),
        }
    }
}

fn new_ring(entries: u32) -> io::Result<IoUring> {
    IoUring::new(entries).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "io_uring is unavailable here: io_uring_setup failed ({e}); it needs Linux 5.6 \
                 or later, sysctl kernel.io_uring_disabled=0 and no seccomp filter refusing it; \
                 use --io pread"
            ),
        )
    })
}

/// Waits until at least one completion is posted, submitting what is queued.
///
/// Reads in flight write into the caller's buffer, so this must not give up while any are:
/// transient refusals (EINTR, EAGAIN, EBUSY) are retried, and any other failure of
/// `io_uring_enter` on a ring that was set up (a broken ring, i.e. a bug) aborts the process,
/// since returning would let the kernel write into a slot that is about to be reused.
fn submit_and_wait(ring: &IoUring) {
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => return,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) => {}
            Err(e) => {
                eprintln!("nectar: io_uring_enter failed with reads in flight ({e}); aborting");
                std::process::abort();
            }
        }
    }
}

/// Reads `dst.len()` bytes of `f` at `off` in `chunk`-byte pieces, at most `depth` in flight,
/// resuming short pieces. Returns the bytes read contiguously from the start (fewer than
/// `dst.len()` only at the end of the file). EINVAL is returned raw (the caller falls back to
/// buffered reads); other errors name the offset of the piece that failed.
fn read_chunks(
    ring: &mut IoUring,
    f: &File,
    dst: &mut [u8],
    off: u64,
    chunk: usize,
    depth: u32,
) -> io::Result<usize> {
    let fd = types::Fd(f.as_raw_fd());
    let total = dst.len();
    let n = total.div_ceil(chunk);
    let span = |i: usize| (i * chunk, ((i + 1) * chunk).min(total));
    let mut done = vec![0usize; n];
    let mut todo: VecDeque<usize> = (0..n).collect();
    let mut in_flight = 0usize;
    let mut failure: Option<(u64, io::Error)> = None;
    let base = dst.as_mut_ptr();
    loop {
        // After a failure nothing new is issued; what is in flight is still reaped below.
        while failure.is_none() && in_flight < depth as usize {
            let Some(i) = todo.pop_front() else { break };
            let (a, b) = span(i);
            let start = a + done[i];
            // SAFETY: `start < b <= total`, so the pointer stays inside `dst`.
            let ptr = unsafe { base.add(start) };
            let sqe = opcode::Read::new(fd, ptr, (b - start) as u32)
                .offset(off + start as u64)
                .build()
                .user_data(i as u64);
            // SAFETY: the entry writes `b - start` bytes at `ptr`, inside `dst`, which stays
            // mutably borrowed (and untouched) until this function returns; it returns only
            // once every submitted read has completed (`in_flight == 0`, or the process aborts
            // in `submit_and_wait`). Pieces are disjoint, so no two reads share bytes. `fd`
            // belongs to `f`, borrowed for the same span.
            let pushed = unsafe { ring.submission().push(&sqe) };
            // The queue holds `depth` entries and at most `depth` are queued or in flight.
            pushed.expect("submission queue has room for every read in flight");
            in_flight += 1;
        }
        if in_flight == 0 {
            break;
        }
        submit_and_wait(ring);
        for cqe in ring.completion() {
            in_flight -= 1;
            let i = cqe.user_data() as usize;
            let (a, b) = span(i);
            match cqe.result() {
                r if r < 0 => {
                    let e = io::Error::from_raw_os_error(-r);
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                    ) {
                        todo.push_back(i);
                    } else if failure.is_none() {
                        failure = Some((off + (a + done[i]) as u64, e));
                    }
                }
                0 => {} // end of file inside this piece
                r => {
                    done[i] += r as usize;
                    // A short read that ends aligned is resumed; one that ends mid-block is
                    // the end of the file (an O_DIRECT read cannot continue from there).
                    if a + done[i] < b && done[i].is_multiple_of(ALIGN) {
                        todo.push_back(i);
                    }
                }
            }
        }
    }
    if let Some((at, e)) = failure {
        if e.raw_os_error() == Some(libc::EINVAL) {
            return Err(e);
        }
        return Err(io::Error::new(
            e.kind(),
            format!("{e} (io_uring read at offset {at})"),
        ));
    }
    // The data ends where the first piece stopped short.
    Ok((0..n)
        .find(|&i| span(i).0 + done[i] < span(i).1)
        .map_or(total, |i| span(i).0 + done[i]))
}

impl ExpertIo for UringIo {
    fn read(&self, op: &ReadOp, dst: &mut [u8]) -> io::Result<()> {
        let mut ring = self.take_ring()?;
        let r = self.files.read_via(op, dst, |f, dst, off, _needed| {
            read_chunks(&mut ring, f, dst, off, self.chunk, self.depth)
        });
        // `read_chunks` returns only with nothing in flight, so the ring is clean for reuse.
        self.rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(ring);
        r
    }

    fn path(&self, shard: usize) -> &Path {
        self.files.path(shard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    fn ring_or_skip() -> Option<IoUring> {
        match new_ring(4) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("skipping io_uring test: {e}");
                None
            }
        }
    }

    fn file(len: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut f, &bytes).unwrap();
        (f, bytes)
    }

    #[test]
    fn failing_pieces_are_reported_after_all_settle_and_the_ring_stays_clean() {
        let Some(mut ring) = ring_or_skip() else {
            return;
        };
        let (f, bytes) = file(1 << 20);
        // Write-only: every read fails (EBADF) while three more pieces are in flight.
        let wo = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(f.path())
            .or_else(|_| std::fs::OpenOptions::new().write(true).open(f.path()))
            .unwrap();
        let buf = crate::Slab::new(1, 1 << 20).unwrap();
        // SAFETY: this test owns the one-slot buffer; nothing else touches it.
        let dst = unsafe { buf.slot_mut(0) };
        let e = read_chunks(&mut ring, &wo, dst, 0, 64 << 10, 4).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("Bad file descriptor"), "{msg}");
        assert!(msg.contains("io_uring read at offset"), "{msg}");
        assert!(ring.completion().is_empty(), "a completion was left behind");
        // The same ring then reads a real file correctly.
        let rd = File::open(f.path()).unwrap();
        assert_eq!(
            read_chunks(&mut ring, &rd, dst, 0, 64 << 10, 4).unwrap(),
            1 << 20
        );
        assert_eq!(&dst[..], &bytes[..]);
    }

    #[test]
    fn a_refused_direct_transfer_falls_back_to_buffered_reads() {
        if ring_or_skip().is_none() {
            return;
        }
        let (f, bytes) = file(3 * ALIGN + 10);
        let io = UringIo::open_with(&[f.path().to_path_buf()], true, ALIGN, 2).unwrap();
        if io.direct_count() == 0 {
            eprintln!("skipping: the temp filesystem refuses O_DIRECT");
            return;
        }
        // An offset O_DIRECT refuses (EINVAL), standing in for a filesystem that accepts
        // O_DIRECT at open but not for transfers: the read is redone through the buffered
        // handle, as FileIo does.
        let op = ReadOp {
            shard: 0,
            file_offset: 1,
            len: 3 * ALIGN,
            needed: 3 * ALIGN,
            slot_offset: 0,
        };
        let buf = crate::Slab::new(1, op.len).unwrap();
        // SAFETY: as above.
        let dst = unsafe { buf.slot_mut(0) };
        io.read(&op, &mut dst[..op.len]).unwrap();
        assert_eq!(&dst[..op.len], &bytes[1..1 + op.len]);
        // And the ring reports that refusal raw, which is what selects the fallback.
        let mut ring = io.take_ring().unwrap();
        let d = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(f.path())
            .unwrap();
        let e = read_chunks(&mut ring, &d, &mut dst[..ALIGN], 1, ALIGN, 2).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }
}
