//! The model directory's usage ledger (`.coli_usage`), kept up to date with this process's
//! expert selections: each [`UsageLog::flush`] re-reads the file (another process may have
//! written it), adds the selections made since the last flush, and writes it back atomically.
//! The ledger feeds the pinned tier at the next start (see `PinRequest`).

use nectar_model::arch::glm5::{Config, PinRequest, RawConfig};
use nectar_model::arch::Arch;
use nectar_model::Glm5;
use nectar_residency::policy::ExpertKey;
use nectar_residency::usage::{Ledger, UsageError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The ledger's file name in a model directory (Colibri's).
pub const LEDGER_FILE: &str = ".coli_usage";

/// An empty ledger with the dimensions and identity of the model configured by `r`.
fn empty_ledger(r: &RawConfig) -> Ledger {
    Ledger::new(
        r.num_hidden_layers as u32,
        r.n_routed_experts as u32,
        r.model_type
            .as_deref()
            .unwrap_or(Arch::GlmMoeDsa.model_type()),
    )
}

/// A model's usage ledger on disk and what this process has already added to it.
#[derive(Debug)]
pub struct UsageLog {
    path: PathBuf,
    /// The model's empty ledger (dimensions and identity), cloned for each read.
    empty: Ledger,
    saved: HashMap<usize, Vec<u64>>,
}

impl UsageLog {
    /// The ledger at `path` for `model`.
    pub fn new(model: &Glm5, path: PathBuf) -> UsageLog {
        UsageLog {
            path,
            empty: empty_ledger(&model.cfg.raw),
            saved: HashMap::new(),
        }
    }

    /// Reads the ledger (empty when the file does not exist), refusing a foreign one.
    fn load(&self) -> Result<Ledger, UsageError> {
        let mut l = self.empty.clone();
        l.load_into(&self.path, false)?;
        Ok(l)
    }

    /// Adds the selections `model` made since the last flush to the file. Returns how many were
    /// added. A ledger that cannot be read (foreign, other dimensions, damaged) is left as it
    /// is, and the error says why.
    pub fn flush(&mut self, model: &Glm5) -> Result<u64, UsageError> {
        self.flush_counts(model.expert_usage())
    }

    /// [`UsageLog::flush`] from a snapshot of `Glm5::expert_usage` (cumulative selection counts
    /// per layer), so the file work can run on another thread than the model's.
    pub fn flush_counts(&mut self, now: Vec<(usize, Vec<u64>)>) -> Result<u64, UsageError> {
        let mut ledger = None;
        let mut added = 0;
        for (layer, counts) in &now {
            let before = self.saved.get(layer);
            for (e, &c) in counts.iter().enumerate() {
                let d = c - before.and_then(|b| b.get(e)).copied().unwrap_or(0);
                if d == 0 {
                    continue;
                }
                if ledger.is_none() {
                    ledger = Some(self.load()?);
                }
                if let Some(l) = ledger.as_mut() {
                    l.add(ExpertKey::new(*layer, e), d);
                }
                added += d;
            }
        }
        if let Some(l) = ledger {
            l.save(&self.path)?;
        }
        self.saved = now.into_iter().collect();
        Ok(added)
    }
}

/// Which experts a budgeted load pins (`--pin`, `--pin-size` of `run` and `serve`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pin {
    /// None.
    Off,
    /// The most used experts of the model directory's usage ledger, by Colibri's auto rule
    /// (`bytes`: this many instead); a ledger another engine wrote is refused with a warning.
    Auto {
        /// Bytes to pin instead of the auto rule.
        bytes: Option<u64>,
    },
    /// The most used experts of this ledger, trusted even if another engine wrote it.
    Ledger {
        /// The ledger.
        file: PathBuf,
        /// Bytes to pin instead of the auto rule.
        bytes: Option<u64>,
    },
}

impl Pin {
    /// The pin request for the model in `dir` ([`pin_request`]; `Off`: none, no warning).
    pub fn request(&self, dir: &Path) -> crate::Result<(Option<PinRequest>, Option<String>)> {
        match self {
            Pin::Off => Ok((None, None)),
            Pin::Auto { bytes } => pin_request(dir, None, *bytes),
            Pin::Ledger { file, bytes } => pin_request(dir, Some(file), *bytes),
        }
    }
}

/// The pin request for the model in `dir` from a usage ledger: `file` names one explicitly
/// (trusted even if another engine wrote it; an unreadable one is an error), `None` uses the
/// directory's `.coli_usage`, where an unreadable or foreign ledger is derived state: `Ok(None)`
/// and the reason in the `String`. `bytes` replaces Colibri's auto rule.
pub fn pin_request(
    dir: &Path,
    file: Option<&Path>,
    bytes: Option<u64>,
) -> crate::Result<(Option<PinRequest>, Option<String>)> {
    let mut ledger = empty_ledger(&Config::from_dir(dir)?.raw);
    let (path, trusted) = match file {
        Some(f) => (f.to_path_buf(), true),
        None => (dir.join(LEDGER_FILE), false),
    };
    match ledger.load_into(&path, trusted) {
        Ok(()) => Ok((Some(PinRequest { ledger, bytes }), None)),
        Err(e) if !trusted => Ok((None, Some(e.to_string()))),
        Err(e) => Err(crate::Error::Request(e.to_string())),
    }
}
