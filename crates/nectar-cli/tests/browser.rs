//! The observability page in a real headless Chromium against a real `nectar serve` on the demo
//! model (an API key, an Atlas file), driven over the Chrome DevTools protocol.
//!
//! The page is loaded, asks for the key (typed into its form, as a user would), connects; a chat
//! request is sent; then the page's grid must show this turn's hits on exactly the layers the
//! server's `/experts/map` HITS plane has lit, its timelines must have gained points, and the
//! Atlas view must list every expert of the file with labels. A screenshot is saved to
//! `target/browser-test/page.png`.
//!
//! Chromium: `NECTAR_CHROMIUM`, else `chromium`, `chromium-browser` or `google-chrome` on PATH
//! (CI installs Debian's `chromium`). Without one the test fails, unless
//! `NECTAR_SKIP_BROWSER_TEST=1` is set (for machines without a browser; CI never sets it).

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tungstenite::{Message, WebSocket};

mod common;
use common::server::Server;

const KEY: &str = "browser-test-key";

fn find_chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NECTAR_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

/// Kills the browser however the test ends.
struct Browser {
    child: Child,
    /// The fresh profile, removed after the browser exits.
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts headless Chromium with a fresh profile; returns it and its DevTools port.
fn launch(chromium: &PathBuf) -> (Browser, u16) {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            // Containers often have a small /dev/shm; Chromium then falls back to /tmp.
            "--disable-dev-shm-usage",
            "--remote-debugging-port=0",
            "--remote-allow-origins=*",
            "--window-size=1280,1400",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("about:blank")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium starts");
    let stderr = child.stderr.take().unwrap();
    let browser = Browser {
        child,
        _profile: profile,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("chromium printed no DevTools address");
        if let Some(rest) = line.split("DevTools listening on ws://127.0.0.1:").nth(1) {
            let port = rest.split('/').next().unwrap().parse().unwrap();
            // Keep draining stderr so the browser never blocks on a full pipe.
            std::thread::spawn(move || for _ in rx {});
            return (browser, port);
        }
    }
}

/// A DevTools session on one page.
struct Page {
    ws: WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
    next: u64,
}

impl Page {
    fn attach(port: u16) -> Page {
        let list = http_get(port, "/json/list");
        let targets: Value = serde_json::from_str(&list).unwrap();
        let url = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .expect("a page target")
            .to_owned();
        let (ws, _) = tungstenite::connect(url).expect("DevTools WebSocket");
        Page { ws, next: 1 }
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        self.ws.send(Message::text(msg)).unwrap();
        loop {
            let m = self.ws.read().expect("DevTools message");
            let Message::Text(t) = m else { continue };
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Evaluates `expr` in the page; its value (JSON).
    fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(r.get("exceptionDetails").is_none(), "{expr}: {r}");
        r["result"]["value"].clone()
    }

    /// Polls `expr` until it is true (or fails after `secs`).
    fn wait_for(&mut self, expr: &str, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while self.eval(expr) != json!(true) {
            assert!(Instant::now() < deadline, "timed out waiting for `{expr}`");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    // DevTools answers with a Content-Length and may keep the connection open.
    let mut r = BufReader::new(s);
    let mut len = 0;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end().to_ascii_lowercase();
        if l.is_empty() {
            break;
        }
        if let Some(v) = l.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    String::from_utf8(body).unwrap()
}

/// An Atlas in `experts.json` form for the demo geometry (layers 1–7, 32 experts).
fn atlas() -> Value {
    let cats = ["code", "math", "law", "poetry"];
    let experts: Vec<Value> = (1..=7)
        .flat_map(|l| (0..32).map(move |e| (l, e)))
        .map(|(l, e)| {
            let spec = ((l * 7 + e * 3) % 10) as f64 / 10.0;
            json!({"layer": l, "expert": e, "total": 100 + e, "spec": spec,
                   "top_topic": cats[(l + e) % 4], "top_lift": 1.0 + 3.0 * spec,
                   "reliability": "3/4", "p": [0.25, 0.25, 0.25, 0.25]})
        })
        .collect();
    json!({"categories": cats, "experts": experts})
}

/// The layers whose row has a HITS bit set in an `/experts/map` frame.
fn hit_layers(frame: &[u8]) -> Vec<u64> {
    assert_eq!(&frame[..4], b"NXM1");
    let rows = u16::from_le_bytes([frame[4], frame[5]]) as usize;
    let cols = u16::from_le_bytes([frame[6], frame[7]]) as usize;
    let layers: Vec<u64> = (0..rows)
        .map(|r| u16::from_le_bytes([frame[24 + 2 * r], frame[25 + 2 * r]]) as u64)
        .collect();
    let hits = &frame[24 + 2 * rows + rows * cols..];
    (0..rows)
        .filter(|r| {
            (0..cols).any(|e| {
                let i = r * cols + e;
                hits[i >> 3] & (1 << (i & 7)) != 0
            })
        })
        .map(|r| layers[r])
        .collect()
}

#[test]
fn the_page_shows_a_chats_experts_timelines_and_the_atlas() {
    let Some(chromium) = find_chromium() else {
        if std::env::var("NECTAR_SKIP_BROWSER_TEST").as_deref() == Ok("1") {
            eprintln!("SKIPPED: no chromium found and NECTAR_SKIP_BROWSER_TEST=1");
            return;
        }
        panic!(
            "no chromium: install it (Debian: apt-get install -y chromium; .ci/run does) or set \
             NECTAR_CHROMIUM=PATH; NECTAR_SKIP_BROWSER_TEST=1 skips this test on a machine \
             without a browser"
        );
    };
    let dir = tempfile::tempdir().unwrap();
    let atlas_file = dir.path().join("experts.json");
    let atlas = atlas();
    std::fs::write(&atlas_file, atlas.to_string()).unwrap();
    let server = Server::start(&[
        "--api-key",
        KEY,
        "--parallel",
        "1",
        "--mtp",
        "off",
        "--atlas",
        atlas_file.to_str().unwrap(),
    ]);
    let (_browser, port) = launch(&chromium);
    let mut page = Page::attach(port);
    page.call("Page.enable", json!({}));
    page.call(
        "Page.navigate",
        json!({"url": format!("http://{}/", server.addr)}),
    );

    // The page asks for the key once; a user types it.
    page.wait_for(
        "!!document.getElementById('key-form') && !document.getElementById('key-form').hidden",
        30,
    );
    page.eval(&format!(
        "document.getElementById('key').value = '{KEY}'; \
         document.getElementById('key-form').requestSubmit(); true"
    ));
    page.wait_for("document.getElementById('conn').textContent === 'live'", 30);
    page.wait_for("document.getElementById('grid').dataset.seq !== '-1'", 30);
    assert_eq!(page.eval("localStorage.getItem('nectar-key')"), json!(KEY));
    let points_before = page
        .eval("window.nectar.timelinePoints()")
        .as_u64()
        .unwrap();

    // A chat request.
    let body = json!({"model": "nectar-demo-glm5", "max_tokens": 12,
        "messages": [{"role": "user", "content": "Tell me about bees."}]});
    let (status, reply) = server.http(
        "POST",
        "/v1/chat/completions",
        Some(KEY),
        Some(&body.to_string()),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
    let (status, frame) = server.http("GET", "/experts/map", Some(KEY), None);
    assert_eq!(status, 200);
    let expected = hit_layers(&frame);
    // MTP is off: every MoE layer of the main model routed this turn, the MTP row did not.
    assert_eq!(expected, (1..=7).collect::<Vec<u64>>());
    let want = expected
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    page.wait_for(
        &format!("document.getElementById('grid').dataset.hitRows === '{want}'"),
        30,
    );
    // The timelines gained points (a sample per second in which tokens were generated).
    page.wait_for(
        &format!("window.nectar.timelinePoints() > {points_before}"),
        30,
    );
    page.wait_for(
        "document.getElementById('v-decode_tok_s').textContent !== '–'",
        10,
    );

    // The Atlas view lists every expert of the file, with labels and confidence.
    let n = atlas["experts"].as_array().unwrap().len();
    page.wait_for(
        &format!("document.getElementById('atlas').dataset.experts === '{n}'"),
        30,
    );
    let table = page.eval("document.getElementById('atlas-table').innerText");
    let table = table.as_str().unwrap();
    assert!(table.contains("specialist: "), "{table}");
    assert!(
        table.contains("0.90"),
        "the most specialised experts first: {table}"
    );

    let shot = page.call("Page.captureScreenshot", json!({"format": "png"}));
    use base64::Engine;
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().unwrap())
        .unwrap();
    let out = common::root().join("target/browser-test");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("page.png"), &png).unwrap();
    assert!(png.starts_with(b"\x89PNG"));
}
