//! Sessions: a conversation's caches kept between turns, and on disk between runs.
//!
//! A [`Session`] holds the compressed caches of one sequence — per main layer the MLA latent and
//! rope key, the DSA indexer keys, and the MTP layer's own cache — together with the token ids
//! they were computed from. A new prompt keeps the longest common prefix (see [`prefix::plan`])
//! and only the rest runs, which is what makes a second turn cheap.
//!
//! Sessions are saved in the Nectar format ([`SessionFormat::Nectar`], exact f32 plus the model
//! identity and a checksum) or in Colibri's `.coli_kv` v1 ([`SessionFormat::ColiKv`], main
//! caches only). Both are written crash-safely, and a file that does not belong to the loaded
//! model, or is truncated or damaged, is refused with an error naming the file.
//!
//! The decision a newcomer would question: the session holds the tokens in the cache, not the
//! whole conversation. The last generated token has no cache row yet (it is the input of the
//! next step), so it is not part of the session; a next turn that repeats it runs it as the
//! first new token.

mod atomic;
pub mod coli_kv;
mod error;
pub mod format;
mod identity;
pub mod prefix;

pub use error::SessionError;
pub use identity::{hex, ModelIdentity};
pub use prefix::Reuse;

use crate::bundle::ModelBundle;
use crate::error::Result;
use crate::generate::generate_speculative_cached;
use crate::generate::Generation;
use crate::request::Request;
use crate::request_state::Step;
use crate::spec::Speculation;
use crate::tokenizer::Tokenizer;
use nectar_model::{Glm5, NoObserver, SeqCache, SeqStep};
use std::path::Path;

/// The on-disk format of a session file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionFormat {
    /// Nectar's own format (`format.rs`): every cache, the identity, a checksum.
    Nectar,
    /// Colibri's `.coli_kv` v1 (`coli_kv.rs`): main caches and tokens; identity in a sidecar.
    ColiKv,
}

impl SessionFormat {
    /// `.coli_kv` for a file named `*.coli_kv` or `*.coli_kv.N` (Colibri's per-slot names),
    /// else the Nectar format.
    pub fn from_path(path: &Path) -> SessionFormat {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        match name.ends_with(".coli_kv") || name.contains(".coli_kv.") {
            true => SessionFormat::ColiKv,
            false => SessionFormat::Nectar,
        }
    }
}

/// Checks, before anything is generated, that `path` can serve as a session file: when it
/// exists it must be a regular file (a FIFO would block the load forever, a device or directory
/// cannot hold a session), and its directory must take a new file (a trial file of the atomic
/// writer's temp pattern is created and removed). Removes the temp files interrupted saves of
/// this path left behind.
pub fn check_path(path: &Path) -> std::result::Result<(), SessionError> {
    check_regular(path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let probe = dir.join(format!(".{name}.{}.probe.tmp", std::process::id()));
    let trial = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe);
    match trial {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
        }
        Err(source) => {
            return Err(SessionError::Directory {
                path: path.to_path_buf(),
                dir,
                source,
            })
        }
    }
    nectar_format::atomic::remove_stale_temps(path);
    Ok(())
}

/// Refuses a path that exists and is not a regular file (links are followed).
fn check_regular(path: &Path) -> std::result::Result<(), SessionError> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(()); // absent: a new session (or an error the open reports)
    };
    let ft = meta.file_type();
    if ft.is_file() {
        return Ok(());
    }
    let kind = if ft.is_dir() {
        "a directory"
    } else {
        special_kind(&ft)
    };
    Err(SessionError::NotAFile {
        path: path.to_path_buf(),
        kind,
    })
}

#[cfg(unix)]
fn special_kind(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_block_device() || ft.is_char_device() {
        "a device"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn special_kind(_ft: &std::fs::FileType) -> &'static str {
    "a special file"
}

/// One conversation's caches and the tokens they hold.
#[derive(Debug, Clone)]
pub struct Session {
    tokens: Vec<u32>,
    cache: SeqCache,
}

/// What [`Session::load`] restored.
#[derive(Debug)]
pub struct Loaded {
    /// The session.
    pub session: Session,
    /// True when the model identity was checked (always for the Nectar format; for `.coli_kv`
    /// only when its sidecar exists).
    pub verified: bool,
    /// True when the caches were recomputed from the tokens (a `.coli_kv` without the indexer
    /// keys the model needs).
    pub recomputed: bool,
}

impl Session {
    /// An empty session for `model`.
    pub fn new(model: &Glm5) -> Session {
        Session {
            tokens: Vec::new(),
            cache: model.new_cache(),
        }
    }

    /// A session from caches computed for `tokens`. MTP rows beyond `tokens.len() - 1` are
    /// dropped: row i depends on the token at i + 1, which the session does not hold for the
    /// last row.
    pub fn from_cache(
        tokens: Vec<u32>,
        mut cache: SeqCache,
    ) -> std::result::Result<Session, SessionError> {
        if let Some((l, c)) = cache
            .layers
            .iter()
            .enumerate()
            .find(|(_, c)| c.len() != tokens.len())
        {
            return Err(SessionError::Inconsistent(format!(
                "{} tokens but layer {l}'s cache holds {}",
                tokens.len(),
                c.len()
            )));
        }
        cache
            .mtp
            .truncate_to_position(tokens.len().saturating_sub(1));
        Ok(Session { tokens, cache })
    }

    /// The tokens the caches hold.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The caches (main layers and the MTP layer).
    pub fn cache(&self) -> &SeqCache {
        &self.cache
    }

    /// Keeps what `prompt` shares with the session (see [`prefix::plan`]) and drops the rest of
    /// the caches.
    pub fn reuse(&mut self, prompt: &[u32]) -> Reuse {
        let r = prefix::plan(&self.tokens, self.cache.mtp.end(), prompt);
        self.cache.truncate(r.main);
        self.cache.mtp.truncate_to_position(r.mtp);
        self.tokens.truncate(r.main);
        r
    }

    /// Generates `request` continuing this session: the common prefix of the prompt is reused,
    /// the rest runs, and afterwards the session holds the prompt and the generated tokens (all
    /// but the last, which has no cache row yet). Output is that of a generation from scratch.
    /// On error the session is emptied (its caches may be partly written).
    pub fn generate(
        &mut self,
        model: &Glm5,
        tokenizer: Option<&Tokenizer>,
        stop_ids: &[u32],
        request: &Request,
        spec: Option<&Speculation>,
        on_step: impl FnMut(&Step) -> Result<bool>,
    ) -> Result<(Generation, Reuse)> {
        let reuse = self.reuse(&request.prompt_ids);
        let out = generate_speculative_cached(
            model,
            tokenizer,
            stop_ids,
            request,
            spec,
            &mut self.cache,
            on_step,
        );
        let gen = match out {
            Ok(g) => g,
            Err(e) => {
                *self = Session::new(model);
                return Err(e);
            }
        };
        let mut history = request.prompt_ids.clone();
        history.extend_from_slice(&gen.tokens);
        // A cancelled speculative round can leave rows for tokens that were not reported; only
        // rows of reported tokens stay.
        let keep = self.cache.len().min(history.len() - 1);
        self.cache.truncate(keep);
        self.cache.mtp.truncate_to_position(keep.saturating_sub(1));
        history.truncate(keep);
        self.tokens = history;
        Ok((gen, reuse))
    }

    /// [`Self::generate`] with `bundle`'s model, tokenizer and stop set.
    pub fn generate_spec(
        &mut self,
        bundle: &ModelBundle,
        request: &Request,
        spec: Option<&Speculation>,
        on_step: impl FnMut(&Step) -> Result<bool>,
    ) -> Result<(Generation, Reuse)> {
        self.generate(
            &bundle.model,
            bundle.tokenizer.as_ref(),
            &bundle.stop_ids,
            request,
            spec,
            on_step,
        )
    }

    /// Saves the session to `path` in `format`, crash-safely (the previous file stays whole
    /// until the new one is complete on disk).
    pub fn save(
        &self,
        path: &Path,
        format: SessionFormat,
        model: &Glm5,
        id: &ModelIdentity,
    ) -> std::result::Result<(), SessionError> {
        let dims = model.cache_dims();
        if self.cache.layers.len() != dims.index.len() {
            return Err(SessionError::Inconsistent(format!(
                "{} cached layers for a model with {}",
                self.cache.layers.len(),
                dims.index.len()
            )));
        }
        match format {
            SessionFormat::Nectar => format::write(path, id, &dims, &self.tokens, &self.cache),
            SessionFormat::ColiKv => coli_kv::write(
                path,
                id,
                &dims,
                model.vocab_size(),
                &self.tokens,
                &self.cache,
            ),
        }
    }

    /// Restores a session saved for `model` (whose identity is `id`) from `path`.
    pub fn load(
        path: &Path,
        format: SessionFormat,
        model: &Glm5,
        id: &ModelIdentity,
    ) -> Result<Loaded> {
        check_regular(path)?;
        let dims = model.cache_dims();
        let vocab = model.vocab_size();
        match format {
            SessionFormat::Nectar => {
                let (tokens, cache) = format::read(path, id, &dims, vocab)?;
                Ok(Loaded {
                    session: Session::from_cache(tokens, cache)?,
                    verified: true,
                    recomputed: false,
                })
            }
            SessionFormat::ColiKv => {
                let kv = coli_kv::read(path, id, &dims, vocab)?;
                let (cache, recomputed) = match kv.cache {
                    // `.coli_kv` carries no MTP rows: the cache's MTP part is empty.
                    Some(c) => (c, false),
                    None => (recompute(model, &kv.tokens)?, true),
                };
                Ok(Loaded {
                    session: Session::from_cache(kv.tokens, cache)?,
                    verified: kv.verified,
                    recomputed,
                })
            }
        }
    }
}

/// The main caches of `tokens`, computed by running them (one prefill).
fn recompute(model: &Glm5, tokens: &[u32]) -> Result<SeqCache> {
    let mut cache = model.new_cache();
    if !tokens.is_empty() {
        model.forward(
            &mut [SeqStep {
                cache: &mut cache,
                tokens,
            }],
            &mut NoObserver,
        )?;
    }
    Ok(cache)
}
