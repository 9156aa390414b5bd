//! Prompt-prefix reuse: how much of a session's cache a new prompt can keep.

/// What a new prompt keeps of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reuse {
    /// Leading tokens the prompt shares with the session.
    pub common: usize,
    /// Main-cache rows kept (prompt tokens not run again).
    pub main: usize,
    /// The MTP cache is kept up to this position (its rows before it; it may have gaps).
    pub mtp: usize,
}

/// The rows a `prompt` keeps of a session holding `tokens` (main rows) and an MTP cache that
/// ends at position `mtp_end`.
///
/// - Main rows: the longest common prefix, but at most `prompt.len() - 1`: the last prompt token
///   must run to produce the first logits.
/// - MTP row i is computed from the main hidden at i and the token at i + 1, so it stays valid
///   only while both lie in the common prefix: rows before position `common - 1`.
///
/// MTP drafting does not cut the main rows back to the MTP cache: its cache may have gaps
/// (`spec/mtp.rs`), so the drafter starts from the rows that run this turn.
pub fn plan(tokens: &[u32], mtp_end: usize, prompt: &[u32]) -> Reuse {
    let common = tokens
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count();
    let main = common.min(prompt.len().saturating_sub(1));
    let mtp = mtp_end.min(common.saturating_sub(1)).min(main);
    Reuse { common, main, mtp }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_common_prefix() {
        let r = plan(&[1, 2, 3, 4], 3, &[1, 2, 9, 9, 9]);
        assert_eq!((r.common, r.main, r.mtp), (2, 2, 1));
    }

    #[test]
    fn a_fully_cached_prompt_still_runs_its_last_token() {
        let r = plan(&[1, 2, 3], 2, &[1, 2, 3]);
        assert_eq!((r.common, r.main, r.mtp), (3, 2, 2));
        let r = plan(&[1, 2, 3, 4], 3, &[1, 2]);
        assert_eq!((r.common, r.main, r.mtp), (2, 1, 1));
        assert_eq!(plan(&[], 0, &[5]), Reuse::default());
    }

    #[test]
    fn main_rows_do_not_wait_for_the_mtp_cache() {
        // The MTP cache ends at 2 (it skipped the rest): every common main row stays.
        let r = plan(&[1, 2, 3, 4, 5], 2, &[1, 2, 3, 4, 5, 6]);
        assert_eq!((r.common, r.main, r.mtp), (5, 5, 2));
        let r = plan(&[1, 2, 3, 4, 5], 5, &[1, 2, 3, 4, 5, 6]);
        assert_eq!((r.main, r.mtp), (5, 4));
    }
}
