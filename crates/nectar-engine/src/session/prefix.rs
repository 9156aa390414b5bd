//! Prompt-prefix reuse: how much of a session's cache a new prompt can keep.

/// What a new prompt keeps of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reuse {
    /// Leading tokens the prompt shares with the session.
    pub common: usize,
    /// Main-cache rows kept (prompt tokens not run again).
    pub main: usize,
    /// MTP-cache rows kept.
    pub mtp: usize,
}

/// The rows a `prompt` keeps of a session holding `tokens` (main rows) and `mtp_rows` MTP rows.
///
/// - Main rows: the longest common prefix, but at most `prompt.len() - 1`: the last prompt token
///   must run to produce the first logits.
/// - MTP row i is computed from the main hidden at i and the token at i + 1, so it stays valid
///   only while both lie in the common prefix: at most `common - 1` rows.
/// - `with_mtp` (MTP drafting this turn): the drafter absorbs the hidden of every main row past
///   its own cache, and hiddens of kept rows are not stored, so main rows are cut back to the
///   MTP rows; those tokens run again and their hiddens feed the MTP layer.
pub fn plan(tokens: &[u32], mtp_rows: usize, prompt: &[u32], with_mtp: bool) -> Reuse {
    let common = tokens
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count();
    let mut main = common.min(prompt.len().saturating_sub(1));
    let mtp = mtp_rows.min(common.saturating_sub(1)).min(main);
    if with_mtp {
        main = mtp;
    }
    Reuse { common, main, mtp }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_common_prefix() {
        let r = plan(&[1, 2, 3, 4], 3, &[1, 2, 9, 9, 9], false);
        assert_eq!((r.common, r.main, r.mtp), (2, 2, 1));
    }

    #[test]
    fn a_fully_cached_prompt_still_runs_its_last_token() {
        let r = plan(&[1, 2, 3], 2, &[1, 2, 3], false);
        assert_eq!((r.common, r.main, r.mtp), (3, 2, 2));
        let r = plan(&[1, 2, 3, 4], 3, &[1, 2], false);
        assert_eq!((r.common, r.main, r.mtp), (2, 1, 1));
        assert_eq!(plan(&[], 0, &[5], false), Reuse::default());
    }

    #[test]
    fn mtp_drafting_keeps_only_rows_with_mtp_rows() {
        let r = plan(&[1, 2, 3, 4, 5], 2, &[1, 2, 3, 4, 5, 6], true);
        assert_eq!((r.common, r.main, r.mtp), (5, 2, 2));
        let r = plan(&[1, 2, 3, 4, 5], 4, &[1, 2, 3, 4, 5, 6], true);
        assert_eq!((r.main, r.mtp), (4, 4));
    }
}
