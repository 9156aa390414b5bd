//! `nectar serve --parallel 4 --mtp on`: concurrent greedy requests speculate inside one batch
//! and each answer equals the serial one (`nectar run --mtp off`); `/stats` shows drafts
//! accepted and more than one row per step in the same run. A seeded sampled request gives the
//! same text under every speculation setting, alone and beside other requests.
mod common;

use common::server::Server;
use common::{ids, json, nectar, root};

/// The demo model's reference prompts (token ids).
fn prompts() -> Vec<Vec<u64>> {
    let path = root().join("models/nectar-demo-glm5/reference.json");
    let v = json(&std::fs::read_to_string(path).unwrap());
    v["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| ids(&p["input_ids"]))
        .collect()
}

fn csv(p: &[u64]) -> String {
    p.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

const TOKENS: usize = 40;

#[test]
fn parallel_mtp_serves_the_serial_outputs_and_reports_drafts_and_rows() {
    let prompts = prompts();
    // Serial references: one request, no speculation.
    let serial: Vec<String> = prompts
        .iter()
        .map(|p| {
            let (ok, out, err) = nectar(&[
                "run",
                "--json",
                "--no-usage-save",
                "--mtp",
                "off",
                "--max-tokens",
                &TOKENS.to_string(),
                "--prompt-ids",
                &csv(p),
            ]);
            assert!(ok, "{err}");
            json(&out)["text"].as_str().unwrap().to_string()
        })
        .collect();
    let s = Server::start(&["--parallel", "4", "--mtp", "on"]);
    let texts: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let s = &s;
                scope.spawn(move || {
                    let body = serde_json::json!({
                        "model": "nectar-demo-glm5",
                        "prompt": p,
                        "max_tokens": TOKENS,
                        "temperature": 0,
                    })
                    .to_string();
                    let (st, out) = s.http("POST", "/v1/completions", None, Some(&body));
                    let v = json(&String::from_utf8_lossy(&out));
                    assert_eq!(st, 200, "{v}");
                    v["choices"][0]["text"].as_str().unwrap().to_string()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(texts, serial);
    let (st, body) = s.http("GET", "/stats", None, None);
    assert_eq!(st, 200);
    let stats = json(&String::from_utf8_lossy(&body));
    let mtp = &stats["mtp"];
    assert_eq!(mtp["mode"], "on", "{mtp}");
    assert!(mtp["accepted"].as_u64().unwrap() > 0, "{mtp}");
    assert!(mtp["speculating_rows"].as_u64().unwrap() > 0, "{mtp}");
    let mean_rows = stats["batch"]["mean_rows"].as_f64().unwrap();
    assert!(mean_rows > 1.0, "{}", stats["batch"]);
    assert!(
        mtp["mean_speculating_rows"].as_f64().unwrap() > 1.0,
        "rows never verified drafts together: {mtp}"
    );
    // The drafts widen the steps' expert union: more distinct experts per MoE layer than the
    // same steps' plain rows route to (the demo: top-4 of 32 per row and layer).
    let u = &mtp["expert_union"];
    assert!(u["verify_steps"].as_u64().unwrap() > 0, "{u}");
    let (all, plain) = (
        u["verify_experts_per_layer"].as_f64().unwrap(),
        u["verify_plain_experts_per_layer"].as_f64().unwrap(),
    );
    assert!(plain >= 4.0 && all > plain && all <= 32.0, "{u}");
    assert!(
        (u["growth"].as_f64().unwrap() - all / plain).abs() < 1e-9,
        "{u}"
    );
    // And /metrics has the sums they come from.
    let (st, body) = s.http("GET", "/metrics", None, None);
    assert_eq!(st, 200);
    let text = String::from_utf8_lossy(&body);
    let counter = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    let layers = counter("nectar_expert_union_verify_layers_total");
    assert!(layers > 0.0);
    let per_layer = counter("nectar_expert_union_verify_experts_total") / layers;
    assert!(per_layer > plain, "{per_layer} vs {plain}");
}

#[test]
fn parallel_auto_reports_its_decisions_per_step_shape() {
    let prompts = prompts();
    let s = Server::start(&["--parallel", "2", "--mtp", "auto"]);
    std::thread::scope(|scope| {
        for p in prompts.iter().take(2) {
            let s = &s;
            scope.spawn(move || {
                let body = serde_json::json!({
                    "model": "nectar-demo-glm5",
                    "prompt": p,
                    "max_tokens": 64,
                    "temperature": 0,
                })
                .to_string();
                let (st, _) = s.http("POST", "/v1/completions", None, Some(&body));
                assert_eq!(st, 200);
            });
        }
    });
    let (_, body) = s.http("GET", "/stats", None, None);
    let stats = json(&String::from_utf8_lossy(&body));
    // One controller for the batch: decisions per step shape (rows sharing the step).
    let auto = &stats["mtp"]["auto"];
    assert!(auto["decisions"].as_u64().unwrap() > 0, "{auto}");
    let choices = auto["choices"].as_array().unwrap();
    assert!(!choices.is_empty(), "{auto}");
    for c in choices {
        let (rows, autos) = (
            c["rows"].as_u64().unwrap(),
            c["auto_rows"].as_u64().unwrap(),
        );
        assert!(
            (1..=2).contains(&rows) && (1..=rows).contains(&autos),
            "{c}"
        );
        assert!(c["gamma"].as_u64().unwrap() <= 3, "{c}");
    }
    let (_, body) = s.http("GET", "/metrics", None, None);
    let text = String::from_utf8_lossy(&body);
    let decisions = text
        .lines()
        .find_map(|l| l.strip_prefix("nectar_mtp_auto_decisions_total "))
        .expect("nectar_mtp_auto_decisions_total");
    assert_eq!(
        decisions.parse::<u64>().unwrap(),
        auto["decisions"].as_u64().unwrap()
    );
}

#[test]
fn a_seeded_sampled_request_gives_the_same_text_whatever_the_servers_speculation() {
    // The reference: the request alone, without speculation.
    let prompts = prompts();
    let (ok, out, err) = nectar(&[
        "run",
        "--json",
        "--no-usage-save",
        "--mtp",
        "off",
        "--temperature",
        "0.8",
        "--top-p",
        "0.95",
        "--seed",
        "7",
        "--max-tokens",
        &TOKENS.to_string(),
        "--prompt-ids",
        &csv(&prompts[1]),
    ]);
    assert!(ok, "{err}");
    let want = json(&out)["text"].as_str().unwrap().to_string();
    let seeded = serde_json::json!({
        "model": "nectar-demo-glm5",
        "prompt": prompts[1],
        "max_tokens": TOKENS,
        "temperature": 0.8,
        "top_p": 0.95,
        "seed": 7,
    })
    .to_string();
    let mut drafted = 0;
    // `serve` offers MTP off, on (γ 1) and auto (γ 0–3 per step, from what it measured);
    // the other depths and prompt lookup are covered at the engine level (`batch_spec.rs`).
    for mtp in ["off", "on", "auto"] {
        let s = Server::start(&["--parallel", "4", "--mtp", mtp]);
        // Alone, then beside a greedy and an unseeded sampled request (and, under `auto`,
        // after the controller has learned from the first requests).
        let (st, out) = s.http("POST", "/v1/completions", None, Some(&seeded));
        assert_eq!(st, 200);
        let alone = json(&String::from_utf8_lossy(&out));
        assert_eq!(
            alone["choices"][0]["text"],
            want.as_str(),
            "--mtp {mtp}, alone"
        );
        let texts: Vec<String> = std::thread::scope(|scope| {
            let handles: Vec<_> = [
                seeded.clone(),
                serde_json::json!({"model": "nectar-demo-glm5", "prompt": prompts[3],
                                   "max_tokens": TOKENS, "temperature": 0})
                .to_string(),
                serde_json::json!({"model": "nectar-demo-glm5", "prompt": prompts[0],
                                   "max_tokens": TOKENS, "temperature": 1.0})
                .to_string(),
                seeded.clone(),
            ]
            .into_iter()
            .map(|body| {
                let s = &s;
                scope.spawn(move || {
                    let (st, out) = s.http("POST", "/v1/completions", None, Some(&body));
                    let v = json(&String::from_utf8_lossy(&out));
                    assert_eq!(st, 200, "{v}");
                    v["choices"][0]["text"].as_str().unwrap().to_string()
                })
            })
            .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(texts[0], want, "--mtp {mtp}, batched");
        assert_eq!(texts[3], want, "--mtp {mtp}, batched");
        let (_, body) = s.http("GET", "/stats", None, None);
        drafted += json(&String::from_utf8_lossy(&body))["mtp"]["drafted"]
            .as_u64()
            .unwrap_or(0);
    }
    assert!(drafted > 0);
}
