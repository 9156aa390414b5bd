//! The model's vocabulary as llguidance sees it: every id's bytes.
//!
//! `toktrie_hf_tokenizers` does this for HF tokenizers but pins
//! `tokenizers` 0.21, and we use 0.22; this is its logic, applied to our
//! [`Tokenizer`]:
//!
//! - byte-level BPE (GPT-2 style, GLM's): a vocabulary string is bytes
//!   written in the GPT-2 byte-to-unicode alphabet, mapped back here;
//! - byte fallback (SentencePiece style): `<0xNN>` is that byte, and the
//!   decoder's space character (`▁`) is a space;
//! - added tokens: those flagged special are marked with
//!   [`TokTrie::SPECIAL_TOKEN_MARKER`], so no grammar can produce them as
//!   text; others (GLM's `<think>`, `<tool_call>`, …) are their literal
//!   content (unlike `toktrie_hf_tokenizers`, which also hides every
//!   `<...>` token);
//! - ids the model has past the tokenizer's vocabulary (a padded embedding)
//!   become unreachable special placeholders;
//! - the eos set is the model's stop ids, so a complete grammar allows
//!   exactly the tokens that end generation.

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tokenizers::DecoderWrapper;

/// How vocabulary strings spell bytes, read off the decoder.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Spelling {
    ByteLevel,
    ByteFallback { space: char },
}

/// Builds the token environment of `tokenizer` for a model whose logits
/// rows have `vocab_size` entries and whose generation ends at `eos`.
pub(crate) fn build(tokenizer: &Tokenizer, vocab_size: usize, eos: &[u32]) -> Result<TokEnv> {
    let bad = |reason: String| Error::Request(format!("structured output: {reason}"));
    let hf = tokenizer.hf();
    let spelling = spelling(hf.get_decoder()).ok_or_else(|| {
        bad(format!(
            "{}: the decoder is neither byte-level nor byte-fallback, so token bytes are unknown",
            tokenizer.path().display()
        ))
    })?;
    let n_tok = hf.get_vocab_size(true);
    if vocab_size < n_tok {
        return Err(bad(format!(
            "the model's vocabulary ({vocab_size}) is smaller than the tokenizer's ({n_tok})"
        )));
    }
    let Some((&first, rest)) = eos.split_first() else {
        return Err(bad(
            "the model has no stop ids, so a grammar could never end".into(),
        ));
    };
    if let Some(&id) = eos.iter().find(|&&id| id as usize >= vocab_size) {
        return Err(bad(format!("stop id {id} is outside the vocabulary")));
    }
    let mut specials = HashSet::new();
    let mut words: Vec<Vec<u8>> = vec![Vec::new(); vocab_size];
    for (id, added) in hf.get_added_tokens_decoder() {
        // Only tokens the tokenizer flags special are kept out of text. GLM's
        // `<think>`, `<tool_call>`, `<arg_key>`… are added but not special:
        // the model writes them as text, tokenising that text yields them
        // (forced-token fast-forward does), and grammars must match them as
        // their bytes.
        if added.special {
            specials.insert(id);
        } else if let Some(w) = words.get_mut(id as usize) {
            *w = added.content.clone().into_bytes();
        }
    }
    let chars = byte_level_chars();
    for id in 0..n_tok as u32 {
        let Some(name) = hf.id_to_token(id) else {
            continue;
        };
        words[id as usize] = if specials.contains(&id) {
            special(name.as_bytes())
        } else {
            match spelling {
                Spelling::ByteLevel => match name.chars().map(|c| chars.get(&c).copied()).collect()
                {
                    Some(bytes) => bytes,
                    // An added non-special token is kept as its literal
                    // content (set above); anything else unmappable is
                    // unreachable, as in toktrie_hf_tokenizers.
                    None => continue,
                },
                Spelling::ByteFallback { space } => fallback_bytes(&name, space),
            }
        };
    }
    // A padded embedding: ids no tokenizer entry names must never be
    // produced, and special tokens are never produced by a grammar.
    for (id, w) in words.iter_mut().enumerate().skip(n_tok) {
        *w = special(format!("<[{id}]>").as_bytes());
    }
    let info = TokRxInfo::new(vocab_size as u32, first);
    let mut trie = TokTrie::from(&info, &words);
    if !rest.is_empty() {
        trie = trie.with_eos_tokens(eos);
    }
    Ok(Arc::new(Env {
        trie,
        hf: hf.clone(),
    }))
}

fn special(name: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(name.len() + 1);
    bytes.push(TokTrie::SPECIAL_TOKEN_MARKER);
    bytes.extend_from_slice(name);
    bytes
}

fn spelling(decoder: Option<&DecoderWrapper>) -> Option<Spelling> {
    match decoder? {
        DecoderWrapper::ByteLevel(_) => Some(Spelling::ByteLevel),
        DecoderWrapper::ByteFallback(_) => Some(Spelling::ByteFallback { space: ' ' }),
        DecoderWrapper::Sequence(seq) => {
            let mut found = None;
            let mut space = ' ';
            for d in seq.get_decoders() {
                match d {
                    DecoderWrapper::Replace(r) if r.content == " " => {
                        // `Replace`'s pattern is private; its serialised form
                        // is the only way to read it.
                        let v = serde_json::to_value(r).ok()?;
                        let mut cs = v["pattern"]["String"].as_str()?.chars();
                        if let (Some(c), None) = (cs.next(), cs.next()) {
                            space = c;
                        }
                    }
                    d => found = found.or(spelling(Some(d))),
                }
            }
            match found? {
                Spelling::ByteFallback { .. } => Some(Spelling::ByteFallback { space }),
                s => Some(s),
            }
        }
        _ => None,
    }
}

fn fallback_bytes(name: &str, space: char) -> Vec<u8> {
    if let Some(hex) = name.strip_prefix("<0x").and_then(|s| s.strip_suffix('>')) {
        if let (2, Ok(b)) = (hex.len(), u8::from_str_radix(hex, 16)) {
            return vec![b];
        }
    }
    name.replace(space, " ").into_bytes()
}

/// GPT-2's byte-to-unicode alphabet, inverted: printable Latin-1 bytes are
/// themselves, the other 68 bytes are U+0100 onwards in byte order.
fn byte_level_chars() -> HashMap<char, u8> {
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            let c = b as char;
            if matches!(c, '!'..='~' | '\u{a1}'..='\u{ac}' | '\u{ae}'..='\u{ff}') {
                (c, b)
            } else {
                next += 1;
                (char::from_u32(next - 1).unwrap_or(c), b)
            }
        })
        .collect()
}

/// llguidance's view of the tokenizer: the trie, and the HF tokenizer for
/// canonical tokenisation of forced text. It holds the HF tokenizer rather
/// than our [`Tokenizer`] because ours caches the compiler that holds this
/// environment (a reference cycle would never be freed).
struct Env {
    trie: TokTrie,
    hf: tokenizers::Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            // The trait cannot fail; the greedy trie tokenisation is a
            // valid (if not canonical) spelling of the same bytes.
            match self.hf.encode_fast(text, false) {
                Ok(enc) => enc.get_ids().to_vec(),
                Err(_) => self.trie.greedy_tokenize(text.as_bytes()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::demo;

    #[test]
    fn byte_level_alphabet_is_a_bijection() {
        let m = byte_level_chars();
        assert_eq!(m.len(), 256);
        assert_eq!(m[&'Ġ'], b' ');
        assert_eq!(m[&'Ċ'], b'\n');
        assert_eq!(m[&'a'], b'a');
    }

    #[test]
    fn token_bytes_decode_like_the_tokenizer() {
        let tok = demo();
        let env = build(&tok, 8200, &[8160, 8167]).unwrap();
        let trie = env.tok_trie();
        assert_eq!(trie.vocab_size(), 8200);
        assert_eq!(trie.eos_tokens(), &[8160, 8167]);
        for text in ["hello world", " {\"a\": 12}\n", "naïve café"] {
            let ids = tok.encode(text, false).unwrap();
            let bytes: Vec<u8> = ids.iter().flat_map(|&t| trie.token(t).to_vec()).collect();
            assert_eq!(String::from_utf8(bytes).unwrap(), text);
            assert_eq!(env.tokenize_bytes(text.as_bytes()), ids);
        }
        // Special and padding ids are marked, never plain text.
        assert!(trie.is_special_token(8160));
        assert!(trie.is_special_token(tok.token_to_id("<|user|>").unwrap()));
        assert!(trie.is_special_token(8195));
    }

    #[test]
    fn a_model_vocabulary_smaller_than_the_tokenizer_is_refused() {
        let err = build(&demo(), 100, &[1]).err().unwrap();
        assert!(err.to_string().contains("smaller"), "{err}");
    }
}
