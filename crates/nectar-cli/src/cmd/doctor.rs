//! `nectar doctor`: checks this machine and a model directory, says what to fix, and exits
//! non-zero when something blocks a run. The figures come from the code that uses them: the
//! memory plan of `nectar fit`, the projection and its measurements of `fit --project` (run
//! with [`Effort::QUICK`]), the usable-memory rule of every default budget.
use super::fit::resolve_budget;
use super::project::{self, Effort};
use crate::args::{DoctorArgs, FitArgs, DEFAULT_ACCEPTANCE};
use crate::machine::usable_memory;
use anyhow::Result;
use nectar_format::Catalog;
use nectar_model::arch::glm5::{plan_memory, Config, Inventory, LoadOptions};
use nectar_residency::planner::human;
use serde::Serialize;
use serde_json::json;
use std::io::Write;
use std::path::Path;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Ok,
    /// Works, but slower or riskier than it could be.
    Warn,
    /// Blocks a run.
    Fail,
}

/// One check's result.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked.
    pub check: &'static str,
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn check(check: &'static str, status: Status, detail: String, fix: Option<String>) -> Check {
    Check {
        check,
        status,
        detail,
        fix,
    }
}

/// Disk free below this is a warning (sessions, the usage ledger and converted shards need room).
const LOW_DISK: u64 = 1 << 30;
/// Expert reads slower than this (GB/s) make decode disk-bound at any useful budget.
const SLOW_DISK_GBPS: f64 = 1.0;

/// Free bytes for an unprivileged user on the filesystem holding `path`.
pub fn free_bytes(path: &Path) -> Option<u64> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
        let mut s = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
        // SAFETY: `c` is a NUL-terminated path and `s` a writable statvfs; the result is read
        // only when the call succeeds (and so filled it).
        let rc = unsafe { libc::statvfs(c.as_ptr(), s.as_mut_ptr()) };
        if rc != 0 {
            return None;
        }
        // SAFETY: statvfs succeeded, so `s` is initialised.
        let s = unsafe { s.assume_init() };
        // The field types differ between platforms (u32 on some): the casts are not useless.
        #[allow(clippy::unnecessary_cast)]
        Some(s.f_bavail as u64 * s.f_frsize as u64)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// `RLIMIT_MEMLOCK` (soft, hard) in bytes; `None` in a field means unlimited.
pub fn memlock_limit() -> Option<(Option<u64>, Option<u64>)> {
    #[cfg(unix)]
    {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `r` is a valid rlimit for the call to fill.
        if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
            return None;
        }
        // rlim_t is not u64 everywhere.
        #[allow(clippy::unnecessary_cast)]
        let f = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v as u64);
        Some((f(r.rlim_cur), f(r.rlim_max)))
    }
    #[cfg(not(unix))]
    None
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn machine_checks(out: &mut Vec<Check>) -> Option<u64> {
    let isa = nectar_kernels::isa();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    out.push(check(
        "cpu",
        if isa == "scalar" {
            Status::Warn
        } else {
            Status::Ok
        },
        format!(
            "{}, {cores} cores ({} compute threads), kernels: {isa}",
            cpu_name(),
            rayon::current_num_threads()
        ),
        (isa == "scalar").then(|| {
            "no SIMD kernel path for this CPU (AVX2, AVX-512 or NEON): every product runs \
             scalar, several times slower"
                .into()
        }),
    ));
    let u = usable_memory();
    let cg = match &u.cgroup {
        None => "no memory cgroup".to_string(),
        Some(c) => format!(
            "cgroup v{} limit {}, headroom {}",
            c.version,
            c.limit.map_or("none".into(), human),
            c.headroom().map_or("unlimited".into(), human)
        ),
    };
    let total = crate::machine::meminfo("MemTotal").map(|t| t as u64);
    let detail = format!(
        "MemTotal {}, MemAvailable {}, {cg} → usable {}",
        total.map_or("?".into(), human),
        u.available.map_or("?".into(), human),
        u.bytes.map_or("?".into(), human)
    );
    let capped = matches!((u.available, u.cgroup.as_ref().and_then(|c| c.headroom())),
        (Some(a), Some(h)) if h < a);
    out.push(match u.bytes {
        None => check(
            "memory",
            Status::Warn,
            "cannot read MemAvailable or a cgroup limit".into(),
            Some("pass --memory-budget explicitly to every command".into()),
        ),
        Some(_) if capped => check(
            "memory",
            Status::Warn,
            detail,
            Some(
                "the cgroup leaves less than MemAvailable shows: default budgets plan from the \
                 cgroup's headroom; a budget from `free` would get this process OOM-killed"
                    .into(),
            ),
        ),
        Some(_) => check("memory", Status::Ok, detail, None),
    });
    let memlock = match memlock_limit() {
        Some((soft, hard)) => format!(
            "RLIMIT_MEMLOCK soft {}, hard {} (Nectar does not lock memory: the budget and the \
             RSS guard bound it)",
            soft.map_or("unlimited".into(), human),
            hard.map_or("unlimited".into(), human)
        ),
        None => "RLIMIT_MEMLOCK unknown".into(),
    };
    out.push(check("memlock", Status::Ok, memlock, None));
    u.bytes
}

/// Inventory and format checks from headers; `false` when the model cannot load.
fn model_checks(dir: &Path, out: &mut Vec<Check>) -> bool {
    let loaded = Config::from_dir(dir)
        .map_err(anyhow::Error::from)
        .and_then(|cfg| Ok((Catalog::open(dir)?, cfg)));
    let (cat, cfg) = match loaded {
        Ok(x) => x,
        Err(e) => {
            out.push(check(
                "model",
                Status::Fail,
                format!("{}: {e:#}", dir.display()),
                Some("point --model at a converted GLM-5.x directory (`nectar convert`), or re-copy the damaged file".into()),
            ));
            return false;
        }
    };
    let inv = Inventory::new(&cat, &cfg);
    let r = &cfg.raw;
    let mut problems = inv.problems.clone();
    if inv.routed_experts != inv.routed_experts_expected {
        problems.push(format!(
            "{} routed experts found, the config implies {}",
            inv.routed_experts, inv.routed_experts_expected
        ));
    }
    if inv.bytes_per_expert.is_none() && inv.routed_experts > 0 {
        problems.push("routed experts differ in size (streaming needs uniform experts)".into());
    }
    let detail = format!(
        "{}: {} layers, {} routed experts ({} per MoE layer, top-{}), {} shards, {} tensors, MTP {}",
        dir.display(),
        r.num_hidden_layers,
        inv.routed_experts,
        r.n_routed_experts,
        r.num_experts_per_tok,
        cat.shards().len(),
        cat.len(),
        if inv.mtp { "present" } else { "absent" }
    );
    let ok = problems.is_empty();
    out.push(if ok {
        check("model", Status::Ok, detail, None)
    } else {
        check(
            "model",
            Status::Fail,
            format!("{detail}; {}", problems.join("; ")),
            Some(
                "re-convert the checkpoint (`nectar convert`) or replace the damaged shards".into(),
            ),
        )
    });
    if !dir.join("tokenizer.json").exists() {
        out.push(check(
            "tokenizer",
            Status::Warn,
            format!("{} has no tokenizer.json", dir.display()),
            Some("copy tokenizer.json (and tokenizer_config.json) from the original checkpoint; without it prompts must be token ids".into()),
        ));
    }
    ok
}

fn disk_free_check(dir: &Path, out: &mut Vec<Check>) {
    out.push(match free_bytes(dir) {
        Some(f) if f < LOW_DISK => check(
            "disk free",
            Status::Warn,
            format!("{} free on {}'s filesystem", human(f), dir.display()),
            Some("free some space: sessions, the usage ledger and conversions write here".into()),
        ),
        Some(f) => check(
            "disk free",
            Status::Ok,
            format!("{} free on {}'s filesystem", human(f), dir.display()),
            None,
        ),
        None => check(
            "disk free",
            Status::Warn,
            format!("cannot stat {}", dir.display()),
            None,
        ),
    });
}

/// The memory plan for `budget` and, when it fits, the projection; `false` when the plan
/// fails.
fn plan_checks(a: &DoctorArgs, dir: &Path, budget: u64, out: &mut Vec<Check>) -> bool {
    let opts = LoadOptions {
        memory_budget: Some(budget),
        ctx_size: a.ctx_size,
        // `nectar run`'s default (`--mtp off`): the MTP layer is not loaded.
        mtp: false,
        ..Default::default()
    };
    match plan_memory(dir, &opts).map(|m| (m.inputs, m.plan)) {
        Ok((inputs, Ok(p))) => out.push(check(
            "memory plan",
            Status::Ok,
            format!(
                "budget {} (context {}): {} per sparse layer × {} layers of {} each, {} unused",
                human(budget),
                a.ctx_size,
                p.lru_words(),
                inputs.sparse_layers,
                human(inputs.slot_bytes),
                human(p.slack)
            ),
            None,
        )),
        Ok((_, Err(e))) | Err(e) => {
            out.push(check(
                "memory plan",
                Status::Fail,
                format!("budget {}: {e}", human(budget)),
                Some(
                    "raise --memory-budget (see `nectar fit`), shorten --ctx-size, or free memory"
                        .into(),
                ),
            ));
            return false;
        }
    }
    let fit = FitArgs {
        model: Some(dir.to_path_buf()),
        memory_budget: None,
        ctx_size: a.ctx_size,
        gpu_memory: None,
        parallel: 1,
        serve: false,
        mtp: None,
        project: true,
        geometry: None,
        disk_gbps: None,
        mem_gbps: None,
        kernel_share: None,
        gflops: None,
        attn_gflops: None,
        cores: None,
        layer_overhead_ms: None,
        moe_overlap: None,
        lookahead_hidden: None,
        lookahead_cancelled: None,
        calibrate: None,
        gpu_gbps: None,
        gpu_product_us: None,
        gpu_copy_gbps: None,
        gpu_prefill_us: None,
        gpu_attn_tflops: None,
        prefetch: "both".into(),
        pilot_busy: None,
        pilot_waste: None,
        predictor: None,
        context: None,
        acceptance: DEFAULT_ACCEPTANCE,
        trace: None,
        io_threads: 3,
        json: false,
    };
    match project::compute(&fit, budget, &Effort::QUICK) {
        Ok(full) => {
            let m = &full["machine"];
            let o = &full["projection"];
            let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
            out.push(check(
                "ram bandwidth",
                Status::Ok,
                format!(
                    "read {:.1} GB/s, int4 decode kernel {:.1} GB/s",
                    f(&m["read_gbps"]),
                    f(&m["decode_kernel_gbps"])
                ),
                None,
            ));
            let disk = f(&m["disk_gbps"]);
            let (d, n) = (
                m["disk_direct_shards"]["direct"].as_u64().unwrap_or(0),
                m["disk_direct_shards"]["of"].as_u64().unwrap_or(0),
            );
            let detail = format!(
                "whole experts at {disk:.2} GB/s ({} threads; O_DIRECT on {d} of {n} shards)",
                fit.io_threads
            );
            out.push(if d < n {
                check(
                    "disk speed",
                    Status::Warn,
                    detail,
                    Some("the filesystem refuses O_DIRECT (tmpfs, some overlay or network filesystems): expert reads go through the page cache, outside the budget; keep the model on a local ext4/xfs NVMe".into()),
                )
            } else if disk < SLOW_DISK_GBPS {
                check(
                    "disk speed",
                    Status::Warn,
                    detail,
                    Some(format!("below {SLOW_DISK_GBPS} GB/s, expert misses dominate decode: put the model on NVMe, or raise the budget so more experts stay cached")),
                )
            } else {
                check("disk speed", Status::Ok, detail, None)
            });
            out.push(check(
                "projection",
                Status::Ok,
                format!(
                    "decode {:.2} tok/s (MTP off), {:.2} tok/s (MTP on); hit rate {:.3}; {}-bound (`nectar fit --project` measures longer)",
                    f(&o["decode_tok_s"]["mtp_off"]),
                    f(&o["decode_tok_s"]["mtp_on"]),
                    f(&o["hit_rate"]["mtp_off"]),
                    o["bound"].as_str().unwrap_or("?")
                ),
                None,
            ));
        }
        Err(e) => out.push(check(
            "projection",
            Status::Warn,
            format!("no projection: {e:#}"),
            None,
        )),
    }
    true
}

pub fn run(a: DoctorArgs) -> Result<()> {
    let mut out = Vec::new();
    let usable = machine_checks(&mut out);
    let budget = match &a.memory_budget {
        Some(s) => Some(resolve_budget(Some(s))?),
        None => resolve_budget(None).ok(),
    };
    if let (Some(b), Some(u), Some(_)) = (budget, usable, &a.memory_budget) {
        if b > u {
            out.push(check(
                "budget",
                Status::Fail,
                format!(
                    "--memory-budget {} is more than the {} this process may use",
                    human(b),
                    human(u)
                ),
                Some(format!(
                    "use at most {} (90 % of the usable memory)",
                    human(u / 10 * 9)
                )),
            ));
        }
    }
    match &a.model {
        Some(dir) => {
            disk_free_check(dir, &mut out);
            if model_checks(dir, &mut out) {
                match budget {
                    Some(b) => {
                        plan_checks(&a, dir, b, &mut out);
                    }
                    None => out.push(check(
                        "memory plan",
                        Status::Fail,
                        "no budget: available memory unreadable".into(),
                        Some("pass --memory-budget".into()),
                    )),
                }
            }
        }
        None => {
            disk_free_check(Path::new("."), &mut out);
            let gbps = project::measure_read(rayon::current_num_threads(), &Effort::QUICK)?;
            out.push(check(
                "ram bandwidth",
                Status::Ok,
                format!("read {gbps:.1} GB/s"),
                None,
            ));
        }
    }
    let fails = out.iter().filter(|c| c.status == Status::Fail).count();
    let warns = out.iter().filter(|c| c.status == Status::Warn).count();
    let mut o = std::io::stdout().lock();
    if a.json {
        let v = json!({"ok": fails == 0, "checks": out});
        writeln!(o, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        for c in &out {
            let tag = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
            };
            writeln!(o, "{tag}  {:<13} {}", c.check, c.detail)?;
            if let Some(f) = &c.fix {
                writeln!(o, "      {:<13} fix: {f}", "")?;
            }
        }
        if fails == 0 {
            writeln!(o, "ready to run ({warns} warning(s))")?;
        }
    }
    anyhow::ensure!(
        fails == 0,
        "{fails} problem(s) block a run: {}",
        out.iter()
            .filter(|c| c.status == Status::Fail)
            .map(|c| c.check)
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_and_memlock_read() {
        let d = tempfile::tempdir().unwrap();
        assert!(free_bytes(d.path()).is_some_and(|f| f > 0));
        assert_eq!(free_bytes(&d.path().join("missing")), None);
        assert!(memlock_limit().is_some());
    }
}
