use crate::error::{Error, Result};

/// The in-memory layout of a weight matrix as the kernels consume it.
///
/// All matrices are `[rows = out_features, cols = in_features]`, row-major, y = W·x.
/// Quantised formats follow Colibri's container maths (`specs/colibri-format.md` §4–5):
/// codes are symmetric, scales are f32 and multiplied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// IEEE f32, 4 bytes per weight.
    F32,
    /// bfloat16, 2 bytes per weight.
    Bf16,
    /// IEEE f16, 2 bytes per weight.
    F16,
    /// int8 codes (two's complement) with one f32 scale per row.
    Int8Row,
    /// int4 codes, two per byte (even column in the low nibble, stored +8), one scale per row.
    Int4Row,
    /// int4 codes as [`WeightFormat::Int4Row`], one scale per `group` consecutive columns.
    Int4Group {
        /// Columns per scale group (the last group of a row may be shorter).
        group: usize,
    },
}

impl WeightFormat {
    /// Bytes one row of `cols` weights occupies.
    pub fn row_bytes(self, cols: usize) -> usize {
        match self {
            WeightFormat::F32 => cols * 4,
            WeightFormat::Bf16 | WeightFormat::F16 => cols * 2,
            WeightFormat::Int8Row => cols,
            WeightFormat::Int4Row | WeightFormat::Int4Group { .. } => cols.div_ceil(2),
        }
    }

    /// Scales one row carries.
    pub fn row_scales(self, cols: usize) -> usize {
        match self {
            WeightFormat::F32 | WeightFormat::Bf16 | WeightFormat::F16 => 0,
            WeightFormat::Int8Row | WeightFormat::Int4Row => 1,
            WeightFormat::Int4Group { group } => cols.div_ceil(group.max(1)),
        }
    }

    /// A short stable name ("bf16", "int4-g64", ...), used in reports and errors.
    pub fn name(self) -> String {
        match self {
            WeightFormat::F32 => "f32".into(),
            WeightFormat::Bf16 => "bf16".into(),
            WeightFormat::F16 => "f16".into(),
            WeightFormat::Int8Row => "int8-row".into(),
            WeightFormat::Int4Row => "int4-row".into(),
            WeightFormat::Int4Group { group } => format!("int4-g{group}"),
        }
    }
}

/// A borrowed weight matrix: its format, logical shape, raw bytes and f32 scales.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    /// Storage format of `data`.
    pub format: WeightFormat,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// `rows * format.row_bytes(cols)` bytes, row-major, little-endian.
    pub data: &'a [u8],
    /// `rows * format.row_scales(cols)` scales (empty for float formats).
    pub scales: &'a [f32],
}

impl<'a> MatRef<'a> {
    /// Builds a matrix view after checking that the byte and scale counts match the shape.
    pub fn new(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        data: &'a [u8],
        scales: &'a [f32],
    ) -> Result<Self> {
        if let WeightFormat::Int4Group { group: 0 } = format {
            return Err(Error::Shape("int4 group size 0".into()));
        }
        let overflow = || {
            Error::Shape(format!(
                "{rows}x{cols} {} matrix overflows usize",
                format.name()
            ))
        };
        let expected = rows
            .checked_mul(format.row_bytes(cols))
            .ok_or_else(overflow)?;
        if data.len() != expected {
            return Err(Error::Size {
                what: "weight bytes",
                format: format.name(),
                rows,
                cols,
                expected,
                found: data.len(),
                unit: "bytes",
            });
        }
        let expected = rows
            .checked_mul(format.row_scales(cols))
            .ok_or_else(overflow)?;
        if scales.len() != expected {
            return Err(Error::Size {
                what: "scales",
                format: format.name(),
                rows,
                cols,
                expected,
                found: scales.len(),
                unit: "f32",
            });
        }
        Ok(MatRef {
            format,
            rows,
            cols,
            data,
            scales,
        })
    }

    /// Re-checks the invariants [`MatRef::new`] establishes. The fields are public, so a view
    /// can be built without `new`; the SIMD kernels read raw pointers and rely on these sizes,
    /// so every public kernel entry point calls this first.
    pub fn validate(&self) -> Result<()> {
        MatRef::new(self.format, self.rows, self.cols, self.data, self.scales).map(|_| ())
    }

    /// The bytes of row `r`.
    #[inline]
    pub fn row_data(&self, r: usize) -> &'a [u8] {
        let rb = self.format.row_bytes(self.cols);
        &self.data[r * rb..(r + 1) * rb]
    }

    /// The scales of row `r`.
    #[inline]
    pub fn row_scales(&self, r: usize) -> &'a [f32] {
        let rs = self.format.row_scales(self.cols);
        &self.scales[r * rs..(r + 1) * rs]
    }

    /// Total bytes the kernels stream for one pass over the matrix (weights + scales).
    pub fn stream_bytes(&self) -> usize {
        self.data.len() + self.scales.len() * 4
    }
}
