//! One test per bad-input class: each must fail with an error naming the file and the tensor
//! (or field), never a panic. Also: sharded checkpoints with and without an index load and give
//! the same logits, and a bf16 checkpoint stays bf16 in memory.
mod common;
use common::*;
use nectar_model::{Glm5, NoObserver, SeqStep};
use std::path::Path;

fn fixture_model() -> std::path::PathBuf {
    fixture_dir("glm5").join("model")
}

/// Writes a mutated copy of the fixture model and returns the load error text.
fn load_err(mutate: impl FnOnce(&mut Vec<RawTensor>, &Path)) -> String {
    let d = tempfile::tempdir().unwrap();
    copy_configs(&fixture_model(), d.path());
    let mut t = read_tensors(&fixture_model());
    mutate(&mut t, d.path());
    if !d.path().join("model.safetensors").exists() {
        write_safetensors(&d.path().join("model.safetensors"), &t);
    }
    Glm5::load(d.path()).unwrap_err().to_string()
}

const NAME: &str = "model.layers.1.self_attn.kv_b_proj.weight";

#[test]
fn unknown_model_type() {
    let e = load_err(|_, dir| {
        let p = dir.join("config.json");
        let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        c["model_type"] = "deepseek_v3".into();
        std::fs::write(&p, c.to_string()).unwrap();
    });
    assert!(
        e.contains("config.json") && e.contains("deepseek_v3"),
        "{e}"
    );
}

#[test]
fn missing_tensor() {
    let e = load_err(|t, _| t.retain(|x| x.0 != NAME));
    assert!(e.contains(NAME) && e.contains("not found"), "{e}");
}

#[test]
fn misshaped_tensor() {
    let e = load_err(|t, _| {
        let x = t.iter_mut().find(|x| x.0 == NAME).unwrap();
        x.2.reverse();
    });
    assert!(
        e.contains(NAME) && e.contains("model.safetensors") && e.contains("expected"),
        "{e}"
    );
}

#[test]
fn wrong_dtype() {
    let e = load_err(|t, _| {
        let x = t.iter_mut().find(|x| x.0 == NAME).unwrap();
        x.1 = "I32".into();
    });
    assert!(e.contains(NAME) && e.contains("I32"), "{e}");
}

#[test]
fn truncated_file() {
    let e = load_err(|t, dir| {
        let p = dir.join("model.safetensors");
        write_safetensors(&p, t);
        let len = std::fs::metadata(&p).unwrap().len();
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(len - 100)
            .unwrap();
    });
    assert!(
        e.contains("model.safetensors") && e.contains("truncated") && e.contains('`'),
        "{e}"
    );
}

#[test]
fn corrupt_header() {
    let e = load_err(|t, dir| {
        let p = dir.join("model.safetensors");
        write_safetensors(&p, t);
        let mut b = std::fs::read(&p).unwrap();
        b[8] = b'#'; // the opening brace of the JSON header
        std::fs::write(&p, b).unwrap();
    });
    assert!(e.contains("model.safetensors") && e.contains("JSON"), "{e}");
}

#[test]
fn malformed_config() {
    let e = load_err(|_, dir| {
        std::fs::write(
            dir.join("config.json"),
            "{\"model_type\": \"glm_moe_dsa\", ",
        )
        .unwrap()
    });
    assert!(e.contains("config.json"), "{e}");
}

fn last_logits(dir: &Path) -> Vec<f32> {
    let m = Glm5::load(dir).unwrap();
    let mut c = m.new_cache();
    let h = m
        .forward(
            &mut [SeqStep {
                cache: &mut c,
                tokens: &[3, 14, 15, 92],
            }],
            &mut NoObserver,
        )
        .unwrap();
    m.logits(&h[3 * m.hidden_size()..]).unwrap()
}

#[test]
fn sharded_with_and_without_index_match_single_file() {
    let want = last_logits(&fixture_model());
    let t = read_tensors(&fixture_model());
    let (a, b) = t.split_at(t.len() / 2);
    for with_index in [false, true] {
        let d = tempfile::tempdir().unwrap();
        copy_configs(&fixture_model(), d.path());
        write_safetensors(&d.path().join("model-00001-of-00002.safetensors"), a);
        write_safetensors(&d.path().join("model-00002-of-00002.safetensors"), b);
        if with_index {
            let mut map = serde_json::Map::new();
            for (part, file) in [
                (a, "model-00001-of-00002.safetensors"),
                (b, "model-00002-of-00002.safetensors"),
            ] {
                for x in part {
                    map.insert(x.0.clone(), file.into());
                }
            }
            let idx = serde_json::json!({"metadata": {}, "weight_map": map});
            std::fs::write(
                d.path().join("model.safetensors.index.json"),
                idx.to_string(),
            )
            .unwrap();
        }
        assert_eq!(last_logits(d.path()), want);
        // A shard the index expects but that is missing.
        if with_index {
            std::fs::remove_file(d.path().join("model-00002-of-00002.safetensors")).unwrap();
            let e = Glm5::load(d.path()).unwrap_err().to_string();
            assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
        }
    }
}

#[test]
fn bf16_checkpoint_stays_bf16_in_memory() {
    let dir = demo_dir();
    let m = Glm5::load(&dir).unwrap();
    let c = m.bytes_by_class();
    let held = c.spine + c.routed + c.mtp + c.indexer;
    let file = std::fs::metadata(dir.join("model.safetensors"))
        .unwrap()
        .len() as usize;
    // Every matrix is held at 2 bytes per weight; only norm vectors are widened (a few KB).
    assert!(held <= file + (1 << 16), "held {held} B vs file {file} B");
    assert!(held >= file * 99 / 100, "held {held} B vs file {file} B");
}
