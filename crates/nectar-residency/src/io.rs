//! Positioned reads of expert bytes into slots.
//!
//! Linux: shards are opened with `O_DIRECT` (no page-cache copy, no double-counted RAM); a
//! filesystem that refuses it gets a buffered handle whose pages are dropped after each read
//! (`POSIX_FADV_DONTNEED`). macOS: `F_NOCACHE`. Short reads are resumed; a read that ends before
//! the bytes the expert needs is an error naming the file and offset.
use crate::layout::ReadOp;
use std::fs::File;
use std::path::{Path, PathBuf};

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

impl ExpertIo for FileIo {
    fn read(&self, op: &ReadOp, dst: &mut [u8]) -> std::io::Result<()> {
        let s = &self.shards[op.shard];
        let mut got = None;
        if let Some(d) = &s.direct {
            match read_fully(d, dst, op.file_offset, op.needed) {
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

    fn path(&self, shard: usize) -> &Path {
        &self.shards[shard].path
    }
}
