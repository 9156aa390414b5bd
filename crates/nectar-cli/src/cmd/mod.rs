//! One module per subcommand.
pub mod atlas;
pub mod bench;
pub mod bench_decode;
pub mod bench_gpu;
pub mod bench_io;
pub mod bench_pilot;
pub mod bench_policy;
pub mod bench_replay;
pub mod convert;
pub mod doctor;
pub mod fit;
pub mod glm52_spine;
pub mod gpu_flag;
pub mod grammar;
pub mod inspect;
pub mod logits;
pub mod project;
pub mod project_calibrate;
pub mod project_gpu;
pub mod run;
pub mod serve;
pub mod session;
pub mod synth;
pub mod trace_routes;
pub mod usage;
pub mod verify;

/// `n` and the noun, singular for exactly one ("1 prompt token", "2 prompt tokens").
pub fn count(n: impl Into<u64>, singular: &str, plural: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { singular } else { plural })
}
