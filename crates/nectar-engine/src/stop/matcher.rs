//! Stop strings over streamed text.
//!
//! Generated text arrives in pieces (one per token, or none while a
//! character is incomplete) and a stop string may span any number of them.
//! The matcher releases only text that can no longer become part of a stop:
//! it holds back the longest tail that is the beginning of some stop string,
//! so a client never sees half of a stop that later completes.

use crate::error::{Error, Result};

/// What feeding one piece of text produced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopScan {
    /// Text that is safe to emit now (possibly empty). On a match, the text
    /// up to the start of the stop string.
    pub text: String,
    /// Index (into the stop list) of the stop string that matched, if one
    /// did. After a match the matcher swallows everything.
    pub matched: Option<usize>,
}

/// Finds the first stop string in a stream of text pieces.
///
/// "First" means the stop that **completes** earliest in the text; if two
/// complete at the same character, the longer one (it starts earlier); if
/// two are identical, the lower index. This is the only rule that gives the
/// same answer however the text is cut into pieces: with stops `abcd` and
/// `bc`, the text `abcd` stops at `bc` whether it arrives as one piece or as
/// `ab`, `c`, `d`, because generation would have ended when `c` arrived.
///
/// Text is matched as Unicode strings, so a stop is found however the
/// tokenizer split its characters' bytes (the stream decoder only ever
/// releases whole characters).
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released: a possible start of a stop.
    held: String,
    done: bool,
}

impl StopMatcher {
    /// A matcher for `stops`. An empty stop string is an error (it would
    /// match before any text).
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> Result<StopMatcher> {
        let stops: Vec<String> = stops.into_iter().map(Into::into).collect();
        if let Some(i) = stops.iter().position(String::is_empty) {
            return Err(Error::InvalidParam {
                param: "stop",
                reason: format!("stop string {i} is empty"),
            });
        }
        Ok(StopMatcher {
            stops,
            held: String::new(),
            done: false,
        })
    }

    /// The stop strings, in the order given.
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// True once a stop has matched.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Feed the next piece of generated text.
    pub fn push(&mut self, piece: &str) -> StopScan {
        if self.done {
            return StopScan::default();
        }
        self.held.push_str(piece);
        if let Some((start, index)) = self.first_match() {
            self.done = true;
            self.held.truncate(start);
            return StopScan {
                text: std::mem::take(&mut self.held),
                matched: Some(index),
            };
        }
        let keep = self.partial_tail_len();
        let text = self.held[..self.held.len() - keep].to_owned();
        self.held.drain(..self.held.len() - keep);
        StopScan {
            text,
            matched: None,
        }
    }

    /// The stream ended without a match: release the held-back text, which
    /// turned out not to be a stop.
    pub fn finish(&mut self) -> String {
        if self.done {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }

    /// `(start, index)` of the match that ends first (ties: starts first,
    /// then lower index). The first occurrence of each stop is the one that
    /// ends first among its occurrences, so one `find` per stop suffices.
    fn first_match(&self) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize, usize)> = None;
        for (index, stop) in self.stops.iter().enumerate() {
            if let Some(start) = self.held.find(stop.as_str()) {
                let cand = (start + stop.len(), start, index);
                if best.is_none_or(|b| cand < b) {
                    best = Some(cand);
                }
            }
        }
        best.map(|(_, start, index)| (start, index))
    }

    /// Length in bytes of the longest tail of `held` that is a proper prefix
    /// of some stop string (0 when none is).
    fn partial_tail_len(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let max = longest.saturating_sub(1).min(self.held.len());
        (1..=max)
            .rev()
            .find(|&k| {
                let at = self.held.len() - k;
                self.held.is_char_boundary(at) && {
                    let tail = &self.held[at..];
                    self.stops.iter().any(|s| s.starts_with(tail))
                }
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `pieces` through a fresh matcher: (every emitted chunk, the
    /// matched stop).
    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, Option<usize>) {
        let mut m = StopMatcher::new(stops.iter().copied()).unwrap();
        let mut out = Vec::new();
        for p in pieces {
            let s = m.push(p);
            out.push(s.text);
            if s.matched.is_some() {
                return (out, s.matched);
            }
        }
        out.push(m.finish());
        (out, None)
    }

    fn joined(stops: &[&str], pieces: &[&str]) -> (String, Option<usize>) {
        let (out, m) = run(stops, pieces);
        (out.concat(), m)
    }

    #[test]
    fn stop_inside_one_piece() {
        assert_eq!(joined(&["END"], &["abcENDxyz"]), ("abc".into(), Some(0)));
    }

    #[test]
    fn stop_split_across_pieces_is_never_leaked() {
        let (out, m) = run(&["<stop>"], &["hello <", "st", "op", "> after"]);
        assert_eq!(m, Some(0));
        assert_eq!(out, ["hello ", "", "", ""]);
    }

    #[test]
    fn false_start_is_released() {
        let (out, m) = run(&["<stop>"], &["a <st", "ay> b"]);
        assert_eq!(m, None);
        assert_eq!(out, ["a ", "<stay> b", ""]);
        // Held text at the end of the stream is released by `finish`.
        assert_eq!(run(&["<stop>"], &["x <sto"]).0, ["x ", "<sto"]);
    }

    #[test]
    fn stop_at_the_very_start() {
        assert_eq!(
            joined(&["Q:"], &["Q", ":", " more"]),
            (String::new(), Some(0))
        );
        assert_eq!(joined(&["Q:"], &["Q: more"]), (String::new(), Some(0)));
    }

    #[test]
    fn overlapping_stops_first_to_complete_wins() {
        assert_eq!(joined(&["bc", "ab"], &["xabc"]), ("x".into(), Some(1)));
        assert_eq!(joined(&["abcd", "bc"], &["abcd"]), ("a".into(), Some(1)));
        assert_eq!(
            joined(&["abcd", "bc"], &["ab", "c", "d"]),
            ("a".into(), Some(1))
        );
        // Same end: the longer (earlier-starting) stop wins.
        assert_eq!(joined(&["c", "abc"], &["xabc"]), ("x".into(), Some(1)));
        // Identical stops: the lower index.
        assert_eq!(joined(&["s", "s"], &["as"]), ("a".into(), Some(0)));
    }

    #[test]
    fn self_overlapping_stop() {
        assert_eq!(
            joined(&["aab"], &["a", "a", "a", "b", "c"]),
            ("a".into(), Some(0))
        );
        assert_eq!(
            joined(&["aab"], &["a", "a", "a", "c"]),
            ("aaac".into(), None)
        );
    }

    #[test]
    fn unicode_stops() {
        assert_eq!(
            joined(&["。"], &["春风不语", "。", "后"]),
            ("春风不语".into(), Some(0))
        );
        assert_eq!(joined(&["🐝!"], &["bee 🐝", "!"]), ("bee ".into(), Some(0)));
        // A tail that shares leading bytes with a stop but not a character
        // is not held back: 'é' (C3 A9) vs stop 'ê' (C3 AA).
        assert_eq!(run(&["ê"], &["é"]).0, ["é", ""]);
    }

    #[test]
    fn after_a_match_everything_is_swallowed() {
        let mut m = StopMatcher::new(["x"]).unwrap();
        assert_eq!(m.push("axb").matched, Some(0));
        assert!(m.is_done());
        assert_eq!(m.push("more"), StopScan::default());
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn no_stops_passes_everything_through() {
        assert_eq!(run(&[], &["a", "b"]).0, ["a", "b", ""]);
    }

    #[test]
    fn empty_stop_is_an_error() {
        let err = StopMatcher::new(["ok", ""]).unwrap_err();
        assert!(
            matches!(err, Error::InvalidParam { param: "stop", .. }),
            "{err}"
        );
    }

    /// The result must not depend on how the text is cut into pieces: try
    /// every cut into up to three pieces, at every character boundary.
    #[test]
    fn result_is_independent_of_piece_boundaries() {
        let stops = ["abcd", "bc", "é🐝", "xx y"];
        for text in [
            "zzabcdzz",
            "zzabczz",
            "aé🐝b",
            "xxx yy",
            "nothing here",
            "abé🐝",
        ] {
            let whole = joined(&stops, &[text]);
            let cuts: Vec<usize> = (0..=text.len())
                .filter(|&i| text.is_char_boundary(i))
                .collect();
            for &i in &cuts {
                for &j in cuts.iter().filter(|&&j| j >= i) {
                    let pieces = [&text[..i], &text[i..j], &text[j..]];
                    assert_eq!(joined(&stops, &pieces), whole, "{text:?} cut at {i},{j}");
                }
            }
        }
    }
}
