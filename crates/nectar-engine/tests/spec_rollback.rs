//! Cache rollback after partial and zero acceptance: after every round the
//! main and MTP caches hold exactly the kept rows, bit-identical to an
//! uninterrupted plain decode (whose MTP layer, like the drafter's, absorbs
//! only the prompt's last `MTP_ABSORB_WINDOW` rows, at their positions), and
//! the next logits equal that decode's bit for bit.

use nectar_engine::{
    argmax, Batch, BatchOptions, Drafter, ModelBundle, Proposals, Request, RequestState, Result,
    RowOptions, Speculation, Speculator, MTP_ABSORB_WINDOW,
};
use nectar_model::{Glm5, MtpStep, NoObserver, SeqCache, SeqStep};
use std::path::Path;
use std::sync::OnceLock;

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/nectar-demo-glm5");
/// The demo's `en_text` reference prompt; with [`TOKENS`] the context passes
/// `index_topk` (128), so the DSA indexer prunes during verification.
const PROMPT: &[u32] = &[
    2337, 1050, 1001, 11, 4568, 863, 369, 3029, 25, 320, 863, 621, 3029, 13, 568, 1050, 3666, 274,
    3029, 11, 431, 448, 621, 1750, 25,
];
const TOKENS: usize = 112;

fn model() -> &'static Glm5 {
    static B: OnceLock<ModelBundle> = OnceLock::new();
    &B.get_or_init(|| ModelBundle::open(Path::new(DEMO)).unwrap())
        .model
}

/// An uninterrupted greedy decode, one token per forward, with the MTP
/// layer absorbing every row as it is produced.
struct Reference {
    tokens: Vec<u32>,
    /// `logits[g]` predicts generated token g.
    logits: Vec<Vec<f32>>,
    cache: SeqCache,
}

fn reference(model: &Glm5, prompt: &[u32], n: usize) -> Reference {
    let hd = model.hidden_size();
    let mut cache = model.new_cache();
    let mut r = Reference {
        tokens: Vec::new(),
        logits: Vec::new(),
        cache: model.new_cache(),
    };
    let mut input = prompt.to_vec();
    while r.tokens.len() < n {
        let h = model
            .forward(
                &mut [SeqStep {
                    cache: &mut cache,
                    tokens: &input,
                }],
                &mut NoObserver,
            )
            .unwrap();
        let logits = model.logits(&h[h.len() - hd..]).unwrap();
        let t = argmax(&logits);
        // The MTP rows of these inputs: (h_i, token at i + 1), at most the window's last.
        let mut next = input[1..].to_vec();
        next.push(t);
        let skip = next.len().saturating_sub(MTP_ABSORB_WINDOW);
        let (h, next) = (&h[skip * hd..], &next[skip..]);
        cache.mtp.skip_to(cache.len() - next.len()).unwrap();
        model
            .mtp_forward(
                &mut [MtpStep {
                    cache: &mut cache,
                    hidden: h,
                    next_tokens: next,
                }],
                &mut NoObserver,
            )
            .unwrap();
        r.tokens.push(t);
        r.logits.push(logits);
        input = vec![t];
    }
    r.cache = cache;
    r
}

/// Proposes the reference continuation for its first `right` drafts, then
/// tokens the model will not produce.
struct Scripted {
    want: Vec<u32>,
    prompt: usize,
    right: usize,
}

impl Drafter for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }
    fn observe(&mut self, _: &mut SeqCache, _: &[f32], _: &[u32]) -> Result<()> {
        Ok(())
    }
    fn draft(&mut self, _: &Glm5, _: &mut SeqCache, p: &mut Proposals<'_>) -> Result<()> {
        for j in 0..p.max() {
            let at = p.context().len() - self.prompt;
            let good = self.want.get(at).copied().unwrap_or(0);
            p.push(if j < self.right {
                good
            } else {
                (good + 1) % 8160
            })?;
        }
        Ok(())
    }
}

/// Every stored row of `got` equals the same row of `want` bit for bit.
fn same_prefix(got: &[f32], want: &[f32], what: &str) {
    assert!(
        got.len() <= want.len(),
        "{what}: {} > {}",
        got.len(),
        want.len()
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(got), bits(&want[..got.len()]), "{what}");
}

/// A batch of one row speculating with `drafter` (`None`: the MTP head) at depth `gamma`.
fn batch_of_one(gamma: usize, drafter: Option<Box<dyn Drafter + Send>>) -> Batch {
    let model = model();
    let mut batch = Batch::new(BatchOptions {
        prefill_chunk: usize::MAX,
        ..BatchOptions::default()
    });
    let req = Request::new(PROMPT.to_vec(), TOKENS);
    let state = RequestState::new(&req, &[], model.vocab_size(), None).unwrap();
    let opts = RowOptions {
        speculation: Some(Speculation {
            speculator: Speculator::Mtp { gamma },
            auto: false,
        }),
        drafter,
        ..RowOptions::default()
    };
    batch.admit_row(model, 0, state, opts).unwrap();
    batch
}

/// Steps the batch to the end, checking the caches and the next logits
/// after every step; returns the (drafted, accepted) of each step.
fn check_rounds(batch: &mut Batch, r: &Reference, mtp: bool) -> Vec<(usize, usize)> {
    let model = model();
    let mut rounds = Vec::new();
    let mut gen = Vec::new();
    loop {
        let before = batch.cache(0).unwrap().len();
        let report = batch.step(model, None).unwrap();
        let finished = report.rows.iter().any(|s| s.summary.is_some());
        gen.extend(report.rows.iter().map(|s| s.step.token));
        rounds.push((report.drafted, report.accepted));
        let generated = gen.len();
        assert_eq!(gen, &r.tokens[..generated]);
        if finished {
            break;
        }
        let c = batch.cache(0).unwrap();
        // Exactly the fed tokens: the prompt and every output token but the last.
        assert_eq!(c.len(), PROMPT.len() + generated - 1);
        for (l, (got, want)) in c.layers.iter().zip(&r.cache.layers).enumerate() {
            same_prefix(&got.latent, &want.latent, &format!("layer {l} latent"));
            same_prefix(&got.k_pe, &want.k_pe, &format!("layer {l} k_pe"));
            same_prefix(&got.index_k, &want.index_k, &format!("layer {l} index_k"));
        }
        if mtp && report.drafted > 0 {
            // The chained rows are gone; the kept rows wait to be absorbed.
            assert_eq!(c.mtp.end(), before, "MTP cache after the round");
            same_prefix(&c.mtp.latent, &r.cache.mtp.latent, "MTP latent");
            same_prefix(&c.mtp.k_pe, &r.cache.mtp.k_pe, "MTP k_pe");
            same_prefix(&c.mtp.index_k, &r.cache.mtp.index_k, "MTP index_k");
        }
        // The next logits equal the uninterrupted decode's bit for bit.
        let mut cache = c.clone();
        let last = *gen.last().unwrap();
        let h = model
            .forward(
                &mut [SeqStep {
                    cache: &mut cache,
                    tokens: &[last],
                }],
                &mut NoObserver,
            )
            .unwrap();
        let logits = model.logits(&h).unwrap();
        same_prefix(&logits, &r.logits[generated], "next logits");
        assert_eq!(logits.len(), r.logits[generated].len());
    }
    assert_eq!(gen, r.tokens);
    rounds
}

#[test]
fn rollback_after_zero_and_partial_acceptance_is_exact() {
    let model = model();
    let r = reference(model, PROMPT, TOKENS);
    for (gamma, right) in [(3, 0), (3, 1), (3, 2), (2, 1), (1, 0), (3, 3)] {
        let drafter = Scripted {
            want: r.tokens.clone(),
            prompt: PROMPT.len(),
            right,
        };
        let mut batch = batch_of_one(gamma, Some(Box::new(drafter)));
        let rounds = check_rounds(&mut batch, &r, false);
        // Every drafting round accepted exactly `right` (or all it could).
        for &(drafted, accepted) in &rounds[1..] {
            assert_eq!(accepted, right.min(drafted), "γ={gamma} right={right}");
        }
        assert!(rounds[1..].iter().any(|&(d, _)| d == gamma));
    }
}

#[test]
fn mtp_cache_rollback_is_exact() {
    let model = model();
    let r = reference(model, PROMPT, TOKENS);
    for gamma in 1..=3 {
        let mut batch = batch_of_one(gamma, None);
        let rounds = check_rounds(&mut batch, &r, true);
        if gamma >= 2 {
            // Both kinds of rollback happened on the way.
            assert!(
                rounds.iter().any(|&(d, a)| d == gamma && a == 0),
                "{rounds:?}"
            );
            assert!(
                rounds.iter().any(|&(d, a)| d == gamma && a > 0 && a < d),
                "{rounds:?}"
            );
        }
    }
}
