//! Incremental detokenisation for streaming output.
//!
//! Decoding one id at a time is wrong for two reasons: byte-level BPE tokens
//! can split a UTF-8 character across ids (the first half decodes to U+FFFD),
//! and some decoders change a token's text depending on what precedes it
//! (e.g. stripping a leading space at the start of a sequence). So we decode a
//! small window that starts a little *before* the new ids, and emit only the
//! part of it beyond what the same window decoded to last time — and only once
//! it no longer ends in an incomplete character.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Turns a stream of ids into a stream of text pieces whose concatenation
/// equals decoding all the ids at once.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    skip_special_tokens: bool,
    /// Ids from `prefix_offset`'s origin on; older ones are dropped.
    ids: Vec<u32>,
    /// Start of the decode window: ids before this are never decoded again.
    prefix_offset: usize,
    /// Ids before this have had their text emitted.
    read_offset: usize,
}

impl StreamDecoder {
    /// A decoder for a fresh stream.
    pub fn new(skip_special_tokens: bool) -> StreamDecoder {
        StreamDecoder {
            skip_special_tokens,
            ..StreamDecoder::default()
        }
    }

    /// A decoder whose first window is preceded by the tail of `context`
    /// (typically the prompt), whose text is never emitted. This keeps
    /// context-dependent decoders (SentencePiece's leading-space rule) from
    /// treating the first generated id as the start of the text.
    pub fn with_context(skip_special_tokens: bool, context: &[u32]) -> StreamDecoder {
        // A handful of ids is enough context for any decoder rule we know of;
        // more would only make every window longer.
        const CONTEXT_IDS: usize = 6;
        let tail = &context[context.len().saturating_sub(CONTEXT_IDS)..];
        StreamDecoder {
            skip_special_tokens,
            ids: tail.to_vec(),
            prefix_offset: 0,
            read_offset: tail.len(),
        }
    }

    /// Add one id; returns the text it completes (possibly empty, when the
    /// id ends part-way through a character or is a skipped special token).
    ///
    /// An id outside the vocabulary is an error and leaves the state
    /// unchanged.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        tok.check_ids(&[id])?;
        self.ids.push(id);
        let prefix = self.decode(tok, self.prefix_offset, self.read_offset)?;
        let full = self.decode(tok, self.prefix_offset, self.ids.len())?;
        // U+FFFD at the end means the window stops inside a character whose
        // remaining bytes are still to come: wait for them.
        if full.len() <= prefix.len() || full.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let delta = suffix_after(&full, &prefix).to_owned();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.compact();
        Ok(delta)
    }

    /// Emit whatever is still held back (an incomplete character decodes as
    /// U+FFFD, as a full decode would) and start a fresh stream.
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String> {
        let prefix = self.decode(tok, self.prefix_offset, self.read_offset)?;
        let full = self.decode(tok, self.prefix_offset, self.ids.len())?;
        let delta = if full.len() > prefix.len() {
            suffix_after(&full, &prefix).to_owned()
        } else {
            String::new()
        };
        *self = StreamDecoder::new(self.skip_special_tokens);
        Ok(delta)
    }

    fn decode(&self, tok: &Tokenizer, start: usize, end: usize) -> Result<String> {
        let window = self.ids.get(start..end).unwrap_or_default();
        tok.decode(window, self.skip_special_tokens)
    }

    /// Drop ids that will never be decoded again so memory stays bounded
    /// over long generations.
    fn compact(&mut self) {
        if self.prefix_offset > 0 {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
    }
}

/// The part of `full` after `prefix`. The window's text normally extends the
/// previous window's text; if a decoder rewrote the overlap, fall back to
/// cutting at the same byte length (on a character boundary) rather than
/// panicking or re-emitting text.
fn suffix_after<'a>(full: &'a str, prefix: &str) -> &'a str {
    if let Some(rest) = full.strip_prefix(prefix) {
        return rest;
    }
    let mut cut = prefix.len().min(full.len());
    while !full.is_char_boundary(cut) {
        cut += 1;
    }
    &full[cut..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::demo;

    fn stream(tok: &Tokenizer, ids: &[u32], skip: bool) -> (Vec<String>, String) {
        let mut dec = StreamDecoder::new(skip);
        let mut pieces: Vec<String> = ids.iter().map(|&id| dec.push(tok, id).unwrap()).collect();
        pieces.push(dec.finish(tok).unwrap());
        let joined = pieces.concat();
        (pieces, joined)
    }

    #[test]
    fn concatenation_matches_full_decode() {
        let tok = demo();
        for text in ["Hello, world!", "春风不语，春风不语。", "emoji 🐝 and ü"] {
            let ids = tok.encode(text, false).unwrap();
            let (_, joined) = stream(&tok, &ids, false);
            assert_eq!(joined, text);
        }
    }

    #[test]
    fn never_emits_a_partial_character() {
        let tok = demo();
        let text = "🐝🐝🐝 欧阳修";
        let ids = tok.encode(text, false).unwrap();
        let (pieces, joined) = stream(&tok, &ids, false);
        assert_eq!(joined, text);
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    }

    #[test]
    fn finish_flushes_an_incomplete_character() {
        let tok = demo();
        let ids = tok.encode("🐝", false).unwrap();
        assert!(ids.len() > 1, "test needs a byte-split character");
        let mut dec = StreamDecoder::new(false);
        assert_eq!(dec.push(&tok, ids[0]).unwrap(), "");
        let tail = dec.finish(&tok).unwrap();
        assert_eq!(tail, tok.decode(&ids[..1], false).unwrap());
        assert!(tail.ends_with('\u{FFFD}'));
    }

    #[test]
    fn skipped_special_tokens_emit_nothing() {
        let tok = demo();
        let mut ids = tok.encode("done", false).unwrap();
        ids.push(tok.token_to_id("<|endoftext|>").unwrap());
        assert_eq!(stream(&tok, &ids, true).1, "done");
        assert_eq!(stream(&tok, &ids, false).1, "done<|endoftext|>");
    }

    #[test]
    fn context_is_not_emitted() {
        let tok = demo();
        let prompt = tok.encode("The sky is", false).unwrap();
        let gen = tok.encode(" blue.", false).unwrap();
        let mut dec = StreamDecoder::with_context(false, &prompt);
        let mut out = String::new();
        for &id in &gen {
            out += &dec.push(&tok, id).unwrap();
        }
        out += &dec.finish(&tok).unwrap();
        assert_eq!(out, " blue.");
    }

    #[test]
    fn unknown_id_errors_without_corrupting_state() {
        let tok = demo();
        let ids = tok.encode("ok", false).unwrap();
        let mut dec = StreamDecoder::new(false);
        assert!(dec.push(&tok, u32::MAX).is_err());
        let mut out = String::new();
        for &id in &ids {
            out += &dec.push(&tok, id).unwrap();
        }
        out += &dec.finish(&tok).unwrap();
        assert_eq!(out, "ok");
    }

    #[test]
    fn suffix_after_handles_rewritten_overlap() {
        assert_eq!(suffix_after("abcdef", "abc"), "def");
        assert_eq!(suffix_after("xbcdef", "abc"), "def");
        // Cut lands inside 'é' (2 bytes): move forward, never panic.
        assert_eq!(suffix_after("aé!", "ab"), "!");
        assert_eq!(suffix_after("a", "abc"), "");
    }
}
