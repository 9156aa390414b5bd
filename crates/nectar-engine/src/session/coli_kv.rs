//! Colibri's `.coli_kv` version 1 (`specs/colibri-format.md` §11), read and written where the
//! dimensions match the loaded model.
//!
//! ```text
//! 0   8      magic "COLIKV1\0"
//! 8   8×i32  n_layers, kv_lora, qk_rope, index_hd or 0, n_indexer_layers, vocab, nrec, 0
//! 40  nrec records: i32 token id; per main layer kv_lora f32 latent then qk_rope f32 rope key;
//!     per full-indexer layer (only when index_hd ≠ 0) index_hd f32 indexer key
//! ```
//!
//! What the format does not carry: the MTP layer's cache (a restored session starts with an
//! empty one), the model identity and a checksum. Nectar keeps both in a sidecar file,
//! `<file>.nectar-id` (JSON: the three hashes of [`ModelIdentity`] and the SHA-256 of the
//! whole `.coli_kv` file as saved), never in the Colibri header, so Colibri still reads the
//! file; the sidecar is checked when present. A save keeps the pair consistent at every
//! moment a crash can hit: the sidecar first lists the new file's checksum beside the old
//! one(s), then the file is replaced, then the sidecar is rewritten with the new checksum only;
//! a file loads when its checksum is one of those listed. (A file Colibri has written to since
//! is refused as altered; deleting the sidecar loads it unverified.) A file without
//! indexer keys (`index_hd = 0`) for a model that has indexers yields the tokens only
//! ([`ColiKv::cache`] is `None`); the caller recomputes the caches from them.
//!
//! Records past `nrec` are a torn append and ignored, as Colibri does. Nectar writes the whole
//! file crash-safely (temp file, fsync, rename) instead of appending, so `nrec` is always final.

use super::atomic::{read_f32s, write_atomic, write_f32s, HashReader, HashWriter};
use super::error::SessionError;
use super::identity::{hex, unhex, ModelIdentity};
use nectar_model::{CacheDims, LayerCache, SeqCache};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// The file's first 8 bytes.
pub const MAGIC: &[u8; 8] = b"COLIKV1\0";
const HEADER: u64 = 40;

/// What a `.coli_kv` file held.
#[derive(Debug)]
pub struct ColiKv {
    /// The token ids, one per record.
    pub tokens: Vec<u32>,
    /// The caches (MTP empty), or `None` when the file lacks indexer keys the model needs.
    pub cache: Option<SeqCache>,
    /// True when a sidecar confirmed the model identity.
    pub verified: bool,
}

/// The identity sidecar of `path`.
pub fn sidecar(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".nectar-id");
    PathBuf::from(s)
}

/// Writes `tokens` and the main caches of `cache` as `.coli_kv` v1 (with indexer keys when the
/// model has indexers), then the identity sidecar; both crash-safely.
pub fn write(
    path: &Path,
    id: &ModelIdentity,
    dims: &CacheDims,
    vocab: usize,
    tokens: &[u32],
    cache: &SeqCache,
) -> Result<(), SessionError> {
    let (index_hd, indexed) = indexer_layers(dims, path)?;
    let header = [
        dims.index.len(),
        dims.latent,
        dims.rope,
        index_hd,
        indexed.len(),
        vocab,
        tokens.len(),
        0,
    ];
    for v in header {
        if i32::try_from(v).is_err() {
            return Err(SessionError::Inconsistent(format!(
                "{v} does not fit the .coli_kv header's int32"
            )));
        }
    }
    let records = |w: &mut dyn std::io::Write| {
        write_records(w, &header, dims, &indexed, index_hd, tokens, cache)
    };
    // The checksum first (serialising into a hash only), so the sidecar can list it before the
    // file changes.
    let mut hw = HashWriter {
        inner: &mut std::io::sink(),
        hash: Sha256::new(),
    };
    records(&mut hw).map_err(|e| SessionError::io(path, e))?;
    let sum = hex(&hw.hash.finalize().into());
    let side = |sums: &[String]| {
        serde_json::json!({
            "format": "nectar-coli-kv-identity",
            "version": 1,
            "config_sha256": hex(&id.config),
            "quant_layout_sha256": hex(&id.quant),
            "tokenizer_sha256": hex(&id.tokenizer),
            "file_sha256": sums,
        })
        .to_string()
    };
    let mut sums = vec![sum.clone()];
    // The checksums the sidecar lists now (the current file's among them); a few suffice, as
    // only a crash mid-save leaves more than one.
    sums.extend(
        listed_sums(&sidecar(path))
            .into_iter()
            .filter(|s| *s != sum)
            .take(3),
    );
    write_atomic(&sidecar(path), |w| w.write_all(side(&sums).as_bytes()))?;
    write_atomic(path, |w| records(w))?;
    write_atomic(&sidecar(path), |w| w.write_all(side(&[sum]).as_bytes()))
}

/// The file checksums a sidecar lists (none when it is missing or unreadable).
fn listed_sums(side: &Path) -> Vec<String> {
    let v: Option<serde_json::Value> = std::fs::read(side)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    v.as_ref()
        .and_then(|v| v.get("file_sha256"))
        .and_then(|s| s.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The file's bytes: magic, header, records.
fn write_records(
    w: &mut dyn std::io::Write,
    header: &[usize; 8],
    dims: &CacheDims,
    indexed: &[usize],
    index_hd: usize,
    tokens: &[u32],
    cache: &SeqCache,
) -> std::io::Result<()> {
    {
        w.write_all(MAGIC)?;
        for &v in header {
            w.write_all(&(v as i32).to_le_bytes())?;
        }
        let (dl, dr) = (dims.latent, dims.rope);
        for (i, &t) in tokens.iter().enumerate() {
            w.write_all(&(t as i32).to_le_bytes())?;
            for l in &cache.layers {
                write_f32s(w, &l.latent[i * dl..(i + 1) * dl])?;
                write_f32s(w, &l.k_pe[i * dr..(i + 1) * dr])?;
            }
            for &l in indexed {
                write_f32s(
                    w,
                    &cache.layers[l].index_k[i * index_hd..(i + 1) * index_hd],
                )?;
            }
        }
        Ok(())
    }
}

/// Reads a `.coli_kv` v1 file for a model with `dims` and `vocab`, checking the identity
/// sidecar against `id` when there is one.
pub fn read(
    path: &Path,
    id: &ModelIdentity,
    dims: &CacheDims,
    vocab: usize,
) -> Result<ColiKv, SessionError> {
    let side = check_sidecar(path, id)?;
    let verified = side.is_some();
    let io = |e| SessionError::io(path, e);
    let file = File::open(path).map_err(io)?;
    let found = file.metadata().map_err(io)?.len();
    let truncated = |expected| SessionError::Truncated {
        path: path.to_path_buf(),
        expected,
        found,
    };
    if found < HEADER {
        return Err(truncated(HEADER));
    }
    let mut r = HashReader {
        inner: BufReader::with_capacity(1 << 20, file),
        hash: Sha256::new(),
    };
    let mut head = [0u8; HEADER as usize];
    r.read_exact(&mut head).map_err(io)?;
    if &head[..8] != MAGIC {
        return Err(SessionError::corrupt(
            path,
            "not a .coli_kv v1 file (bad magic; KV8 and KV_TQ variants are not read)",
        ));
    }
    let f: Vec<i64> = head[8..]
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)
        .collect();
    let (model_hd, indexed) = indexer_layers(dims, path)?;
    let check = |what: &str, file: i64, model: usize| match file == model as i64 {
        true => Ok(()),
        false => Err(SessionError::dims(path, what, file, model)),
    };
    check("n_layers", f[0], dims.index.len())?;
    check("kv_lora", f[1], dims.latent)?;
    check("qk_rope", f[2], dims.rope)?;
    check("vocab", f[5], vocab)?;
    if f[7] != 0 {
        return Err(SessionError::corrupt(
            path,
            format!("header field 8 is {}, expected 0", f[7]),
        ));
    }
    let has_keys = f[3] != 0;
    if has_keys {
        check("index_hd", f[3], model_hd)?;
        check("n_indexer_layers", f[4], indexed.len())?;
    }
    if f[6] < 0 {
        return Err(SessionError::corrupt(path, format!("nrec is {}", f[6])));
    }
    let nrec = f[6] as u64;
    let keys = if has_keys {
        indexed.len() * model_hd
    } else {
        0
    };
    let record = 4 + 4 * (dims.index.len() * (dims.latent + dims.rope) + keys) as u64;
    let expected = HEADER + nrec * record;
    if found < expected {
        return Err(truncated(expected));
    }
    let n = nrec as usize;
    let mut tokens = Vec::with_capacity(n);
    let mut layers: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = dims
        .index
        .iter()
        .map(|&d| {
            (
                Vec::with_capacity(n * dims.latent),
                Vec::with_capacity(n * dims.rope),
                Vec::with_capacity(if has_keys { n * d } else { 0 }),
            )
        })
        .collect();
    for i in 0..n {
        let mut t = [0u8; 4];
        r.read_exact(&mut t).map_err(io)?;
        let t = i32::from_le_bytes(t);
        if t < 0 || t as usize >= vocab {
            return Err(SessionError::corrupt(
                path,
                format!("record {i} has token id {t}, outside the vocabulary of {vocab}"),
            ));
        }
        tokens.push(t as u32);
        for l in layers.iter_mut() {
            l.0.extend(read_f32s(&mut r, dims.latent).map_err(io)?);
            l.1.extend(read_f32s(&mut r, dims.rope).map_err(io)?);
        }
        if has_keys {
            for &l in &indexed {
                layers[l].2.extend(read_f32s(&mut r, model_hd).map_err(io)?);
            }
        }
    }
    if let Some(Some(listed)) = side {
        // The whole file, torn tail included, is what was saved.
        std::io::copy(&mut r, &mut std::io::sink()).map_err(io)?;
        let got: [u8; 32] = r.hash.finalize().into();
        if !listed.contains(&got) {
            return Err(SessionError::corrupt(
                path,
                format!(
                    "its SHA-256 differs from the one saved in {} (the contents were altered or \
                     damaged; delete the sidecar to load the file unverified)",
                    sidecar(path).display()
                ),
            ));
        }
    }
    let cache = if has_keys || indexed.is_empty() {
        let mut c = SeqCache::new(0);
        for ((latent, k_pe, index_k), &d) in layers.into_iter().zip(&dims.index) {
            c.layers.push(
                LayerCache::from_parts(n, [dims.latent, dims.rope, d], latent, k_pe, index_k)
                    .map_err(|e| SessionError::corrupt(path, e.to_string()))?,
            );
        }
        Some(c)
    } else {
        None
    };
    Ok(ColiKv {
        tokens,
        cache,
        verified,
    })
}

/// The model's indexer-key width and its full-indexer layers (every one has the same width).
fn indexer_layers(dims: &CacheDims, path: &Path) -> Result<(usize, Vec<usize>), SessionError> {
    let indexed: Vec<usize> = (0..dims.index.len())
        .filter(|&l| dims.index[l] > 0)
        .collect();
    let hd = indexed.first().map_or(0, |&l| dims.index[l]);
    if let Some(&l) = indexed.iter().find(|&&l| dims.index[l] != hd) {
        return Err(SessionError::dims(
            path,
            format!("layer {l}'s indexer-key width (.coli_kv has one width)"),
            dims.index[l],
            hd,
        ));
    }
    Ok((hd, indexed))
}

/// The file checksums a sidecar accepts (`None`: a sidecar written before checksums).
type Listed = Option<Vec<[u8; 32]>>;

/// Checks the identity sidecar when present: `None` when there is none, else the file checksums
/// it lists.
fn check_sidecar(path: &Path, id: &ModelIdentity) -> Result<Option<Listed>, SessionError> {
    let side = sidecar(path);
    let bytes = match std::fs::read(&side) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(SessionError::io(&side, e)),
    };
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| SessionError::corrupt(&side, format!("not JSON: {e}")))?;
    let hash = |k: &str| {
        v.get(k)
            .and_then(|s| s.as_str())
            .and_then(unhex)
            .ok_or_else(|| SessionError::corrupt(&side, format!("`{k}` is not a SHA-256 hex")))
    };
    let saved = ModelIdentity {
        config: hash("config_sha256")?,
        quant: hash("quant_layout_sha256")?,
        tokenizer: hash("tokenizer_sha256")?,
    };
    id.check(&saved, path)?;
    let listed = match v.get("file_sha256") {
        None => None,
        Some(a) => Some(
            a.as_array()
                .filter(|a| !a.is_empty())
                .and_then(|a| a.iter().map(|s| s.as_str().and_then(unhex)).collect())
                .ok_or_else(|| {
                    SessionError::corrupt(&side, "`file_sha256` is not a list of SHA-256 hexes")
                })?,
        ),
    };
    Ok(Some(listed))
}
