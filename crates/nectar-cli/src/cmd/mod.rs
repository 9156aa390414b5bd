//! One module per subcommand.
pub mod convert;
pub mod inspect;
pub mod logits;
pub mod run;
