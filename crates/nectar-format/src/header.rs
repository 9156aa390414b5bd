//! The safetensors header: an 8-byte little-endian length, then a JSON object mapping tensor
//! names to `{dtype, shape, data_offsets}` (offsets relative to the data section), plus an
//! optional `__metadata__` string map.
use crate::dtype::DType;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// Largest header accepted (real GLM shards have headers of a few hundred KiB).
pub const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// One tensor as the header describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct HeaderTensor {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape (row-major).
    pub shape: Vec<usize>,
    /// Start of the data, relative to the data section.
    pub begin: u64,
    /// End (exclusive), relative to the data section.
    pub end: u64,
}

/// A validated header.
#[derive(Debug, Clone, Default)]
pub struct ParsedHeader {
    /// Tensors sorted by data offset.
    pub tensors: Vec<HeaderTensor>,
    /// `__metadata__` entries (non-string values are kept as their JSON text).
    pub metadata: BTreeMap<String, String>,
}

/// Parses and validates the JSON header of `path` whose data section is `data_len` bytes long.
///
/// Checks: every entry has a known dtype, a shape and two offsets; `begin <= end <= data_len`;
/// `end - begin == product(shape) * dtype size`; no two tensors overlap.
pub fn parse_header(path: &Path, json: &[u8], data_len: u64) -> Result<ParsedHeader> {
    let herr = |msg: String| Error::Header {
        path: path.to_path_buf(),
        msg,
    };
    let value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| herr(format!("header is not valid JSON: {e}")))?;
    let obj = value
        .as_object()
        .ok_or_else(|| herr("header is not a JSON object".into()))?;
    let mut out = ParsedHeader::default();
    for (name, entry) in obj {
        if name == "__metadata__" {
            let meta = entry
                .as_object()
                .ok_or_else(|| herr("`__metadata__` is not an object".into()))?;
            for (k, v) in meta {
                let s = v
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| v.to_string());
                out.metadata.insert(k.clone(), s);
            }
            continue;
        }
        out.tensors.push(parse_entry(path, name, entry, data_len)?);
    }
    out.tensors
        .sort_by(|a, b| (a.begin, a.end, &a.name).cmp(&(b.begin, b.end, &b.name)));
    // Sorted by start, a tensor overlaps an earlier one iff it starts before the furthest end
    // seen so far (empty tensors occupy no bytes and never overlap).
    let mut furthest: Option<&HeaderTensor> = None;
    for t in out.tensors.iter().filter(|t| t.begin < t.end) {
        if let Some(a) = furthest {
            if t.begin < a.end {
                return Err(Error::Tensor {
                    path: path.to_path_buf(),
                    tensor: t.name.clone(),
                    msg: format!(
                        "data [{}, {}) overlaps `{}` [{}, {})",
                        t.begin, t.end, a.name, a.begin, a.end
                    ),
                });
            }
        }
        if furthest.is_none_or(|a| t.end > a.end) {
            furthest = Some(t);
        }
    }
    Ok(out)
}

fn parse_entry(
    path: &Path,
    name: &str,
    entry: &serde_json::Value,
    data_len: u64,
) -> Result<HeaderTensor> {
    let terr = |msg: String| Error::Tensor {
        path: path.to_path_buf(),
        tensor: name.to_owned(),
        msg,
    };
    let dtype_s = entry
        .get("dtype")
        .and_then(|v| v.as_str())
        .ok_or_else(|| terr("missing string field `dtype`".into()))?;
    let dtype = DType::parse(dtype_s).ok_or_else(|| terr(format!("unknown dtype `{dtype_s}`")))?;
    let shape = entry
        .get("shape")
        .and_then(|v| v.as_array())
        .ok_or_else(|| terr("missing array field `shape`".into()))?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| terr("`shape` must hold non-negative integers".into()))?;
    let offs = entry
        .get("data_offsets")
        .and_then(|v| v.as_array())
        .filter(|a| a.len() == 2)
        .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)))
        .ok_or_else(|| terr("`data_offsets` must be two non-negative integers".into()))?;
    let (begin, end) = offs;
    if begin > end {
        return Err(terr(format!("data_offsets [{begin}, {end}) are reversed")));
    }
    if end > data_len {
        return Err(terr(format!(
            "data [{begin}, {end}) runs past the end of the data section ({data_len} bytes): the file is truncated or corrupt"
        )));
    }
    let elems = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
    let want = elems.and_then(|e| e.checked_mul(dtype.size() as u64));
    if want != Some(end - begin) {
        return Err(terr(format!(
            "shape {shape:?} of {dtype} needs {} bytes but data_offsets give {}",
            want.map_or("overflowing".to_string(), |w| w.to_string()),
            end - begin
        )));
    }
    Ok(HeaderTensor {
        name: name.to_owned(),
        dtype,
        shape,
        begin,
        end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("x.safetensors")
    }

    #[test]
    fn accepts_valid_and_metadata() {
        let h = br#"{"__metadata__":{"format":"pt","n":3},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}"#;
        let ph = parse_header(p(), h, 16).unwrap();
        assert_eq!(ph.tensors[0].name, "a");
        assert_eq!(ph.metadata["format"], "pt");
        assert_eq!(ph.metadata["n"], "3");
    }

    #[test]
    fn rejects_each_inconsistency_naming_the_tensor() {
        let cases: &[(&[u8], &str)] = &[
            (br#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#, "runs past the end"),
            (br#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, "needs 12 bytes"),
            (br#"{"w":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}}"#, "unknown dtype"),
            (br#"{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#, "non-negative"),
            (br#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}"#, "reversed"),
            (br#"{"w":{"dtype":"F32","shape":[1]}}"#, "data_offsets"),
            (
                br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                "overlaps",
            ),
        ];
        for (json, want) in cases {
            let e = parse_header(p(), json, 8).unwrap_err().to_string();
            assert!(e.contains(want), "{e} should contain {want}");
            assert!(e.contains("x.safetensors"), "{e}");
        }
        assert!(parse_header(p(), b"[1]", 0).is_err());
        assert!(parse_header(p(), b"{not json", 0).is_err());
    }
}
