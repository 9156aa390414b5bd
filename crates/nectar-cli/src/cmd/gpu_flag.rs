//! `--gpu-memory SIZE|auto|off` of `run`, `serve` and `fit`, and its default: `auto` (most of the
//! free VRAM, `nectar_model::arch::glm5::auto_budget`) in a build with the CUDA tier, the CPU in
//! one without (docs/gpu.md).
use anyhow::Result;
use nectar_model::arch::glm5::GpuMemory;

/// Whether this build has the CUDA tier.
pub const CUDA_BUILD: bool = cfg!(feature = "cuda");

/// The VRAM asked for: `None` runs on the CPU without trying a GPU.
pub fn resolve(flag: Option<&str>) -> Result<Option<GpuMemory>> {
    match flag.map(str::trim) {
        None => Ok(CUDA_BUILD.then_some(GpuMemory::Auto)),
        Some("off" | "0") => Ok(None),
        Some("auto") => Ok(Some(GpuMemory::Auto)),
        Some(s) => nectar_residency::planner::parse_size(s)
            .map(|b| Some(GpuMemory::Size(b)))
            .map_err(|e| {
                anyhow::anyhow!("--gpu-memory: {e} (a size such as 16G, `auto` or `off`)")
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_auto_off_and_the_build_default() {
        assert_eq!(resolve(Some("2G")).unwrap(), Some(GpuMemory::Size(2 << 30)));
        assert_eq!(resolve(Some("auto")).unwrap(), Some(GpuMemory::Auto));
        assert_eq!(resolve(Some("off")).unwrap(), None);
        assert_eq!(resolve(Some("0")).unwrap(), None);
        assert!(resolve(Some("lots"))
            .unwrap_err()
            .to_string()
            .contains("--gpu-memory"));
        let default = resolve(None).unwrap();
        assert_eq!(default, CUDA_BUILD.then_some(GpuMemory::Auto));
    }
}
