//! Writing one converted shard: planned header, positioned row-block writes, fsync, rename.
use super::plan::{bits_for, family, outputs, Bits, ConvertParams, Family, OutTensor};
use crate::catalog::{Catalog, TensorEntry, STAMP_KEY};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::{fp8_e4m3_to_f32, quantize_int4_row, quantize_int8_row, QuantFormat};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Rows quantised per block (Colibri's `COLI_QUANT_ROWS`).
const ROW_BLOCK: usize = 8192;

struct Item<'a> {
    src: &'a TensorEntry,
    scale_inv: Option<&'a TensorEntry>,
    bits: Bits,
    outs: Vec<OutTensor>,
}

/// Converts the tensors of input shard `k`; returns the output files and their sizes.
pub(super) fn convert_shard(
    cat: &Catalog,
    k: usize,
    to: &Path,
    p: &ConvertParams,
    min_free: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<Vec<(PathBuf, u64)>> {
    let mut fams: BTreeMap<u8, (Family, Vec<Item<'_>>)> = BTreeMap::new();
    for e in cat
        .tensors()
        .filter(|e| e.shard == k && !e.name.ends_with("_scale_inv"))
    {
        let scale_inv = cat.get(&format!("{}_scale_inv", e.name));
        if e.dtype == DType::F8E4M3 {
            let si = scale_inv
                .ok_or_else(|| cat.tensor_error(e, "fp8 tensor without a `_scale_inv` sibling"))?;
            let want = [
                e.shape[0].div_ceil(128),
                e.shape.get(1).copied().unwrap_or(1).div_ceil(128),
            ];
            if e.shape.len() != 2
                || si.shape.iter().product::<usize>() != want[0] * want[1]
                || si.dtype != DType::F32
            {
                return Err(cat.tensor_error(si, format!("fp8 block scales must be F32 {want:?}")));
            }
        } else if !matches!(e.dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(cat.tensor_error(e, format!("cannot convert dtype {}", e.dtype)));
        }
        let bits = bits_for(&e.name, &e.shape, p);
        let f = family(&e.name, p);
        let outs = outputs(&e.name, e.dtype, &e.shape, bits, p.group_size);
        fams.entry(f as u8).or_insert((f, Vec::new())).1.push(Item {
            src: e,
            scale_inv,
            bits,
            outs,
        });
    }
    let mut written = Vec::new();
    let mut done_bytes = 0u64;
    for (_, (fam, items)) in fams {
        let path = to.join(format!("{}{:05}.safetensors", fam.prefix(), k + 1));
        let size = write_family(cat, &path, &items, p, min_free, &mut |b| {
            progress(done_bytes + b)
        })?;
        done_bytes += items.iter().map(|i| i.src.len).sum::<u64>();
        written.push((path, size));
    }
    Ok(written)
}

fn write_family(
    cat: &Catalog,
    path: &Path,
    items: &[Item<'_>],
    p: &ConvertParams,
    min_free: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<u64> {
    // Python safetensors order: wider dtypes first (the f32 `.qs` scales), names sorted within.
    let mut all: Vec<&OutTensor> = items.iter().flat_map(|i| i.outs.iter()).collect();
    all.sort_by(|a, b| {
        b.dtype
            .size()
            .cmp(&a.dtype.size())
            .then(a.name.cmp(&b.name))
    });
    let mut header = serde_json::Map::new();
    let mut offsets = BTreeMap::new();
    let mut pos = 0u64;
    for t in &all {
        header.insert(
            t.name.clone(),
            serde_json::json!({"dtype": t.dtype.as_str(), "shape": t.shape, "data_offsets": [pos, pos + t.bytes]}),
        );
        offsets.insert(t.name.clone(), pos);
        pos += t.bytes;
    }
    let stamps: BTreeMap<&str, String> = items
        .iter()
        .filter(|i| i.bits != Bits::Float && !i.src.name.contains(".mlp.experts."))
        .map(|i| {
            (
                i.src.name.as_str(),
                stamp_of(i.bits, i.src.shape[1], p.group_size),
            )
        })
        .collect();
    let mut meta = serde_json::Map::new();
    meta.insert("format".into(), "pt".into());
    meta.insert(
        "nectar.convert".into(),
        serde_json::to_string(p).expect("params serialise").into(),
    );
    if !stamps.is_empty() {
        meta.insert(
            STAMP_KEY.into(),
            serde_json::to_string(&stamps)
                .expect("stamps serialise")
                .into(),
        );
    }
    header.insert("__metadata__".into(), serde_json::Value::Object(meta));
    let mut h = serde_json::to_vec(&header).expect("header serialises");
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let data_start = 8 + h.len() as u64;
    let total = data_start + pos;
    let free = free_bytes(path.parent().unwrap_or(Path::new(".")))?;
    if free < total + min_free {
        return Err(Error::Convert(format!(
            "{}: needs {total} bytes but only {free} are free and {min_free} must stay free (disk full?)",
            path.display()
        )));
    }
    let tmp = path.with_extension("safetensors.tmp");
    let mut f = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let io = |e| Error::io(&tmp, e);
    f.set_len(total).map_err(io)?;
    f.write_all(&(h.len() as u64).to_le_bytes()).map_err(io)?;
    f.write_all(&h).map_err(io)?;
    let mut done = 0u64;
    for it in items {
        let at = |n: &str| data_start + offsets[n];
        write_item(cat, it, p.group_size, &mut f, &at).map_err(|e| match e {
            Error::Io { source, .. } => Error::io(&tmp, source),
            other => other,
        })?;
        // A source shard truncated meanwhile read as zeros: never write them as weights.
        cat.take_fault()?;
        done += it.src.len;
        progress(done);
    }
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    crate::atomic::sync_parent(path)?;
    Ok(total)
}

fn stamp_of(bits: Bits, cols: usize, group: usize) -> String {
    match bits {
        Bits::Int8 => QuantFormat::Int8Row.name(),
        Bits::Int4 if group == 0 || group >= cols => QuantFormat::Int4Row.name(),
        Bits::Int4 => QuantFormat::Int4Group(group).name(),
        Bits::Float => QuantFormat::Float.name(),
    }
}

/// Decodes row `r` of a source tensor to f32 (fp8 rows use their 128×128 block scales).
fn source_row(cat: &Catalog, e: &TensorEntry, si: Option<&TensorEntry>, r: usize, out: &mut [f32]) {
    let cols = out.len();
    let b = cat.bytes(e);
    match e.dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(b[r * cols * 4..].chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(b[r * cols * 2..].chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(b[r * cols * 2..].chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DType::F8E4M3 => {
            let sb = cat.bytes(si.expect("validated"));
            let bc = cols.div_ceil(128);
            for (c, o) in out.iter_mut().enumerate() {
                let s = &sb[((r / 128) * bc + c / 128) * 4..][..4];
                *o =
                    fp8_e4m3_to_f32(b[r * cols + c]) * f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        _ => unreachable!("dtype validated before writing"),
    }
}

fn write_item(
    cat: &Catalog,
    it: &Item<'_>,
    group: usize,
    f: &mut File,
    at: &dyn Fn(&str) -> u64,
) -> Result<()> {
    let e = it.src;
    let io = |err| Error::io(cat.path_of(e), err);
    let name = &e.name;
    if it.bits == Bits::Float && e.dtype != DType::F8E4M3 {
        f.seek(SeekFrom::Start(at(name))).map_err(io)?;
        return f.write_all(cat.bytes(e)).map_err(io);
    }
    let rows = e.shape.first().copied().unwrap_or(1);
    let cols = if e.shape.len() >= 2 {
        e.shape[1..].iter().product()
    } else {
        1
    };
    let mut row = vec![0.0f32; cols];
    let mut scales = Vec::new();
    let mut pos = at(name);
    for r0 in (0..rows).step_by(ROW_BLOCK) {
        let mut bytes = Vec::new();
        for r in r0..(r0 + ROW_BLOCK).min(rows) {
            source_row(cat, e, it.scale_inv, r, &mut row);
            match it.bits {
                Bits::Float => bytes.extend(
                    row.iter()
                        .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()),
                ),
                Bits::Int8 => quantize_int8_row(&row, &mut bytes, &mut scales),
                Bits::Int4 => quantize_int4_row(&row, group, &mut bytes, &mut scales),
            }
        }
        f.seek(SeekFrom::Start(pos)).map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        pos += bytes.len() as u64;
    }
    if it.bits != Bits::Float {
        f.seek(SeekFrom::Start(at(&format!("{name}.qs"))))
            .map_err(io)?;
        let sb: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        f.write_all(&sb).map_err(io)?;
    }
    Ok(())
}

/// Writes `bytes` to `path` crash-safely ([`crate::atomic::write_atomic`]).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::atomic::write_atomic_bytes(path, bytes).map_err(Error::from)
}

/// [`write_atomic`] of a JSON value.
pub(crate) fn write_json_atomic(path: &Path, v: &serde_json::Value) -> Result<()> {
    write_atomic(
        path,
        serde_json::to_string_pretty(v)
            .expect("json serialises")
            .as_bytes(),
    )
}

/// Removes `*.tmp` files a killed run left behind.
pub(super) fn remove_stale_temps(dir: &Path) -> Result<()> {
    for ent in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let p = ent.map_err(|e| Error::io(dir, e))?.path();
        if p.extension().is_some_and(|x| x == "tmp") {
            std::fs::remove_file(&p).map_err(|e| Error::io(&p, e))?;
        }
    }
    Ok(())
}

/// Free bytes on the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> Result<u64> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| Error::Convert(format!("{}: path contains a NUL byte", dir.display())))?;
        // SAFETY: `c` is a valid NUL-terminated path and `st` is a properly sized, zeroed
        // out-parameter that statvfs fills on success; nothing is read from it on failure.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
        if rc != 0 {
            return Err(Error::io(dir, std::io::Error::last_os_error()));
        }
        Ok(st.f_bavail as u64 * st.f_frsize as u64)
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(u64::MAX)
    }
}
