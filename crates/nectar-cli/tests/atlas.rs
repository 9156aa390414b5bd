//! `nectar atlas probe` + `analyze` end to end on the demo model (a few prompts, a few tokens).
mod common;
use common::{json, nectar, root};
use std::collections::BTreeMap;

/// Two prompts each of three domains of the demo's atlas prompts, and the file's text.
fn few_prompts(dir: &std::path::Path) -> (std::path::PathBuf, String) {
    let src = std::fs::read_to_string(root().join("models/nectar-demo-glm5/atlas-prompts.jsonl"))
        .unwrap();
    let mut per: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = String::new();
    for line in src.lines() {
        let v = json(line);
        let d = v["domain"].as_str().unwrap().to_string();
        if ["en_bible", "code_rust", "zh"].contains(&d.as_str()) {
            let n = per.entry(d).or_default();
            if *n < 2 {
                *n += 1;
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    let p = dir.join("prompts.jsonl");
    std::fs::write(&p, &out).unwrap();
    (p, out)
}

#[test]
fn probe_counts_every_token_top_k_and_analyze_writes_the_atlas() {
    let d = tempfile::tempdir().unwrap();
    let (prompts, text) = few_prompts(d.path());
    let probe = d.path().join("probe");
    let out = d.path().join("atlas");
    let (ok, _, err) = nectar(&[
        "atlas",
        "probe",
        "--prompts",
        prompts.to_str().unwrap(),
        "--out",
        probe.to_str().unwrap(),
        "--generate",
        "3",
    ]);
    assert!(ok, "{err}");
    let m = json(&std::fs::read_to_string(probe.join("probe.json")).unwrap());
    assert_eq!(
        m["categories"],
        serde_json::json!(["en_bible", "code_rust", "zh"])
    );
    let runs = m["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6);
    let (k, moe_layers) = (m["top_k"].as_u64().unwrap(), 7);
    for r in runs {
        // Every token (prompt and generated) counts exactly top-k selections in each of the 7
        // MoE layers: nothing deduplicated, nothing dropped.
        let toks = r["prompt_tokens"].as_u64().unwrap() + r["generated_tokens"].as_u64().unwrap();
        assert_eq!(r["generated_tokens"], 3);
        assert_eq!(r["selections"].as_u64().unwrap(), toks * k * moe_layers);
        let usage = std::fs::read_to_string(probe.join(r["file"].as_str().unwrap())).unwrap();
        assert!(usage.starts_with("-1 8 32\n-2 1 3815245270\n"), "{usage}");
        let sum: u64 = usage
            .lines()
            .skip(2)
            .map(|l| l.split_whitespace().nth(2).unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(sum, r["selections"].as_u64().unwrap());
    }
    assert_eq!(runs[1]["file"], "en_bible_1.txt");
    assert_eq!(
        m["prompts"]["sha256"].as_str().unwrap(),
        sha256(text.as_bytes())
    );
    assert_eq!(m["model"]["sha256"].as_str().unwrap().len(), 64);

    let (ok, stdout, err) = nectar(&[
        "atlas",
        "analyze",
        "--stats",
        probe.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--min-count",
        "1",
    ]);
    assert!(ok, "{err}");
    assert!(stdout.contains("leave-one-prompt-out: "), "{stdout}");
    let ex = json(&std::fs::read_to_string(out.join("experts.json")).unwrap());
    assert_eq!(ex["categories"], m["categories"]);
    let experts = ex["experts"].as_array().unwrap();
    assert!(!experts.is_empty() && experts.len() <= 7 * 32);
    for e in experts {
        for f in [
            "layer",
            "expert",
            "total",
            "spec",
            "top_topic",
            "top_lift",
            "reliability",
            "p",
        ] {
            assert!(!e[f].is_null(), "{f} missing in {e}");
        }
        assert!((1..8).contains(&e["layer"].as_u64().unwrap()), "{e}");
        let p: f64 = e["p"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .sum();
        assert!((p - 1.0).abs() < 1e-3, "{e}");
        let spec = e["spec"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&spec));
    }
    let a = json(&std::fs::read_to_string(out.join("atlas.json")).unwrap());
    assert_eq!(a["model"], m["model"]);
    assert_eq!(a["prompts"]["sha256"], m["prompts"]["sha256"]);
    assert_eq!(a["validation"]["prompts"], 6);
    assert!((a["validation"]["chance"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-12);
    assert_eq!(a["categories"][2]["prompts"], 2);
    assert_eq!(a["categories"][2]["generated_tokens"], 6);
}

#[test]
fn probe_counts_are_the_routers_own_choices() {
    // Prompt tokens only, nothing generated: the usage file must equal the per-position
    // router output `nectar logits --router` reports for the same ids.
    let d = tempfile::tempdir().unwrap();
    let text = "fn main() { let x = 1; }";
    let p = d.path().join("p.jsonl");
    std::fs::write(
        &p,
        format!("{}\n", serde_json::json!({"domain": "code", "text": text})),
    )
    .unwrap();
    let probe = d.path().join("probe");
    let (ok, _, err) = nectar(&[
        "atlas",
        "probe",
        "--prompts",
        p.to_str().unwrap(),
        "--out",
        probe.to_str().unwrap(),
        "--generate",
        "0",
        "--tokens",
        "prompt",
    ]);
    assert!(ok, "{err}");
    let (ok, out, err) = nectar(&["run", "--json", "--max-tokens", "1", text]);
    assert!(ok, "{err}");
    let ids: Vec<String> = json(&out)["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.to_string())
        .collect();
    let (ok, out, err) = nectar(&["logits", "--router", "--prompt-ids", &ids.join(",")]);
    assert!(ok, "{err}");
    let mut want: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for (layer, r) in json(&out)["router"].as_object().unwrap() {
        for pos in r["ids"].as_array().unwrap() {
            for e in pos.as_array().unwrap() {
                *want
                    .entry((layer.parse().unwrap(), e.as_u64().unwrap()))
                    .or_default() += 1;
            }
        }
    }
    let usage = std::fs::read_to_string(probe.join("code_0.txt")).unwrap();
    let got: BTreeMap<(u64, u64), u64> = usage
        .lines()
        .skip(2)
        .map(|l| {
            let f: Vec<u64> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            ((f[0], f[1]), f[2])
        })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn analyze_refuses_a_single_category_naming_the_directory() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("code_0.txt"), "0 1 5\n").unwrap();
    let (ok, _, err) = nectar(&[
        "atlas",
        "analyze",
        "--stats",
        d.path().to_str().unwrap(),
        "--out",
        d.path().join("o").to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(
        err.contains("at least 2") && err.contains(d.path().to_str().unwrap()),
        "{err}"
    );
}

fn sha256(b: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

#[test]
fn the_shipped_demo_atlas_belongs_to_the_shipped_model_and_prompts() {
    // A stale atlas (prompts, config or tokenizer changed since) fails here: re-run the two
    // commands of docs/atlas.md.
    let dir = root().join("models/nectar-demo-glm5");
    let a = json(&std::fs::read_to_string(dir.join("atlas.json")).unwrap());
    let file = |f: &str| sha256(&std::fs::read(dir.join(f)).unwrap());
    assert_eq!(
        a["prompts"]["sha256"].as_str().unwrap(),
        file("atlas-prompts.jsonl")
    );
    assert_eq!(
        a["model"]["config_sha256"].as_str().unwrap(),
        file("config.json")
    );
    assert_eq!(
        a["model"]["tokenizer_sha256"].as_str().unwrap(),
        file("tokenizer.json")
    );
    assert_eq!(a["validation"]["prompts"], 120);
    let e = json(&std::fs::read_to_string(dir.join("experts.json")).unwrap());
    assert_eq!(e["categories"].as_array().unwrap().len(), 12);
    assert_eq!(e["experts"].as_array().unwrap().len(), 7 * 32);
}
