//! File faults driven through real processes: a model shard truncated while `nectar run` or
//! `nectar serve` runs (with and without a memory budget) must give a clean error naming the
//! file and offset — never SIGBUS — and the server must keep serving and recover once the file
//! is back. Each test works on its own copy of the demo model.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::root;

/// The demo model's stop ids, banned so that generation runs until the truncation hits.
const NO_EOS: [&str; 6] = [
    "--logit-bias",
    "8160=-100",
    "--logit-bias",
    "8167=-100",
    "--logit-bias",
    "8169=-100",
];

/// A private copy of the demo model (its shard gets truncated).
fn model_copy() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(root().join("models/nectar-demo-glm5")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, d.path().join(p.file_name().unwrap())).unwrap();
    }
    let shard = d.path().join("model.safetensors");
    (d, shard)
}

fn truncate(p: &Path, len: u64) {
    std::fs::File::options()
        .write(true)
        .open(p)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn restore(p: &Path) {
    // Rewrites the same file (same inode), as `cp` over it would.
    let orig = std::fs::read(root().join("models/nectar-demo-glm5/model.safetensors")).unwrap();
    std::fs::File::options()
        .write(true)
        .open(p)
        .unwrap()
        .write_all(&orig)
        .unwrap();
}

/// Starts `nectar run` on the copy, truncates the shard once output flows, and checks the exit.
fn run_truncated(extra: &[&str]) {
    let (dir, shard) = model_copy();
    let mut args = vec!["run", "--model", dir.path().to_str().unwrap()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&NO_EOS);
    args.extend_from_slice(&["--max-tokens", "4000", "And God said,"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_nectar"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    out.read_exact(&mut first).expect("generation starts");
    truncate(&shard, 1 << 20);
    let mut rest = Vec::new();
    let _ = out.read_to_end(&mut rest);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(1),
        "a clean error exit, not a signal ({status:?}); stderr: {err}"
    );
    assert!(
        err.contains("model.safetensors") && err.contains("offset"),
        "names the file and offset: {err}"
    );
}

#[test]
fn run_reports_a_shard_truncated_while_mapped() {
    run_truncated(&[]);
}

#[test]
fn run_reports_a_shard_truncated_under_a_budget() {
    run_truncated(&["--memory-budget", "210M"]);
}

/// Kills the server however the test ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `nectar serve ARGS` and returns it, its `host:port` and its stderr lines once ready.
fn serve(args: &[&str]) -> (Server, String, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nectar"))
        .args(["serve", "--port", "0", "--parallel", "2"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut addr = None;
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the server neither became ready nor exited");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            addr = rest.split_whitespace().next().map(str::to_owned);
        }
        if line.contains(" ready") {
            break;
        }
        assert!(!line.contains("failed"), "server: {line}");
    }
    (server, addr.unwrap(), rx)
}

/// One HTTP/1.1 request with `Connection: close`: (status, body).
pub fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {resp:?}"));
    let body = resp.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

const COMPLETION: &str = r#"{"prompt":"And God said,","max_tokens":48,"temperature":0,
    "logit_bias":{"8160":-100,"8167":-100,"8169":-100}}"#;

fn serve_truncated(extra: &[&str]) {
    let (dir, shard) = model_copy();
    let mut args = vec!["--model", dir.path().to_str().unwrap()];
    args.extend_from_slice(extra);
    let (mut server, addr, _log) = serve(&args);
    let (status, before) = http(&addr, "POST", "/v1/completions", COMPLETION);
    assert_eq!(status, 200, "{before}");

    truncate(&shard, 1 << 20);
    let (status, body) = http(&addr, "POST", "/v1/completions", COMPLETION);
    assert_eq!(status, 500, "{body}");
    assert!(
        body.contains("model file could not be read"),
        "a shaped error saying what failed: {body}"
    );
    assert!(
        !body.contains("/tmp") && !body.contains(dir.path().to_str().unwrap()),
        "paths stay in the log: {body}"
    );
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "the server is still running"
    );
    let (status, _) = http(&addr, "GET", "/v1/models", "");
    assert_eq!(status, 200, "other routes keep working");

    restore(&shard);
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let (status, body) = http(&addr, "POST", "/v1/completions", COMPLETION);
        if status == 200 || Instant::now() > deadline {
            assert_eq!(status, 200, "recovers once the file is back: {body}");
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = |b: &str| -> String {
        let v: serde_json::Value = serde_json::from_str(b).unwrap();
        v["choices"][0]["text"].as_str().unwrap().to_owned()
    };
    assert_eq!(
        text(&after),
        text(&before),
        "the same greedy output as before"
    );
}

#[test]
fn serve_survives_a_shard_truncated_while_mapped() {
    serve_truncated(&[]);
}

#[test]
fn serve_survives_a_shard_truncated_under_a_budget() {
    serve_truncated(&["--memory-budget", "310M"]);
}

/// Reads until the server closes the connection (or 20 s pass): what it sent.
fn read_until_closed(s: &mut TcpStream) -> std::io::Result<String> {
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let mut got = Vec::new();
    s.read_to_end(&mut got)?;
    Ok(String::from_utf8_lossy(&got).into_owned())
}

#[test]
fn half_sent_requests_are_cut_off_and_trailing_json_is_refused() {
    let (mut server, addr, _log) = serve(&["--header-timeout", "1", "--body-timeout", "1"]);

    // Half a head: the connection is closed (without the deadline it stays open forever).
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    read_until_closed(&mut s).expect("the server closes a connection whose head never ends");

    // A head, then half the body: 408 in the route's error shape.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"model\":",
    )
    .unwrap();
    let resp = read_until_closed(&mut s).expect("the server answers a body that never ends");
    assert!(resp.starts_with("HTTP/1.1 408"), "{resp}");
    assert!(
        resp.contains("\"type\":\"error\""),
        "Anthropic shape: {resp}"
    );

    // Two JSON values in one body.
    let (status, body) = http(
        &addr,
        "POST",
        "/v1/completions",
        r#"{"prompt":"a","max_tokens":1}{"prompt":"b"}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("trailing"), "{body}");
    // A complete request still works, and the server is alive.
    let (status, body) = http(
        &addr,
        "POST",
        "/v1/completions",
        r#"{"prompt":"a","max_tokens":1} "#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(server.0.try_wait().unwrap().is_none());
}

/// Runs `nectar ARGS`, killing it after 60 s (a hang is a failure): (exit code, stdout, stderr).
fn run_bounded(args: &[&str]) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nectar"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("nectar {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[cfg(unix)]
#[test]
fn a_fifo_session_is_refused_without_hanging() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("s.nectar");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (code, out, err) = run_bounded(&["run", "--session", fifo.to_str().unwrap(), "Hi"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("FIFO") && err.contains("s.nectar"), "{err}");
    assert!(
        out.trim() == "Hi" || out.is_empty(),
        "nothing generated: {out}"
    );
}

#[test]
fn an_unwritable_session_directory_is_found_before_generating() {
    let d = tempfile::tempdir().unwrap();
    // A directory that does not exist, and a "directory" that is a file.
    let file = d.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    for path in [d.path().join("missing/s.nectar"), file.join("s.coli_kv")] {
        let (code, out, err) = run_bounded(&["run", "--session", path.to_str().unwrap(), "Hi"]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("cannot write in its directory"), "{err}");
        // At most the prompt's echo: nothing generated.
        assert!(
            out.trim() == "Hi" || out.is_empty(),
            "refused before generating: {out}"
        );
    }
}

#[test]
fn temp_files_of_interrupted_saves_are_removed() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("s.nectar");
    // Left by a writer that died (no process has this id: above Linux's pid_max), and one of a
    // live writer (this test process), which must stay.
    let stale = d.path().join(".s.nectar.4194999.0.tmp");
    let live = d
        .path()
        .join(format!(".s.nectar.{}.0.tmp", std::process::id()));
    std::fs::write(&stale, b"partial").unwrap();
    std::fs::write(&live, b"partial").unwrap();
    let (code, _, err) = run_bounded(&["run", "--session", s.to_str().unwrap(), "Hi"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(s.is_file());
    assert!(!stale.exists(), "the stale temp file is removed");
    assert!(live.exists(), "a live writer's temp file stays");
}
