//! The benchmark-only route replacement (`Observer::replay_route`): a replayed route is what the
//! MoE computes with and reports; a route that cannot exist is refused naming the layer; an
//! observer that replays nothing leaves the forward bit for bit as it was.
mod common;
use common::*;
use nectar_model::{Glm5, Observer, SeqStep};

/// Replays `ids` at every MoE layer and row, recording what the router reports.
struct Fixed {
    ids: Vec<u32>,
    seen: Vec<(usize, Vec<u32>)>,
    replay: bool,
}

impl Observer for Fixed {
    fn router(&mut self, layer: usize, _row: usize, ids: &[u32], weights: &[f32]) {
        assert_eq!(ids.len(), weights.len());
        self.seen.push((layer, ids.to_vec()));
    }
    fn replay_route(&mut self, _layer: usize, _row: usize) -> Option<Vec<u32>> {
        self.replay.then(|| self.ids.clone())
    }
}

fn forward(model: &Glm5, obs: &mut Fixed) -> nectar_model::Result<Vec<f32>> {
    let mut cache = model.new_cache();
    model.forward(
        &mut [SeqStep {
            cache: &mut cache,
            tokens: &[5, 17, 42],
        }],
        obs,
    )
}

#[test]
fn replayed_routes_drive_the_moe_and_bad_ones_are_refused() {
    let model = Glm5::load(&demo_dir()).unwrap();
    let fixed = |ids: Vec<u32>, replay| Fixed {
        ids,
        seen: Vec::new(),
        replay,
    };
    let mut plain = fixed(vec![], false);
    let base = forward(&model, &mut plain).unwrap();
    let mut same = fixed(vec![], false);
    assert_eq!(forward(&model, &mut same).unwrap(), base);
    let mut replayed = fixed(vec![3, 1, 4, 0], true);
    let out = forward(&model, &mut replayed).unwrap();
    assert!(!replayed.seen.is_empty());
    assert!(replayed.seen.iter().all(|(_, ids)| ids == &[3, 1, 4, 0]));
    assert_ne!(out, base, "other experts give another output");
    assert!(plain.seen.iter().any(|(_, ids)| ids != &[3, 1, 4, 0]));
    let mut bad = fixed(vec![0, 1, 2, 999], true);
    let e = forward(&model, &mut bad).unwrap_err().to_string();
    assert!(e.contains("layer") && e.contains("999"), "{e}");
}

/// Replays `ids` as every next-layer prediction, recording what the forward reports predicted.
struct Predicted {
    ids: Option<Vec<u32>>,
    seen: Vec<(usize, Vec<u32>)>,
}

impl Observer for Predicted {
    fn predicted(&mut self, layer: usize, _row: usize, ids: &[u32]) {
        self.seen.push((layer, ids.to_vec()));
    }
    fn replay_prediction(&mut self, _layer: usize, _row: usize) -> Option<Vec<u32>> {
        self.ids.clone()
    }
}

#[test]
fn replayed_predictions_stand_for_the_early_router_and_change_no_output() {
    use nectar_model::arch::glm5::{LoadOptions, Prefetch};
    let opts = LoadOptions {
        prefetch: Prefetch::Measure,
        ..Default::default()
    };
    let model = Glm5::load_with(&demo_dir(), &opts).unwrap();
    let run = |ids: Option<Vec<u32>>| {
        let mut obs = Predicted {
            ids,
            seen: Vec::new(),
        };
        let mut cache = model.new_cache();
        let out = model
            .forward(
                &mut [SeqStep {
                    cache: &mut cache,
                    tokens: &[5, 17, 42],
                }],
                &mut obs,
            )
            .unwrap();
        (out, obs.seen)
    };
    let (base, own) = run(None);
    let (out, replayed) = run(Some(vec![7, 2]));
    assert!(!own.is_empty() && own.len() == replayed.len());
    assert!(replayed.iter().all(|(_, ids)| ids == &[7, 2]));
    assert!(own.iter().any(|(_, ids)| ids != &[7, 2]), "{own:?}");
    // Predictions only move reads: the forward's output is the same bits.
    assert_eq!(out, base);
}
