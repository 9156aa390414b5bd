//! Seeded sampling is keyed by (seed, output position): over many seeds its marginal at a
//! position is the target distribution p, and coupled verification of drafts drawn with the
//! same noise from another distribution q still emits p (chi-square on a tiny vocabulary,
//! a fixed seed set, so deterministic) while accepting at least the Gumbel coupling's bound.

use nectar_engine::{distribution, verify_coupled, Distribution, Sampler, SamplingParams, Verdict};

const SEEDS: u64 = 200_000;
/// Chi-square critical value, 4 degrees of freedom, p = 0.001.
const CHI2_4_999: f64 = 18.47;

fn params(temperature: f32, top_k: usize, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

fn chi_square(counts: &[usize; 5], p: &Distribution) -> f64 {
    (0..5u32)
        .filter(|&id| p.prob(id) > 0.0)
        .map(|id| {
            let e = SEEDS as f64 * p.prob(id);
            (counts[id as usize] as f64 - e).powi(2) / e
        })
        .sum()
}

/// Tokens at output `position` over seeds 0..SEEDS: the draft from `q` (with that position's
/// noise), verified against `p` by coupling; returns the emitted tokens' histogram and the
/// acceptance rate.
fn coupled(p: &Distribution, q: &Distribution, position: usize) -> ([usize; 5], f64) {
    let mut counts = [0usize; 5];
    let mut accepted = 0;
    for seed in 0..SEEDS {
        let s = Sampler::new(params(1.0, 0, seed), 5).unwrap();
        let d = s.draw(q, position);
        let t = match verify_coupled(&s, p, position, d) {
            Verdict::Accepted => {
                accepted += 1;
                d
            }
            Verdict::Rejected(t) => t,
        };
        counts[t as usize] += 1;
    }
    (counts, accepted as f64 / SEEDS as f64)
}

fn tv(p: &Distribution, q: &Distribution) -> f64 {
    (0..5).map(|i| (p.prob(i) - q.prob(i)).abs()).sum::<f64>() / 2.0
}

#[test]
fn over_many_seeds_a_position_follows_p_and_coupled_drafts_keep_it() {
    let p = distribution(&params(1.0, 0, 0), &[2.0, 1.0, 0.5, 0.0, -1.0]).unwrap();
    // A near draft (what an MTP head gives) and a far one.
    let near = distribution(&params(1.0, 0, 0), &[1.8, 1.1, 0.6, 0.1, -0.8]).unwrap();
    let far = distribution(&params(1.0, 0, 0), &[0.0, 1.5, 2.0, -0.5, 1.0]).unwrap();
    for position in [0, 17] {
        for q in [&p, &near, &far] {
            let (counts, rate) = coupled(&p, q, position);
            let chi = chi_square(&counts, &p);
            assert!(chi < CHI2_4_999, "chi-square {chi:.2}: {counts:?}");
            // Gumbel coupling: (1 − TV) / (1 + TV) ≤ acceptance ≤ 1 − TV (the maximal
            // coupling, what rejection sampling reaches), up to sampling error.
            let d = tv(&p, q);
            assert!(
                rate > (1.0 - d) / (1.0 + d) - 0.005 && rate < 1.0 - d + 0.005,
                "acceptance {rate:.4}, TV {d:.4}"
            );
        }
    }
    // The test has power: q's own draws (always accepting) fail it.
    let mut raw = [0usize; 5];
    for seed in 0..SEEDS {
        let s = Sampler::new(params(1.0, 0, seed), 5).unwrap();
        raw[s.draw(&near, 3) as usize] += 1;
    }
    assert!(chi_square(&raw, &p) > 10.0 * CHI2_4_999);
}

#[test]
fn a_truncated_target_never_emits_a_truncated_token() {
    let p = distribution(&params(0.7, 3, 0), &[2.0, 1.0, 0.5, 0.0, -1.0]).unwrap();
    let q = distribution(&params(1.0, 0, 0), &[0.0, 0.0, 0.0, 3.0, 3.0]).unwrap();
    let (counts, rate) = coupled(&p, &q, 5);
    assert_eq!(counts[3] + counts[4], 0, "{counts:?}");
    assert!(chi_square(&counts, &p) < CHI2_4_999, "{counts:?}");
    assert!(rate < 0.2, "{rate}");
}

#[test]
fn a_seeds_choice_at_a_position_does_not_depend_on_earlier_draws() {
    let p = distribution(&params(1.0, 0, 0), &[0.3, 1.0, 0.5, 0.0, 0.2]).unwrap();
    let mut s = Sampler::new(params(1.0, 0, 9), 5).unwrap();
    let first: Vec<u32> = (0..64).map(|t| s.draw(&p, t)).collect();
    // Draws in another order, with rejection-sampling uniforms taken in between.
    let mut again = vec![0; 64];
    for t in (0..64).rev() {
        s.next_uniform();
        again[t] = s.draw(&p, t);
    }
    assert_eq!(first, again);
    assert!(first.iter().any(|&t| t != first[0]));
}
