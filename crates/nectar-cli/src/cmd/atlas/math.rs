//! The Atlas arithmetic, on selection counts alone (no files, no model), so every formula is
//! tested on crafted counts.
//!
//! A run is one prompt: its category and its selection count per cell (layer × expert). Each
//! run is normalised by its own total first, so a long prompt weighs as much as a short one;
//! a category's profile is the mean share over its runs, and p(category | expert) the
//! category means of that expert normalised to sum to 1 (every category weighs the same,
//! however many prompts it has).

/// Selection counts of one prompt.
#[derive(Debug, Clone)]
pub struct Run {
    /// Index into [`Stats::categories`].
    pub category: usize,
    /// Selections per cell, `layer * experts + expert`.
    pub counts: Vec<u64>,
}

/// Every prompt of a probe.
#[derive(Debug, Clone)]
pub struct Stats {
    /// Category names, in the order of `p`.
    pub categories: Vec<String>,
    /// Experts per layer (cells are `layer * experts + expert`).
    pub experts: usize,
    /// The prompts.
    pub runs: Vec<Run>,
}

/// The gates.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Experts with fewer selections over all runs are dropped as sparse.
    pub min_count: u64,
    /// An affinity counts only if it holds in at least this many prompts of its category.
    pub min_runs: usize,
    /// Specialisation at or above which a replicated expert is a specialist.
    pub strong: f64,
}

/// Additive smoothing of p(category | expert) in the held-out classifier, so an expert never
/// seen with a category does not veto it outright.
pub const SMOOTHING: f64 = 0.01;

/// One characterised expert.
#[derive(Debug, Clone, PartialEq)]
pub struct Expert {
    pub layer: usize,
    pub expert: usize,
    /// Selections over all runs.
    pub total: u64,
    /// p(category | expert), in category order.
    pub p: Vec<f64>,
    /// Entropy of `p` in nats.
    pub entropy: f64,
    /// `1 − H(p) / ln C`.
    pub spec: f64,
    /// Index of the largest `p`.
    pub top: usize,
    /// `p_top · C`.
    pub top_lift: f64,
    /// Runs of the top category in which the expert was selected at all.
    pub fired: usize,
    /// Runs of the top category.
    pub runs: usize,
    /// Runs of the top category in which the affinity holds on its own: the expert's share
    /// of that run exceeds its mean share in every other category.
    pub support: usize,
    /// `support ≥ min_runs`.
    pub replicated: bool,
    /// `spec ≥ strong` and replicated.
    pub specialist: bool,
}

/// Leave-one-prompt-out classification.
#[derive(Debug, Clone, PartialEq)]
pub struct Lopo {
    /// Held-out runs classified correctly.
    pub correct: usize,
    /// Runs held out.
    pub runs: usize,
    /// `correct / runs`.
    pub accuracy: f64,
    /// `1 / C`.
    pub chance: f64,
    /// Per category: (correct, runs).
    pub per_category: Vec<(usize, usize)>,
}

/// Per-category sums of run shares, selections per cell and runs per category.
#[derive(Debug, Clone)]
struct Profile {
    share_sum: Vec<Vec<f64>>,
    total: Vec<u64>,
    runs: Vec<usize>,
}

/// A run's counts as shares of its own total (all zero for an empty run).
fn shares(r: &Run) -> Vec<f64> {
    let t: u64 = r.counts.iter().sum();
    let t = t.max(1) as f64;
    r.counts.iter().map(|&c| c as f64 / t).collect()
}

impl Profile {
    fn new(stats: &Stats, shares: &[Vec<f64>]) -> Profile {
        let cells = stats.runs.first().map_or(0, |r| r.counts.len());
        let c = stats.categories.len();
        let mut p = Profile {
            share_sum: vec![vec![0.0; cells]; c],
            total: vec![0; cells],
            runs: vec![0; c],
        };
        for (r, s) in stats.runs.iter().zip(shares) {
            p.add(r, s, 1);
        }
        p
    }

    /// Adds (`sign` 1) or removes (`sign` −1) one run.
    fn add(&mut self, r: &Run, s: &[f64], sign: i64) {
        let f = sign as f64;
        for (a, b) in self.share_sum[r.category].iter_mut().zip(s) {
            *a += f * b;
        }
        for (a, &b) in self.total.iter_mut().zip(&r.counts) {
            *a = (*a as i64 + sign * b as i64) as u64;
        }
        self.runs[r.category] = (self.runs[r.category] as i64 + sign) as usize;
    }

    /// Mean share of `cell` in category `c` (0 for a category without runs).
    fn mean(&self, c: usize, cell: usize) -> f64 {
        match self.runs[c] {
            0 => 0.0,
            n => self.share_sum[c][cell] / n as f64,
        }
    }

    /// p(category | cell), or `None` when the cell was never selected.
    fn p(&self, cell: usize) -> Option<Vec<f64>> {
        let m: Vec<f64> = (0..self.runs.len()).map(|c| self.mean(c, cell)).collect();
        let sum: f64 = m.iter().sum();
        (sum > 0.0).then(|| m.iter().map(|x| x / sum).collect())
    }
}

/// Entropy in nats of a distribution.
pub fn entropy(p: &[f64]) -> f64 {
    -p.iter()
        .filter(|&&x| x > 0.0)
        .map(|&x| x * x.ln())
        .sum::<f64>()
}

/// Index of the largest value (the first of equals).
fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Characterises every expert with at least `min_count` selections.
pub fn characterise(stats: &Stats, params: &Params) -> Vec<Expert> {
    let c = stats.categories.len();
    let sh: Vec<Vec<f64>> = stats.runs.iter().map(shares).collect();
    let prof = Profile::new(stats, &sh);
    let ln_c = (c as f64).ln();
    let mut out = Vec::new();
    for cell in 0..prof.total.len() {
        if prof.total[cell] < params.min_count.max(1) {
            continue;
        }
        let Some(p) = prof.p(cell) else { continue };
        let h = entropy(&p);
        let top = argmax(&p);
        let others_max = (0..c)
            .filter(|&k| k != top)
            .map(|k| prof.mean(k, cell))
            .fold(0.0f64, f64::max);
        let of_top = || {
            stats
                .runs
                .iter()
                .zip(&sh)
                .filter(|(r, _)| r.category == top)
        };
        let fired = of_top().filter(|(r, _)| r.counts[cell] > 0).count();
        let support = of_top().filter(|(_, s)| s[cell] > others_max).count();
        let spec = if c > 1 { 1.0 - h / ln_c } else { 0.0 };
        let replicated = support >= params.min_runs;
        out.push(Expert {
            layer: cell / stats.experts,
            expert: cell % stats.experts,
            total: prof.total[cell],
            top_lift: p[top] * c as f64,
            p,
            entropy: h,
            spec,
            top,
            fired,
            runs: prof.runs[top],
            support,
            replicated,
            specialist: replicated && spec >= params.strong,
        });
    }
    out
}

/// Strict leave-one-prompt-out validation: each run is classified from its own shares by an
/// atlas built from every other run (its own counts removed from the means, the totals and
/// the min-count gate). The score of category c is Σ over the atlas's characterised experts
/// of share · ln p̃(c | expert), p̃ smoothed by [`SMOOTHING`] — multinomial naive Bayes with
/// equal category priors, since p(c | e) ∝ p(e | c) when every category weighs the same.
pub fn leave_one_out(stats: &Stats, params: &Params) -> Lopo {
    let c = stats.categories.len();
    let sh: Vec<Vec<f64>> = stats.runs.iter().map(shares).collect();
    let mut prof = Profile::new(stats, &sh);
    let mut per_category = vec![(0usize, 0usize); c];
    let mut correct = 0;
    for (r, s) in stats.runs.iter().zip(&sh) {
        prof.add(r, s, -1);
        let mut score = vec![0.0f64; c];
        for (cell, &x) in s.iter().enumerate() {
            if x == 0.0 || prof.total[cell] < params.min_count.max(1) {
                continue;
            }
            let Some(p) = prof.p(cell) else { continue };
            for (k, pk) in p.iter().enumerate() {
                score[k] += x * ((pk + SMOOTHING) / (1.0 + SMOOTHING * c as f64)).ln();
            }
        }
        // A category with no other run cannot be predicted: nothing describes it.
        for (k, sc) in score.iter_mut().enumerate() {
            if prof.runs[k] == 0 {
                *sc = f64::NEG_INFINITY;
            }
        }
        let guess = argmax(&score);
        per_category[r.category].1 += 1;
        if guess == r.category {
            correct += 1;
            per_category[r.category].0 += 1;
        }
        prof.add(r, s, 1);
    }
    let runs = stats.runs.len();
    Lopo {
        correct,
        runs,
        accuracy: correct as f64 / runs.max(1) as f64,
        chance: 1.0 / c.max(1) as f64,
        per_category,
    }
}

/// The same runs with their category labels permuted (Fisher–Yates, xorshift seeded with
/// `seed`; category sizes kept): a control whose leave-one-out accuracy shows what the
/// classifier reaches on these very routes when labels carry no information.
pub fn shuffled(stats: &Stats, seed: u64) -> Stats {
    let mut labels: Vec<usize> = stats.runs.iter().map(|r| r.category).collect();
    let mut x = seed | 1;
    for i in (1..labels.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        labels.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let mut out = stats.clone();
    for (r, l) in out.runs.iter_mut().zip(labels) {
        r.category = l;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four categories × `per` runs over one layer of 8 experts: expert k (k < 4) is used 10×
    /// more by category k; experts 4..8 evenly by everyone; each run varies a little.
    fn crafted(per: usize) -> Stats {
        let mut runs = Vec::new();
        for cat in 0..4 {
            for i in 0..per {
                let mut counts = vec![0u64; 8];
                for (e, c) in counts.iter_mut().enumerate() {
                    *c = if e < 4 {
                        if e == cat {
                            100 + i as u64
                        } else {
                            10
                        }
                    } else {
                        40 + ((i + e) % 3) as u64
                    };
                }
                runs.push(Run {
                    category: cat,
                    counts,
                });
            }
        }
        Stats {
            categories: ["a", "b", "c", "d"].map(String::from).to_vec(),
            experts: 8,
            runs,
        }
    }

    const P: Params = Params {
        min_count: 30,
        min_runs: 2,
        strong: 0.3,
    };

    #[test]
    fn a_specialist_and_a_generalist() {
        let s = crafted(4);
        let ex = characterise(&s, &P);
        assert_eq!(ex.len(), 8);
        let spec = &ex[2];
        assert_eq!((spec.layer, spec.expert, spec.top), (0, 2, 2));
        // Shares: 100..103 of ~290 in its category, 10 of ~290 elsewhere: p_top ≈ 10/13.
        assert!(spec.p[2] > 0.7 && spec.p[2] < 0.8, "{:?}", spec.p);
        assert!((spec.p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!((spec.top_lift - 4.0 * spec.p[2]).abs() < 1e-12);
        let h = entropy(&spec.p);
        assert!((spec.spec - (1.0 - h / 4f64.ln())).abs() < 1e-12);
        assert!(spec.specialist && spec.replicated);
        assert_eq!((spec.fired, spec.runs, spec.support), (4, 4, 4));
        // The generalist: near-uniform p, specialisation near 0, never a specialist.
        let gen = &ex[5];
        assert!(gen.spec < 0.01, "{}", gen.spec);
        assert!(gen.p.iter().all(|&x| (x - 0.25).abs() < 0.03));
        assert!(!gen.specialist);
    }

    #[test]
    fn uniform_is_zero_and_one_hot_is_one() {
        let u = [0.25; 4];
        assert!((1.0 - entropy(&u) / 4f64.ln()).abs() < 1e-12);
        assert_eq!(entropy(&[1.0, 0.0, 0.0, 0.0]), 0.0);
    }

    #[test]
    fn sparse_experts_are_dropped() {
        let mut s = crafted(2);
        for r in &mut s.runs {
            r.counts[7] = 0;
        }
        s.runs[0].counts[7] = 29;
        let ex = characterise(&s, &P);
        assert!(ex.iter().all(|e| e.expert != 7));
        s.runs[1].counts[7] = 1;
        assert!(characterise(&s, &P).iter().any(|e| e.expert == 7));
    }

    #[test]
    fn an_affinity_from_one_prompt_fails_the_replication_gate() {
        // Expert 6 is used heavily by one prompt of category 1 only: as specialised as the
        // real specialists, but no second prompt confirms it.
        let mut s = crafted(4);
        for r in &mut s.runs {
            r.counts[6] = 0;
        }
        s.runs[4].counts[6] = 2000;
        let ex = characterise(&s, &P);
        let fluke = ex.iter().find(|e| e.expert == 6).unwrap();
        assert_eq!(fluke.top, 1);
        assert!(fluke.spec >= P.strong, "{}", fluke.spec);
        assert_eq!(fluke.support, 1);
        assert!(!fluke.replicated && !fluke.specialist);
        // A second prompt confirms it: now it counts.
        s.runs[5].counts[6] = 2000;
        let ex = characterise(&s, &P);
        let e = ex.iter().find(|e| e.expert == 6).unwrap();
        assert!(e.replicated && e.specialist, "{e:?}");
    }

    #[test]
    fn shares_are_normalised_per_run() {
        // A category whose prompts are 100× longer does not dominate p.
        let mut s = crafted(2);
        for r in s.runs.iter_mut().filter(|r| r.category == 0) {
            for c in &mut r.counts {
                *c *= 100;
            }
        }
        let gen = &characterise(&s, &P)[5];
        assert!(
            gen.p.iter().all(|&x| (x - 0.25).abs() < 0.03),
            "{:?}",
            gen.p
        );
    }

    #[test]
    fn leave_one_out_classifies_real_structure() {
        let l = leave_one_out(&crafted(4), &P);
        assert_eq!((l.correct, l.runs), (16, 16));
        assert_eq!(l.chance, 0.25);
        assert!(l.per_category.iter().all(|&(c, n)| c == n && n == 4));
    }

    #[test]
    fn leave_one_out_fails_on_shuffled_categories() {
        // Relabel run i of category k as category (k + i) mod 4: every new category holds one
        // run of each true category, so labels carry no information about routes. Holding a
        // run out leaves its own label with one run fewer of its true pattern, so an honest
        // held-out classifier cannot beat chance here.
        let mut s = crafted(4);
        for (j, r) in s.runs.iter_mut().enumerate() {
            r.category = (r.category + j % 4) % 4;
        }
        let l = leave_one_out(&s, &P);
        assert!(l.accuracy <= l.chance, "{l:?}");
    }

    #[test]
    fn the_shuffled_control_keeps_category_sizes_and_loses_the_structure() {
        let s = crafted(4);
        let sh = shuffled(&s, 7);
        let mut a: Vec<usize> = s.runs.iter().map(|r| r.category).collect();
        let mut b: Vec<usize> = sh.runs.iter().map(|r| r.category).collect();
        assert_ne!(a, b);
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
        assert!(leave_one_out(&sh, &P).accuracy < 0.5);
    }

    #[test]
    fn the_held_out_prompt_is_really_held_out() {
        // One run per category: with the run removed its category has no data, so a leaky
        // validation (the run still in the atlas) would score 4/4; the strict one cannot.
        let l = leave_one_out(&crafted(1), &P);
        assert_eq!(l.correct, 0, "{l:?}");
    }
}
