//! Which model a session belongs to. A cache is only meaningful for the exact weights, layout and
//! tokenizer that produced it, so a saved session carries three hashes (SHA-256) and is refused
//! by any model whose hashes differ, naming the part that differs.

use super::error::SessionError;
use nectar_format::Catalog;
use nectar_model::Glm5;
use sha2::{Digest, Sha256};
use std::path::Path;

/// A SHA-256 digest.
pub type Hash = [u8; 32];

/// The identity of a loaded model, as far as its caches are concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelIdentity {
    /// SHA-256 of `config.json`'s bytes.
    pub config: Hash,
    /// SHA-256 over every tensor's name, dtype, shape, byte length and format stamp, in name
    /// order: the quantisation layout (what storage each weight has), without hashing weights.
    pub quant: Hash,
    /// SHA-256 of `tokenizer.json`'s bytes; all zeros when the directory has none.
    pub tokenizer: Hash,
}

impl ModelIdentity {
    /// The identity of `model`, loaded from `dir`.
    pub fn of(dir: &Path, model: &Glm5) -> Result<ModelIdentity, SessionError> {
        Self::of_catalog(dir, model.catalog())
    }

    /// The identity of the model in `dir` whose tensors `cat` lists.
    pub fn of_catalog(dir: &Path, cat: &Catalog) -> Result<ModelIdentity, SessionError> {
        let file_hash = |name: &str, required: bool| -> Result<Hash, SessionError> {
            let p = dir.join(name);
            match std::fs::read(&p) {
                Ok(b) => Ok(Sha256::digest(&b).into()),
                Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Ok([0; 32]),
                Err(e) => Err(SessionError::io(&p, e)),
            }
        };
        let mut entries: Vec<_> = cat.tensors().collect();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let mut h = Sha256::new();
        for e in entries {
            // Length-prefixed fields, so no two layouts serialise to the same bytes.
            let stamp = cat.stamp(&e.name).unwrap_or("");
            let dtype = format!("{:?}", e.dtype);
            for field in [e.name.as_str(), dtype.as_str(), stamp] {
                h.update((field.len() as u64).to_le_bytes());
                h.update(field.as_bytes());
            }
            h.update((e.shape.len() as u64).to_le_bytes());
            for d in &e.shape {
                h.update((*d as u64).to_le_bytes());
            }
            h.update(e.len.to_le_bytes());
        }
        Ok(ModelIdentity {
            config: file_hash("config.json", true)?,
            quant: h.finalize().into(),
            tokenizer: file_hash("tokenizer.json", false)?,
        })
    }

    /// Refuses `saved` (read from `path`) unless it equals `self`, naming the first part that
    /// differs.
    pub fn check(&self, saved: &ModelIdentity, path: &Path) -> Result<(), SessionError> {
        for (part, s, l) in [
            ("config.json", &saved.config, &self.config),
            ("quantisation layout", &saved.quant, &self.quant),
            ("tokenizer.json", &saved.tokenizer, &self.tokenizer),
        ] {
            if s != l {
                return Err(SessionError::IdentityMismatch {
                    path: path.to_path_buf(),
                    part,
                    saved: hex(s),
                    loaded: hex(l),
                });
            }
        }
        Ok(())
    }
}

/// Lower-case hex of a digest.
pub fn hex(h: &Hash) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

/// The digest a hex string names, if it is one.
pub fn unhex(s: &str) -> Option<Hash> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let h: Hash = Sha256::digest(b"nectar").into();
        assert_eq!(unhex(&hex(&h)), Some(h));
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn check_names_the_part_that_differs() {
        let a = ModelIdentity {
            config: [1; 32],
            quant: [2; 32],
            tokenizer: [3; 32],
        };
        let mut b = a.clone();
        b.tokenizer = [4; 32];
        let e = a.check(&b, Path::new("x.nkv")).unwrap_err().to_string();
        assert!(e.contains("tokenizer.json") && e.contains("x.nkv"), "{e}");
        assert!(a.check(&a.clone(), Path::new("x")).is_ok());
    }
}
