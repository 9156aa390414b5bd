//! Rejection sampling preserves the target distribution: drafts drawn from
//! q, verified against p, give tokens distributed as p (chi-square on a
//! tiny vocabulary, deterministic seeds).

use nectar_engine::{distribution, verify_draft, Distribution, Sampler, SamplingParams, Verdict};

const TRIALS: usize = 200_000;
/// Chi-square critical value, 4 degrees of freedom, p = 0.001.
const CHI2_4_999: f64 = 18.47;

fn params(temperature: f32, top_k: usize) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        seed: Some(20240607),
        ..SamplingParams::default()
    }
}

/// Histogram of verified tokens when drafts come from `q` (`None`: the
/// fixed draft `fixed`), and the acceptance rate.
fn histogram(p: &Distribution, q: Option<&Distribution>, fixed: u32) -> ([usize; 5], f64) {
    let mut s = Sampler::new(params(1.0, 0), 5).unwrap();
    let mut counts = [0usize; 5];
    let mut accepted = 0;
    for i in 0..TRIALS {
        // Each trial its own output position: independent draws from q.
        let d = q.map_or(fixed, |q| s.draw(q, i));
        let t = match verify_draft(&mut s, p, q, d) {
            Verdict::Accepted => {
                accepted += 1;
                d
            }
            Verdict::Rejected(t) => t,
        };
        counts[t as usize] += 1;
    }
    (counts, accepted as f64 / TRIALS as f64)
}

fn chi_square(counts: &[usize; 5], p: &Distribution) -> f64 {
    (0..5u32)
        .filter(|&id| p.prob(id) > 0.0)
        .map(|id| {
            let e = TRIALS as f64 * p.prob(id);
            (counts[id as usize] as f64 - e).powi(2) / e
        })
        .sum()
}

#[test]
fn drafts_from_another_distribution_give_the_target() {
    let p = distribution(&params(1.0, 0), &[2.0, 1.0, 0.5, 0.0, -1.0]).unwrap();
    let q = distribution(&params(1.0, 0), &[0.0, 1.5, 2.0, -0.5, 1.0]).unwrap();
    let (counts, rate) = histogram(&p, Some(&q), 0);
    let chi = chi_square(&counts, &p);
    assert!(chi < CHI2_4_999, "chi-square {chi:.2}: {counts:?}");
    // The test has power: the raw drafts (always accepting) fail it.
    let s = Sampler::new(params(1.0, 0), 5).unwrap();
    let mut raw = [0usize; 5];
    for i in 0..TRIALS {
        raw[s.draw(&q, i) as usize] += 1;
    }
    assert!(chi_square(&raw, &p) > 100.0 * CHI2_4_999);
    // The acceptance rate is Σ min(p, q).
    let want: f64 = (0..5).map(|i| p.prob(i).min(q.prob(i))).sum();
    assert!((rate - want).abs() < 0.005, "{rate} vs {want}");
}

#[test]
fn a_truncated_target_never_emits_a_truncated_token() {
    let p = distribution(&params(0.7, 3), &[2.0, 1.0, 0.5, 0.0, -1.0]).unwrap();
    let q = distribution(&params(1.0, 0), &[0.0, 0.0, 0.0, 3.0, 3.0]).unwrap();
    let (counts, _) = histogram(&p, Some(&q), 0);
    assert_eq!(counts[3] + counts[4], 0, "{counts:?}");
    let chi = chi_square(&counts, &p);
    assert!(chi < CHI2_4_999, "chi-square {chi:.2}: {counts:?}");
}

#[test]
fn deterministic_drafts_give_the_target() {
    // Prompt lookup proposes a fixed token: q is a point mass.
    let p = distribution(&params(1.0, 0), &[0.3, 1.0, 0.5, 0.0, 0.2]).unwrap();
    for fixed in [1, 3] {
        let (counts, rate) = histogram(&p, None, fixed);
        let chi = chi_square(&counts, &p);
        assert!(
            chi < CHI2_4_999,
            "draft {fixed}: chi-square {chi:.2}: {counts:?}"
        );
        assert!((rate - p.prob(fixed)).abs() < 0.005, "{rate}");
    }
}
