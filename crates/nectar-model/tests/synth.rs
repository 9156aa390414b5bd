//! `nectar synth` containers load, validate and stream like converted ones.
use nectar_format::synth::{synth, SynthSpec};
use nectar_format::Catalog;
use nectar_model::arch::glm5::{Config, Inventory, LoadOptions};
use nectar_model::{Glm5, NoObserver, SeqStep};

#[test]
fn tiny_synth_container_is_valid_and_streams() {
    let d = tempfile::tempdir().unwrap();
    let spec = SynthSpec::tiny(3);
    let mut last = (0, 0);
    let files = synth(d.path(), &spec, &mut |a, b| last = (a, b)).unwrap();
    assert_eq!(files.len(), 4);
    assert_eq!(last.0, last.1, "progress reaches the total");
    let cfg = Config::from_dir(d.path()).unwrap();
    let cat = Catalog::open(d.path()).unwrap();
    let inv = Inventory::new(&cat, &cfg);
    assert!(inv.problems.is_empty(), "{:?}", inv.problems);
    assert_eq!(inv.routed_experts, 3 * 16);
    assert_eq!(inv.bytes_per_expert, Some(spec.expert_bytes()));
    assert_eq!(
        inv.indexers,
        (3, 3),
        "layers 0, 1, 2 are full-indexer layers (GLM-5.2 rule)"
    );
    // Resident and streamed (2 slots per layer) agree bit for bit and produce finite logits.
    let run = |m: &Glm5| {
        let mut c = m.new_cache();
        let h = m
            .forward(
                &mut [SeqStep {
                    cache: &mut c,
                    tokens: &[1, 2, 3, 4, 5, 6, 7, 8],
                }],
                &mut NoObserver,
            )
            .unwrap();
        m.logits(&h).unwrap()
    };
    let resident = run(&Glm5::load(d.path()).unwrap());
    assert!(resident.iter().all(|v| v.is_finite()));
    let opts = LoadOptions {
        memory_budget: Some(0),
        ctx_size: 64,
        runtime_reserve: Some(0),
        working_slots: 8,
        ..Default::default()
    };
    let e = Glm5::load_with(d.path(), &opts).unwrap_err().to_string();
    assert!(e.contains("memory budget too small"), "{e}");
    let opts = LoadOptions {
        memory_budget: Some(64 << 20),
        ..opts
    };
    let m = Glm5::load_with(d.path(), &opts).unwrap();
    assert_eq!(run(&m), resident);
}
