//! Token-embedding tables. A forward needs one row per token, so under a memory budget the table
//! is not held at all: each token's row is read from the model file when it is embedded (a few
//! KB by one positioned read — GLM-5.2's int8 table is 0.95 GB, which buys expert slots
//! instead). Without a budget the table is a view of the mapped file like every other weight.
//! Either way a row is dequantised by the same kernel routine, so the bits do not depend on
//! where the table lives.
use super::linear::Linear;
use crate::error::{Error, Result};
use nectar_format::{Catalog, Floats, TensorEntry};
use nectar_kernels::{decode_row, team, MatRef, WeightFormat};
use std::sync::Arc;

/// A `[rows = vocabulary, cols = hidden]` embedding table; rows are gathered and dequantised one
/// at a time, so no f32 copy of the table ever exists.
#[derive(Debug, Clone)]
pub struct Embedding {
    rows: usize,
    cols: usize,
    store: Store,
}

#[derive(Debug, Clone)]
enum Store {
    /// Every row in memory (mapped or owned).
    Held(Linear),
    /// Rows read from the file per token; only the (small) scales are held.
    File {
        cat: Arc<Catalog>,
        entry: TensorEntry,
        format: WeightFormat,
        scales: Floats,
    },
}

impl Embedding {
    /// A table whose rows are all in memory.
    pub fn held(table: Linear) -> Embedding {
        Embedding {
            rows: table.rows,
            cols: table.cols,
            store: Store::Held(table),
        }
    }

    /// A table read row by row from `entry` of `cat` (its format and scales already validated
    /// against the shape by the loader).
    pub fn from_file(
        cat: Arc<Catalog>,
        entry: TensorEntry,
        format: WeightFormat,
        (rows, cols): (usize, usize),
        scales: Floats,
    ) -> Result<Embedding> {
        // The whole-table view checks the byte and scale counts once, for every later row.
        if rows.checked_mul(format.row_bytes(cols)) != Some(entry.len as usize) {
            let msg = format!(
                "{} bytes, expected {rows} rows of {} ({})",
                entry.len,
                format.row_bytes(cols),
                format.name()
            );
            return Err(cat.tensor_error(&entry, msg).into());
        }
        if scales.len() != rows * format.row_scales(cols) {
            let msg = format!("{} scales for {rows} rows of {cols}", scales.len());
            return Err(cat.tensor_error(&entry, msg).into());
        }
        Ok(Embedding {
            rows,
            cols,
            store: Store::File {
                cat,
                entry,
                format,
                scales,
            },
        })
    }

    /// Stored bytes of the table (weights + scales), wherever they are.
    pub fn bytes(&self) -> usize {
        match &self.store {
            Store::Held(l) => l.bytes(),
            Store::File { entry, scales, .. } => entry.len as usize + scales.len() * 4,
        }
    }

    /// Bytes of it held in memory: the table, or only its scales when rows come from the file.
    pub fn held_bytes(&self) -> usize {
        match &self.store {
            Store::Held(l) => l.host_bytes(),
            Store::File { scales, .. } => scales.len() * 4,
        }
    }

    /// Whether rows are read from the model file per token.
    pub fn reads_rows(&self) -> bool {
        matches!(self.store, Store::File { .. })
    }

    /// The f32 embedding of every token, into consecutive rows of `out` (`tokens.len() ×
    /// hidden`): held rows of a prompt on the compute team (each row alone: the same bits),
    /// rows from the file one read each. A token outside the vocabulary is an error naming it;
    /// a row the file no longer has is an error naming the file.
    pub fn rows(&self, tokens: &[u32], out: &mut [f32]) -> Result<()> {
        let hidden = self.cols;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.rows) {
            return Err(Error::Input(format!(
                "token id {t} is outside the vocabulary (size {})",
                self.rows
            )));
        }
        if tokens.is_empty() {
            return Ok(());
        }
        if out.len() != tokens.len() * hidden || hidden == 0 {
            return Err(Error::Input(format!(
                "embedding: {} values for {} tokens of {hidden}",
                out.len(),
                tokens.len()
            )));
        }
        match &self.store {
            Store::Held(table) => {
                let mat = table.mat()?;
                team::for_each_row_mut(out, hidden, |i, r| decode_row(&mat, tokens[i] as usize, r));
            }
            Store::File {
                cat,
                entry,
                format,
                scales,
            } => {
                let (rb, rs) = (format.row_bytes(hidden), format.row_scales(hidden));
                let mut buf = vec![0u8; rb];
                for (&t, r) in tokens.iter().zip(out.chunks_exact_mut(hidden)) {
                    let t = t as usize;
                    cat.read_part(entry, (t * rb) as u64, &mut buf)?;
                    let row = MatRef::new(*format, 1, hidden, &buf, &scales[t * rs..][..rs])?;
                    decode_row(&row, 0, r);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nectar_format::Bytes;

    /// An f32 table of `rows` rows of `cols`, row r = [r·100 + c].
    fn table(rows: usize, cols: usize) -> Embedding {
        let v: Vec<u8> = (0..rows * cols)
            .flat_map(|i| ((i / cols * 100 + i % cols) as f32).to_le_bytes())
            .collect();
        let data = Bytes::Owned(Arc::new(v));
        Embedding::held(
            Linear::new("embed".into(), WeightFormat::F32, rows, cols, data, vec![]).unwrap(),
        )
    }

    #[test]
    fn embedding_rows_gather_each_token_and_name_a_bad_one() {
        let e = table(40, 3);
        // More rows than the team's threshold, so the parallel path runs too.
        let tokens: Vec<u32> = (0..20).map(|i| (i * 7 % 40) as u32).collect();
        let mut out = vec![f32::NAN; tokens.len() * 3];
        e.rows(&tokens, &mut out).unwrap();
        for (r, &t) in tokens.iter().enumerate() {
            let want: Vec<f32> = (0..3).map(|c| (t as usize * 100 + c) as f32).collect();
            assert_eq!(&out[r * 3..r * 3 + 3], &want[..], "row {r}, token {t}");
        }
        let err = e.rows(&[1, 40], &mut [0.0; 6]).unwrap_err().to_string();
        assert!(
            err.contains("token id 40") && err.contains("size 40"),
            "{err}"
        );
        assert!(e.rows(&[1, 2], &mut [0.0; 5]).is_err());
        assert!(e.rows(&[], &mut []).is_ok());
    }

    /// A one-tensor container: `embed` int8 per row or int4 in groups of 16, with its scales.
    fn container(
        dir: &std::path::Path,
        rows: usize,
        cols: usize,
        int4: bool,
    ) -> std::path::PathBuf {
        use nectar_format::quant;
        let (mut codes, mut scales) = (Vec::new(), Vec::new());
        for r in 0..rows {
            let row: Vec<f32> = (0..cols)
                .map(|c| ((r * 31 + c * 7) % 23) as f32 - 11.0)
                .collect();
            match int4 {
                true => quant::quantize_int4_row(&row, 16, &mut codes, &mut scales),
                false => quant::quantize_int8_row(&row, &mut codes, &mut scales),
            }
        }
        let qs: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        let header = serde_json::json!({
            "embed": {"dtype": "U8", "shape": [rows, codes.len() / rows], "data_offsets": [0, codes.len()]},
            "embed.qs": {"dtype": "F32", "shape": [scales.len()], "data_offsets": [codes.len(), codes.len() + qs.len()]},
        });
        let h = serde_json::to_vec(&header).unwrap();
        let mut f = (h.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(&h);
        f.extend_from_slice(&codes);
        f.extend_from_slice(&qs);
        let path = dir.join("model.safetensors");
        std::fs::write(&path, f).unwrap();
        path
    }

    #[test]
    fn rows_read_from_the_file_equal_held_rows_and_a_truncated_file_is_named() {
        let (rows, cols) = (50, 48);
        for int4 in [false, true] {
            let d = tempfile::tempdir().unwrap();
            let path = container(d.path(), rows, cols, int4);
            let cat = Arc::new(Catalog::open(d.path()).unwrap());
            let held = crate::blocks::Loader::owned(&cat)
                .embedding("embed", rows, cols)
                .unwrap();
            let file = crate::blocks::Loader::owned(&cat)
                .embeddings_from_file(&cat)
                .embedding("embed", rows, cols)
                .unwrap();
            assert!(file.reads_rows() && !held.reads_rows());
            assert_eq!(file.bytes(), held.bytes());
            assert_eq!(file.held_bytes(), rows * if int4 { 3 } else { 1 } * 4);
            let tokens: Vec<u32> = (0..40).map(|i| (i * 13 % rows) as u32).collect();
            let (mut a, mut b) = (vec![0.0; 40 * cols], vec![0.0; 40 * cols]);
            held.rows(&tokens, &mut a).unwrap();
            file.rows(&tokens, &mut b).unwrap();
            assert_eq!(a, b, "int4 {int4}");
            assert!(a.iter().any(|&v| v != 0.0));
            let err = file.rows(&[rows as u32], &mut b[..cols]).unwrap_err();
            assert!(err.to_string().contains("outside the vocabulary"), "{err}");
            // Cut into the last rows (the scales after them go too): the held copy does not
            // care, the file's rows past the cut are an error naming the file and the tensor.
            let len = std::fs::metadata(&path).unwrap().len();
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(len - (rows * 4 * if int4 { 3 } else { 1 }) as u64 - 5)
                .unwrap();
            held.rows(&[rows as u32 - 1], &mut a[..cols]).unwrap();
            let err = file
                .rows(&[0, rows as u32 - 1], &mut b[..2 * cols])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("model.safetensors") && err.contains("`embed`"),
                "{err}"
            );
            file.rows(&[0], &mut b[..cols]).unwrap();
        }
    }
}
