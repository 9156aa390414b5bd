//! `nectar run`'s usage ledger: which experts to pin at load (`--pin`, `--pin-size`), and adding
//! the run's selections to the model directory's `.coli_usage` afterwards.
use anyhow::Result;
use nectar_engine::{Pin, UsageLog, LEDGER_FILE};
use nectar_model::arch::glm5::PinRequest;
use nectar_model::Glm5;
use nectar_residency::planner::parse_size;
use std::path::Path;

/// `--pin MODE` (`off`, `auto` or a ledger FILE) and `--pin-size`, as `run` and `serve` take them.
pub fn pin(mode: &str, size: Option<&str>) -> Result<Pin> {
    let bytes = match size {
        Some(s) => Some(parse_size(s).map_err(anyhow::Error::msg)?),
        None => None,
    };
    Ok(match mode {
        "off" => Pin::Off,
        "auto" => Pin::Auto { bytes },
        f => Pin::Ledger {
            file: f.into(),
            bytes,
        },
    })
}

/// The pin request for `--pin MODE` and `--pin-size`: `None` for `off`. An unreadable
/// `.coli_usage` is derived state: warned about, never fatal (a named FILE must be readable).
pub fn pin_request(dir: &Path, mode: &str, size: Option<&str>) -> Result<Option<PinRequest>> {
    let (req, warning) = pin(mode, size)?.request(dir)?;
    if let Some(w) = warning {
        eprintln!("warning: not pinning: {w}");
    }
    Ok(req)
}

/// Adds the run's selections to `<dir>/.coli_usage` (a failure is a warning: the ledger is
/// derived state and the run's output stands).
pub fn save(dir: &Path, model: &Glm5) {
    let mut log = UsageLog::new(model, dir.join(LEDGER_FILE));
    if let Err(e) = log.flush(model) {
        eprintln!("warning: usage ledger not updated: {e}");
    }
}
