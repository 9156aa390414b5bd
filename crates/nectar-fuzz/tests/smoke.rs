//! The fuzz smoke CI runs on stable: every target's seeds, then seeded random mutations of them
//! (byte flips, insertions, deletions, truncations, splices of two seeds) through the same
//! harness the libFuzzer targets use. A panic fails the test and proptest prints the input.
use nectar_fuzz::{seeds, TARGETS};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// One edit of a byte string.
#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
    Splice(usize, usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<usize>().prop_map(Edit::Delete),
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), any::<usize>(), any::<usize>())
            .prop_map(|(s, a, b)| Edit::Splice(s, a, b)),
    ]
}

fn apply(mut v: Vec<u8>, edits: &[Edit], all: &[Vec<u8>]) -> Vec<u8> {
    for e in edits {
        let n = v.len();
        match *e {
            Edit::Flip(i, b) if n > 0 => v[i % n] ^= b,
            Edit::Insert(i, b) => v.insert(i % (n + 1), b),
            Edit::Delete(i) if n > 0 => {
                v.remove(i % n);
            }
            Edit::Truncate(i) => v.truncate(i % (n + 1)),
            Edit::Splice(s, a, b) => {
                let other = &all[s % all.len()];
                let from = a % (other.len() + 1);
                let to = from + b % (other.len() - from + 1);
                let at = a % (n + 1);
                v.splice(at..at, other[from..to].iter().copied());
            }
            _ => {}
        }
    }
    v
}

/// Mutated inputs per target (about 3 s for all targets on a 2-core machine).
const CASES: u32 = 20_000;

#[test]
fn every_target_survives_its_seeds_and_mutations() {
    for (name, run) in TARGETS {
        let all = seeds(name);
        assert!(!all.is_empty(), "{name} has seeds");
        for s in &all {
            run(s);
        }
        let mut runner = TestRunner::new_with_rng(
            Config {
                cases: CASES,
                failure_persistence: None,
                ..Config::default()
            },
            proptest::test_runner::TestRng::deterministic_rng(
                proptest::test_runner::RngAlgorithm::ChaCha,
            ),
        );
        let strat = (0..all.len(), prop::collection::vec(edit(), 1..8));
        runner
            .run(&strat, |(k, edits)| {
                run(&apply(all[k].clone(), &edits, &all));
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    nectar_fuzz::remove_scratch();
    let left = std::fs::read_dir(if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    })
    .unwrap()
    .flatten()
    .filter(|e| {
        e.file_name()
            .to_string_lossy()
            .starts_with(&format!("nectar-fuzz-{}-", std::process::id()))
    })
    .count();
    assert_eq!(left, 0, "scratch files left behind");
}
