//! `nectar run --session FILE`: restore, reuse, save.
use crate::args::SessionFormatArg;
use anyhow::{Context, Result};
use nectar_engine::{ModelBundle, ModelIdentity, Reuse, Session, SessionFormat};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The session of one `nectar run`.
pub struct RunSession {
    path: PathBuf,
    format: SessionFormat,
    id: ModelIdentity,
    /// The session (restored, or new when the file does not exist yet).
    pub session: Session,
    /// Tokens the file held when it was restored.
    restored: usize,
}

/// Restores `path` when it exists (identity-checked), else starts an empty session.
pub fn open(path: &Path, format: SessionFormatArg, bundle: &ModelBundle) -> Result<RunSession> {
    let format = match format {
        SessionFormatArg::Auto => SessionFormat::from_path(path),
        SessionFormatArg::Nectar => SessionFormat::Nectar,
        SessionFormatArg::ColiKv => SessionFormat::ColiKv,
    };
    // A FIFO, a device or an unwritable directory is found now, not after generating.
    nectar_engine::check_session_path(path)?;
    let id = ModelIdentity::of(&bundle.dir, &bundle.model)?;
    let session = if path.exists() {
        let l = Session::load(path, format, &bundle.model, &id)
            .with_context(|| format!("restoring session {}", path.display()))?;
        if !l.verified {
            eprintln!(
                "warning: {} has no identity sidecar; its dimensions match this model, but it may \
                 come from another one",
                path.display()
            );
        }
        if l.recomputed {
            eprintln!(
                "note: {} has no DSA indexer keys; its caches were recomputed from its tokens",
                path.display()
            );
        }
        l.session
    } else {
        Session::new(&bundle.model)
    };
    Ok(RunSession {
        path: path.to_path_buf(),
        format,
        id,
        restored: session.tokens().len(),
        session,
    })
}

impl RunSession {
    /// Saves the session back to its file, crash-safely.
    pub fn save(&self, bundle: &ModelBundle) -> Result<()> {
        self.session
            .save(&self.path, self.format, &bundle.model, &self.id)
            .with_context(|| format!("saving session {}", self.path.display()))
    }

    /// `--json`'s `session` object.
    pub fn json(&self, reuse: &Reuse, prompt_tokens: usize) -> Value {
        json!({
            "path": self.path,
            "format": match self.format {
                SessionFormat::Nectar => "nectar",
                SessionFormat::ColiKv => "coli_kv",
            },
            "restored_tokens": self.restored,
            "prompt_tokens": prompt_tokens,
            "reused_tokens": reuse.main,
            "saved_tokens": self.session.tokens().len(),
        })
    }

    /// The stderr line.
    pub fn summary(&self, reuse: &Reuse, prompt_tokens: usize) -> String {
        format!(
            "[session {}: {} of {} reused ({} restored), {} saved]",
            self.path.display(),
            reuse.main,
            super::count(prompt_tokens as u64, "prompt token", "prompt tokens"),
            self.restored,
            super::count(self.session.tokens().len() as u64, "token", "tokens")
        )
    }
}
