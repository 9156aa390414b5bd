//! Typed access to a catalog's tensors: every tensor is checked for dtype and shape before use,
//! and errors name the file and the tensor.
use super::linear::{Embedding, Linear};
use crate::error::Result;
use nectar_format::{quant, Bytes, Catalog, DType, TensorEntry};
use nectar_kernels::{decode_row, MatRef, WeightFormat};

/// Loads named tensors from a catalog with shape and dtype checks.
#[derive(Debug, Clone, Copy)]
pub struct Loader<'a> {
    cat: &'a Catalog,
    owned: bool,
}

impl<'a> Loader<'a> {
    /// A loader whose weights are views of the catalog's (guarded) memory maps.
    pub fn new(cat: &'a Catalog) -> Self {
        Loader { cat, owned: false }
    }

    /// A loader that copies every weight into process memory: what stays resident under a
    /// memory budget (the spine), so that a model file changing later cannot touch it.
    pub fn owned(cat: &'a Catalog) -> Self {
        Loader { cat, owned: true }
    }

    fn data(&self, e: &TensorEntry) -> Result<Bytes> {
        Ok(if self.owned {
            self.cat.read_owned(e)?
        } else {
            self.cat.shared_bytes(e)
        })
    }

    /// The catalog.
    pub fn catalog(&self) -> &'a Catalog {
        self.cat
    }

    /// True when the tensor exists.
    pub fn has(&self, name: &str) -> bool {
        self.cat.get(name).is_some()
    }

    fn float_format(&self, e: &TensorEntry) -> Result<WeightFormat> {
        Ok(match e.dtype {
            DType::F32 => WeightFormat::F32,
            DType::BF16 => WeightFormat::Bf16,
            DType::F16 => WeightFormat::F16,
            other => {
                return Err(self
                    .cat
                    .tensor_error(
                        e,
                        format!("dtype {other} is not supported here (want F32, BF16 or F16)"),
                    )
                    .into())
            }
        })
    }

    fn check_shape(&self, e: &TensorEntry, want: &[usize]) -> Result<()> {
        if e.shape != want {
            return Err(self
                .cat
                .tensor_error(e, format!("shape {:?}, expected {:?}", e.shape, want))
                .into());
        }
        Ok(())
    }

    /// A `[rows, cols]` weight matrix: a float tensor, or quantised codes with a `.qs` scale
    /// sibling whose format is detected by byte arithmetic and checked against any stamp.
    pub fn linear(&self, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        let e = self.cat.require(name)?;
        let Some(qs) = self.cat.get(&format!("{name}.qs")) else {
            if self.cat.get(&format!("{name}_scale_inv")).is_some() || e.dtype == DType::F8E4M3 {
                let msg = "fp8 checkpoints must be converted first (`nectar convert`)";
                return Err(self.cat.tensor_error(e, msg).into());
            }
            let format = self.float_format(e)?;
            self.check_shape(e, &[rows, cols])?;
            let data = self.data(e)?;
            return Linear::new(name.to_owned(), format, rows, cols, data, Vec::new());
        };
        if !matches!(e.dtype, DType::U8 | DType::I8) {
            let msg = format!("quantised codes must be U8 or I8, found {}", e.dtype);
            return Err(self.cat.tensor_error(e, msg).into());
        }
        let scales = self.cat.read_f32(qs)?;
        let detected = quant::resolve(
            rows,
            cols,
            e.len as usize,
            scales.len(),
            self.cat.stamp(name),
        )
        .map_err(|m| self.cat.tensor_error(e, m))?;
        let format = detected.weight_format().ok_or_else(|| {
            let msg = format!(
                "format `{}` is not supported by the kernels",
                detected.name()
            );
            self.cat.tensor_error(e, msg)
        })?;
        Linear::new(name.to_owned(), format, rows, cols, self.data(e)?, scales)
    }

    /// A `[rows, cols]` embedding table.
    pub fn embedding(&self, name: &str, rows: usize, cols: usize) -> Result<Embedding> {
        Ok(Embedding(self.linear(name, rows, cols)?))
    }

    /// A `[len]` vector (norm weight, bias), widened to f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let e = self.cat.require(name)?;
        let format = self.float_format(e)?;
        self.check_shape(e, &[len])?;
        let data = self.data(e)?;
        let m = MatRef::new(format, 1, len, &data, &[])?;
        let mut out = vec![0.0; len];
        decode_row(&m, 0, &mut out);
        Ok(out)
    }
}
