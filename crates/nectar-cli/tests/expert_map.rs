//! The expert map of a real `nectar serve` streaming the demo model's experts under a budget:
//! `/experts/map` (binary frame and Colibri's EMAP lines), `/experts/events`, and the per-tier
//! expert counters of `/metrics`, after one chat request.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::Duration;

mod common;
use common::server::Server;

struct Frame {
    layers: Vec<u64>,
    cols: usize,
    seq: u64,
    turn: u64,
    cells: Vec<u8>,
    hits: Vec<u8>,
}

fn parse(f: &[u8]) -> Frame {
    assert_eq!(&f[..4], b"NXM1");
    let rows = u16::from_le_bytes([f[4], f[5]]) as usize;
    let cols = u16::from_le_bytes([f[6], f[7]]) as usize;
    let at = 24 + 2 * rows;
    assert_eq!(f.len(), at + rows * cols + (rows * cols).div_ceil(8));
    Frame {
        layers: (0..rows)
            .map(|r| u16::from_le_bytes([f[24 + 2 * r], f[25 + 2 * r]]) as u64)
            .collect(),
        cols,
        seq: u64::from_le_bytes(f[8..16].try_into().unwrap()),
        turn: u64::from_le_bytes(f[16..24].try_into().unwrap()),
        cells: f[at..at + rows * cols].to_vec(),
        hits: f[at + rows * cols..].to_vec(),
    }
}

fn hit(h: &[u8], i: usize) -> bool {
    h[i >> 3] & (1 << (i & 7)) != 0
}

/// Reads `/experts/events` on a thread: (event name, data) pairs.
fn events(addr: &str) -> mpsc::Receiver<(String, Value)> {
    let mut s = TcpStream::connect(addr).unwrap();
    // HTTP/1.0: the body comes unchunked until the server closes.
    write!(s, "GET /experts/events HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut name = String::new();
        for line in BufReader::new(s).lines().map_while(Result::ok) {
            if let Some(n) = line.strip_prefix("event: ") {
                name = n.to_owned();
            } else if let Some(d) = line.strip_prefix("data: ") {
                let v: Value = serde_json::from_str(d).unwrap();
                if tx.send((name.clone(), v)).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

#[test]
fn a_streamed_servers_map_events_and_metrics_agree() {
    // 264 MiB buys about 9 LRU slots per layer of the demo model's 32 experts: some stay on disk.
    let s = Server::start(&["--memory-budget", "264M", "--parallel", "1", "--mtp", "off"]);
    let rx = events(&s.addr);
    let (name, hello) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(name, "hello");
    // `--mtp off` does not load the MTP layer (layer 8): the map has the 7 main MoE layers.
    assert_eq!(hello["layers"], json!([1, 2, 3, 4, 5, 6, 7]));
    assert_eq!(
        (hello["cols"].clone(), hello["streamed"].clone()),
        (json!(32), json!(true))
    );
    let tiers: Vec<String> = serde_json::from_value(hello["tiers"].clone()).unwrap();
    assert_eq!(tiers[0], "disk");

    let body = json!({"model": "nectar-demo-glm5", "max_tokens": 6,
        "messages": [{"role": "user", "content": "What do bees make?"}]});
    let (st, _) = s.http(
        "POST",
        "/v1/chat/completions",
        None,
        Some(&body.to_string()),
    );
    assert_eq!(st, 200);
    let (st, raw) = s.http("GET", "/experts/map", None, None);
    assert_eq!(st, 200);
    let f = parse(&raw);
    assert_eq!(f.layers, vec![1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(f.turn, 1);

    // The events of the turn: its start, then per-step hits whose union is the HITS plane.
    let mut lit = std::collections::BTreeSet::new();
    let mut turn_seen = false;
    while lit.len() < (0..f.cells.len()).filter(|&i| hit(&f.hits, i)).count() {
        let (name, data) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("hits events");
        match name.as_str() {
            "turn" => turn_seen = data["turn"] == 1,
            "hits" => lit.extend(
                data["cells"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c.as_u64().unwrap() as usize),
            ),
            _ => {}
        }
    }
    assert!(turn_seen, "a turn event came before the hits");
    let plane: std::collections::BTreeSet<usize> =
        (0..f.cells.len()).filter(|&i| hit(&f.hits, i)).collect();
    assert_eq!(lit, plane);

    // Tiers at rest: every hit expert was selected (heat > 0); experts are in the LRU or on disk
    // (no read in flight, no working slot between requests).
    let tier = |i: usize| tiers[(f.cells[i] >> 5) as usize].as_str();
    let heat = |i: usize| f.cells[i] & 31;
    assert!(plane.iter().all(|&i| heat(i) > 0));
    assert!(
        (0..f.cells.len()).all(|i| heat(i) == 0 || plane.contains(&i)),
        "only this turn ran"
    );
    let count = |t: &str| (0..f.cells.len()).filter(|&i| tier(i) == t).count();
    assert!(
        count("lru") > 0 && count("disk") > 0,
        "lru {} disk {}",
        count("lru"),
        count("disk")
    );
    assert_eq!(
        count("lru") + count("disk") + count("pinned"),
        f.cells.len()
    );
    let rows_hit: Vec<u64> = (0..7)
        .filter(|r| (0..f.cols).any(|e| hit(&f.hits, r * f.cols + e)))
        .map(|r| f.layers[r])
        .collect();
    assert_eq!(rows_hit, vec![1, 2, 3, 4, 5, 6, 7]);

    // An unchanged map answers 304; Colibri's EMAP lines carry the same cells.
    let (st, body) = s.http("GET", &format!("/experts/map?since={}", f.seq), None, None);
    assert_eq!((st, body.len()), (304, 0));
    let (st, text) = s.http("GET", "/experts/map?format=emap", None, None);
    assert_eq!(st, 200);
    let text = String::from_utf8(text).unwrap();
    let mut lines = text.lines();
    let emap: Vec<&str> = lines.next().unwrap().split(' ').collect();
    assert_eq!(&emap[..3], &["EMAP", "7", "32"]);
    for i in 0..f.cells.len() {
        let b = u8::from_str_radix(&emap[3][2 * i..2 * i + 2], 16).unwrap();
        let ram = matches!(tier(i), "lru" | "pinned" | "working" | "mapped");
        assert_eq!(b, (u8::from(ram) << 6) | heat(i), "cell {i}");
    }
    let hits_hex: String = f.hits.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(lines.next().unwrap(), format!("HITS 7 32 {hits_hex}"));

    // /metrics counts the same expert requests, per tier.
    let (_, metrics) = s.http("GET", "/metrics", None, None);
    let metrics = String::from_utf8(metrics).unwrap();
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.trim().parse().ok()))
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    let requests = value("nectar_expert_hits_total{tier=\"main\"}")
        + value("nectar_expert_misses_total{tier=\"main\"}");
    assert!(
        requests >= plane.len() as f64,
        "{requests} expert requests for {} experts",
        plane.len()
    );
    assert!(value("nectar_expert_read_bytes_total{tier=\"main\"}") > 0.0);
    assert!(value("nectar_memory_budget_bytes") > 0.0);
}
