//! The `nectar` binary end to end: the exact flags other work and acceptance checks rely on.
mod common;
use common::{ids, json, nectar, root};

#[test]
fn run_demo_json_matches_reference_greedy() {
    let reference = json(
        &std::fs::read_to_string(root().join("models/nectar-demo-glm5/reference.json")).unwrap(),
    );
    for p in reference["prompts"].as_array().unwrap() {
        let prompt: Vec<String> = ids(&p["input_ids"]).iter().map(u64::to_string).collect();
        let (ok, out, err) = nectar(&[
            "run",
            "--json",
            "--max-tokens",
            "32",
            "--prompt-ids",
            &prompt.join(","),
        ]);
        assert!(ok, "{err}");
        let v = json(&out);
        assert_eq!(ids(&v["tokens"]), ids(&p["greedy_ids"]), "{}", p["name"]);
        assert!(v["stats"]["decode_tok_s"].as_f64().unwrap() > 0.0);
        assert!(v["stats"]["prefill_tok_s"].as_f64().unwrap() > 0.0);
        if p["name"] == "chat" {
            assert!(
                v["text"]
                    .as_str()
                    .unwrap()
                    .starts_with("harbor \\harbor\\ n."),
                "{}",
                v["text"]
            );
        }
    }
}

#[test]
fn run_chat_text_prompt_streams_text() {
    let (ok, out, err) = nectar(&[
        "run",
        "--chat",
        "--max-tokens",
        "12",
        "Define the word \"harbor\".",
    ]);
    assert!(ok, "{err}");
    assert!(out.starts_with("harbor \\harbor\\ n."), "{out}");
    assert!(err.contains("tok/s"), "{err}");
    let (ok, out, _) = nectar(&["run", "--max-tokens", "4"]);
    assert!(ok && out.starts_with("And God said,"), "{out}");
}

#[test]
fn run_sampling_flags() {
    let base = ["run", "--json", "--chat", "--max-tokens", "10"];
    let sampled = |seed: &str| {
        let mut args = base.to_vec();
        args.extend([
            "--temperature",
            "1.1",
            "--top-p",
            "0.9",
            "--top-k",
            "40",
            "--seed",
            seed,
        ]);
        args.extend(["--repeat-penalty", "1.1", "--presence-penalty", "-0.5"]);
        args.push("Define the word \"harbor\".");
        let (ok, out, err) = nectar(&args);
        assert!(ok, "{err}");
        json(&out)
    };
    let (a, b) = (sampled("5"), sampled("5"));
    assert_eq!(a["tokens"], b["tokens"]);
    assert_eq!(a["text"], b["text"]);
    assert_eq!(a["seed"], 5);
    assert!(a["stats"]["decode_tok_s"].as_f64().unwrap() > 0.0);
    // Greedy output carries no seed.
    let (ok, out, _) = nectar(&[&base[..], &["hi"]].concat());
    assert!(ok && json(&out).get("seed").is_none(), "{out}");
}

#[test]
fn run_stop_strings_and_logprobs() {
    let (ok, out, err) = nectar(&[
        "run",
        "--json",
        "--chat",
        "--max-tokens",
        "32",
        "--stop",
        "\\ n",
        "--logprobs",
        "2",
        "Define the word \"harbor\".",
    ]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(v["text"], "harbor \\harbor");
    assert_eq!(v["finish_reason"], "stop");
    assert_eq!(v["stop_reason"], "\\ n");
    let lps = v["logprobs"].as_array().unwrap();
    assert_eq!(lps.len(), v["tokens"].as_array().unwrap().len());
    for lp in lps {
        let top = lp["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["id"], lp["id"], "greedy picks the most likely");
        assert!(lp["logprob"].as_f64().unwrap() <= 0.0);
        assert!(lp["token"].is_string());
    }
    // Streaming: the stop string and what follows never reach stdout.
    let (ok, out, err) = nectar(&[
        "run",
        "--chat",
        "--max-tokens",
        "32",
        "--stop",
        "\\ n",
        "Define the word \"harbor\".",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, "harbor \\harbor\n");
    assert!(err.contains("finish: stop"), "{err}");
}

#[test]
fn run_bad_sampling_flags_fail_cleanly() {
    for (args, want) in [
        (&["--temperature", "1", "--top-p", "1.5"][..], "top_p"),
        (&["--temperature", "-1"][..], "temperature"),
        (&["--logprobs", "3"][..], "--json"),
        (&["--json", "--logprobs", "21"][..], "logprobs"),
        (&["--logit-bias", "5"][..], "ID=BIAS"),
        (&["--logit-bias", "99999999=1"][..], "logit_bias"),
        (&["--stop", ""][..], "stop"),
        (&["--ctx-size", "0"][..], "--ctx-size"),
    ] {
        let (ok, out, err) = nectar(&[&["run"][..], args].concat());
        assert!(!ok && err.contains(want), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?} printed {out}");
    }
}

#[test]
fn logits_json_matches_fixture() {
    let dir = root().join("tests/fixtures/glm-tiny/glm52");
    let exp = json(&std::fs::read_to_string(dir.join("expected.json")).unwrap());
    let prompt: Vec<String> = ids(&exp["prompt_ids"]).iter().map(u64::to_string).collect();
    let model = dir.join("model");
    let (ok, out, err) = nectar(&[
        "logits",
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        &prompt.join(","),
        "--json",
        "--mtp",
        "--router",
        "--indexer",
    ]);
    assert!(ok, "{err}");
    let v = json(&out);
    let s = prompt.len();
    let logits = v["logits"].as_array().unwrap();
    assert_eq!(logits.len(), s);
    let argmax: Vec<u64> = logits
        .iter()
        .map(|row| {
            let r: Vec<f64> = row
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            (0..r.len()).fold(0, |b, i| if r[i] > r[b] { i } else { b }) as u64
        })
        .collect();
    assert_eq!(argmax, ids(&exp["prompt_argmax"]));
    assert_eq!(v["mtp_logits"].as_array().unwrap().len(), s - 1);
    for (layer, r) in exp["router"]["layers"].as_object().unwrap() {
        let got = &v["router"][layer]["ids"];
        for p in 0..s {
            assert_eq!(got[p], r["ids"][p], "router layer {layer} position {p}");
        }
    }
    for (layer, want) in exp["indexer"]["last_prompt_position"].as_object().unwrap() {
        if exp["indexer"]["layers"][layer]["type"] == "full" {
            assert_eq!(v["indexer"][layer], *want, "indexer layer {layer}");
        }
    }
}

#[test]
fn inspect_reports_classes() {
    let (ok, out, err) = nectar(&["inspect", "--json"]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(v["inventory"]["routed_experts"], 224);
    assert_eq!(v["inventory"]["mtp"], true);
    assert!(
        v["inventory"]["classes"]["routed_expert"]["bytes"]
            .as_u64()
            .unwrap()
            > 0
    );
}

#[test]
fn bad_inputs_fail_cleanly() {
    let (ok, _, err) = nectar(&["run", "--model", "/nonexistent/model"]);
    assert!(!ok && err.contains("/nonexistent/model"), "{err}");
    let (ok, _, err) = nectar(&["run", "--prompt-ids", "99999999"]);
    assert!(!ok && err.contains("99999999"), "{err}");
    let model = root().join("tests/fixtures/glm-tiny/glm5/model");
    let (ok, _, err) = nectar(&["run", "--model", model.to_str().unwrap(), "hello"]);
    assert!(!ok && err.contains("tokenizer.json"), "{err}");
}

#[test]
fn synth_mtp_under_a_budget_auto_follows_its_measurement() {
    // A synthetic model with an MTP layer (int8 experts, their own tier) has random weights, so
    // its drafts are not accepted here: `auto` must measure that and choose by it, and `on` must
    // still produce exactly the tokens of `off`.
    let dir = tempfile::tempdir().unwrap();
    let synth = dir.path().join("tiny-mtp");
    let s = synth.to_str().unwrap();
    let (ok, _, err) = nectar(&[
        "synth", "--preset", "tiny", "--layers", "2", "--mtp", "--out", s,
    ]);
    assert!(ok, "{err}");
    let run = |mtp: &str| {
        let (ok, out, err) = nectar(&[
            "run",
            "--model",
            s,
            "--prompt-ids",
            "1,2,3,4",
            "--max-tokens",
            "80",
            "--memory-budget",
            "200M",
            "--mtp",
            mtp,
            "--json",
        ]);
        assert!(ok, "{err}");
        json(&out)
    };
    let off = run("off");
    let on = run("on");
    assert_eq!(on["tokens"], off["tokens"]);
    assert!(on["stats"]["mtp"]["drafted"].as_u64().unwrap() > 0);
    // The union growth per verify: drafts add experts to the steps' union; without drafts
    // there is no verify step and the plain steps' union is reported.
    let u = &on["stats"]["mtp"]["expert_union"];
    assert!(u["verify_steps"].as_u64().unwrap() > 0, "{u}");
    assert!(u["growth"].as_f64().unwrap() > 1.0, "{u}");
    let u = &off["stats"]["mtp"]["expert_union"];
    assert_eq!(u["verify_steps"], 0, "{u}");
    assert!(u["plain_steps"].as_u64().unwrap() > 0, "{u}");
    assert!(u["plain_experts_per_layer"].as_f64().unwrap() > 0.0, "{u}");
    let tier = &on["stats"]["residency"]["mtp_tier"];
    assert!(tier["reads"].as_u64().unwrap() > 0, "{tier}");
    assert!(
        tier["slot_bytes"].as_u64().unwrap() > 0,
        "the MTP tier has its own slots: {tier}"
    );
    let auto = run("auto");
    assert_eq!(auto["tokens"], off["tokens"]);
    let m = &auto["stats"]["mtp"];
    // Never-accepted drafts cost time and give nothing: `auto` chooses the depth its own
    // measurement says is fastest — plain decoding, unless timing noise on a loaded machine
    // makes a drafting round look as cheap, which the decision then records.
    assert_eq!(m["accepted"], 0, "{m}");
    let last = m["decisions"].as_array().unwrap().last().cloned().unwrap();
    let expected: Vec<f64> = last["expected_tok_s"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let best = (0..expected.len())
        .max_by(|&a, &b| expected[a].total_cmp(&expected[b]).then(b.cmp(&a)))
        .unwrap();
    assert_eq!(last["gamma"], best as u64, "{last}");
    assert_eq!(m["final_gamma"], last["gamma"], "{m}");
}

#[test]
fn usage_ledger_is_written_and_pins_the_hottest_experts() {
    let dir = tempfile::tempdir().unwrap();
    let synth = dir.path().join("tiny");
    let s = synth.to_str().unwrap();
    let (ok, _, err) = nectar(&["synth", "--preset", "tiny", "--layers", "2", "--out", s]);
    assert!(ok, "{err}");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            s,
            "--prompt-ids",
            "1,2,3,4,5,6",
            "--max-tokens",
            "24",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (ok, out, err) = nectar(&args);
        assert!(ok, "{err}");
        (json(&out), err)
    };
    // A run adds its selections to <model>/.coli_usage, in Colibri's grammar.
    let (plain, _) = run(&[]);
    let ledger = std::fs::read_to_string(synth.join(".coli_usage")).unwrap();
    let mut lines = ledger.lines();
    assert_eq!(lines.next(), Some("-1 2 16"));
    assert_eq!(lines.next(), Some("-2 1 3815245270"));
    let total: u64 = lines
        .map(|l| l.split(' ').nth(2).unwrap().parse::<u64>().unwrap())
        .sum();
    // 6 prompt + 23 decode positions (the last token is not run), 2 MoE layers, top-4.
    assert_eq!(total, 29 * 2 * 4);
    let (_, _) = run(&["--no-usage-save"]);
    assert_eq!(
        std::fs::read_to_string(synth.join(".coli_usage")).unwrap(),
        ledger
    );
    // Pinning the hottest experts changes where they live, never the output.
    let (pinned, _) = run(&["--memory-budget", "200M", "--pin-size", "60K"]);
    assert_eq!(pinned["tokens"], plain["tokens"]);
    let n = pinned["stats"]["residency"]["pinned"].as_u64().unwrap();
    assert!(n >= 2, "{}", pinned["stats"]["residency"]);
    let (off, _) = run(&["--memory-budget", "200M", "--pin", "off"]);
    assert_eq!(off["stats"]["residency"]["pinned"], 0);
    // A ledger from another engine: refused for auto (warned, nothing pinned), trusted when named.
    let foreign = dir.path().join("foreign.usage");
    std::fs::write(&foreign, "-1 2 16\n-2 1 42\n0 3 100\n1 5 90\n").unwrap();
    std::fs::copy(&foreign, synth.join(".coli_usage")).unwrap();
    let (auto, err) = run(&[
        "--memory-budget",
        "200M",
        "--pin-size",
        "60K",
        "--no-usage-save",
    ]);
    assert_eq!(auto["stats"]["residency"]["pinned"], 0);
    assert!(err.contains("engine id"), "{err}");
    let (named, _) = run(&[
        "--memory-budget",
        "200M",
        "--pin-size",
        "60K",
        "--pin",
        foreign.to_str().unwrap(),
        "--no-usage-save",
    ]);
    assert_eq!(named["stats"]["residency"]["pinned"], 2);
    assert_eq!(named["tokens"], plain["tokens"]);
}
