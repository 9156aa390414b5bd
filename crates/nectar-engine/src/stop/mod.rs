//! When generation stops: stop token ids and stop strings.
//!
//! Two mechanisms, both ending a request with finish reason `stop`:
//! - [`stop_token_ids`]: the model's eos set, read from its config files and
//!   never filtered; a request may add ids of its own. The stop token is not
//!   part of the text.
//! - [`StopMatcher`]: request-supplied stop strings over the streamed text;
//!   the stop string and anything after it are not part of the text.

mod ids;
mod matcher;

pub use ids::stop_token_ids;
pub use matcher::{StopMatcher, StopScan};
