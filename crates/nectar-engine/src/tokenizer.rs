//! The tokenizer: text to ids and back, loaded from a model's `tokenizer.json`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::grammar::GrammarCompiler;

use crate::error::{Error, Result};

/// A Hugging Face `tokenizer.json` tokenizer.
///
/// Special tokens written literally in the text (e.g. `[gMASK]<sop><|user|>`
/// produced by the chat template) are always recognised as their single ids;
/// that is how a rendered chat prompt becomes the ids the model was trained
/// on.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    /// The structured-output compiler, built on first use (it walks the
    /// whole vocabulary) and shared by clones.
    grammar: Arc<OnceLock<Arc<GrammarCompiler>>>,
}

impl fmt::Debug for Tokenizer {
    // The inner tokenizer's Debug prints the whole vocabulary; keep logs short.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl Tokenizer {
    /// Load a tokenizer from a `tokenizer.json` file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        // Read the bytes ourselves so a missing file is an `Io` error that
        // names the path, rather than a bare "No such file" from the crate.
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|source| Error::TokenizerLoad {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Tokenizer {
            inner,
            path: path.to_path_buf(),
            grammar: Arc::default(),
        })
    }

    /// The file this tokenizer was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Encode text to ids.
    ///
    /// `add_special_tokens` applies the tokenizer's post-processor (e.g. a
    /// BOS). GLM's tokenizer has none, so GLM prompts never get a BOS
    /// prepended either way; the chat template writes `[gMASK]<sop>` itself.
    /// Literal special tokens in `text` are matched regardless of the flag.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        // `encode_fast` skips offset tracking, which we never use.
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|source| Error::Encode {
                path: self.path.clone(),
                source,
            })?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Decode ids to text. With `skip_special_tokens`, special tokens (e.g.
    /// `<|endoftext|>`) are left out of the text.
    ///
    /// An id outside the vocabulary is an error (see
    /// [`Error::UnknownTokenId`]).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.check_ids(ids)?;
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|source| Error::Decode {
                path: self.path.clone(),
                source,
            })
    }

    /// The id of a token string (as it appears in the vocabulary), if any.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary string of an id, if any. For byte-level BPE this is
    /// the byte-mapped form (e.g. `Ġthe`), not display text.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of entries in the vocabulary, added tokens included. The
    /// model's embedding may be larger (padded); ids past this are not text.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The wrapped HF tokenizer (the grammar's token environment reads
    /// its decoder and added tokens).
    pub(crate) fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Where [`GrammarCompiler::for_tokenizer`] caches its compiler.
    pub(crate) fn grammar_cache(&self) -> &OnceLock<Arc<GrammarCompiler>> {
        &self.grammar
    }

    /// Fail on the first id that has no vocabulary entry.
    pub(crate) fn check_ids(&self, ids: &[u32]) -> Result<()> {
        match ids.iter().find(|&&id| self.inner.id_to_token(id).is_none()) {
            Some(&id) => Err(Error::UnknownTokenId {
                path: self.path.clone(),
                id,
                vocab_size: self.vocab_size(),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/nectar-demo-glm5");

    /// The demo model's tokenizer (shared by the crate's unit tests).
    pub(crate) fn demo() -> Tokenizer {
        Tokenizer::from_file(Path::new(DEMO).join("tokenizer.json")).unwrap()
    }

    #[test]
    fn literal_special_tokens_are_single_ids() {
        let tok = demo();
        let ids = tok.encode("[gMASK]<sop><|user|>", false).unwrap();
        let want: Vec<u32> = ["[gMASK]", "<sop>", "<|user|>"]
            .iter()
            .map(|t| tok.token_to_id(t).unwrap())
            .collect();
        assert_eq!(ids, want);
    }

    #[test]
    fn no_bos_is_prepended() {
        let tok = demo();
        assert_eq!(
            tok.encode("hello", true).unwrap(),
            tok.encode("hello", false).unwrap()
        );
    }

    #[test]
    fn decode_skips_special_tokens_on_request() {
        let tok = demo();
        let eos = tok.token_to_id("<|endoftext|>").unwrap();
        let mut ids = tok.encode("hi", false).unwrap();
        ids.push(eos);
        assert_eq!(tok.decode(&ids, false).unwrap(), "hi<|endoftext|>");
        assert_eq!(tok.decode(&ids, true).unwrap(), "hi");
    }

    #[test]
    fn id_round_trip_and_vocab_size() {
        let tok = demo();
        assert_eq!(tok.vocab_size(), 8192);
        assert_eq!(tok.id_to_token(8160).as_deref(), Some("<|endoftext|>"));
        assert_eq!(tok.token_to_id("<|endoftext|>"), Some(8160));
        assert_eq!(tok.id_to_token(1 << 30), None);
    }

    #[test]
    fn unknown_id_is_an_error() {
        let tok = demo();
        let err = tok.decode(&[1, 999_999], false).unwrap_err();
        assert!(
            matches!(err, Error::UnknownTokenId { id: 999_999, .. }),
            "{err}"
        );
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = Tokenizer::from_file("/nonexistent/tokenizer.json").unwrap_err();
        assert!(matches!(err, Error::Io { .. }));
        assert!(err.to_string().contains("/nonexistent/tokenizer.json"));
    }

    #[test]
    fn malformed_file_names_the_path() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(b"{ not json").unwrap();
        let err = Tokenizer::from_file(f.path()).unwrap_err();
        assert!(matches!(err, Error::TokenizerLoad { .. }), "{err}");
        assert!(err.to_string().contains(&*f.path().to_string_lossy()));
    }
}
