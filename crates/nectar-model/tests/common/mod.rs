//! Fixture access shared by the parity tests.
#![allow(dead_code)]
use nectar_format::{Catalog, DType};
use nectar_model::Observer;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `tests/fixtures/glm-tiny/<variant>`; `NECTAR_FIXTURES` overrides the glm-tiny directory for
/// a test executable run away from its source tree (the GPU machine: scripts/gpu-device-run).
pub fn fixture_dir(variant: &str) -> PathBuf {
    std::env::var_os("NECTAR_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../tests/fixtures/glm-tiny"
            ))
        })
        .join(variant)
}

/// The demo model: `NECTAR_DEMO_MODEL` (the GPU machine gets a copy, scripts/gpu-device-run),
/// else the repository's.
pub fn demo_dir() -> PathBuf {
    std::env::var_os("NECTAR_DEMO_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../models/nectar-demo-glm5"
            ))
        })
}

pub struct Expected {
    pub json: serde_json::Value,
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f64>)>,
}

impl Expected {
    pub fn load(dir: &std::path::Path) -> Expected {
        let json =
            serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        let cat = Catalog::open(dir).unwrap();
        let mut tensors = BTreeMap::new();
        for e in cat.tensors() {
            let b = cat.bytes(e);
            let v: Vec<f64> = match e.dtype {
                DType::F32 => b
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                DType::F64 => b
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                other => panic!("unexpected dtype {other}"),
            };
            tensors.insert(e.name.clone(), (e.shape.clone(), v));
        }
        Expected { json, tensors }
    }

    pub fn ids(&self, key: &str) -> Vec<u32> {
        self.json[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    }

    /// Row `r` of a 2-D expected tensor.
    pub fn row(&self, name: &str, r: usize) -> Vec<f64> {
        let (shape, v) = &self.tensors[name];
        let w = *shape.last().unwrap();
        v[r * w..(r + 1) * w].to_vec()
    }
}

/// Max |a - b| over two rows.
pub fn max_abs(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - y).abs())
        .fold(0.0, f64::max)
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Records router and indexer decisions by (layer, absolute position).
#[derive(Default)]
pub struct Recorder {
    pub base: usize,
    pub router: BTreeMap<(usize, usize), (Vec<u32>, Vec<f32>)>,
    pub indexer: BTreeMap<(usize, usize), Option<Vec<u32>>>,
    pub layers: Vec<Vec<f32>>,
}

impl Observer for Recorder {
    fn layer_output(&mut self, _layer: usize, x: &[f32]) {
        self.layers.push(x.to_vec());
    }
    fn router(&mut self, layer: usize, row: usize, ids: &[u32], weights: &[f32]) {
        self.router
            .insert((layer, self.base + row), (ids.to_vec(), weights.to_vec()));
    }
    fn indexer(&mut self, layer: usize, row: usize, _full: bool, selected: Option<&[u32]>) {
        self.indexer
            .insert((layer, self.base + row), selected.map(|s| s.to_vec()));
    }
}

/// A tensor read back from a safetensors file: (name, dtype string, shape, bytes).
pub type RawTensor = (String, String, Vec<usize>, Vec<u8>);

/// Reads every tensor of a model directory.
pub fn read_tensors(dir: &std::path::Path) -> Vec<RawTensor> {
    let cat = Catalog::open(dir).unwrap();
    cat.tensors()
        .map(|e| {
            (
                e.name.clone(),
                e.dtype.as_str().to_string(),
                e.shape.clone(),
                cat.bytes(e).to_vec(),
            )
        })
        .collect()
}

/// Writes tensors as one safetensors file (names in the given order).
pub fn write_safetensors(path: &std::path::Path, tensors: &[RawTensor]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let b = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [b, data.len()]}),
        );
    }
    let h = serde_json::to_vec(&header).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

/// Copies a fixture model's config files into `dst` (no weights).
pub fn copy_configs(src: &std::path::Path, dst: &std::path::Path) {
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
}

/// Router ids (exact), router weights (1e-5) and indexer selections (exact) of `rec` against
/// the fixture at `positions`.
pub fn check_selections(exp: &Expected, rec: &Recorder, positions: std::ops::Range<usize>) {
    for (layer, r) in exp.json["router"]["layers"].as_object().unwrap() {
        let l: usize = layer.parse().unwrap();
        for p in positions.clone() {
            let want_ids: Vec<u32> = r["ids"][p]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let (ids, w) = &rec.router[&(l, p)];
            assert_eq!(ids, &want_ids, "router ids layer {l} position {p}");
            for (a, b) in w.iter().zip(r["weights"][p].as_array().unwrap()) {
                assert!(
                    (*a as f64 - b.as_f64().unwrap()).abs() <= 1e-5,
                    "router weight layer {l} pos {p}"
                );
            }
        }
    }
    for (layer, ix) in exp.json["indexer"]["layers"].as_object().unwrap() {
        let l: usize = layer.parse().unwrap();
        for p in positions.clone() {
            let want: Vec<u32> = ix["selected"][p]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let got = rec.indexer[&(l, p)]
                .clone()
                .unwrap_or_else(|| (0..=p as u32).collect());
            assert_eq!(got, want, "indexer layer {l} position {p}");
        }
    }
}
