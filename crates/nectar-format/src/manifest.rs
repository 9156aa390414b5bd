//! Weight checksums: `nectar-manifest.json` lists every tensor of a model directory with its
//! file, dtype, shape and the SHA-256 of its bytes.
//!
//! `nectar convert` writes it after the last shard; `nectar verify DIR` recomputes every hash
//! ([`verify`]); [`Catalog::open`] compares each header's dtype and shape with it, which costs
//! no I/O, so a header edited in place (a BF16 tensor relabelled F16) is refused at load. Bytes
//! are only hashed by `verify` (hashing hundreds of GB at every load would defeat streaming).
//!
//! ```json
//! {"format": "nectar-manifest", "version": 1,
//!  "tensors": {"model.norm.weight": {"file": "model-00001.safetensors", "dtype": "BF16",
//!                                     "shape": [6144], "sha256": "…"}, …}}
//! ```
use crate::catalog::{Catalog, TensorEntry};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

/// The manifest's file name inside a model directory.
pub const MANIFEST_FILE: &str = "nectar-manifest.json";
const FORMAT: &str = "nectar-manifest";

/// One tensor's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// The shard's file name.
    pub file: String,
    /// Element type as the header spells it (`BF16`).
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// SHA-256 of the tensor's bytes, lowercase hex.
    pub sha256: String,
}

/// Every tensor of a directory (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// `nectar-manifest`.
    pub format: String,
    /// 1.
    pub version: u32,
    /// Records by tensor name.
    pub tensors: BTreeMap<String, ManifestEntry>,
}

/// One finding of [`verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The tensor (or file) concerned.
    pub tensor: String,
    /// What differs.
    pub msg: String,
}

/// What [`verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Tensors whose bytes were hashed and compared.
    pub hashed: usize,
    /// Bytes hashed.
    pub bytes: u64,
    /// Differences (empty: the directory is what the manifest describes).
    pub mismatches: Vec<Mismatch>,
    /// True when the directory has a manifest (else only headers and the index were checked).
    pub has_manifest: bool,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// SHA-256 of `e`'s bytes, read by positioned reads (no map: a truncated file is an error).
fn hash_tensor(cat: &Catalog, e: &TensorEntry) -> Result<String> {
    let path = cat.path_of(e);
    let f = File::open(path).map_err(|err| Error::io(path, err))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = e.offset;
    let end = e.offset + e.len;
    while off < end {
        let n = ((end - off) as usize).min(buf.len());
        crate::catalog::read_exact_at(&f, &mut buf[..n], off).map_err(|err| Error::Tensor {
            path: path.to_path_buf(),
            tensor: e.name.clone(),
            msg: format!("reading {n} bytes at offset {off}: {err}"),
        })?;
        h.update(&buf[..n]);
        off += n as u64;
    }
    Ok(hex(&h.finalize()))
}

fn file_name(cat: &Catalog, e: &TensorEntry) -> String {
    cat.path_of(e)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl Manifest {
    /// Hashes every tensor of `cat`.
    pub fn of_catalog(cat: &Catalog) -> Result<Manifest> {
        let tensors = cat
            .tensors()
            .map(|e| {
                Ok((
                    e.name.clone(),
                    ManifestEntry {
                        file: file_name(cat, e),
                        dtype: e.dtype.to_string(),
                        shape: e.shape.clone(),
                        sha256: hash_tensor(cat, e)?,
                    },
                ))
            })
            .collect::<Result<_>>()?;
        Ok(Manifest {
            format: FORMAT.into(),
            version: 1,
            tensors,
        })
    }

    /// Reads `dir`'s manifest; `None` when it has none.
    pub fn read(dir: &Path) -> Result<Option<Manifest>> {
        let p = dir.join(MANIFEST_FILE);
        let text = match std::fs::read(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&p, e)),
        };
        let m: Manifest = serde_json::from_slice(&text).map_err(|e| Error::Index {
            path: p.clone(),
            msg: format!("not a Nectar manifest: {e}"),
        })?;
        if m.format != FORMAT || m.version != 1 {
            return Err(Error::Index {
                path: p,
                msg: format!(
                    "format `{}` version {}, expected {FORMAT} 1",
                    m.format, m.version
                ),
            });
        }
        Ok(Some(m))
    }

    /// Writes the manifest into `dir`, crash-safely.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let text = serde_json::to_vec_pretty(self).expect("a manifest serialises");
        crate::atomic::write_atomic_bytes(&dir.join(MANIFEST_FILE), &text)?;
        Ok(())
    }

    /// The header-level differences between the manifest and `cat` (tensor set, file, dtype,
    /// shape): what loading checks, without reading a weight byte.
    pub fn header_mismatches(&self, cat: &Catalog) -> Vec<Mismatch> {
        let mut out = Vec::new();
        for e in cat.tensors() {
            let Some(m) = self.tensors.get(&e.name) else {
                out.push(Mismatch {
                    tensor: e.name.clone(),
                    msg: "is not in the manifest".into(),
                });
                continue;
            };
            let file = file_name(cat, e);
            let dtype = e.dtype.to_string();
            if m.file != file || m.dtype != dtype || m.shape != e.shape {
                out.push(Mismatch {
                    tensor: e.name.clone(),
                    msg: format!(
                        "is {dtype} {:?} in {file}; the manifest says {} {:?} in {}",
                        e.shape, m.dtype, m.shape, m.file
                    ),
                });
            }
        }
        for name in self.tensors.keys() {
            if cat.get(name).is_none() {
                out.push(Mismatch {
                    tensor: name.clone(),
                    msg: "is in the manifest but in no shard (missing shard?)".into(),
                });
            }
        }
        out
    }
}

/// Checks `dir`: its headers and `model.safetensors.index.json` (by opening the catalog), and,
/// when it has a manifest, every tensor's dtype, shape and bytes against it.
pub fn verify(dir: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<VerifyReport> {
    let cat = Catalog::open_unchecked(dir)?;
    let Some(m) = Manifest::read(dir)? else {
        return Ok(VerifyReport::default());
    };
    let mut r = VerifyReport {
        has_manifest: true,
        mismatches: m.header_mismatches(&cat),
        ..Default::default()
    };
    let total: u64 = cat.tensors().map(|e| e.len).sum();
    for e in cat.tensors() {
        let Some(want) = m.tensors.get(&e.name) else {
            continue;
        };
        let got = hash_tensor(&cat, e)?;
        r.hashed += 1;
        r.bytes += e.len;
        if got != want.sha256 {
            r.mismatches.push(Mismatch {
                tensor: e.name.clone(),
                msg: format!(
                    "bytes in {} differ from the manifest (SHA-256 {got}, expected {})",
                    file_name(&cat, e),
                    want.sha256
                ),
            });
        }
        progress(r.bytes, total);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::tests::write_st;

    #[test]
    fn verify_finds_flipped_headers_and_bytes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.safetensors");
        write_st(
            &p,
            &[
                ("w", "BF16", &[2], vec![1, 2, 3, 4]),
                ("v", "U8", &[2], vec![5, 6]),
            ],
        );
        let m = Manifest::of_catalog(&Catalog::open(d.path()).unwrap()).unwrap();
        m.write(d.path()).unwrap();
        let r = verify(d.path(), &mut |_, _| {}).unwrap();
        assert!(
            r.has_manifest && r.mismatches.is_empty() && r.hashed == 2,
            "{r:?}"
        );

        // Overwritten tensor bytes: found by verify only (loading reads no bytes).
        let mut bytes = std::fs::read(&p).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        Catalog::open(d.path()).unwrap();
        let r = verify(d.path(), &mut |_, _| {}).unwrap();
        assert_eq!(r.mismatches.len(), 1, "{r:?}");
        assert_eq!(r.mismatches[0].tensor, "v");

        // A BF16 → F16 header flip: refused at load, and by verify.
        let text = String::from_utf8_lossy(&bytes).replacen("\"BF16\"", "\"F16\" ", 1);
        std::fs::write(&p, text.as_bytes()).unwrap();
        let e = Catalog::open(d.path()).unwrap_err().to_string();
        assert!(e.contains("`w`") && e.contains("manifest"), "{e}");
        let r = verify(d.path(), &mut |_, _| {}).unwrap();
        assert!(r.mismatches.iter().any(|m| m.tensor == "w"), "{r:?}");
    }
}
