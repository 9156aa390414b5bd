//! `nectar convert` robustness: resume after a crash, parameter pinning, the lock, fp8 input,
//! and corrupt input. Runs on the fixture checkpoint split into two shards.
mod common;
use common::*;
use nectar_format::convert::{convert, ConvertParams};
use nectar_format::quant::fp8_e4m3_to_f32;
use std::path::Path;

fn two_shard_source(dst: &Path) {
    let src = fixture_dir("glm52").join("model");
    copy_configs(&src, dst);
    let t = read_tensors(&src);
    let (a, b) = t.split_at(t.len() / 2);
    write_safetensors(&dst.join("model-00001-of-00002.safetensors"), a);
    write_safetensors(&dst.join("model-00002-of-00002.safetensors"), b);
}

fn outputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn resume_skips_done_shards_and_redoes_lost_ones() {
    let src = tempfile::tempdir().unwrap();
    two_shard_source(src.path());
    let out = tempfile::tempdir().unwrap();
    let p = ConvertParams::recommended(4);
    let r = convert(src.path(), out.path(), &p, 0, &mut |_| {}).unwrap();
    assert_eq!((r.converted, r.skipped), (2, 0));
    let first = outputs(out.path());
    assert!(first.iter().any(|(n, _)| n == "out-00001.safetensors"));
    assert!(first.iter().any(|(n, _)| n.starts_with("out-mtp-")));
    assert!(first.iter().any(|(n, _)| n.starts_with("out-idx-")));
    // A rerun does nothing; a crash leftover (.tmp) is removed; a lost output is redone.
    std::fs::write(out.path().join("out-00002.safetensors.tmp"), b"partial").unwrap();
    let r = convert(src.path(), out.path(), &p, 0, &mut |_| {}).unwrap();
    assert_eq!((r.converted, r.skipped), (0, 2));
    assert!(!out.path().join("out-00002.safetensors.tmp").exists());
    let lost = &first
        .iter()
        .find(|(n, _)| n.ends_with("00002.safetensors"))
        .unwrap()
        .0;
    std::fs::remove_file(out.path().join(lost)).unwrap();
    let r = convert(src.path(), out.path(), &p, 0, &mut |_| {}).unwrap();
    assert_eq!((r.converted, r.skipped), (1, 1));
    assert_eq!(
        outputs(out.path()),
        first,
        "a resumed conversion writes the same bytes"
    );
    nectar_model::Glm5::load(out.path()).unwrap();
}

#[test]
fn different_parameters_and_a_held_lock_are_refused() {
    let src = fixture_dir("glm5").join("model");
    let out = tempfile::tempdir().unwrap();
    convert(
        &src,
        out.path(),
        &ConvertParams::recommended(4),
        0,
        &mut |_| {},
    )
    .unwrap();
    let mut other = ConvertParams::recommended(4);
    other.group_size = 32;
    let e = convert(&src, out.path(), &other, 0, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("different parameters"), "{e}");
    let lock = std::fs::File::create(out.path().join(".convert.lock")).unwrap();
    lock.try_lock().unwrap();
    let e = convert(
        &src,
        out.path(),
        &ConvertParams::recommended(4),
        0,
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("lock"), "{e}");
}

#[test]
fn disk_space_floor_is_enforced() {
    let src = fixture_dir("glm5").join("model");
    let out = tempfile::tempdir().unwrap();
    let e = convert(
        &src,
        out.path(),
        &ConvertParams::recommended(4),
        u64::MAX / 2,
        &mut |_| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("must stay free"), "{e}");
    assert!(
        outputs(out.path()).is_empty(),
        "nothing that looks complete is left"
    );
}

fn to_e4m3(v: f32) -> u8 {
    (0u8..=255)
        .filter(|b| !fp8_e4m3_to_f32(*b).is_nan())
        .min_by(|a, b| {
            let (da, db) = (
                (fp8_e4m3_to_f32(*a) - v).abs(),
                (fp8_e4m3_to_f32(*b) - v).abs(),
            );
            da.partial_cmp(&db).unwrap()
        })
        .unwrap()
}

/// An FP8 (e4m3 + 128×128 `weight_scale_inv`) checkpoint converts to exactly the bytes of its
/// dequantised f32 image.
#[test]
fn fp8_input_equals_its_dequantised_image() {
    let src = fixture_dir("glm5").join("model");
    let (fp8, deq) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    copy_configs(&src, fp8.path());
    copy_configs(&src, deq.path());
    let mut a = Vec::new();
    let mut b = Vec::new();
    for (name, dtype, shape, bytes) in read_tensors(&src) {
        let fp8_class = shape.len() == 2
            && name.starts_with("model.layers.")
            && !name.starts_with("model.layers.4.")
            && !name.ends_with("mlp.gate.weight")
            && !name.contains("weights_proj");
        if !fp8_class {
            a.push((name.clone(), dtype.clone(), shape.clone(), bytes.clone()));
            b.push((name, dtype, shape, bytes));
            continue;
        }
        let w: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let (o, i) = (shape[0], shape[1]);
        let (bo, bi) = (o.div_ceil(128), i.div_ceil(128));
        let amax = w.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let s = amax / 448.0;
        let codes: Vec<u8> = w.iter().map(|x| to_e4m3(x / s)).collect();
        let image: Vec<u8> = codes
            .iter()
            .flat_map(|c| (fp8_e4m3_to_f32(*c) * s).to_le_bytes())
            .collect();
        let scales: Vec<u8> = (0..bo * bi).flat_map(|_| s.to_le_bytes()).collect();
        a.push((name.clone(), "F8_E4M3".into(), shape.clone(), codes));
        a.push((
            format!("{name}_scale_inv"),
            "F32".into(),
            vec![bo, bi],
            scales,
        ));
        b.push((name, dtype, shape, image));
    }
    write_safetensors(&fp8.path().join("model.safetensors"), &a);
    write_safetensors(&deq.path().join("model.safetensors"), &b);
    let (oa, ob) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let p = ConvertParams::recommended(4);
    convert(fp8.path(), oa.path(), &p, 0, &mut |_| {}).unwrap();
    convert(deq.path(), ob.path(), &p, 0, &mut |_| {}).unwrap();
    assert_eq!(outputs(oa.path()), outputs(ob.path()));
    // An fp8 checkpoint must be converted before it can run.
    let e = nectar_model::Glm5::load(fp8.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("nectar convert"), "{e}");
}

#[test]
fn truncated_input_is_refused_before_writing() {
    let src = tempfile::tempdir().unwrap();
    two_shard_source(src.path());
    let p = src.path().join("model-00002-of-00002.safetensors");
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    let out = tempfile::tempdir().unwrap();
    let e = convert(
        src.path(),
        out.path(),
        &ConvertParams::recommended(4),
        0,
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("model-00002-of-00002.safetensors") && e.contains("truncated"),
        "{e}"
    );
    assert!(outputs(out.path()).is_empty());
}
