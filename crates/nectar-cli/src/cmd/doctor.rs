//! `nectar doctor`.
use crate::args::DoctorArgs;
use anyhow::Result;
pub fn run(_a: DoctorArgs) -> Result<()> {
    anyhow::bail!("todo")
}
