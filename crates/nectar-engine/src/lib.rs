//! Text in, text out.
//!
//! `nectar-engine` is the only crate that knows about text: it turns chat
//! messages into a prompt (chat template), the prompt into token ids
//! (tokenizer), decides which ids end a turn (stop set), and turns generated
//! ids back into text as they arrive (stream decoder). Sampling, speculation
//! and sessions live here too. The model crate only ever sees token ids and
//! knows nothing of text.

#![deny(missing_docs)]

mod bundle;
mod chat_template;
mod error;
mod generate;
mod jinja_env;
mod py_json;
mod stops;
mod stream_decoder;
mod strftime;
mod tokenizer;

pub use bundle::ModelBundle;
pub use chat_template::ChatTemplate;
pub use error::{Error, Result};
pub use generate::{argmax, generate_greedy, FinishReason, Generation};
pub use stops::stop_token_ids;
pub use stream_decoder::StreamDecoder;
pub use tokenizer::Tokenizer;
