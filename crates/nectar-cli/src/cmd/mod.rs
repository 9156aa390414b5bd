//! One module per subcommand.
pub mod inspect;
pub mod logits;
pub mod run;
