//! `nectar atlas`: which routed experts each prompt domain uses (docs/atlas.md).
//!
//! `probe` runs prompts and writes one usage file per prompt; `analyze` turns a probe directory
//! into `experts.json` (Colibri's Atlas format, `colibri-format.md` §10) and `atlas.json`
//! (provenance, counts and the leave-one-prompt-out validation). The arithmetic lives in
//! [`math`], apart from files and the model, so it is tested on crafted counts.
pub mod analyze;
pub mod math;
pub mod probe;
pub mod stats;

use crate::args::{AtlasArgs, AtlasWhat};
use anyhow::Result;
use sha2::{Digest, Sha256};

pub fn run(a: AtlasArgs) -> Result<()> {
    match a.what {
        AtlasWhat::Probe(p) => probe::run(p),
        AtlasWhat::Analyze(p) => analyze::run(p),
    }
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Now, as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    utc_iso(secs)
}

/// Unix seconds as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian; Hinnant's days-to-civil).
pub fn utc_iso(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_iso() {
        assert_eq!(utc_iso(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_iso(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_iso(1_795_000_000), "2026-11-18T11:06:40Z");
    }
}
