//! The memory guard under a real memory hog: `nectar run` with a budget runs inside a memory
//! cgroup that another process then fills. Without the guard the cgroup's OOM killer ends one of
//! them; with it, nectar shrinks its expert cache, gives the pages back to the OS, and finishes
//! with the same tokens as an undisturbed run.
//!
//! The test needs a memory cgroup it can create (root, cgroup v1 `memory` or v2 with the memory
//! controller). Where there is none it says so and passes, unless `NECTAR_REQUIRE_CGROUP=1`
//! (set it where the capability is known to exist).
mod common;

use common::{json, nectar};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const MB: u64 = 1_000_000;

/// A memory cgroup of our own, removed on drop.
struct Cgroup {
    dir: PathBuf,
    procs: &'static str,
}

impl Cgroup {
    fn create(limit: u64) -> Result<Cgroup, String> {
        // Tests run in parallel threads of one process: each cgroup gets its own name.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("nectar-guard-test-{}-{n}", std::process::id());
        let v1 = PathBuf::from("/sys/fs/cgroup/memory");
        let v2 = PathBuf::from("/sys/fs/cgroup");
        let v2_has_memory = std::fs::read_to_string(v2.join("cgroup.subtree_control"))
            .is_ok_and(|s| s.split_whitespace().any(|c| c == "memory"));
        let (dir, limit_file) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(&name), "memory.limit_in_bytes")
        } else if v2_has_memory {
            (v2.join(&name), "memory.max")
        } else {
            return Err("no memory cgroup hierarchy here".into());
        };
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cg = Cgroup {
            dir,
            procs: "cgroup.procs",
        };
        std::fs::write(cg.dir.join(limit_file), limit.to_string())
            .map_err(|e| format!("cannot set {limit_file}: {e}"))?;
        Ok(cg)
    }

    /// A cgroup, or `None` (said on stderr) where none can be made and
    /// `NECTAR_REQUIRE_CGROUP=1` is not set.
    fn or_skip(limit: u64) -> Option<Cgroup> {
        match Cgroup::create(limit) {
            Ok(cg) => Some(cg),
            Err(why) if std::env::var("NECTAR_REQUIRE_CGROUP").as_deref() != Ok("1") => {
                eprintln!("skipped: {why} (set NECTAR_REQUIRE_CGROUP=1 to make this a failure)");
                None
            }
            Err(why) => panic!("{why}"),
        }
    }

    /// `program args` started inside the cgroup (a shell joins it, then execs).
    fn spawn(&self, program: &str, args: &[&str], stdin: Stdio) -> Child {
        let procs = self.dir.join(self.procs);
        Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$0" && exec "$@""#)
            .arg(procs)
            .arg(program)
            .args(args)
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Empty by now (every child was waited for); a cgroup directory is removed with rmdir.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The process's anonymous resident memory (`RssAnon`): what its cgroup is charged for it.
/// File pages (the binary, the memory-mapped spine) count in RSS too, but they are charged to
/// whoever read them first and the kernel reclaims them under pressure.
fn rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Allocates `MB` megabytes in 10 MB steps 50 ms apart (200 MB/s: the guard looks every 100 ms
/// while idle and keeps 32 MiB free), touching every page, prints `full`, and holds the
/// memory until its stdin closes.
const HOG: &str = r#"
import sys, time
mb = int(sys.argv[1])
chunks = []
for _ in range(mb // 10):
    b = bytearray(10_000_000)
    for i in range(0, len(b), 4096):
        b[i] = 1
    chunks.append(b)
    time.sleep(0.05)
print("full", flush=True)
sys.stdin.read()
print("done", flush=True)
"#;

/// Kills the server however the test ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 exchange with `Connection: close`; the response body.
fn http(addr: &str, method: &str, path: &str, body: &str) -> String {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{body}");
    body.to_string()
}

/// The served model's greedy log-probabilities for a fixed prompt: a fingerprint of the output
/// (the synthetic model has no tokenizer, so there is no text to compare).
fn completion(addr: &str, model: &str) -> Vec<f64> {
    let body = format!(
        r#"{{"model":"{model}","prompt":[1,2,3,4],"max_tokens":48,"temperature":0,"logprobs":0}}"#
    );
    let v = json(&http(addr, "POST", "/v1/completions", &body));
    let lp = v["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect::<Vec<_>>();
    assert_eq!(lp.len(), 48, "{v}");
    lp
}

#[test]
fn a_memory_hog_makes_the_cache_shrink_and_the_output_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("small");
    let m = model.to_str().unwrap();
    // 0.9 GB of experts, 1.5 times the budget.
    let (ok, _, err) = nectar(&["synth", "--preset", "small", "--layers", "16", "--out", m]);
    assert!(ok, "{err}");
    let limit = 800 * MB;
    let Some(cg) = Cgroup::or_skip(limit) else {
        return;
    };
    let serve = [
        "serve",
        "--model",
        m,
        "--port",
        "0",
        "--memory-budget",
        "600M",
        "--parallel",
        "1",
        "--mtp",
        "off",
    ];
    let mut child = cg.spawn(env!("CARGO_BIN_EXE_nectar"), &serve, Stdio::null());
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    let pid = server.0.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut log = Vec::new();
    let mut addr = None;
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the server neither became ready nor exited");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            addr = rest.split_whitespace().next().map(str::to_owned);
        }
        let ready = line.contains(" ready");
        log.push(line);
        if ready {
            break;
        }
    }
    let addr = addr.expect("the server printed its address");
    let models = json(&http(&addr, "GET", "/v1/models", ""));
    let id = models["data"][0]["id"].as_str().unwrap().to_string();
    // Fill the cache, then fingerprint the output.
    let reference = completion(&addr, &id);
    let before = rss(pid).unwrap();
    assert!(
        before > 250 * MB,
        "the expert cache is resident: {before} B"
    );
    // The hog leaves the server 100 MB less than it holds now.
    let hog_mb = (limit - before) / MB + 100;

    // The hog fills the cgroup while the server is idle: the guard's idle check must act.
    let mut hog = cg.spawn("python3", &["-c", HOG, &hog_mb.to_string()], Stdio::piped());
    let mut hog_out = BufReader::new(hog.stdout.take().unwrap());
    let mut line = String::new();
    hog_out.read_line(&mut line).unwrap();
    if line.trim() != "full" {
        std::thread::sleep(Duration::from_millis(500));
        let log: Vec<String> = log.into_iter().chain(rx.try_iter()).collect();
        panic!(
            "the hog did not get its memory (server RSS {before} B, now {:?})\n{}",
            rss(pid),
            log.join("\n")
        );
    }
    let after = rss(pid).expect("the server survived the hog");
    // Serving goes on beside the hog, with the same output.
    let during = completion(&addr, &id);
    let stats = json(&http(&addr, "GET", "/stats", ""));
    drop(hog.stdin.take());
    let hog_status = hog.wait().unwrap();
    drop(server);
    log.extend(rx.try_iter());
    let log = log.join("\n");
    eprintln!("server anonymous RSS {before} -> {after} B beside a {hog_mb} MB hog\n{log}");
    assert!(hog_status.success(), "the hog was killed: {hog_status:?}");
    assert!(
        after + hog_mb * MB <= limit,
        "server RSS {before} -> {after} B does not leave the hog's {hog_mb} MB in {limit} B"
    );
    assert_eq!(
        during, reference,
        "shrinking the cache must not change the output"
    );
    let res = &stats["residency"];
    assert!(res["rss_shrinks"].as_u64().unwrap_or(0) >= 1, "{stats}");
    // Slots that held experts (tens of them: a slot never written is released uncounted).
    assert!(
        res["released_bytes"].as_u64().unwrap_or(0) > 20 * MB,
        "{stats}"
    );
    assert!(log.contains("memory pressure"), "{log}");
}

/// A budget above the cgroup's limit is planned down to what the cgroup can give: without that,
/// the slab (allocated and touched at load) would bring the OOM killer before the first token.
#[test]
fn a_budget_above_the_cgroup_limit_is_planned_down() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("small");
    let m = model.to_str().unwrap();
    let (ok, _, err) = nectar(&["synth", "--preset", "small", "--layers", "8", "--out", m]);
    assert!(ok, "{err}");
    let Some(cg) = Cgroup::or_skip(300 * MB) else {
        return;
    };
    let args = [
        "run",
        "--model",
        m,
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "8",
        "--memory-budget",
        "2G",
        "--no-usage-save",
        "--json",
    ];
    let out = cg
        .spawn(env!("CARGO_BIN_EXE_nectar"), &args, Stdio::null())
        .wait_with_output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stderr}", out.status);
    assert!(stderr.contains("planning for"), "{stderr}");
    let v = json(&String::from_utf8_lossy(&out.stdout));
    let planned = v["stats"]["residency"]["memory_budget"].as_u64().unwrap();
    assert!(
        planned < 300 * MB,
        "planned for {planned} B inside a 300 MB cgroup"
    );
}

/// `fit`'s minimum for the int4 demo at a context (bytes).
fn fit_minimum(model: &str, ctx: &str) -> u64 {
    let (ok, _, err) = nectar(&[
        "fit",
        "--model",
        model,
        "--ctx-size",
        ctx,
        "--memory-budget",
        "1M",
    ]);
    assert!(!ok, "1 MiB holds nothing");
    err.split(" bytes)")
        .next()
        .and_then(|x| x.rsplit('(').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no minimum in: {err}"))
}

/// The runtime reserve is what the process really holds: the int4 demo decodes text (its
/// tokenizer loaded) inside a memory cgroup of Colibri's 40 MB, and at `fit`'s own minimum
/// inside a cgroup of that minimum plus the guard's 1/32 reserve, with the tokens of an
/// unlimited run and without the guard shrinking anything.
#[test]
fn the_int4_demo_decodes_inside_a_40_mb_cgroup_and_at_fits_minimum() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::int4_demo(dir.path()).to_str().unwrap().to_string();
    let ctx = "64";
    let args = |budget: &str| {
        vec![
            "run".to_string(),
            "--model".into(),
            model.clone(),
            "And God said,".into(),
            "--ctx-size".into(),
            ctx.into(),
            "--max-tokens".into(),
            "48".into(),
            "--no-usage-save".into(),
            "--json".into(),
            "--memory-budget".into(),
            budget.into(),
        ]
    };
    let (ok, out, err) = nectar(&args("1G").iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{err}");
    let reference = common::ids(&json(&out)["tokens"]);
    let need = fit_minimum(&model, ctx);
    for (limit, budget) in [
        (40 * MB, (40 * MB).to_string()),
        (need + need.div_ceil(31) + 4096, need.to_string()),
    ] {
        let Some(cg) = Cgroup::or_skip(limit) else {
            return;
        };
        let a = args(&budget);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let out = cg
            .spawn(env!("CARGO_BIN_EXE_nectar"), &a, Stdio::null())
            .wait_with_output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "budget {budget} in a {limit} B cgroup (fit's minimum {need}): {:?}\n{stderr}",
            out.status
        );
        let v = json(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(common::ids(&v["tokens"]), reference, "{stderr}");
        let res = &v["stats"]["residency"];
        assert!(res["lru_per_layer"].as_u64().unwrap() >= 1, "{v}");
        assert_eq!(res["rss_shrinks"], 0, "{stderr}");
        if budget == need.to_string() {
            assert_eq!(res["memory_budget"].as_u64(), Some(need), "{stderr}");
        }
    }
}
