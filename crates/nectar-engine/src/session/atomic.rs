//! Session files' I/O helpers: crash-safe replacement (the shared
//! [`nectar_format::atomic::write_atomic`], with session errors), hashing and little-endian
//! array reads and writes.

use super::error::SessionError;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::Path;

/// Replaces `path` with what `body` writes, crash-safely ([`nectar_format::atomic`]).
pub fn write_atomic(
    path: &Path,
    body: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), SessionError> {
    nectar_format::atomic::write_atomic(path, body).map_err(|e| SessionError::io(&e.path, e.source))
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

/// A reader that hashes what passes through it.
pub struct HashReader<R> {
    pub inner: R,
    pub hash: Sha256,
}

impl<R: std::io::Read> std::io::Read for HashReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
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
