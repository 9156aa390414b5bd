//! `nectar run`'s usage ledger: which experts to pin at load (`--pin`, `--pin-size`), and adding
//! the run's selections to the model directory's `.coli_usage` afterwards.
use anyhow::Result;
use nectar_engine::{UsageLog, LEDGER_FILE};
use nectar_model::arch::glm5::PinRequest;
use nectar_model::Glm5;
use nectar_residency::planner::parse_size;
use std::path::Path;

/// The pin request for `--pin MODE` and `--pin-size`: `None` for `off`. An unreadable
/// `.coli_usage` is derived state: warned about, never fatal (a named FILE must be readable).
pub fn pin_request(dir: &Path, mode: &str, size: Option<&str>) -> Result<Option<PinRequest>> {
    let bytes = match size {
        Some(s) => Some(parse_size(s).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let file = match mode {
        "off" => return Ok(None),
        "auto" => None,
        f => Some(Path::new(f)),
    };
    let (req, warning) = nectar_engine::pin_request(dir, file, bytes)?;
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
