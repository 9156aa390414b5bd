//! Crash-safe file replacement, shared by every writer of persistent state (converted shards'
//! side files, sessions, the usage ledger): the new contents go to a temporary file of this
//! write's own in the same directory, are flushed to disk, renamed over the old file, and the
//! directory is synced so the rename itself survives a crash. A reader sees the old file or the
//! new one, never a mixture, whenever the process or the machine dies.
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A failed atomic write: the file the error happened on (the temp file, the target or its
/// directory) and the OS error.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct AtomicWriteError {
    /// The file or directory the operation failed on.
    pub path: PathBuf,
    /// The OS error.
    pub source: std::io::Error,
}

/// Replaces `path` with what `body` writes, crash-safely (see the module docs). On failure the
/// temp file is removed and `path` is untouched.
pub fn write_atomic(
    path: &Path,
    body: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), AtomicWriteError> {
    // Interrupted earlier writes of this file left their temp files: gone writers' ones go.
    remove_stale_temps(path);
    let tmp = temp_path(path);
    let result = (|| -> std::io::Result<()> {
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        body(&mut w)?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()
    })();
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| AtomicWriteError { path, source }
    };
    if let Err(e) = result {
        // Best effort: a leftover temp file is never read, but wastes space.
        let _ = std::fs::remove_file(&tmp);
        return Err(err(&tmp)(e));
    }
    std::fs::rename(&tmp, path).map_err(err(path))?;
    sync_parent(path)
}

/// Syncs the directory holding `path`, so that a rename into it is durable. Directories cannot
/// be opened for syncing everywhere (Windows); there the rename stands as it is.
pub fn sync_parent(path: &Path) -> Result<(), AtomicWriteError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| AtomicWriteError {
            path: dir.to_path_buf(),
            source,
        })?;
    Ok(())
}

/// [`write_atomic`] of a byte buffer.
pub fn write_atomic_bytes(path: &Path, bytes: &[u8]) -> Result<(), AtomicWriteError> {
    write_atomic(path, |w| w.write_all(bytes))
}

/// A temporary name beside `path` of this write's own (process id and a counter: two processes
/// or two threads writing the same file never share one), ending in `.tmp` so a cleanup of
/// stale temp files recognises it.
fn temp_path(path: &Path) -> PathBuf {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Removes the temp files that interrupted writes of `path` left beside it: only names of
/// [`temp_path`]'s pattern for this very file (`.NAME.PID.N.tmp`), and only those whose writer
/// is gone (its process no longer exists; where that cannot be asked, older than a day). A
/// writer that is still running keeps its file. Returns how many were removed; errors are
/// ignored (cleanup must never fail the caller).
pub fn remove_stale_temps(path: &Path) -> usize {
    let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return 0;
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let prefix = format!(".{name}.");
    let mut removed = 0;
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = file
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(".tmp"))
            .and_then(|rest| rest.split_once('.'))
            .filter(|(_, n)| n.bytes().all(|b| b.is_ascii_digit()) && !n.is_empty())
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        // Only plain files: never follow a link or remove a directory of that name.
        let Ok(meta) = e.path().symlink_metadata() else {
            continue;
        };
        if meta.is_file() && writer_is_gone(pid, &meta) && std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// True when process `pid` (the writer of a temp file) no longer runs.
fn writer_is_gone(pid: u32, meta: &std::fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        let _ = meta;
        if pid == std::process::id() {
            return false; // a write of ours may be under way on another thread
        }
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
        r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        meta.modified()
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(86_400))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.json");
        write_atomic_bytes(&p, b"old").unwrap();
        write_atomic_bytes(&p, b"new").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_failed_body_keeps_the_old_file_and_removes_the_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        write_atomic_bytes(&p, b"old").unwrap();
        let e = write_atomic(&p, |w| {
            w.write_all(b"partial")?;
            Err(std::io::Error::other("disk full"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("disk full"), "{e}");
        assert!(e.path.to_string_lossy().ends_with(".tmp"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn stale_temps_of_this_file_only_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.nectar");
        // A process id that cannot exist (above Linux's pid_max limit of 2^22).
        let dead = dir.path().join(".s.nectar.4194999.3.tmp");
        let live = dir
            .path()
            .join(format!(".s.nectar.{}.0.tmp", std::process::id()));
        let other = dir.path().join(".t.nectar.4194999.3.tmp");
        let unrelated = dir.path().join("s.nectar.tmp");
        for f in [&dead, &live, &other, &unrelated] {
            std::fs::write(f, b"x").unwrap();
        }
        std::fs::create_dir(dir.path().join(".s.nectar.4194998.1.tmp")).unwrap();
        assert_eq!(remove_stale_temps(&p), 1);
        assert!(!dead.exists());
        assert!(live.exists() && other.exists() && unrelated.exists());
        assert!(dir.path().join(".s.nectar.4194998.1.tmp").is_dir());
    }

    #[test]
    fn concurrent_writers_use_distinct_temp_files() {
        assert_ne!(temp_path(Path::new("a/x")), temp_path(Path::new("a/x")));
        assert!(temp_path(Path::new("x"))
            .to_string_lossy()
            .ends_with(".tmp"));
    }
}
