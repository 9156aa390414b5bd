//! A model directory's shards, validated header-first, with borrowed views of tensor bytes.
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::floats::Floats;
use crate::guard::GuardedMap;
use crate::header::{parse_header, MAX_HEADER_BYTES};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Most shards a directory may hold (Colibri's limit; GLM-5.2 artifacts have ≈ 150).
const MAX_SHARDS: usize = 512;

/// One shard file.
#[derive(Debug)]
pub struct ShardInfo {
    /// Path of the shard.
    pub path: PathBuf,
    /// File length in bytes.
    pub file_len: u64,
    /// Absolute offset of the data section (8 + header length).
    pub data_start: u64,
    /// `__metadata__` entries of the header.
    pub metadata: BTreeMap<String, String>,
}

/// One tensor: where its bytes are.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Index of the shard in [`Catalog::shards`].
    pub shard: usize,
    /// Absolute byte offset in the shard file.
    pub offset: u64,
    /// Byte length.
    pub len: u64,
}

/// All tensors of a model directory.
///
/// Opening reads only headers; the files are memory-mapped, so a byte is read from disk only
/// when a caller touches it (the routed experts of a converted container never are: they go
/// through `nectar-residency`). The maps are guarded: a shard truncated while mapped makes
/// [`Catalog::take_fault`] fail instead of the process dying of SIGBUS, and callers that read
/// mapped bytes check it after each computation. [`Catalog::read_owned`] copies a tensor
/// into process memory instead (no map involved).
pub struct Catalog {
    dir: PathBuf,
    shards: Vec<ShardInfo>,
    maps: Vec<Arc<GuardedMap>>,
    files: Vec<File>,
    /// Per shard: the header bytes at load (to recognise the file when it is back) and whether
    /// a fault was seen since (then the map serves zeros until [`Catalog::ensure_intact`]).
    headers: Vec<Vec<u8>>,
    damaged: Vec<AtomicBool>,
    tensors: BTreeMap<String, TensorEntry>,
    stamps: BTreeMap<String, String>,
}

/// Header metadata key of Colibri's per-tensor format stamps (a JSON map name → format name).
pub const STAMP_KEY: &str = "colibri.fmt";

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("dir", &self.dir)
            .field("shards", &self.shards.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl Catalog {
    /// Discovers `*.safetensors` in `dir` (sorted by name), validates every header, checks for
    /// duplicate names and, when present, that `model.safetensors.index.json` agrees and that
    /// every tensor's dtype and shape are those of `nectar-manifest.json`.
    pub fn open(dir: &Path) -> Result<Catalog> {
        let cat = Self::open_unchecked(dir)?;
        if let Some(m) = crate::manifest::Manifest::read(dir)? {
            if let Some(x) = m.header_mismatches(&cat).into_iter().next() {
                let path = cat.get(&x.tensor).map_or_else(
                    || dir.join(crate::manifest::MANIFEST_FILE),
                    |e| cat.path_of(e).to_path_buf(),
                );
                return Err(Error::Tensor {
                    path,
                    tensor: x.tensor,
                    msg: format!(
                        "{} ({}; `nectar verify` checks every byte)",
                        x.msg,
                        crate::manifest::MANIFEST_FILE
                    ),
                });
            }
        }
        Ok(cat)
    }

    /// [`Catalog::open`] without the manifest check (for `verify`, which reports every
    /// difference instead of failing at the first).
    pub fn open_unchecked(dir: &Path) -> Result<Catalog> {
        let mut paths = Vec::new();
        let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
        for ent in rd {
            let ent = ent.map_err(|e| Error::io(dir, e))?;
            let p = ent.path();
            if p.extension().is_some_and(|x| x == "safetensors") && p.is_file() {
                paths.push(p);
            }
        }
        paths.sort();
        if paths.is_empty() {
            return Err(Error::NoShards(dir.to_path_buf()));
        }
        if paths.len() > MAX_SHARDS {
            return Err(Error::Header {
                path: dir.to_path_buf(),
                msg: format!("{} shards exceed the limit of {MAX_SHARDS}", paths.len()),
            });
        }
        let mut cat = Catalog {
            dir: dir.to_path_buf(),
            shards: Vec::new(),
            maps: Vec::new(),
            files: Vec::new(),
            headers: Vec::new(),
            damaged: Vec::new(),
            tensors: BTreeMap::new(),
            stamps: BTreeMap::new(),
        };
        for p in paths {
            cat.add_shard(p)?;
        }
        let index = dir.join("model.safetensors.index.json");
        if index.exists() {
            cat.check_index(&index)?;
        }
        Ok(cat)
    }

    fn add_shard(&mut self, path: PathBuf) -> Result<()> {
        let mut f = File::open(&path).map_err(|e| Error::io(&path, e))?;
        let file_len = f.metadata().map_err(|e| Error::io(&path, e))?.len();
        let herr = |msg: String| Error::Header {
            path: path.clone(),
            msg,
        };
        if file_len < 8 {
            return Err(herr(format!(
                "file is {file_len} bytes, too short for a header (truncated?)"
            )));
        }
        let mut len8 = [0u8; 8];
        f.read_exact(&mut len8).map_err(|e| Error::io(&path, e))?;
        let hlen = u64::from_le_bytes(len8);
        if hlen > MAX_HEADER_BYTES {
            return Err(herr(format!(
                "header length {hlen} exceeds {MAX_HEADER_BYTES} bytes (corrupt?)"
            )));
        }
        if 8 + hlen > file_len {
            return Err(herr(format!(
                "header of {hlen} bytes runs past the end of the {file_len}-byte file (truncated?)"
            )));
        }
        let mut json = vec![0u8; hlen as usize];
        f.read_exact(&mut json).map_err(|e| Error::io(&path, e))?;
        let data_start = 8 + hlen;
        let parsed = parse_header(&path, &json, file_len - data_start)?;
        if let Some(st) = parsed.metadata.get(STAMP_KEY) {
            let map: BTreeMap<String, String> = serde_json::from_str(st).map_err(|e| {
                herr(format!(
                    "`__metadata__.{STAMP_KEY}` is not a JSON map of strings: {e}"
                ))
            })?;
            self.stamps.extend(map);
        }
        let shard = self.shards.len();
        for t in parsed.tensors {
            if let Some(prev) = self.tensors.get(&t.name) {
                return Err(Error::Duplicate {
                    tensor: t.name,
                    first: self.shards[prev.shard].path.clone(),
                    second: path,
                });
            }
            let entry = TensorEntry {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape,
                shard,
                offset: data_start + t.begin,
                len: t.end - t.begin,
            };
            self.tensors.insert(t.name, entry);
        }
        // The header checks above guarantee every tensor range lies inside the mapped length;
        // a later external truncation is caught by the guard.
        let map = GuardedMap::new(&f).map_err(|e| Error::io(&path, e))?;
        self.maps.push(Arc::new(map));
        let mut header = len8.to_vec();
        header.extend_from_slice(&json);
        self.headers.push(header);
        self.damaged.push(AtomicBool::new(false));
        self.files.push(f);
        self.shards.push(ShardInfo {
            path,
            file_len,
            data_start,
            metadata: parsed.metadata,
        });
        Ok(())
    }

    fn check_index(&self, index: &Path) -> Result<()> {
        let ierr = |msg: String| Error::Index {
            path: index.to_path_buf(),
            msg,
        };
        let text = std::fs::read(index).map_err(|e| Error::io(index, e))?;
        let v: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| ierr(format!("not valid JSON: {e}")))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| ierr("missing object `weight_map`".into()))?;
        for (name, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| ierr(format!("`{name}`: file is not a string")))?;
            let entry = self.tensors.get(name).ok_or_else(|| {
                ierr(format!(
                    "lists tensor `{name}` in {file}, but no shard contains it (missing shard?)"
                ))
            })?;
            let actual = &self.shards[entry.shard].path;
            if actual.file_name().and_then(|n| n.to_str()) != Some(file) {
                return Err(ierr(format!(
                    "lists tensor `{name}` in {file}, but it is in {}",
                    actual.display()
                )));
            }
        }
        Ok(())
    }

    /// The format stamp of a tensor, when a shard header carries one.
    pub fn stamp(&self, name: &str) -> Option<&str> {
        self.stamps.get(name).map(String::as_str)
    }

    /// An F32 tensor (scales, biases) as values: with `owned` false a view of the map where
    /// its bytes are aligned (every tensor of a converted container is), else read into
    /// process memory (`owned`: by positioned reads, as [`Catalog::read_owned`]).
    pub fn f32s(&self, e: &TensorEntry, owned: bool) -> Result<Floats> {
        if e.dtype != DType::F32 {
            return Err(self.tensor_error(e, format!("dtype {}, expected F32", e.dtype)));
        }
        if owned {
            return Ok(Floats::copied(&self.read_owned(e)?));
        }
        let shared = self.shared_bytes(e);
        Ok(match Floats::view(shared.clone()) {
            Some(v) => v,
            None => Floats::copied(&shared),
        })
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// All shards, in discovery order.
    pub fn shards(&self) -> &[ShardInfo] {
        &self.shards
    }

    /// All tensors, sorted by name.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorEntry> {
        self.tensors.values()
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when the catalog holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Looks a tensor up.
    pub fn get(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.get(name)
    }

    /// Looks a tensor up, or fails naming it and the directory.
    pub fn require(&self, name: &str) -> Result<&TensorEntry> {
        self.get(name).ok_or_else(|| Error::Missing {
            dir: self.dir.clone(),
            tensor: name.to_owned(),
        })
    }

    /// The path of the shard holding `e`.
    pub fn path_of(&self, e: &TensorEntry) -> &Path {
        &self.shards[e.shard].path
    }

    /// The bytes of `e` (borrowed from the shard's memory map).
    pub fn bytes(&self, e: &TensorEntry) -> &[u8] {
        let start = e.offset as usize;
        &self.maps[e.shard][start..start + e.len as usize]
    }

    /// The bytes of `e` copied into process memory by positioned reads (no map): a file
    /// truncated later cannot affect them, and a short read now is an error naming the file
    /// and offset.
    pub fn read_owned(&self, e: &TensorEntry) -> Result<Bytes> {
        let mut buf = vec![0u8; e.len as usize];
        read_exact_at(&self.files[e.shard], &mut buf, e.offset).map_err(|err| {
            self.changed(
                e.shard,
                format!("reading `{}` at offset {}: {err}", e.name, e.offset),
            )
        })?;
        Ok(Bytes::Owned(Arc::new(buf)))
    }

    /// `buf.len()` bytes of `e` from byte `start` of the tensor, by a positioned read (no map):
    /// what a caller reads part by part (an embedding table's rows) instead of holding it. A
    /// range outside the tensor is an error naming it; a short read (the file truncated since
    /// load) is an error naming the file and offset.
    pub fn read_part(&self, e: &TensorEntry, start: u64, buf: &mut [u8]) -> Result<()> {
        let end = start.checked_add(buf.len() as u64);
        if end.is_none_or(|end| end > e.len) {
            return Err(self.tensor_error(
                e,
                format!(
                    "bytes {start}..+{} are outside the tensor ({} bytes)",
                    buf.len(),
                    e.len
                ),
            ));
        }
        let off = e.offset + start;
        read_exact_at(&self.files[e.shard], buf, off).map_err(|err| {
            self.changed(
                e.shard,
                format!("reading `{}` at offset {off}: {err}", e.name),
            )
        })
    }

    /// Fails when a read of a mapped shard found the file shorter than at load since the last
    /// call (the bytes read were zeros: discard what was computed from them). The shard stays
    /// marked until [`Catalog::ensure_intact`] finds the file back.
    pub fn take_fault(&self) -> Result<()> {
        for (i, map) in self.maps.iter().enumerate() {
            if let Some(off) = map.take_fault() {
                self.damaged[i].store(true, Ordering::Release);
                return Err(self.changed(
                    i,
                    format!(
                        "byte offset {off}: the file is shorter than when it was \
                         loaded (truncated or replaced while running)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Before reading mapped bytes: fails while a shard that faulted is still not what it was
    /// at load (same length, same header); once it is, maps it again and succeeds.
    pub fn ensure_intact(&self) -> Result<()> {
        for (i, shard) in self.shards.iter().enumerate() {
            if !self.damaged[i].load(Ordering::Acquire) {
                continue;
            }
            let now = std::fs::metadata(&shard.path).map(|m| m.len()).ok();
            if now != Some(shard.file_len) {
                let now = now.map_or("missing".to_owned(), |n| format!("{n} bytes"));
                return Err(self.changed(
                    i,
                    format!(
                        "the file is {now}, not the {} bytes it had at load; restore it",
                        shard.file_len
                    ),
                ));
            }
            let mut head = vec![0u8; self.headers[i].len()];
            let same = File::open(&shard.path)
                .and_then(|f| read_exact_at(&f, &mut head, 0))
                .is_ok_and(|()| head == self.headers[i]);
            if !same {
                let msg = "its header changed since load; restart to load the new file";
                return Err(self.changed(i, msg.to_owned()));
            }
            self.maps[i]
                .restore(&shard.path)
                .map_err(|e| self.changed(i, format!("mapping it again failed: {e}")))?;
            // Faults recorded before the restore belong to the damaged period.
            let _ = self.maps[i].take_fault();
            self.damaged[i].store(false, Ordering::Release);
        }
        Ok(())
    }

    fn changed(&self, shard: usize, msg: String) -> Error {
        Error::FileChanged {
            path: self.shards[shard].path.clone(),
            msg,
        }
    }

    /// An owning handle on the bytes of `e` that keeps the shard mapped.
    pub fn shared_bytes(&self, e: &TensorEntry) -> Bytes {
        Bytes::Mapped {
            map: self.maps[e.shard].clone(),
            start: e.offset as usize,
            len: e.len as usize,
        }
    }

    /// A typed error about tensor `e` (for callers that validate shapes and dtypes).
    pub fn tensor_error(&self, e: &TensorEntry, msg: impl Into<String>) -> Error {
        Error::Tensor {
            path: self.path_of(e).to_path_buf(),
            tensor: e.name.clone(),
            msg: msg.into(),
        }
    }
}

/// Bytes that are either a view into a mapped shard or owned by the process.
#[derive(Clone)]
pub enum Bytes {
    /// A range of a memory-mapped file.
    Mapped {
        /// The mapping (kept alive by this handle).
        map: Arc<GuardedMap>,
        /// Start offset in the mapping.
        start: usize,
        /// Length.
        len: usize,
    },
    /// Bytes in an owned buffer.
    Owned(Arc<Vec<u8>>),
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({} bytes)", self.len())
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped { map, start, len } => &map[*start..*start + *len],
            Bytes::Owned(v) => v,
        }
    }
}

/// Reads exactly `buf.len()` bytes at `off`; a file that ends first is `UnexpectedEof`.
pub(crate) fn read_exact_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    return std::os::unix::fs::FileExt::read_exact_at(f, buf, off);
    #[cfg(windows)]
    {
        let mut got = 0;
        while got < buf.len() {
            match std::os::windows::fs::FileExt::seek_read(f, &mut buf[got..], off + got as u64)? {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                n => got += n,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    pub(crate) fn write_st(path: &Path, tensors: &[(&str, &str, &[usize], Vec<u8>)]) {
        let mut header = serde_json::Map::new();
        let mut data = Vec::new();
        for (name, dtype, shape, bytes) in tensors {
            let b = data.len();
            data.extend_from_slice(bytes);
            header.insert(
                name.to_string(),
                serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [b, data.len()]}),
            );
        }
        let h = serde_json::to_vec(&header).unwrap();
        let mut f = File::create(path).unwrap();
        f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
        f.write_all(&h).unwrap();
        f.write_all(&data).unwrap();
    }

    #[test]
    fn opens_shards_and_reads_bytes() {
        let d = tempfile::tempdir().unwrap();
        write_st(
            &d.path().join("a.safetensors"),
            &[("x", "F32", &[2], vec![0, 0, 128, 63, 0, 0, 0, 64])],
        );
        write_st(
            &d.path().join("b.safetensors"),
            &[("y", "U8", &[3], vec![1, 2, 3])],
        );
        let c = Catalog::open(d.path()).unwrap();
        assert_eq!(c.len(), 2);
        let x = c.require("x").unwrap();
        assert_eq!(c.bytes(x), &[0, 0, 128, 63, 0, 0, 0, 64]);
        assert_eq!(&*c.shared_bytes(c.get("y").unwrap()), &[1, 2, 3]);
        assert!(c.require("z").unwrap_err().to_string().contains("`z`"));
    }

    /// F32 tensors at a 4-aligned file offset are views of the map, others (and owned reads)
    /// copies; all give the same values, and other dtypes are refused by name.
    #[test]
    fn f32_tensors_are_views_where_aligned() {
        let vals = [1.5f32, -0.0, f32::MIN_POSITIVE, 3.0e38, f32::NAN, -7.25];
        let le: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let d = tempfile::tempdir().unwrap();
        // Four copies at data offsets 1, 26, 51 and 76 (1, 2, 3, 0 mod 4): whatever the
        // header's length, exactly one sits at a 4-aligned file offset (a map is page-aligned).
        write_st(
            &d.path().join("m.safetensors"),
            &[
                ("p0", "U8", &[1], vec![0]),
                ("f0", "F32", &[6], le.clone()),
                ("p1", "U8", &[1], vec![0]),
                ("f1", "F32", &[6], le.clone()),
                ("p2", "U8", &[1], vec![0]),
                ("f2", "F32", &[6], le.clone()),
                ("p3", "U8", &[1], vec![0]),
                ("f3", "F32", &[6], le.clone()),
                ("codes", "U8", &[4], vec![1; 4]),
            ],
        );
        let c = Catalog::open(d.path()).unwrap();
        let bits = |f: &Floats| f.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let want: Vec<u32> = vals.iter().map(|x| x.to_bits()).collect();
        let mut mapped = 0;
        for name in ["f0", "f1", "f2", "f3"] {
            let e = c.require(name).unwrap();
            let aligned = (c.bytes(e).as_ptr() as usize).is_multiple_of(4);
            let view = c.f32s(e, false).unwrap();
            assert_eq!(view.is_mapped(), aligned, "{name}: {view:?}");
            mapped += usize::from(view.is_mapped());
            let owned = c.f32s(e, true).unwrap();
            assert!(!owned.is_mapped());
            assert_eq!((bits(&view), bits(&owned)), (want.clone(), want.clone()));
        }
        assert_eq!(mapped, 1, "one of the four offsets is aligned");
        let e = c.f32s(c.require("codes").unwrap(), false).unwrap_err();
        assert!(
            e.to_string().contains("`codes`") && e.to_string().contains("F32"),
            "{e}"
        );
    }

    #[test]
    fn read_part_reads_inside_the_tensor_and_names_what_fails() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.safetensors");
        write_st(
            &p,
            &[
                ("a", "U8", &[4], vec![9, 9, 9, 9]),
                ("t", "U8", &[2, 3], vec![1, 2, 3, 4, 5, 6]),
            ],
        );
        let c = Catalog::open(d.path()).unwrap();
        let t = c.require("t").unwrap();
        let mut row = [0u8; 3];
        c.read_part(t, 3, &mut row).unwrap();
        assert_eq!(row, [4, 5, 6]);
        let e = c.read_part(t, 4, &mut row).unwrap_err().to_string();
        assert!(e.contains("`t`") && e.contains("outside"), "{e}");
        let e = c.read_part(t, u64::MAX, &mut row).unwrap_err().to_string();
        assert!(e.contains("outside"), "{e}");
        // Truncated after load: a short read names the file and the offset.
        let len = std::fs::metadata(&p).unwrap().len();
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(len - 2)
            .unwrap();
        let e = c.read_part(t, 3, &mut row).unwrap_err().to_string();
        assert!(e.contains("m.safetensors") && e.contains("`t`"), "{e}");
        c.read_part(t, 0, &mut row).unwrap();
        assert_eq!(row, [1, 2, 3]);
    }

    #[test]
    fn duplicate_names_across_shards_are_refused() {
        let d = tempfile::tempdir().unwrap();
        write_st(
            &d.path().join("a.safetensors"),
            &[("x", "U8", &[1], vec![1])],
        );
        write_st(
            &d.path().join("b.safetensors"),
            &[("x", "U8", &[1], vec![1])],
        );
        let e = Catalog::open(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("`x`") && e.contains("a.safetensors") && e.contains("b.safetensors"),
            "{e}"
        );
    }

    #[test]
    fn truncated_shard_names_file_and_tensor() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.safetensors");
        write_st(
            &p,
            &[
                ("w.a", "F32", &[4], vec![0; 16]),
                ("w.b", "F32", &[4], vec![0; 16]),
            ],
        );
        let len = std::fs::metadata(&p).unwrap().len();
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(len - 3)
            .unwrap();
        let e = Catalog::open(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("m.safetensors") && e.contains("`w.b`") && e.contains("truncated"),
            "{e}"
        );
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(5)
            .unwrap();
        assert!(Catalog::open(d.path())
            .unwrap_err()
            .to_string()
            .contains("too short"));
    }

    #[test]
    fn index_must_agree_with_shards() {
        let d = tempfile::tempdir().unwrap();
        write_st(
            &d.path().join("a.safetensors"),
            &[("x", "U8", &[1], vec![1])],
        );
        let idx = d.path().join("model.safetensors.index.json");
        std::fs::write(&idx, r#"{"weight_map":{"x":"a.safetensors"}}"#).unwrap();
        Catalog::open(d.path()).unwrap();
        std::fs::write(
            &idx,
            r#"{"weight_map":{"x":"a.safetensors","y":"b.safetensors"}}"#,
        )
        .unwrap();
        let e = Catalog::open(d.path()).unwrap_err().to_string();
        assert!(e.contains("`y`") && e.contains("b.safetensors"), "{e}");
    }

    #[test]
    fn empty_dir_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(Catalog::open(d.path()), Err(Error::NoShards(_))));
    }
}
