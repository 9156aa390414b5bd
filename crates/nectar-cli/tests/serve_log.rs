//! `nectar serve`'s request log: one line per request at info, successful or not, with id,
//! route, model, prompt and generated tokens, TTFT, total time, finish reason and status;
//! `--log-format json` writes one JSON object per line; a log that is not a terminal (here: a
//! pipe) carries no ANSI colour codes.

use serde_json::{json, Value};
use std::time::{Duration, Instant};

mod common;
use common::server::Server;

/// Waits until `n` request lines are in the log; returns every line.
fn request_lines(s: &Server, n: usize, is_request: impl Fn(&str) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let lines = s.log.lock().unwrap().clone();
        if lines.iter().filter(|l| is_request(l)).count() >= n {
            return lines;
        }
        assert!(Instant::now() < deadline, "log so far: {lines:#?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn chat(stream: bool) -> String {
    json!({"model": "nectar-demo-glm5", "max_tokens": 5, "stream": stream,
           "messages": [{"role": "user", "content": "Hello"}]})
    .to_string()
}

#[test]
fn json_log_has_one_line_per_request_with_its_fields() {
    let s = Server::start(&["--log-format", "json", "--parallel", "1", "--mtp", "off"]);
    let (st, body) = s.http("POST", "/v1/chat/completions", None, Some(&chat(false)));
    assert_eq!(st, 200);
    let reply: Value = serde_json::from_slice(&body).unwrap();
    let (st, _) = s.http("POST", "/v1/chat/completions", None, Some(&chat(true)));
    assert_eq!(st, 200);
    let (st, _) = s.http("POST", "/v1/chat/completions", None, Some("{not json"));
    assert_eq!(st, 400);
    let lines = request_lines(&s, 3, |l| l.contains("\"nectar_server::request\""));
    assert!(
        lines.iter().all(|l| !l.contains('\x1b')),
        "ANSI codes in a piped log"
    );
    let requests: Vec<Value> = lines
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .filter(|v| v["target"] == "nectar_server::request")
        .collect();
    assert_eq!(requests.len(), 3, "{requests:#?}");
    for r in &requests {
        assert_eq!(r["level"], "INFO");
        let f = &r["fields"];
        for k in [
            "id",
            "method",
            "route",
            "model",
            "status",
            "prompt_tokens",
            "generated_tokens",
            "total_ms",
            "finish",
        ] {
            assert!(f.get(k).is_some(), "no `{k}` in {r}");
        }
        assert_eq!(f["route"], "/v1/chat/completions");
    }
    let plain = &requests[0]["fields"];
    assert_eq!(plain["status"], 200);
    assert_eq!(plain["model"], "nectar-demo-glm5");
    assert_eq!(plain["prompt_tokens"], reply["usage"]["prompt_tokens"]);
    assert_eq!(
        plain["generated_tokens"],
        reply["usage"]["completion_tokens"]
    );
    assert_eq!(plain["finish"], "length");
    assert!(plain["ttft_ms"].as_f64().unwrap() <= plain["total_ms"].as_f64().unwrap());
    // The stream is logged when its body ends, with its own tokens.
    let streamed = &requests[1]["fields"];
    assert_eq!(
        (streamed["status"].clone(), streamed["finish"].clone()),
        (json!(200), json!("length"))
    );
    assert_eq!(streamed["generated_tokens"], 5);
    // A failing request is logged too, with its status.
    let bad = &requests[2]["fields"];
    assert_eq!(bad["status"], 400);
    assert_eq!(bad["generated_tokens"], 0);
    let ids: Vec<u64> = requests
        .iter()
        .map(|r| r["fields"]["id"].as_u64().unwrap())
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] != w[1]),
        "distinct ids: {ids:?}"
    );
}

#[test]
fn text_log_without_a_terminal_has_no_colour() {
    let s = Server::start(&["--parallel", "1", "--mtp", "off"]);
    let (st, _) = s.http("POST", "/v1/chat/completions", None, Some(&chat(false)));
    assert_eq!(st, 200);
    let lines = request_lines(&s, 1, |l| l.contains("nectar_server::request"));
    let line = lines
        .iter()
        .find(|l| l.contains("nectar_server::request"))
        .unwrap();
    assert!(
        line.contains(" INFO ") && line.contains("status=200"),
        "{line}"
    );
    assert!(line.contains("route=/v1/chat/completions"), "{line}");
    assert!(
        lines.iter().all(|l| !l.contains('\x1b')),
        "ANSI codes: {lines:#?}"
    );
}

#[test]
fn a_client_that_leaves_early_is_logged_as_499() {
    use std::io::Write;
    let s = Server::start(&["--log-format", "json", "--parallel", "1", "--mtp", "off"]);
    let body = json!({"model": "nectar-demo-glm5", "max_tokens": 3000,
        "messages": [{"role": "user", "content": "Write a very long story."}]})
    .to_string();
    {
        let mut c = std::net::TcpStream::connect(&s.addr).unwrap();
        write!(
            c,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(300));
    } // the client goes away mid-generation
    let lines = request_lines(&s, 1, |l| l.contains("\"nectar_server::request\""));
    let line = lines
        .iter()
        .find(|l| l.contains("\"nectar_server::request\""))
        .unwrap();
    let v: Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["fields"]["status"], 499, "{line}");
    assert_eq!(v["fields"]["route"], "/v1/chat/completions");
}
