//! The usage ledger, `.coli_usage` (`colibri-format.md` §8): how often each routed expert was
//! selected, kept across runs so the hottest experts can be pinned at startup. Same grammar as
//! Colibri's, so learned pin sets carry over both ways.
//!
//! ```text
//! -1 <n_layers> <n_experts>        dims (layers run 0..=n_layers: the MTP layer is n_layers)
//! -2 <version> <engine_id>         identity: version 1, FNV-1a-32 of model_type
//! <layer> <expert> <count>         one line per nonzero count
//! ```
//!
//! Reading accepts any record order and sums duplicates; a file without headers (legacy) is
//! accepted. Dimension and version mismatches are refused; a foreign engine id is refused unless
//! the caller trusts the file (it was named explicitly). Writing is sorted and atomic.

use crate::policy::ExpertKey;
use std::collections::BTreeMap;
use std::path::Path;

/// The ledger format version this code reads and writes.
pub const VERSION: u64 = 1;

/// Why a ledger was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UsageError {
    /// A line that is not three integers, or a record outside the dimensions.
    #[error("{path}: line {line}: {msg}")]
    Malformed {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        msg: String,
    },
    /// The dims header disagrees with the model.
    #[error("{path}: ledger is for {found_layers} layers × {found_experts} experts, the model has {layers} × {experts}")]
    Dims {
        /// The file.
        path: String,
        /// The file's layers.
        found_layers: u64,
        /// The file's experts.
        found_experts: u64,
        /// The model's layers.
        layers: u64,
        /// The model's experts.
        experts: u64,
    },
    /// Another format version.
    #[error("{path}: ledger version {found}, this build reads version {VERSION}")]
    Version {
        /// The file.
        path: String,
        /// The file's version.
        found: u64,
    },
    /// Written by an engine for another model type.
    #[error("{path}: ledger engine id {found} is not this model's ({expected}); name the file explicitly to trust it")]
    Identity {
        /// The file.
        path: String,
        /// The file's id.
        found: u64,
        /// This model's id.
        expected: u64,
    },
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// FNV-1a 32-bit of `s` (the ledger's engine id of a `model_type`).
pub fn fnv1a32(s: &str) -> u32 {
    s.bytes().fold(0x811C_9DC5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Selection counts per routed expert of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    /// Main layers (the MTP layer, if any, is layer `n_layers`).
    pub n_layers: u32,
    /// Experts per layer.
    pub n_experts: u32,
    /// FNV-1a-32 of the model type.
    pub engine_id: u32,
    counts: BTreeMap<ExpertKey, u64>,
}

impl Ledger {
    /// An empty ledger for a model.
    pub fn new(n_layers: u32, n_experts: u32, model_type: &str) -> Ledger {
        Ledger {
            n_layers,
            n_experts,
            engine_id: fnv1a32(model_type),
            counts: BTreeMap::new(),
        }
    }

    /// Parses `text` (from `path`, for messages) for this ledger's model. `trusted` accepts a
    /// foreign engine id.
    pub fn parse_into(&mut self, text: &str, path: &str, trusted: bool) -> Result<(), UsageError> {
        let mut add = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let bad = |msg: String| UsageError::Malformed {
                path: path.into(),
                line: i + 1,
                msg,
            };
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.is_empty() {
                continue;
            }
            if f.len() != 3 {
                return Err(bad(format!("expected 3 fields, found {}", f.len())));
            }
            let n = |s: &str| {
                s.parse::<i64>()
                    .map_err(|_| bad(format!("`{s}` is not an integer")))
            };
            let (a, b, c) = (n(f[0])?, n(f[1])?, n(f[2])?);
            match a {
                -1 => {
                    if (b, c) != (i64::from(self.n_layers), i64::from(self.n_experts)) {
                        return Err(UsageError::Dims {
                            path: path.into(),
                            found_layers: b.max(0) as u64,
                            found_experts: c.max(0) as u64,
                            layers: self.n_layers.into(),
                            experts: self.n_experts.into(),
                        });
                    }
                }
                -2 => {
                    if b != VERSION as i64 {
                        return Err(UsageError::Version {
                            path: path.into(),
                            found: b.max(0) as u64,
                        });
                    }
                    if c != i64::from(self.engine_id) && !trusted {
                        return Err(UsageError::Identity {
                            path: path.into(),
                            found: c.max(0) as u64,
                            expected: self.engine_id.into(),
                        });
                    }
                }
                l if l >= 0 => {
                    if l > i64::from(self.n_layers)
                        || b < 0
                        || b >= i64::from(self.n_experts)
                        || c < 0
                    {
                        return Err(bad(format!("record {l} {b} {c} is outside the model")));
                    }
                    *add.entry(ExpertKey::new(l as usize, b as usize))
                        .or_insert(0u64) += c as u64;
                }
                other => return Err(bad(format!("unknown header {other}"))),
            }
        }
        for (k, c) in add {
            *self.counts.entry(k).or_insert(0) += c;
        }
        Ok(())
    }

    /// Reads `path` into this ledger (see [`Ledger::parse_into`]); a missing file is empty.
    /// Temp files that interrupted saves left beside it are removed first; a path that is not
    /// a regular file (a FIFO would block the read forever) is an error.
    pub fn load_into(&mut self, path: &Path, trusted: bool) -> Result<(), UsageError> {
        nectar_format::atomic::remove_stale_temps(path);
        if let Ok(m) = std::fs::metadata(path) {
            if !m.is_file() {
                return Err(UsageError::Io {
                    path: path.display().to_string(),
                    source: std::io::Error::other("not a regular file"),
                });
            }
        }
        match std::fs::read_to_string(path) {
            Ok(t) => self.parse_into(&t, &path.display().to_string(), trusted),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(UsageError::Io {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    /// Adds `n` selections of `key`.
    pub fn add(&mut self, key: ExpertKey, n: u64) {
        if n > 0 {
            *self.counts.entry(key).or_insert(0) += n;
        }
    }

    /// Multiplies every count by `d` (rounded half up), dropping zeros: Colibri's per-run decay.
    pub fn decay(&mut self, d: f64) {
        for c in self.counts.values_mut() {
            *c = (*c as f64 * d + 0.5) as u64;
        }
        self.counts.retain(|_, c| *c > 0);
    }

    /// The count of `key`.
    pub fn count(&self, key: ExpertKey) -> u64 {
        self.counts.get(&key).copied().unwrap_or(0)
    }

    /// Selections recorded in all.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// The `n` most selected experts satisfying `keep`: count descending, then layer, then id.
    pub fn hottest(&self, n: usize, keep: impl Fn(ExpertKey) -> bool) -> Vec<ExpertKey> {
        let mut v: Vec<(ExpertKey, u64)> = self
            .counts
            .iter()
            .filter(|(k, _)| keep(**k))
            .map(|(k, c)| (*k, *c))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.into_iter().take(n).map(|(k, _)| k).collect()
    }

    /// The file text: headers, then records sorted by (layer, expert).
    pub fn render(&self) -> String {
        let mut s = format!(
            "-1 {} {}\n-2 {VERSION} {}\n",
            self.n_layers, self.n_experts, self.engine_id
        );
        for (k, c) in &self.counts {
            s.push_str(&format!("{} {} {c}\n", k.layer, k.expert));
        }
        s
    }

    /// Writes the ledger to `path` atomically (temp file in the same directory, fsync, rename):
    /// a crash leaves the old ledger or the new one.
    pub fn save(&self, path: &Path) -> Result<(), UsageError> {
        nectar_format::atomic::write_atomic_bytes(path, self.render().as_bytes()).map_err(|e| {
            UsageError::Io {
                path: e.path.display().to_string(),
                source: e.source,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_id_matches_colibri() {
        assert_eq!(fnv1a32("glm_moe_dsa"), 3_815_245_270);
    }

    #[test]
    fn round_trip_sums_duplicates_and_sorts() {
        let mut l = Ledger::new(78, 256, "glm_moe_dsa");
        l.parse_into(
            "-1 78 256\n-2 1 3815245270\n5 9 3\n3 1 7\n5 9 2\n78 0 4\n",
            "f",
            false,
        )
        .unwrap();
        assert_eq!(l.count(ExpertKey::new(5, 9)), 5);
        assert_eq!(
            l.render(),
            "-1 78 256\n-2 1 3815245270\n3 1 7\n5 9 5\n78 0 4\n"
        );
        assert_eq!(
            l.hottest(2, |_| true),
            vec![ExpertKey::new(3, 1), ExpertKey::new(5, 9)]
        );
        assert_eq!(l.hottest(1, |k| k.layer == 78), vec![ExpertKey::new(78, 0)]);
        // Legacy: no headers.
        let mut legacy = Ledger::new(78, 256, "glm_moe_dsa");
        legacy.parse_into("4 4 1\n", "f", false).unwrap();
        assert_eq!(legacy.total(), 1);
        l.decay(0.5);
        assert_eq!(
            l.render(),
            "-1 78 256\n-2 1 3815245270\n3 1 4\n5 9 3\n78 0 2\n"
        );
    }

    #[test]
    fn mismatches_are_refused_with_the_file_and_line() {
        let mut l = Ledger::new(78, 256, "glm_moe_dsa");
        let e = l.parse_into("-1 92 128\n", "u", false).unwrap_err();
        assert!(matches!(e, UsageError::Dims { .. }), "{e}");
        assert!(matches!(
            l.parse_into("-2 2 3815245270\n", "u", false).unwrap_err(),
            UsageError::Version { found: 2, .. }
        ));
        assert!(matches!(
            l.parse_into("-2 1 42\n", "u", false).unwrap_err(),
            UsageError::Identity { .. }
        ));
        l.parse_into("-2 1 42\n", "u", true).unwrap();
        let e = l.parse_into("1 2\n", "u", false).unwrap_err().to_string();
        assert!(e.contains("u: line 1"), "{e}");
        assert!(l.parse_into("79 0 1\n", "u", false).is_err());
        assert!(l.parse_into("1 256 1\n", "u", false).is_err());
        assert!(l.parse_into("1 x 1\n", "u", false).is_err());
    }

    #[test]
    fn save_is_atomic_and_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".coli_usage");
        // What a save killed mid-write left (its writer is gone: no process has this id).
        let stale = dir.path().join("..coli_usage.4194999.7.tmp");
        std::fs::write(&stale, b"1 2").unwrap();
        let mut l = Ledger::new(3, 8, "glm_moe_dsa");
        l.add(ExpertKey::new(1, 2), 9);
        l.save(&p).unwrap();
        assert!(!stale.exists(), "the next save removes it");
        let mut back = Ledger::new(3, 8, "glm_moe_dsa");
        back.load_into(&p, false).unwrap();
        assert_eq!(back, l);
        let mut missing = Ledger::new(3, 8, "glm_moe_dsa");
        missing.load_into(&dir.path().join("nope"), false).unwrap();
        assert_eq!(missing.total(), 0);
        // Loading (at startup) removes a stale temp file too, and refuses a directory.
        std::fs::write(&stale, b"1 2").unwrap();
        back.load_into(&p, false).unwrap();
        assert!(!stale.exists());
        let e = missing
            .load_into(dir.path(), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
