//! Opening a GPU: probing for the driver and NVRTC without panicking, creating the context and
//! stream, and compiling the kernels for the device's architecture.
use crate::error::{Error, Result};
use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use std::sync::Arc;
use std::time::Instant;

/// The kernel source, compiled at run time by NVRTC for the device found: the GEMV kernels
/// (`gemv.cu`), the tensor-core GEMM (`gemm.cu`, which uses gemv.cu's definitions), then the
/// tensor-core GEMVs (`gemv_tc.cu` and int4's `gemv_q.cu`, which use both), then MLA attention
/// (`attention.cu`), the DSA indexer's scores (`index.cu`) and the SwiGLU combine (`swiglu.cu`).
const KERNEL_SOURCE: &str = concat!(
    include_str!("gemv.cu"),
    include_str!("gemm.cu"),
    include_str!("gemv_tc.cu"),
    include_str!("gemv_q.cu"),
    include_str!("attention.cu"),
    include_str!("index.cu"),
    include_str!("swiglu.cu"),
    include_str!("moe.cu"),
    include_str!("rope.cu"),
    include_str!("absorbed.cu")
);

/// What the device reports about itself (printed by `nectar bench gpu` and the CLI's notices).
#[derive(Debug, Clone)]
pub struct GpuInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Marketing name (`NVIDIA H200`).
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Device memory, bytes.
    pub total_bytes: usize,
    /// Free device memory when the device was opened, bytes.
    pub free_bytes: usize,
    /// Streaming multiprocessors.
    pub multiprocessors: usize,
    /// L2 cache, bytes.
    pub l2_bytes: usize,
    /// Time building and loading the kernels took (or loading them from the cache),
    /// milliseconds.
    pub compile_ms: f64,
    /// Whether the kernels came from the on-disk cache (`kernel_cache.rs`) instead of NVRTC.
    pub kernels_cached: bool,
}

/// An opened GPU: its context, the stream every Nectar kernel and copy is queued on, and the
/// compiled kernels.
pub struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    info: GpuInfo,
    /// What the decode attention's KV mirrors hold, and their cap (`absorbed.rs`).
    pub(crate) mirrors: Arc<crate::absorbed::MirrorLedger>,
    /// Buffers of host-in, host-out GEMV products (`round_trip.rs`).
    pub(crate) scratch: std::sync::Mutex<crate::round_trip::Scratch>,
    /// The page-locked buffer of large activation copies (`bounce.rs`).
    pub(crate) bounce: std::sync::Mutex<crate::bounce::Bounce>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("info", &self.info).finish()
    }
}

/// NVRTC's options for compute capability `cc`: fmad stays on (the kernels' FMAs are explicit
/// anyway); no fast math: the dequantisation and the sums are IEEE f32 as documented.
fn options(cc: (i32, i32)) -> Vec<String> {
    vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1)]
}

/// Compiles the kernels to PTX for compute capability `cc` (needs NVRTC, not a GPU).
pub(crate) fn compile(cc: (i32, i32)) -> Result<Ptx> {
    let opts = CompileOptions {
        options: options(cc),
        ..Default::default()
    };
    compile_ptx_with_opts(KERNEL_SOURCE, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            Error::Compile(log.to_string_lossy().into_owned())
        }
        e => Error::Compile(format!("{e:?}")),
    })
}

/// NVRTC's options for machine code (a CUBIN) of compute capability `cc`: [`options`]' choices,
/// for the real architecture, its optimisation passes spread over the cores (`--split-compile=0`).
fn cubin_options(cc: (i32, i32)) -> Vec<String> {
    vec![
        format!("--gpu-architecture=sm_{}{}", cc.0, cc.1),
        "--split-compile=0".into(),
    ]
}

/// Builds the kernels' machine code for compute capability `cc` (needs NVRTC, not a GPU), so
/// the driver loads it without translating PTX (a minute on the H200's host; `kernel_cache.rs`).
pub(crate) fn compile_cubin(cc: (i32, i32)) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    let src = std::ffi::CString::new(KERNEL_SOURCE)
        .map_err(|_| Error::Compile("the kernel source holds a NUL byte".into()))?;
    let nvrtc = |what: &str, e: result::NvrtcError| Error::Compile(format!("{what}: {e:?}"));
    let prog = result::create_program(&src, None).map_err(|e| nvrtc("nvrtcCreateProgram", e))?;
    // SAFETY: `prog` was created above from `src`, which outlives it, and is destroyed once, at
    // the end; the size query writes one usize and the image call fills exactly that many bytes.
    let built = unsafe {
        let built = match result::compile_program(prog, &cubin_options(cc)) {
            Ok(()) => {
                let mut n = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut n)
                    .result()
                    .and_then(|()| {
                        let mut image = vec![0u8; n];
                        sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast())
                            .result()
                            .map(|()| image)
                    })
                    .map_err(|e| nvrtc("nvrtcGetCUBIN", e))
            }
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| {
                        std::ffi::CStr::from_ptr(l.as_ptr())
                            .to_string_lossy()
                            .into_owned()
                    })
                    .unwrap_or_default();
                Err(Error::Compile(format!("{e:?}: {log}")))
            }
        };
        let _ = result::destroy_program(prog);
        built
    };
    match built {
        Ok(image) if !image.is_empty() => Ok(image),
        Ok(_) => Err(Error::Compile("NVRTC returned an empty CUBIN".into())),
        Err(e) => Err(e),
    }
}

/// The kernels for compute capability `cc` in `ctx`: the cached machine code of this source,
/// options and NVRTC (`kernel_cache.rs`), or NVRTC's build of it, which is then cached. A cached
/// file the driver refuses is built over; where NVRTC cannot build machine code for the device,
/// the PTX path (the driver translates it). Returns whether the cache served them.
fn load_kernels(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> Result<(Arc<CudaModule>, bool)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (`Gpu::open` checked); the call writes two ints.
    let _ = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    let (opts, version) = (
        cubin_options(cc).join(" "),
        format!("nvrtc {major}.{minor}"),
    );
    let file = crate::kernel_cache::dir()
        .map(|d| crate::kernel_cache::path(&d, &[KERNEL_SOURCE, &opts, &version]));
    if let Some(image) = file.as_deref().and_then(crate::kernel_cache::load) {
        if let Ok(module) = ctx.load_module(Ptx::from_binary(image)) {
            return Ok((module, true));
        }
    }
    let built = compile_cubin(cc).and_then(|image| {
        let module = ctx.load_module(Ptx::from_binary(image.clone()))?;
        if let Some(f) = &file {
            // Best effort: without a cache the next start builds again.
            let _ = crate::kernel_cache::store(f, &image);
        }
        Ok(module)
    });
    match built {
        Ok(module) => Ok((module, false)),
        Err(_) => Ok((ctx.load_module(compile(cc)?)?, false)),
    }
}

/// Maps a driver error during probing to [`Error::Unavailable`]: no device, no driver and a
/// driver too old are all "run on the CPU", not faults.
fn unavailable(what: &str) -> impl FnOnce(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::Unavailable(format!("{what}: {e}"))
}

impl Gpu {
    /// Opens device `ordinal` and compiles the kernels for it.
    ///
    /// Returns [`Error::Unavailable`] (never panics) when the driver library, a device or NVRTC
    /// is missing; callers print that and stay on the CPU.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        // SAFETY: both probes only try to dlopen the libraries by their usual names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::Unavailable(
                "the CUDA driver library (libcuda.so) is not installed".into(),
            ));
        }
        let count = CudaContext::device_count().map_err(unavailable("cuInit"))?;
        if ordinal >= count.max(0) as usize {
            return Err(Error::Unavailable(format!(
                "device {ordinal} requested, the driver sees {count}"
            )));
        }
        // SAFETY: as above.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(Error::Unavailable(
                "NVRTC (libnvrtc.so) is not on the library path; add the CUDA toolkit's lib64 \
                 directory to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(unavailable("creating the context"))?;
        // One stream orders every kernel and copy; cudarc's per-buffer events add nothing then.
        // SAFETY: this context is used from a single stream only (see `Gpu::stream`).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let cc = ctx.compute_capability()?;
        let started = Instant::now();
        let (module, kernels_cached) = load_kernels(&ctx, cc)?;
        let compile_ms = started.elapsed().as_secs_f64() * 1e3;
        let (free_bytes, total_bytes) = ctx.mem_get_info()?;
        let info = GpuInfo {
            ordinal,
            name: ctx.name()?,
            compute_capability: cc,
            total_bytes,
            free_bytes,
            multiprocessors: ctx.attribute(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
                as usize,
            l2_bytes: ctx.attribute(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
            compile_ms,
            kernels_cached,
        };
        Ok(Gpu {
            ctx,
            stream,
            module,
            info,
            mirrors: Arc::default(),
            scratch: Default::default(),
            bounce: Default::default(),
        })
    }

    /// What the device reports about itself.
    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    /// One line for notices: `NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB free of 139.8 GiB)`.
    pub fn describe(&self) -> String {
        let i = &self.info;
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        format!(
            "{} (sm_{}{}, {} SMs, {:.1} GiB free of {:.1} GiB)",
            i.name,
            i.compute_capability.0,
            i.compute_capability.1,
            i.multiprocessors,
            gib(i.free_bytes),
            gib(i.total_bytes)
        )
    }

    /// VRAM the device reports free now.
    pub fn free_bytes(&self) -> Result<u64> {
        Ok(self.ctx.mem_get_info()?.0 as u64)
    }

    /// The stream every operation of this handle is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits for everything queued so far.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }

    pub(crate) fn function(&self, name: &str) -> Result<CudaFunction> {
        Ok(self.module.load_function(name)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemv::{kernel_names, MAX_M};

    /// Whether NVRTC can be opened; without it the kernel tests skip, unless
    /// `NECTAR_REQUIRE_NVRTC` is set (CI fetches NVRTC and sets it, so there a skip fails).
    fn nvrtc_present() -> bool {
        // SAFETY: only probes for the library.
        let present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
        assert!(
            present || std::env::var_os("NECTAR_REQUIRE_NVRTC").is_none(),
            "NECTAR_REQUIRE_NVRTC is set but NVRTC (libnvrtc.so.13) is not on the library path"
        );
        if !present {
            eprintln!("skipped: NVRTC (libnvrtc.so) not on the library path");
        }
        present
    }

    /// NVRTC builds the Hopper machine code the driver loads without translating (an ELF image).
    #[test]
    fn kernels_build_to_machine_code() {
        if !nvrtc_present() {
            return;
        }
        let image = compile_cubin((9, 0)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            &image[..4],
            b"\x7fELF",
            "{} bytes, not a CUBIN",
            image.len()
        );
    }

    /// NVRTC needs no GPU: where it is installed (`LD_LIBRARY_PATH`), the source must compile
    /// for Hopper and export every kernel the host side launches.
    #[test]
    fn kernels_compile_and_export_every_entry_point() {
        if !nvrtc_present() {
            return;
        }
        let ptx = compile((9, 0)).unwrap_or_else(|e| panic!("{e}")).to_src();
        let mut names = kernel_names();
        assert_eq!(
            names.len(),
            3 * MAX_M + 2 * 2 * 2 * MAX_M + 2 * 2 * 2 + 6 * 4 + 2
        );
        names.extend(crate::gemm::kernel_names());
        names.push("mla_prefill_attn".into());
        names.push("swiglu_combine".into());
        names.push("moe_gather".into());
        names.push("moe_combine".into());
        names.push("rope_heads".into());
        names.push("dsa_index_scores".into());
        names.push("dsa_index_scores_few".into());
        names.extend(crate::absorbed::kernel_names());
        for name in names {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "{name} missing from the PTX"
            );
        }
    }
}
