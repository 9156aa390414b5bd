//! Crash-safe file replacement: the new contents go to a temporary file in the same directory,
//! which is flushed to disk before it is renamed over the old file, and the directory is synced
//! so the rename itself survives a crash. A reader therefore sees the old file or the new one,
//! never a mixture, whenever the process or the machine dies.

use super::error::SessionError;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Replaces `path` with what `body` writes, crash-safely (see the module docs).
pub fn write_atomic(
    path: &Path,
    body: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), SessionError> {
    let tmp = temp_path(path);
    let result = (|| -> std::io::Result<()> {
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        body(&mut w)?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()
    })();
    if let Err(e) = result {
        // Best effort: a leftover temp file is harmless (never read) but wastes space.
        let _ = std::fs::remove_file(&tmp);
        return Err(SessionError::io(&tmp, e));
    }
    std::fs::rename(&tmp, path).map_err(|e| SessionError::io(path, e))?;
    sync_dir(path)
}

/// A per-process temporary name beside `path`, so that two writers never share one.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp.{}", std::process::id()))
}

/// Syncs `path`'s directory so a rename into it is durable (a no-op where directories cannot be
/// opened, e.g. Windows).
fn sync_dir(path: &Path) -> Result<(), SessionError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| SessionError::io(dir, e))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// A writer that hashes what passes through it (the Nectar format's trailing checksum).
pub struct HashWriter<'a> {
    pub inner: &'a mut dyn Write,
    pub hash: Sha256,
}

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `v` as little-endian f32s.
pub fn write_f32s(w: &mut dyn Write, v: &[f32]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(v.len().min(1 << 16) * 4);
    for chunk in v.chunks(1 << 16) {
        buf.clear();
        buf.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
        w.write_all(&buf)?;
    }
    Ok(())
}

/// Reads `n` little-endian f32s.
pub fn read_f32s(r: &mut dyn std::io::Read, n: usize) -> std::io::Result<Vec<f32>> {
    let mut out = Vec::with_capacity(n);
    let mut buf = vec![0u8; n.min(1 << 16) * 4];
    let mut left = n;
    while left > 0 {
        let k = left.min(1 << 16);
        r.read_exact(&mut buf[..k * 4])?;
        out.extend(
            buf[..k * 4]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        left -= k;
    }
    Ok(out)
}

/// Reads `n` little-endian u32s.
pub fn read_u32s(r: &mut dyn std::io::Read, n: usize) -> std::io::Result<Vec<u32>> {
    let mut buf = vec![0u8; n * 4];
    r.read_exact(&mut buf)?;
    Ok(buf
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}
