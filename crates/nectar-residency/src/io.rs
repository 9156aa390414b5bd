//! Positioned reads of expert bytes into slots.
//!
//! Linux: shards are opened with `O_DIRECT` (no page-cache copy, no double-counted RAM); a
//! filesystem that refuses it gets a buffered handle whose pages are dropped after each read
//! (`POSIX_FADV_DONTNEED`). macOS: `F_NOCACHE`. Short reads are resumed; a read that ends before
//! the bytes the expert needs is an error naming the file and offset.
//!
//! Two backends share those rules: [`FileIo`] (one `pread` per range, the default) and, on Linux
//! with the `io-uring` feature, [`UringIo`] (each range split into chunks that are in flight
//! together). [`IoBackend`] names them for `--io`.
use crate::layout::ReadOp;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(all(target_os = "linux", feature = "io-uring"))]
mod uring;
#[cfg(all(target_os = "linux", feature = "io-uring"))]
pub use uring::UringIo;

/// Which system interface moves expert bytes (`--io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoBackend {
    /// One positioned read (`pread`) per range, issued by the I/O worker pool.
    #[default]
    Pread,
    /// io_uring: each range split into aligned chunks submitted together (Linux, feature
    /// `io-uring`).
    Uring,
}

impl std::str::FromStr for IoBackend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pread" => Ok(IoBackend::Pread),
            "uring" => Ok(IoBackend::Uring),
            _ => Err(format!("unknown I/O backend `{s}` (pread or uring)")),
        }
    }
}

impl std::fmt::Display for IoBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoBackend::Pread => "pread",
            IoBackend::Uring => "uring",
        })
    }
}

/// Opens the shards for `backend` (`direct` as in [`FileIo::open`]). `Uring` fails with a message
/// naming the cause where this build or this kernel has no io_uring.
pub fn open(
    paths: &[PathBuf],
    direct: bool,
    backend: IoBackend,
) -> std::io::Result<Arc<dyn ExpertIo>> {
    match backend {
        IoBackend::Pread => Ok(Arc::new(FileIo::open(paths, direct)?)),
        IoBackend::Uring => open_uring(paths, direct, None),
    }
}

/// Opens the shards for the io_uring backend with `(chunk bytes, depth)` instead of the
/// defaults; in every build, so callers need no `cfg` (it fails where there is no backend).
#[cfg(all(target_os = "linux", feature = "io-uring"))]
pub fn open_uring(
    paths: &[PathBuf],
    direct: bool,
    tuning: Option<(usize, u32)>,
) -> std::io::Result<Arc<dyn ExpertIo>> {
    let (chunk, depth) = tuning.unwrap_or((uring::DEFAULT_CHUNK, uring::DEFAULT_DEPTH));
    Ok(Arc::new(UringIo::open_with(paths, direct, chunk, depth)?))
}

/// Opens the shards for the io_uring backend with `(chunk bytes, depth)` instead of the
/// defaults; in every build, so callers need no `cfg` (it fails where there is no backend).
#[cfg(not(all(target_os = "linux", feature = "io-uring")))]
pub fn open_uring(
    _paths: &[PathBuf],
    _direct: bool,
    _tuning: Option<(usize, u32)>,
) -> std::io::Result<Arc<dyn ExpertIo>> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "this build has no io_uring backend (Linux only, cargo feature `io-uring` of \
         nectar-residency); use --io pread",
    ))
}

/// Where expert bytes come from (a trait so tests can inject short reads, EIO and delays).
pub trait ExpertIo: Send + Sync {
    /// Fills `dst` (exactly `op.len` bytes, 4 KiB-aligned) from `op`'s file range; at least
    /// `op.needed` bytes must arrive.
    fn read(&self, op: &ReadOp, dst: &mut [u8]) -> std::io::Result<()>;
    /// The path of a shard (for error messages).
    fn path(&self, shard: usize) -> &Path;
}

struct Shard {
    path: PathBuf,
    direct: Option<File>,
    buffered: File,
}

/// Reads shard files with direct I/O where the filesystem allows it.
pub struct FileIo {
    shards: Vec<Shard>,
}

impl std::fmt::Debug for FileIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FileIo({} shards, direct: {})",
            self.shards.len(),
            self.direct_count()
        )
    }
}

impl FileIo {
    /// Opens every shard; `direct` asks for O_DIRECT / F_NOCACHE where supported.
    pub fn open(paths: &[PathBuf], direct: bool) -> std::io::Result<FileIo> {
        let mut shards = Vec::with_capacity(paths.len());
        for p in paths {
            let buffered = File::open(p)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
            let direct = if direct { open_direct(p) } else { None };
            shards.push(Shard {
                path: p.clone(),
                direct,
                buffered,
            });
        }
        Ok(FileIo { shards })
    }

    /// Shards opened with direct I/O.
    pub fn direct_count(&self) -> usize {
        self.shards.iter().filter(|s| s.direct.is_some()).count()
    }
}

#[cfg(target_os = "linux")]
fn open_direct(p: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(p)
        .ok()
}

#[cfg(target_os = "macos")]
fn open_direct(p: &Path) -> Option<File> {
    use std::os::unix::io::AsRawFd;
    let f = File::open(p).ok()?;
    // SAFETY: a valid descriptor and a documented fcntl command with an int argument.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1) };
    (rc == 0).then_some(f)
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn open_direct(_p: &Path) -> Option<File> {
    None
}

#[cfg(unix)]
fn read_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(f, buf, off)
}

#[cfg(windows)]
fn read_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(f, buf, off)
}

#[cfg(target_os = "linux")]
fn drop_pages(f: &File, off: u64, len: usize) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: advisory call on a valid descriptor; failure is harmless and ignored.
    unsafe {
        libc::posix_fadvise(
            f.as_raw_fd(),
            off as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn drop_pages(_f: &File, _off: u64, _len: usize) {}

/// Reads until `needed` bytes arrived or the file ends; resumes short reads.
fn read_fully(f: &File, dst: &mut [u8], off: u64, needed: usize) -> std::io::Result<usize> {
    let mut got = 0;
    while got < dst.len() {
        match read_at(f, &mut dst[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if got >= needed && got % crate::slab::ALIGN != 0 {
            break; // end of file reached mid-block
        }
    }
    Ok(got)
}

impl FileIo {
    /// Reads `op` the way every backend must: `direct` moves bytes over the shard's O_DIRECT
    /// handle (returning how many arrived before the end of the file); a direct transfer the
    /// filesystem refuses (EINVAL) is redone buffered, a direct read that stops short of
    /// `op.needed` is resumed buffered, and shards without a direct handle read buffered and
    /// drop their pages afterwards.
    fn read_via(
        &self,
        op: &ReadOp,
        dst: &mut [u8],
        direct: impl FnOnce(&File, &mut [u8], u64, usize) -> std::io::Result<usize>,
    ) -> std::io::Result<()> {
        let s = &self.shards[op.shard];
        let mut got = None;
        if let Some(d) = &s.direct {
            match direct(d, dst, op.file_offset, op.needed) {
                Ok(n) => got = Some(n),
                // Some filesystems accept O_DIRECT at open but refuse the transfer.
                Err(e) if e.raw_os_error() == Some(22) => {}
                Err(e) => return Err(e),
            }
        }
        let n = match got {
            Some(n) if n >= op.needed => n,
            Some(n) => {
                // Resume the tail through the buffered handle (alignment no longer holds).
                n + read_fully(
                    &s.buffered,
                    &mut dst[n..],
                    op.file_offset + n as u64,
                    op.needed - n,
                )?
            }
            None => {
                let n = read_fully(&s.buffered, dst, op.file_offset, op.needed)?;
                drop_pages(&s.buffered, op.file_offset, op.len);
                n
            }
        };
        if n < op.needed {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "short read: {n} of {} bytes at offset {} (file truncated?)",
                    op.needed, op.file_offset
                ),
            ));
        }
        Ok(())
    }
}

impl ExpertIo for FileIo {
    fn read(&self, op: &ReadOp, dst: &mut [u8]) -> std::io::Result<()> {
        self.read_via(op, dst, read_fully)
    }

    fn path(&self, shard: usize) -> &Path {
        &self.shards[shard].path
    }
}
