//! Weight checksums end to end: `nectar convert` writes `nectar-manifest.json`, `nectar verify`
//! checks every tensor against it, and loading refuses a header that no longer matches it.

mod common;
use common::{nectar, root};

fn flip_header_dtype(p: &std::path::Path) {
    // BF16 → F16 in the first header entry that has it (same byte count, so the header stays
    // valid and only the manifest can tell).
    let mut b = std::fs::read(p).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let head = String::from_utf8(b[8..8 + n].to_vec()).unwrap();
    let at = head.find("\"BF16\"").expect("a BF16 tensor");
    b[8 + at..8 + at + 7].copy_from_slice(b"\"F16\" ,");
    std::fs::write(p, b).unwrap();
}

#[test]
fn convert_writes_a_manifest_that_verify_and_loading_check() {
    let d = tempfile::tempdir().unwrap();
    let out = common::int4_demo(d.path());
    let o = out.to_str().unwrap();
    let (ok, stdout, err) = nectar(&["verify", o]);
    assert!(ok, "{err}");
    assert!(
        stdout.contains("tensors") && stdout.contains("match"),
        "{stdout}"
    );

    // Overwritten tensor bytes (the shard's last byte): verify names the tensor and fails.
    let shard = out.join("out-00001.safetensors");
    let orig = std::fs::read(&shard).unwrap();
    let mut b = orig.clone();
    *b.last_mut().unwrap() ^= 0x10;
    std::fs::write(&shard, &b).unwrap();
    let (ok, stdout, err) = nectar(&["verify", o]);
    assert!(!ok);
    assert!(stdout.contains("MISMATCH `"), "{stdout}");
    assert!(err.contains("1 difference"), "{err}");

    // A BF16 → F16 header flip: loading refuses it, naming the tensor and the manifest.
    std::fs::write(&shard, &orig).unwrap();
    flip_header_dtype(&shard);
    let (ok, _, err) = nectar(&[
        "run",
        "--model",
        o,
        "--prompt-ids",
        "5",
        "--max-tokens",
        "1",
    ]);
    assert!(!ok);
    assert!(
        err.contains("nectar-manifest.json") && err.contains("BF16"),
        "{err}"
    );
    let (ok, stdout, _) = nectar(&["verify", o]);
    assert!(!ok && stdout.contains("the manifest says BF16"), "{stdout}");
}

#[test]
fn verify_without_a_manifest_checks_headers_and_the_index() {
    let d = tempfile::tempdir().unwrap();
    let demo = root().join("models/nectar-demo-glm5");
    for e in std::fs::read_dir(&demo).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, d.path().join(p.file_name().unwrap())).unwrap();
    }
    let o = d.path().to_str().unwrap();
    let (ok, stdout, err) = nectar(&["verify", o]);
    assert!(ok, "{err}");
    assert!(stdout.contains("not checked"), "{stdout}");
    // An index naming a tensor no shard has.
    std::fs::write(
        d.path().join("model.safetensors.index.json"),
        r#"{"weight_map":{"model.norm.weight":"model.safetensors","lost.weight":"model-2.safetensors"}}"#,
    )
    .unwrap();
    let (ok, _, err) = nectar(&["verify", o]);
    assert!(!ok);
    assert!(err.contains("lost.weight"), "{err}");
}
