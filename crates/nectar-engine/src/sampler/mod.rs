//! Turning one row of logits into one token.
//!
//! Order of operations, fixed and the same for every request:
//!
//! 1. **logit bias** (`logit_bias`);
//! 2. **penalties**: repetition (prompt + output, or a window), then presence
//!    and frequency (generated tokens);
//! 3. **allowed mask** (optional; the structured-output hook);
//! 4. **temperature** — `0` means greedy: the argmax, lowest id on ties;
//! 5. **top-k → top-p → min-p** truncation, each over the survivors of the
//!    one before;
//! 6. **draw** one token with noise keyed by the request's seed and the token's output
//!    position (`noise.rs`: the Gumbel-max trick, exact for the distribution of step 5).
//!
//! Steps 1–3 are [`process_logits`], 4–5 [`distribution`]; both are pure
//! functions so a speculative verifier can recompute the target distribution
//! of any position. Logprobs (see [`Logprobs`]) come from the log-softmax
//! after step 4 and before step 5.
//!
//! Reproducibility: the token at output position `t` (tokens generated before it, forced
//! ones included) depends only on the distribution at `t`, the seed and `t` — not on how
//! many draws came before — so a seed replays the same tokens for the same logits on any
//! machine, and speculative decoding, which draws in a different order at each draft depth,
//! gives a seeded request exactly the text plain decoding gives (see [`Sampler::coupled`]).
//! Speculative rejection sampling of unseeded requests draws its acceptance uniforms from
//! the request's ChaCha12 stream (keyed by the seed's 8 little-endian bytes, zero-padded).

mod distribution;
mod history;
mod logprobs;
mod noise;
mod params;
mod process;

pub use distribution::{argmax, distribution, Distribution};
pub use history::TokenHistory;
pub use logprobs::{log_softmax, logprobs, Logprobs};
pub use params::{SamplingParams, MAX_TOP_LOGPROBS};
pub use process::process_logits;

use crate::error::{Error, Result};
use rand_chacha::rand_core::{OsRng, RngCore, SeedableRng, TryRngCore};
use rand_chacha::ChaCha12Rng;

/// What one sampling step chose.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The chosen token id.
    pub token: u32,
    /// Its log-probability and the top alternatives, when the request asked.
    pub logprobs: Option<Logprobs>,
}

/// One request's sampler: its validated parameters and its own RNG.
///
/// When to use: one per request, for its whole life; never share one between
/// requests (the RNG stream is what makes a seed reproducible).
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    vocab_size: usize,
    seed: u64,
    rng: ChaCha12Rng,
}

impl Sampler {
    /// Validates `params` against a vocabulary of `vocab_size` ids (the
    /// length of a logits row) and seeds the RNG: from `params.seed`, or from
    /// the OS when it is `None` and the request samples.
    pub fn new(params: SamplingParams, vocab_size: usize) -> Result<Sampler> {
        params.validate(vocab_size)?;
        let seed = match params.seed {
            Some(s) => s,
            // Greedy never draws, so it needs no entropy (and cannot fail
            // for lack of it).
            None if params.is_greedy() => 0,
            None => OsRng.try_next_u64().map_err(Error::Entropy)?,
        };
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        Ok(Sampler {
            params,
            vocab_size,
            seed,
            rng: ChaCha12Rng::from_seed(key),
        })
    }

    /// The length of a logits row.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The request's parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed in use (drawn from the OS when a sampled request gave none;
    /// 0 for an unseeded greedy one), so a sampled run can be replayed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The next uniform number in `[0, 1)` from the request's stream (53
    /// random bits). A speculative verifier draws its acceptance tests here
    /// so they replay with the seed too.
    pub fn next_uniform(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Whether speculative verification of this request is *coupled*: a draft at position
    /// `t` is accepted exactly when the target's own keyed draw at `t` equals it, and
    /// otherwise that draw replaces it — so the output is plain decoding's for any draft
    /// depth, provider or batch. True for a sampled request that gave a seed (its text must
    /// replay); an unseeded one verifies by rejection sampling ([`crate::verify_draft`]),
    /// which accepts more MTP drafts (`benchmarks/RESULTS.md`, "Seeded speculative
    /// sampling"). Greedy requests need neither (exact match with the argmax).
    pub fn coupled(&self) -> bool {
        self.params.seed.is_some() && !self.params.is_greedy()
    }

    /// Steps 1–5 for one row: the processed logits and the distribution.
    pub fn distribution(
        &self,
        logits: &[f32],
        history: &TokenHistory,
        allowed: Option<&[bool]>,
    ) -> Result<(Vec<f32>, Distribution)> {
        if logits.len() != self.vocab_size {
            return Err(Error::ShapeMismatch {
                what: "logits",
                expected: self.vocab_size,
                found: logits.len(),
            });
        }
        let processed = process_logits(&self.params, logits, history, allowed)?;
        let dist = distribution(&self.params, &processed)?;
        Ok((processed, dist))
    }

    /// Chooses the next token from one row of `logits` (one entry per
    /// vocabulary id), given what the request has seen and, optionally, which
    /// ids a grammar allows.
    pub fn sample(
        &mut self,
        logits: &[f32],
        history: &TokenHistory,
        allowed: Option<&[bool]>,
    ) -> Result<Sampled> {
        let (processed, dist) = self.distribution(logits, history, allowed)?;
        let token = self.draw(&dist, history.generated().len());
        let logprobs = self.logprobs_of(&processed, token);
        Ok(Sampled { token, logprobs })
    }

    /// Step 6 alone: the token at output `position` (tokens generated before it) from
    /// `dist`, with the noise of that position (`noise.rs`). Greedy requests take the point
    /// mass. Consumes nothing from the request's stream: drawing the same position twice
    /// gives the same token.
    pub fn draw(&self, dist: &Distribution, position: usize) -> u32 {
        if self.params.is_greedy() {
            dist.sample_at(0.0)
        } else {
            noise::PositionNoise::new(self.seed, position).choose(dist)
        }
    }

    /// The logprobs of `token` under `processed` logits, when the request
    /// asked for them (the convention of [`Logprobs`]).
    pub fn logprobs_of(&self, processed: &[f32], token: u32) -> Option<Logprobs> {
        self.params
            .logprobs
            .map(|n| logprobs(processed, self.params.temperature, token, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampled(seed: u64, n: usize) -> Vec<u32> {
        let p = SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(p, 4).unwrap();
        let mut h = TokenHistory::new(&[]);
        (0..n)
            .map(|_| {
                let t = s.sample(&[0.0, 0.1, 0.2, 0.3], &h, None).unwrap().token;
                h.push(t);
                t
            })
            .collect()
    }

    #[test]
    fn same_seed_same_tokens_different_seed_different_tokens() {
        assert_eq!(sampled(42, 64), sampled(42, 64));
        assert_ne!(sampled(42, 64), sampled(43, 64));
    }

    #[test]
    fn unseeded_requests_report_their_seed() {
        let hot = SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        };
        let s = Sampler::new(hot.clone(), 4).unwrap();
        let t = Sampler::new(hot.clone(), 4).unwrap();
        assert_ne!(s.seed(), t.seed(), "seeds come from the OS");
        let p = SamplingParams {
            seed: Some(s.seed()),
            ..hot
        };
        assert_eq!(Sampler::new(p, 4).unwrap().rng, s.rng);
    }

    #[test]
    fn greedy_consumes_no_randomness() {
        let p = SamplingParams {
            seed: Some(1),
            ..SamplingParams::default()
        };
        let mut a = Sampler::new(p.clone(), 3).unwrap();
        let b = Sampler::new(p, 3).unwrap();
        let t = a
            .sample(&[0.0, 5.0, 1.0], &TokenHistory::new(&[]), None)
            .unwrap();
        assert_eq!(t.token, 1);
        assert_eq!(a.rng, b.rng);
    }

    #[test]
    fn wrong_row_length_is_an_error() {
        let mut s = Sampler::new(SamplingParams::default(), 3).unwrap();
        let err = s
            .sample(&[0.0; 2], &TokenHistory::new(&[]), None)
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::ShapeMismatch {
                    expected: 3,
                    found: 2,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn uniform_is_in_range() {
        let mut s = Sampler::new(SamplingParams::default(), 1).unwrap();
        for _ in 0..1000 {
            let u = s.next_uniform();
            assert!((0.0..1.0).contains(&u));
        }
    }
}
