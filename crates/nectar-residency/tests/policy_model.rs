//! The policy state machine against a small, independent reference model of the same rules,
//! on proptest-generated traces: identical hit / miss / evict / bypass sequences.
use nectar_residency::policy::{Admission, Event, ExpertKey, Policy};
use proptest::prelude::*;
use std::collections::HashSet;

/// Reference: per layer a list of (key, last_use, wave); pinned keys; plain loops.
struct Model {
    cap: Vec<usize>,
    lru: Vec<Vec<(ExpertKey, u64, u64)>>,
    pinned: HashSet<ExpertKey>,
    clock: u64,
    wave: u64,
    misses: Vec<(ExpertKey, u64)>,
}

impl Model {
    fn access(&mut self, k: ExpertKey, ev: &mut Vec<Event>) {
        self.clock += 1;
        if self.pinned.contains(&k) {
            ev.push(Event::Hit(k));
            return;
        }
        if let Some(m) = self.misses.iter_mut().find(|m| m.0 == k) {
            m.1 = self.clock; // a repeated request within the wave refreshes recency
            ev.push(Event::Hit(k));
            return;
        }
        let (clock, wave) = (self.clock, self.wave);
        if let Some(e) = self.lru[k.layer as usize].iter_mut().find(|e| e.0 == k) {
            e.1 = clock;
            e.2 = wave;
            ev.push(Event::Hit(k));
            return;
        }
        self.misses.push((k, self.clock));
        ev.push(Event::Miss(k));
    }

    fn end_wave(&mut self, ev: &mut Vec<Event>) {
        // Layers are independent; each layer's misses are promoted last first.
        let mut misses = std::mem::take(&mut self.misses);
        misses.reverse();
        misses.sort_by_key(|(k, _)| k.layer); // stable: keeps the reversed order within a layer
        let mut done = vec![0usize; self.cap.len()];
        for &(k, used) in misses.iter() {
            let l = k.layer as usize;
            if done[l] >= self.cap[l] {
                ev.push(Event::Bypass(k));
                continue;
            }
            let lru = &mut self.lru[l];
            if lru.len() < self.cap[l] {
                lru.push((k, used, self.wave));
            } else {
                // The victim: not touched this wave, smallest last use. (Slot-id ties cannot
                // occur: the clock is strictly increasing.)
                let v = lru
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| e.2 != self.wave)
                    .min_by_key(|(_, e)| e.1)
                    .map(|(i, _)| i);
                let Some(v) = v else {
                    ev.push(Event::Bypass(k));
                    continue;
                };
                ev.push(Event::Evict {
                    evicted: lru[v].0,
                    admitted: k,
                });
                lru[v] = (k, used, self.wave);
            }
            done[l] += 1;
        }
        self.wave += 1;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn policy_matches_reference(
        caps in prop::collection::vec(0usize..5, 1..4),
        waves in prop::collection::vec(prop::collection::vec((0usize..3, 0usize..10), 1..12), 1..60),
        pins in prop::collection::vec((0usize..3, 0usize..10), 0..3),
    ) {
        let n_layers = caps.len();
        let pinned: Vec<ExpertKey> = pins.iter().filter(|(l, _)| *l < n_layers).map(|&(l, e)| ExpertKey::new(l, e))
            .collect::<HashSet<_>>().into_iter().collect();
        let mut p = Policy::new(caps.clone(), 16, &pinned);
        let mut m = Model {
            cap: caps.clone(),
            lru: vec![Vec::new(); n_layers],
            pinned: pinned.iter().copied().collect(),
            clock: 0,
            wave: 1,
            misses: Vec::new(),
        };
        for w in waves {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let keys: Vec<ExpertKey> = w.iter().filter(|(l, _)| *l < n_layers).map(|&(l, e)| ExpertKey::new(l, e)).collect();
            for &k in &keys {
                p.access(k, &mut a).unwrap();
                m.access(k, &mut b);
            }
            p.end_wave(&mut a);
            m.end_wave(&mut b);
            prop_assert_eq!(&a, &b);
            // Invariant: every resident key is in exactly one slot; LRU occupancy ≤ capacity.
            for (l, &c) in caps.iter().enumerate() {
                prop_assert!(m.lru[l].len() <= c);
            }
            prop_assert_eq!(p.free_working(), 16);
        }
    }
}

/// One wave of `experts` on layer 0: the events it produced.
fn wave(p: &mut Policy, experts: &[usize]) -> Vec<Event> {
    let mut ev = Vec::new();
    for &e in experts {
        p.access(ExpertKey::new(0, e), &mut ev).unwrap();
    }
    p.end_wave(&mut ev);
    ev
}

#[test]
fn frequency_admission_keeps_recurring_experts_over_one_offs() {
    let freq = Admission::Frequency { half_life: 8.0 };
    let resident = |p: &Policy, e: usize| p.lookup(ExpertKey::new(0, e)).is_some();
    for admission in [Admission::Lru, freq] {
        let mut p = Policy::new(vec![2], 4, &[]).with_admission(admission);
        // Experts 1 and 2 recur; then a stream of one-offs.
        for _ in 0..4 {
            wave(&mut p, &[1, 2]);
        }
        for one_off in 10..14 {
            let ev = wave(&mut p, &[one_off]);
            if admission == freq {
                assert!(
                    ev.contains(&Event::Bypass(ExpertKey::new(0, one_off))),
                    "{ev:?}"
                );
            }
        }
        let kept = resident(&p, 1) && resident(&p, 2);
        // LRU lets the one-offs push the recurring pair out; frequency admission does not.
        assert_eq!(kept, admission == freq, "{admission:?}");
    }
    // Scores decay: once the pair stops recurring, a new recurring expert gets in.
    let mut p = Policy::new(vec![2], 4, &[]).with_admission(freq);
    for _ in 0..4 {
        wave(&mut p, &[1, 2]);
    }
    let mut admitted = false;
    for _ in 0..64 {
        let ev = wave(&mut p, &[7]);
        if ev
            .iter()
            .any(|e| matches!(e, Event::Evict { admitted, .. } if admitted.expert == 7))
        {
            admitted = true;
            break;
        }
    }
    assert!(admitted && resident(&p, 7));
    // Under frequency admission an empty slot always takes a miss.
    let mut p = Policy::new(vec![2], 4, &[]).with_admission(freq);
    assert!(wave(&mut p, &[3])
        .iter()
        .all(|e| !matches!(e, Event::Bypass(_))));
    assert!(resident(&p, 3));
}
