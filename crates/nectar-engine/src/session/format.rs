//! The Nectar session file (`.nkv`, version 2): the model identity, the token ids and every
//! cache — main layers, DSA indexer keys and the MTP layer with its gaps — as exact f32, with a
//! trailing SHA-256 over everything before it. All integers and floats are little-endian.
//! Version 1 files (the MTP cache only up to its first gap, no gap list) are still read.
//!
//! ```text
//! 0    8   magic "NECTARKV"
//! 8    4   u32 version (2; 1 is read too)
//! 12   4   u32 n_gaps: entries of the MTP cache's gap list (version 1: 0)
//! 16   32  SHA-256 of config.json
//! 48   32  SHA-256 of the quantisation layout (see identity.rs)
//! 80   32  SHA-256 of tokenizer.json (zeros: none)
//! 112  4   u32 n_layers (main layers)
//! 116  4   u32 latent width (kv_lora_rank)
//! 120  4   u32 rope-key width (qk_rope_head_dim)
//! 124  4   u32 MTP indexer-key width (u32::MAX: the saving model had no MTP layer)
//! 128  8   u64 n_tokens
//! 136  8   u64 mtp_rows: the MTP cache's rows, each at a position below n_tokens − 1
//!              (version 1: the rows up to its first gap)
//! 144  4·n_layers  u32 indexer-key width per main layer (0: none)
//! then     4·n_tokens  u32 token ids
//! then     per main layer: latent, rope keys, indexer keys (n_tokens rows each)
//! then     the MTP layer: latent, rope keys, indexer keys (mtp_rows rows each)
//! then     16·n_gaps  per gap: u64 row index, u64 position of the row after it
//!              (`LayerCache::gaps`: the drafter skips rows, `spec/mtp.rs`)
//! then     32  SHA-256 of every byte above
//! ```
//!
//! Reading validates everything that sizes an allocation (version, identity, every width against
//! the loaded model, the exact file length the header implies) before reading the caches, and
//! the checksum before returning them.

use super::atomic::{read_f32s, read_u32s, write_atomic, write_f32s, HashReader, HashWriter};
use super::error::SessionError;
use super::identity::{Hash, ModelIdentity};
use nectar_model::{CacheDims, LayerCache, SeqCache};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::Path;

/// The file's first 8 bytes.
pub const MAGIC: &[u8; 8] = b"NECTARKV";
/// The version this build writes (it reads this one and every earlier one).
pub const VERSION: u32 = 2;
const FIXED: u64 = 144;
const NO_MTP: u32 = u32::MAX;

/// Writes `tokens` and `cache` to `path` crash-safely.
pub fn write(
    path: &Path,
    id: &ModelIdentity,
    dims: &CacheDims,
    tokens: &[u32],
    cache: &SeqCache,
) -> Result<(), SessionError> {
    let n = tokens.len();
    let mtp_rows = cache.mtp.len();
    let gaps = cache.mtp.gaps();
    let n_gaps = u32::try_from(gaps.len()).map_err(|_| {
        SessionError::corrupt(
            path,
            format!("{} MTP cache gaps exceed the format", gaps.len()),
        )
    })?;
    write_atomic(path, |out| {
        let mut w = HashWriter {
            inner: out,
            hash: Sha256::new(),
        };
        w.write_all(MAGIC)?;
        w.write_all(&VERSION.to_le_bytes())?;
        w.write_all(&n_gaps.to_le_bytes())?;
        for h in [&id.config, &id.quant, &id.tokenizer] {
            w.write_all(h)?;
        }
        let mtp_index = dims.mtp_index.map_or(NO_MTP, |d| d as u32);
        for v in [dims.index.len(), dims.latent, dims.rope] {
            w.write_all(&(v as u32).to_le_bytes())?;
        }
        w.write_all(&mtp_index.to_le_bytes())?;
        w.write_all(&(n as u64).to_le_bytes())?;
        w.write_all(&(mtp_rows as u64).to_le_bytes())?;
        for d in &dims.index {
            w.write_all(&(*d as u32).to_le_bytes())?;
        }
        let ids: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        w.write_all(&ids)?;
        for (l, rows) in cache
            .layers
            .iter()
            .map(|l| (l, n))
            .chain([(&cache.mtp, mtp_rows)])
        {
            let part = |v: &[f32]| v.len().checked_div(l.len()).map_or(0, |w| rows * w);
            write_f32s(&mut w, &l.latent[..part(&l.latent)])?;
            write_f32s(&mut w, &l.k_pe[..part(&l.k_pe)])?;
            write_f32s(&mut w, &l.index_k[..part(&l.index_k)])?;
        }
        for &(i, p) in gaps {
            w.write_all(&(i as u64).to_le_bytes())?;
            w.write_all(&(p as u64).to_le_bytes())?;
        }
        let sum: Hash = w.hash.finalize().into();
        out.write_all(&sum)
    })
}

/// Reads a session saved by [`write`], refusing one from another model (`id`) or whose widths
/// differ from `dims`; token ids must be below `vocab`.
pub fn read(
    path: &Path,
    id: &ModelIdentity,
    dims: &CacheDims,
    vocab: usize,
) -> Result<(Vec<u32>, SeqCache), SessionError> {
    let io = |e| SessionError::io(path, e);
    let file = File::open(path).map_err(io)?;
    let found = file.metadata().map_err(io)?.len();
    let truncated = |expected| SessionError::Truncated {
        path: path.to_path_buf(),
        expected,
        found,
    };
    let mut r = HashReader {
        inner: BufReader::with_capacity(1 << 20, file),
        hash: Sha256::new(),
    };
    if found < 16 {
        return Err(truncated(FIXED));
    }
    let mut head = [0u8; FIXED as usize];
    r.read_exact(&mut head[..16]).map_err(io)?;
    if &head[..8] != MAGIC {
        return Err(SessionError::corrupt(
            path,
            "not a Nectar session (bad magic)",
        ));
    }
    let u32_at = |h: &[u8], o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
    let version = u32_at(&head, 8);
    if !(1..=VERSION).contains(&version) {
        return Err(SessionError::Version {
            path: path.to_path_buf(),
            found: version,
            supported: VERSION,
        });
    }
    if found < FIXED {
        return Err(truncated(FIXED));
    }
    r.read_exact(&mut head[16..]).map_err(io)?;
    let hash_at = |o: usize| -> Hash { head[o..o + 32].try_into().expect("32 bytes") };
    id.check(
        &ModelIdentity {
            config: hash_at(16),
            quant: hash_at(48),
            tokenizer: hash_at(80),
        },
        path,
    )?;
    let dim = |what: &str, o: usize, model: usize| {
        let v = u32_at(&head, o);
        match v as usize == model {
            true => Ok(()),
            false => Err(SessionError::dims(path, what, v, model)),
        }
    };
    dim("the number of main layers", 112, dims.index.len())?;
    dim("the latent width (kv_lora_rank)", 116, dims.latent)?;
    dim("the rope-key width (qk_rope_head_dim)", 120, dims.rope)?;
    let file_mtp_index = u32_at(&head, 124);
    let u64_at = |o: usize| u64::from_le_bytes(head[o..o + 8].try_into().expect("8 bytes"));
    let (n, mtp_rows, n_gaps) = (u64_at(128), u64_at(136), u32_at(&head, 12) as u64);
    if mtp_rows > 0 && mtp_rows >= n {
        return Err(SessionError::corrupt(
            path,
            format!("{mtp_rows} MTP rows for {n} tokens (at most one fewer)"),
        ));
    }
    if version == 1 && n_gaps != 0 {
        return Err(SessionError::corrupt(
            path,
            "version 1 with a nonzero reserved field",
        ));
    }
    let mtp_index = match dims.mtp_index {
        Some(d) if mtp_rows == 0 || file_mtp_index as usize == d => d,
        None if mtp_rows == 0 => 0,
        // Saved by a process that ran the MTP layer, loaded by one that does not (`--mtp off`
        // skips it): the rows are read (the checksum covers them) and dropped.
        None if file_mtp_index != NO_MTP => file_mtp_index as usize,
        model => {
            return Err(SessionError::dims(
                path,
                "the MTP layer's indexer-key width (u32::MAX: no MTP layer)",
                file_mtp_index,
                model.map_or(NO_MTP as usize, |d| d),
            ))
        }
    };
    let layers = dims.index.len();
    if found < FIXED + 4 * layers as u64 {
        return Err(truncated(FIXED + 4 * layers as u64));
    }
    let index = read_u32s(&mut r, layers).map_err(io)?;
    for (l, (&f, &m)) in index.iter().zip(&dims.index).enumerate() {
        if f as usize != m {
            return Err(SessionError::dims(
                path,
                format!("layer {l}'s indexer-key width"),
                f,
                m,
            ));
        }
    }
    // The exact length the header implies, in u64 with overflow treated as corruption, checked
    // before anything is allocated from `n`.
    let per_token: u64 = dims
        .index
        .iter()
        .map(|&d| (dims.latent + dims.rope + d) as u64)
        .sum::<u64>()
        + 1;
    let per_mtp = (dims.latent + dims.rope + mtp_index) as u64;
    let expected = n
        .checked_mul(per_token)
        .and_then(|a| mtp_rows.checked_mul(per_mtp).and_then(|b| a.checked_add(b)))
        .and_then(|f| f.checked_mul(4))
        .and_then(|b| b.checked_add(FIXED + 4 * layers as u64 + 16 * n_gaps + 32))
        .ok_or_else(|| SessionError::corrupt(path, format!("{n} tokens overflow the size")))?;
    if found < expected {
        return Err(truncated(expected));
    }
    if found > expected {
        return Err(SessionError::corrupt(
            path,
            format!(
                "{} bytes after the data its header describes",
                found - expected
            ),
        ));
    }
    let (n, mtp_rows) = (n as usize, mtp_rows as usize);
    let tokens = read_u32s(&mut r, n).map_err(io)?;
    if let Some((i, t)) = tokens
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab)
    {
        return Err(SessionError::corrupt(
            path,
            format!("token {i} is id {t}, outside the vocabulary of {vocab}"),
        ));
    }
    let mut layer = |rows: usize, index: usize| -> Result<LayerCache, SessionError> {
        let latent = read_f32s(&mut r, rows * dims.latent).map_err(io)?;
        let k_pe = read_f32s(&mut r, rows * dims.rope).map_err(io)?;
        let index_k = read_f32s(&mut r, rows * index).map_err(io)?;
        LayerCache::from_parts(rows, [dims.latent, dims.rope, index], latent, k_pe, index_k)
            .map_err(|e| SessionError::corrupt(path, e.to_string()))
    };
    let mut cache = SeqCache::new(0);
    for &d in &dims.index {
        cache.layers.push(layer(n, d)?);
    }
    let mtp = layer(mtp_rows, mtp_index)?;
    let mut gaps = Vec::with_capacity(n_gaps as usize);
    for _ in 0..n_gaps {
        let mut e = [0u8; 16];
        r.read_exact(&mut e).map_err(io)?;
        let at = |o: usize| u64::from_le_bytes(e[o..o + 8].try_into().expect("8 bytes"));
        let (i, p) = (at(0), at(8));
        // Positions at or past n_tokens are refused before any arithmetic on them.
        if p >= n as u64 {
            return Err(SessionError::corrupt(
                path,
                format!("MTP cache gap at position {p} of {n} tokens"),
            ));
        }
        gaps.push((i as usize, p as usize));
    }
    let mtp = mtp
        .with_gaps(gaps)
        .map_err(|e| SessionError::corrupt(path, e.to_string()))?;
    // Each MTP row needs the token after its position.
    if !mtp.is_empty() && mtp.end() >= n {
        return Err(SessionError::corrupt(
            path,
            format!("MTP rows reach position {} of {n} tokens", mtp.end() - 1),
        ));
    }
    if dims.mtp_index.is_some() {
        cache.mtp = mtp;
    }
    let sum: Hash = r.hash.finalize_reset().into();
    let mut stored = [0u8; 32];
    r.inner.read_exact(&mut stored).map_err(io)?;
    if sum != stored {
        return Err(SessionError::corrupt(
            path,
            "checksum mismatch (the contents were altered or damaged)",
        ));
    }
    Ok((tokens, cache))
}
