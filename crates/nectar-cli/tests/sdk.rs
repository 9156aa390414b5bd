//! `nectar serve` driven by the official OpenAI and Anthropic Python SDKs (`tests/sdk/`).
//!
//! Starts the real binary on the demo model (an API key, 8 rows of continuous batching, two
//! model aliases, a free port), waits until the model is ready, and runs `tests/sdk/test_sdk.py` with the Python of
//! `.venv-sdk` — which `scripts/test` (the README's test command) creates with the pinned SDK
//! versions of `tests/sdk/requirements.txt`. `NECTAR_SDK_PYTHON` names another interpreter.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

mod common;
use common::root;

const KEY: &str = "sdk-test-key";

/// Kills the server however the test ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn python() -> PathBuf {
    let p = std::env::var_os("NECTAR_SDK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv-sdk/bin/python"));
    assert!(
        p.exists(),
        "{} does not exist: run the tests with `scripts/test`, which installs the pinned \
         openai/anthropic SDKs into .venv-sdk (or set NECTAR_SDK_PYTHON)",
        p.display()
    );
    p
}

/// Starts the server; returns it and its base URL once the model is ready.
fn start() -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nectar"))
        .args(["serve", "--port", "0", "--api-key", KEY, "--parallel", "8"])
        .args(["--alias", "nectar-alias", "--alias", "gpt-4o-mini"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nectar serve starts");
    let stderr = child.stderr.take().expect("piped stderr");
    let server = Server(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            // Keep draining so the server never blocks on a full pipe.
            let _ = tx.send(line);
        }
    });
    let mut base = None;
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(180))
            .expect("the server neither became ready nor exited");
        if let Some(rest) = line.split("listening on ").nth(1) {
            base = rest.split_whitespace().next().map(str::to_owned);
        }
        if line.contains(" ready") {
            break;
        }
        assert!(!line.contains("failed"), "server: {line}");
    }
    (server, base.expect("the server printed its address"))
}

#[test]
fn official_sdks_against_the_real_server() {
    let python = python();
    let (_server, base) = start();
    let out = Command::new(python)
        .arg(root().join("tests/sdk/test_sdk.py"))
        .env("NECTAR_BASE_URL", &base)
        .env("NECTAR_API_KEY", KEY)
        .output()
        .expect("python runs");
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "SDK tests failed:\n{report}");
    // unittest reports "OK" (and nothing skipped silently: the suite has no skips).
    assert!(report.contains("\nOK"), "{report}");
}
