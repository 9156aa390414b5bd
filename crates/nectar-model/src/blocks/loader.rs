//! Typed access to a catalog's tensors: every tensor is checked for dtype and shape before use,
//! and errors name the file and the tensor.
use super::embedding::Embedding;
use super::linear::Linear;
use crate::error::Result;
use nectar_format::{quant, Bytes, Catalog, DType, Floats, TensorEntry};
use nectar_kernels::{decode_row, MatRef, WeightFormat};
use std::sync::Arc;

/// How a matrix goes to VRAM ([`PlaceRule`], [`super::Linear::place_on_gpu`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuCopy {
    /// Release the host copy once uploaded.
    pub release_host: bool,
    /// Keep the stored layout (kernels that read single weights in place need it) instead of
    /// int4's packed one (`nectar_cuda::Gpu::upload`).
    pub stored_layout: bool,
}

/// Where `--gpu-memory` puts a matrix as it is loaded, by checkpoint name: `None` keeps it on
/// the CPU; `Some(copy)` uploads it to VRAM as `copy` says.
#[cfg(feature = "cuda")]
pub type PlaceRule<'a> = &'a dyn Fn(&str) -> Option<GpuCopy>;

/// Loads named tensors from a catalog with shape and dtype checks.
#[derive(Clone, Copy)]
pub struct Loader<'a> {
    cat: &'a Catalog,
    owned: bool,
    /// Embedding tables read row by row from these files instead of held
    /// ([`Loader::embeddings_from_file`]).
    rows_from: Option<&'a Arc<Catalog>>,
    /// Matrices placed in VRAM as they load ([`Loader::placing`]).
    #[cfg(feature = "cuda")]
    place: Option<(&'a std::sync::Arc<nectar_cuda::Gpu>, PlaceRule<'a>)>,
}

impl std::fmt::Debug for Loader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("dir", &self.cat.dir())
            .field("owned", &self.owned)
            .field("rows_from_file", &self.rows_from.is_some())
            .finish()
    }
}

impl<'a> Loader<'a> {
    /// A loader whose weights are views of the catalog's (guarded) memory maps.
    pub fn new(cat: &'a Catalog) -> Self {
        Loader {
            cat,
            owned: false,
            rows_from: None,
            #[cfg(feature = "cuda")]
            place: None,
        }
    }

    /// A loader that copies every weight into process memory: what stays resident under a
    /// memory budget (the spine), so that a model file changing later cannot touch it.
    pub fn owned(cat: &'a Catalog) -> Self {
        Loader {
            owned: true,
            ..Self::new(cat)
        }
    }

    /// This loader, its embedding tables read from `cat`'s files a token's row at a time (what
    /// a memory budget wants: only the scales stay in memory). `cat` must be this loader's
    /// catalog.
    pub fn embeddings_from_file(self, cat: &'a Arc<Catalog>) -> Self {
        debug_assert!(std::ptr::eq(cat.as_ref(), self.cat));
        Loader {
            rows_from: Some(cat),
            ..self
        }
    }

    /// This loader, uploading each matrix `rule` places to `gpu` as it loads (embedding tables,
    /// gathered on the CPU, excepted). A matrix whose host copy is released is read into an
    /// owned buffer — never through the shared map, whose pages would stay resident — and
    /// that buffer is freed once uploaded, so at most one such matrix is in RAM at a time.
    #[cfg(feature = "cuda")]
    pub fn placing(self, gpu: &'a std::sync::Arc<nectar_cuda::Gpu>, rule: PlaceRule<'a>) -> Self {
        Loader {
            place: Some((gpu, rule)),
            ..self
        }
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
    /// sibling whose format is detected by byte arithmetic and checked against any stamp. In
    /// VRAM when this loader places it ([`Loader::placing`]).
    pub fn linear(&self, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        #[cfg(feature = "cuda")]
        if let Some((gpu, rule)) = self.place {
            if let Some(copy) = rule(name) {
                let host = Loader {
                    owned: self.owned || copy.release_host,
                    ..Self::new(self.cat)
                };
                let mut l = host.linear(name, rows, cols)?;
                l.place_on_gpu(gpu, copy)?;
                return Ok(l);
            }
        }
        self.host_linear(name, rows, cols)
    }

    /// [`Loader::linear`] in host memory only.
    fn host_linear(&self, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        let (e, format, scales) = self.stored(name, rows, cols)?;
        Linear::new(name.to_owned(), format, rows, cols, self.data(e)?, scales)
    }

    /// The entry, format and scales of a `[rows, cols]` matrix, checked against the shape: a
    /// float tensor, or quantised codes with a `.qs` scale sibling whose format is detected by
    /// byte arithmetic and checked against any stamp.
    fn stored(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<(&'a TensorEntry, WeightFormat, Floats)> {
        let e = self.cat.require(name)?;
        let Some(qs) = self.cat.get(&format!("{name}.qs")) else {
            if self.cat.get(&format!("{name}_scale_inv")).is_some() || e.dtype == DType::F8E4M3 {
                let msg = "fp8 checkpoints must be converted first (`nectar convert`)";
                return Err(self.cat.tensor_error(e, msg).into());
            }
            let format = self.float_format(e)?;
            self.check_shape(e, &[rows, cols])?;
            return Ok((e, format, Vec::new().into()));
        };
        if !matches!(e.dtype, DType::U8 | DType::I8) {
            let msg = format!("quantised codes must be U8 or I8, found {}", e.dtype);
            return Err(self.cat.tensor_error(e, msg).into());
        }
        // Views of the map beside the codes' when those are (no copy of an eighth of a g64
        // model), copies when the loader owns its weights.
        let scales = self.cat.f32s(qs, self.owned)?;
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
        Ok((e, format, scales))
    }

    /// A `[rows, cols]` embedding table: held (mapped or owned, as the loader's weights), or
    /// read a row at a time from the file ([`Loader::embeddings_from_file`]).
    pub fn embedding(&self, name: &str, rows: usize, cols: usize) -> Result<Embedding> {
        match self.rows_from {
            None => Ok(Embedding::held(self.host_linear(name, rows, cols)?)),
            Some(cat) => {
                let (e, format, scales) = self.stored(name, rows, cols)?;
                Embedding::from_file(cat.clone(), e.clone(), format, (rows, cols), scales)
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A resident load's scales are views of the map, an owned (budgeted) load's are copies;
    /// both compute the same bits.
    #[test]
    fn resident_scales_are_mapped_and_owned_ones_copied() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/nectar-demo-glm5-e256-int4");
        let cat = Catalog::open(&dir).unwrap();
        // int4 in groups of 64 (384 × 1024) and int8 per row (the output head, 8192 × 384).
        for (name, rows, cols) in [
            ("model.layers.0.mlp.down_proj.weight", 384, 1024),
            ("lm_head.weight", 8192, 384),
        ] {
            let mapped = Loader::new(&cat).linear(name, rows, cols).unwrap();
            let owned = Loader::owned(&cat).linear(name, rows, cols).unwrap();
            assert!(mapped.scales_mapped() && !owned.scales_mapped(), "{name}");
            let x: Vec<f32> = (0..2 * cols).map(|i| (i as f32 * 0.37).sin()).collect();
            let bits = |l: &Linear| -> Vec<u32> {
                l.forward(&x, 2)
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            assert_eq!(bits(&mapped), bits(&owned), "{name}");
        }
    }
}
