use thiserror::Error;

/// Errors raised by kernel entry points when their inputs do not describe a valid product.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// The byte or scale count does not match the matrix shape and format.
    #[error(
        "{what}: expected {expected} {unit} for a {rows}x{cols} {format} matrix, found {found}"
    )]
    Size {
        /// Which buffer was wrong ("weight bytes", "scales").
        what: &'static str,
        /// Format name.
        format: String,
        /// Logical rows.
        rows: usize,
        /// Logical columns.
        cols: usize,
        /// Expected count.
        expected: usize,
        /// Found count.
        found: usize,
        /// Unit of the counts.
        unit: &'static str,
    },
    /// A kernel path that cannot be selected (unknown, unsupported, or another already in use).
    #[error("{0}")]
    Isa(String),
    /// Activation or output buffers do not match the product's shape.
    #[error("shape mismatch: {0}")]
    Shape(String),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
