//! Recorded routing traces (`tests/fixtures/traces/*`, as written by the trace tool of the demo
//! models): `{kind}.experts.npy` (int8 or int16 `[T, layers, k]`, -1 = absent), the optional
//! `{kind}.tokens.npy` (uint16 `[T]`), the optional `{kind}.streams.npy` (uint16 `[T]`: the
//! sequence of each row, where a batch interleaves several), and `manifest.json` naming the model layers of axis 1,
//! the segments of each kind (a conversation: `warmup` prompt rows, then decode rows) and
//! whether a replay resets the cache per segment. One reader for every consumer (the policy
//! replay, `bench decode`, `bench replay`), so the format knowledge lives here only.
use crate::sim::{read_npy_ids, read_npy_u16};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A trace could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {msg}")]
pub struct TraceError {
    /// The file at fault.
    pub path: PathBuf,
    /// What is wrong with it.
    pub msg: String,
}

fn err(path: &Path, msg: impl Into<String>) -> TraceError {
    TraceError {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// One stretch of rows replayed as a unit (a conversation, or a text of the prefill stream).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Segment {
    /// First row.
    pub start: usize,
    /// One past the last row.
    pub end: usize,
    /// Leading prompt rows (processed before decoding; replayed, not counted).
    #[serde(default)]
    pub warmup: usize,
    /// What the text is about (for reports).
    #[serde(default)]
    pub domain: String,
}

#[derive(Deserialize)]
struct Manifest {
    format: Format,
    traces: std::collections::BTreeMap<String, KindEntry>,
}

#[derive(Deserialize)]
struct Format {
    layers: Vec<u32>,
    experts_per_layer: usize,
    top_k: usize,
}

#[derive(Deserialize)]
struct KindEntry {
    experts: String,
    #[serde(default)]
    tokens: Option<String>,
    #[serde(default)]
    streams: Option<String>,
    segments: Vec<Segment>,
    #[serde(default)]
    replay: Replay,
}

#[derive(Deserialize, Default)]
struct Replay {
    #[serde(default)]
    reset: Option<String>,
}

/// One trace kind of a directory (e.g. `decode`).
#[derive(Debug, Clone)]
pub struct Trace {
    /// The kind's name.
    pub kind: String,
    /// The file the routes came from.
    pub path: PathBuf,
    /// Model layer index of each trace layer (axis 1); the last is the MTP layer when the
    /// model has one.
    pub layers: Vec<u32>,
    /// Routed experts per layer of the traced model.
    pub experts_per_layer: usize,
    /// Experts selected per token.
    pub top_k: usize,
    /// Rows.
    pub rows: usize,
    /// `[row][layer][k]` flattened; -1 = absent.
    pub ids: Vec<i32>,
    /// Token id per row, when the trace has them.
    pub tokens: Option<Vec<u16>>,
    /// The stream (sequence) of each row, when rows of several sequences interleave (a batch:
    /// `{kind}.streams.npy`, uint16 `[T]`); without it every row is one stream's.
    pub streams: Option<Vec<u16>>,
    /// Segments, in row order.
    pub segments: Vec<Segment>,
    /// The cache starts empty at every segment (conversations) rather than once.
    pub reset_per_segment: bool,
    /// The traced model's `num_hidden_layers` (from `model-config.json` beside the manifest,
    /// when present): trace layers with ids at or above it are MTP layers.
    pub num_hidden_layers: Option<u32>,
}

impl Trace {
    /// The names of the kinds a trace directory holds.
    pub fn kinds(dir: &Path) -> Result<Vec<String>, TraceError> {
        Ok(read_manifest(dir)?.traces.into_keys().collect())
    }

    /// Reads kind `kind` of the trace directory `dir`, checking every id against the manifest.
    pub fn load(dir: &Path, kind: &str) -> Result<Trace, TraceError> {
        let man = read_manifest(dir)?;
        let mpath = dir.join("manifest.json");
        let entry = man.traces.get(kind).ok_or_else(|| {
            let have: Vec<&str> = man.traces.keys().map(String::as_str).collect();
            err(
                &mpath,
                format!("no trace kind `{kind}` (has: {})", have.join(", ")),
            )
        })?;
        let path = dir.join(&entry.experts);
        let bytes = std::fs::read(&path).map_err(|e| err(&path, e.to_string()))?;
        let (shape, ids) = read_npy_ids(&bytes).map_err(|e| err(&path, e))?;
        let [rows, nl, k] = shape[..] else {
            return Err(err(
                &path,
                format!("expected [T, layers, k], got {shape:?}"),
            ));
        };
        let f = &man.format;
        if nl != f.layers.len() || k != f.top_k {
            return Err(err(
                &path,
                format!(
                    "shape {shape:?} disagrees with the manifest ({} layers, top-{})",
                    f.layers.len(),
                    f.top_k
                ),
            ));
        }
        if let Some(bad) = ids
            .iter()
            .position(|&e| e < -1 || e >= f.experts_per_layer as i32)
        {
            return Err(err(
                &path,
                format!(
                    "row {}: expert id {} outside 0..{}",
                    bad / (nl * k),
                    ids[bad],
                    f.experts_per_layer
                ),
            ));
        }
        let per_row = |name: &Option<String>| -> Result<Option<Vec<u16>>, TraceError> {
            let Some(t) = name else { return Ok(None) };
            let tp = dir.join(t);
            let b = std::fs::read(&tp).map_err(|e| err(&tp, e.to_string()))?;
            let (ts, tv) = read_npy_u16(&b).map_err(|e| err(&tp, e))?;
            if ts != [rows] {
                return Err(err(&tp, format!("shape {ts:?}, expected [{rows}]")));
            }
            Ok(Some(tv))
        };
        let tokens = per_row(&entry.tokens)?;
        let streams = per_row(&entry.streams)?;
        let mut prev = 0;
        for s in &entry.segments {
            if s.start < prev || s.end < s.start || s.end > rows || s.warmup > s.end - s.start {
                return Err(err(
                    &mpath,
                    format!(
                        "trace `{kind}`: segment {}..{} (warmup {}) is out of order or outside \
                         its {rows} rows",
                        s.start, s.end, s.warmup
                    ),
                ));
            }
            prev = s.end;
        }
        let reset_per_segment = match entry.replay.reset.as_deref() {
            None | Some("never") => false,
            Some("segment") => true,
            Some(o) => {
                return Err(err(
                    &mpath,
                    format!("trace `{kind}`: replay.reset `{o}` (expected segment or never)"),
                ))
            }
        };
        let cpath = dir.join("model-config.json");
        let num_hidden_layers = match std::fs::read_to_string(&cpath) {
            Ok(text) => {
                let v: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| err(&cpath, e.to_string()))?;
                let n = v.get("num_hidden_layers").and_then(|n| n.as_u64());
                Some(n.ok_or_else(|| err(&cpath, "no integer `num_hidden_layers`"))? as u32)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(err(&cpath, e.to_string())),
        };
        Ok(Trace {
            kind: kind.to_string(),
            path,
            layers: f.layers.clone(),
            experts_per_layer: f.experts_per_layer,
            top_k: k,
            rows,
            ids,
            tokens,
            streams,
            segments: entry.segments.clone(),
            reset_per_segment,
            num_hidden_layers,
        })
    }

    /// The selected experts of `row` at trace layer `layer` (absent entries skipped).
    pub fn experts(&self, row: usize, layer: usize) -> impl Iterator<Item = u32> + '_ {
        let base = (row * self.layers.len() + layer) * self.top_k;
        self.ids[base..base + self.top_k]
            .iter()
            .filter(|&&e| e >= 0)
            .map(|&e| e as u32)
    }

    /// The sequence `row` belongs to (`{kind}.streams.npy`; 0 without one, or past its end).
    pub fn stream(&self, row: usize) -> u16 {
        self.streams
            .as_ref()
            .and_then(|s| s.get(row))
            .copied()
            .unwrap_or(0)
    }

    /// The sequences of a segment in order of their first row: one without a streams file; a
    /// batch trace (`benchmarks/trace_interleave.py`'s INTER) has one per conversation.
    pub fn segment_streams(&self, seg: &Segment) -> Vec<u16> {
        let mut out: Vec<u16> = Vec::new();
        for r in seg.start..seg.end {
            let s = self.stream(r);
            if !out.contains(&s) {
                out.push(s);
            }
        }
        out
    }

    /// Trace layers (axis-1 indices) of the main model, given its `num_hidden_layers`: every
    /// layer whose id is below it (layer ids at or above it are MTP layers). Pass
    /// [`Trace::hidden_layers`] when the trace itself says.
    pub fn main_layers(&self, num_hidden_layers: u32) -> Vec<usize> {
        (0..self.layers.len())
            .filter(|&i| self.layers[i] < num_hidden_layers)
            .collect()
    }

    /// Trace layers of the MTP head (ids at or above `num_hidden_layers`).
    pub fn mtp_layers(&self, num_hidden_layers: u32) -> Vec<usize> {
        (0..self.layers.len())
            .filter(|&i| self.layers[i] >= num_hidden_layers)
            .collect()
    }

    /// `n` segments spread evenly over the trace (segment ⌊i·S/n⌋ for i < n; all S when n ≥
    /// S), in trace order. A benchmark that replays a few conversations takes these, not the
    /// first few: a trace is ordered by domain, and route256's first two decode conversations
    /// are both greedy loops over the same text (distinct 4-gram shares 0.19 and 0.06), which
    /// flatter a cache and a context-match predictor alike.
    pub fn spread(&self, n: usize) -> Vec<&Segment> {
        let s = self.segments.len();
        if n >= s {
            return self.segments.iter().collect();
        }
        (0..n).map(|i| &self.segments[i * s / n]).collect()
    }

    /// The traced model's `num_hidden_layers` when `model-config.json` gave it, else one
    /// past the last trace layer (every layer is then a main layer).
    pub fn hidden_layers(&self) -> u32 {
        self.num_hidden_layers
            .unwrap_or_else(|| self.layers.iter().max().map_or(0, |&l| l + 1))
    }
}

fn read_manifest(dir: &Path) -> Result<Manifest, TraceError> {
    let mpath = dir.join("manifest.json");
    let text = std::fs::read_to_string(&mpath).map_err(|e| err(&mpath, e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| err(&mpath, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_takes_segments_evenly_over_the_trace() {
        let seg = |i: usize| Segment {
            start: 10 * i,
            end: 10 * i + 10,
            warmup: 0,
            domain: format!("d{}", i / 2),
        };
        let t = Trace {
            kind: "decode".into(),
            path: PathBuf::new(),
            layers: vec![1],
            experts_per_layer: 8,
            top_k: 1,
            rows: 240,
            ids: vec![0; 240],
            tokens: None,
            streams: None,
            segments: (0..24).map(seg).collect(),
            reset_per_segment: true,
            num_hidden_layers: None,
        };
        let starts = |n: usize| t.spread(n).iter().map(|s| s.start / 10).collect::<Vec<_>>();
        assert_eq!(starts(1), [0]);
        assert_eq!(starts(2), [0, 12]);
        assert_eq!(starts(4), [0, 6, 12, 18]);
        assert_eq!(starts(8), [0, 3, 6, 9, 12, 15, 18, 21]);
        assert_eq!(starts(24), (0..24).collect::<Vec<_>>());
        assert_eq!(starts(99).len(), 24);
        // Eight of twelve domains, no two from one, where the first eight segments held four.
        let domains: std::collections::BTreeSet<_> =
            t.spread(8).iter().map(|s| s.domain.clone()).collect();
        assert_eq!(domains.len(), 8);
    }

    fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        let h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}\n");
        b.extend((h.len() as u16).to_le_bytes());
        b.extend(h.as_bytes());
        b.extend(data);
        b
    }

    fn write_dir(ids: &[i16], reset: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let data: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
        let rows = ids.len() / 4;
        std::fs::write(
            d.path().join("decode.experts.npy"),
            npy("<i2", &format!("({rows}, 2, 2)"), &data),
        )
        .unwrap();
        let man = format!(
            r#"{{"format": {{"layers": [1, 2], "experts_per_layer": 300, "top_k": 2}},
               "traces": {{"decode": {{"experts": "decode.experts.npy",
                 "segments": [{{"start": 0, "end": {rows}, "warmup": 1}}],
                 "replay": {{"reset": "{reset}"}}}}}}}}"#
        );
        std::fs::write(d.path().join("manifest.json"), man).unwrap();
        d
    }

    #[test]
    fn loads_int16_routes_and_checks_them() {
        let d = write_dir(&[1, 299, 3, -1, 5, 6, 7, 8], "segment");
        let t = Trace::load(d.path(), "decode").unwrap();
        assert_eq!((t.rows, t.top_k, t.layers.len()), (2, 2, 2));
        assert_eq!(t.experts(0, 0).collect::<Vec<_>>(), [1, 299]);
        assert_eq!(t.experts(0, 1).collect::<Vec<_>>(), [3]);
        assert!(t.reset_per_segment);
        assert_eq!(t.main_layers(t.hidden_layers()), [0, 1]);
        assert!(t.mtp_layers(t.hidden_layers()).is_empty());
        std::fs::write(
            d.path().join("model-config.json"),
            r#"{"num_hidden_layers": 2}"#,
        )
        .unwrap();
        let t = Trace::load(d.path(), "decode").unwrap();
        let n = t.hidden_layers();
        assert_eq!((t.main_layers(n), t.mtp_layers(n)), (vec![0], vec![1]));
        assert_eq!(Trace::kinds(d.path()).unwrap(), ["decode"]);
        let e = Trace::load(d.path(), "session").unwrap_err().to_string();
        assert!(e.contains("manifest.json") && e.contains("no trace kind `session`"));
        let d = write_dir(&[1, 300, 3, 4, 5, 6, 7, 8], "never");
        let e = Trace::load(d.path(), "decode").unwrap_err().to_string();
        assert!(e.contains("decode.experts.npy") && e.contains("300"), "{e}");
        let d = write_dir(&[1, 2, 3, 4], "sometimes");
        let e = Trace::load(d.path(), "decode").unwrap_err().to_string();
        assert!(
            e.contains("segment 0..1") || e.contains("replay.reset"),
            "{e}"
        );
    }

    #[test]
    fn route256_fixture_loads() {
        let dir =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/traces/route256");
        for kind in Trace::kinds(&dir).unwrap() {
            let t = Trace::load(&dir, &kind).unwrap();
            assert_eq!((t.experts_per_layer, t.top_k, t.layers.len()), (256, 8, 8));
            let n = t.hidden_layers();
            assert_eq!((t.main_layers(n).len(), t.mtp_layers(n)), (7, vec![7]));
            assert_eq!(t.tokens.as_ref().map(Vec::len), Some(t.rows));
        }
    }
}
