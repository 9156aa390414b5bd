//! The CUDA tier's command-line contract on any machine: `--gpu-memory` never changes the tokens
//! and always says where the matrices run (on a machine without a usable GPU, or in a build
//! without `--features cuda`, why it stays on the CPU); `bench gpu` without the feature says how
//! to get it. The GPU itself is exercised on the GPU machine (scripts/gpu-device-run).
mod common;
use common::{ids, json, nectar, root};

#[test]
fn gpu_memory_keeps_the_tokens_and_says_where_the_model_runs() {
    let model = root().join("tests/fixtures/glm-tiny/glm5/model");
    let model = model.to_str().unwrap();
    let args = [
        "run",
        "--model",
        model,
        "--json",
        "--prompt-ids",
        "1,2,3,4,5",
        "--max-tokens",
        "16",
        "--no-usage-save",
    ];
    let (ok, cpu, err) = nectar(&args);
    assert!(ok, "{err}");
    let mut with_gpu = args.to_vec();
    with_gpu.extend(["--gpu-memory", "1G"]);
    let (ok, gpu, err) = nectar(&with_gpu);
    assert!(ok, "{err}");
    assert_eq!(ids(&json(&gpu)["tokens"]), ids(&json(&cpu)["tokens"]));
    let placed = err
        .lines()
        .any(|l| l.starts_with("GPU: ") && l.contains("in VRAM"));
    let fell_back = err.contains("--gpu-memory:") && err.contains("running on the CPU");
    assert!(placed || fell_back, "no placement line: {err}");
    // `--json` says where the routed experts ran: every one counted once per forward, on one
    // of the three routes (all on the CPU without a GPU; no copies without a memory budget).
    let g = &json(&gpu)["stats"]["gpu"];
    let runs = |k: &str| g["expert_runs"][k].as_u64().unwrap();
    assert!(runs("vram") + runs("cpu") > 0, "{g}");
    assert_eq!(runs("copied"), 0, "{g}");
    assert!(g["copy"].is_null(), "{g}");
    if fell_back {
        assert_eq!(runs("vram"), 0, "{g}");
    }
    // Without the flag a default build asks for no GPU (a CUDA build defaults to `auto`).
    #[cfg(not(feature = "cuda"))]
    assert!(json(&cpu)["stats"]["gpu"].is_null());
    #[cfg(not(feature = "cuda"))]
    assert!(err.contains("--features cuda"), "{err}");
}

#[test]
fn gpu_memory_refuses_a_bad_size() {
    let (ok, _, err) = nectar(&["run", "--gpu-memory", "lots", "--max-tokens", "1"]);
    assert!(!ok);
    assert!(err.contains("--gpu-memory"), "{err}");
}

#[cfg(not(feature = "cuda"))]
#[test]
fn bench_gpu_without_the_feature_says_how_to_get_it() {
    let (ok, _, err) = nectar(&["bench", "gpu", "--quick"]);
    assert!(!ok);
    assert!(err.contains("--features cuda"), "{err}");
}

/// `fit --gpu-memory` prints the VRAM plan from the headers (no GPU needed): the spine by
/// class in placement order, the routed experts in VRAM per layer, what stays in RAM — and the
/// JSON agrees with itself and with the budget.
#[test]
fn fit_prints_the_vram_plan_without_a_gpu() {
    let model = root().join("tests/fixtures/glm-tiny/glm5/model");
    let model = model.to_str().unwrap();
    let fit = |gpu: &str, json_out: bool| {
        // The MTP layer loaded (`run`'s default `--mtp off` loads and plans none of it: below).
        let mut args = vec![
            "fit",
            "--model",
            model,
            "--memory-budget",
            "27M",
            "--mtp",
            "on",
        ];
        args.extend(["--gpu-memory", gpu]);
        if json_out {
            args.push("--json");
        }
        let (ok, out, err) = nectar(&args);
        assert!(ok, "{err}");
        out
    };
    let text = fit("1M", false);
    for line in [
        "VRAM plan (--gpu-memory 1.0 MiB):",
        "attention + indexers (32 of 32 matrices)",
        "LM heads (0 of 1 matrices)",
        "routed experts: 1 of 32 in VRAM",
        "experts in VRAM per layer: 1: 1/8, 2: 0/8",
        "stays in RAM: 1 spine matrices",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    // Room beside the spine: the staging area for experts copied from RAM comes before the
    // expert tier (two slots per routed expert of a token: 4 here).
    let text = fit("1300K", false);
    assert!(
        text.contains("staging for experts copied from RAM: 4 slots of 25.5 KiB"),
        "{text}"
    );
    assert!(text.contains("each copied to the staging area or computed on the CPU"));
    for budget in ["1K", "300K", "1M", "1300K", "2M"] {
        let v = json(&fit(budget, true));
        let g = &v["gpu"];
        let b = g["budget"].as_u64().unwrap();
        let spine = g["spine_bytes"].as_u64().unwrap();
        let experts = g["expert_bytes"].as_u64().unwrap();
        let staging = g["staging"]["bytes"].as_u64().unwrap();
        assert_eq!(
            g["used_bytes"].as_u64().unwrap(),
            spine + staging + experts,
            "{g}"
        );
        assert!(spine + staging + experts <= b, "{g}");
        assert_eq!(staging > 0, budget == "1300K", "{g}");
        let placed: u64 = g["classes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["placed_bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(placed, spine);
        let held: u64 = g["experts_per_layer"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["in_vram"].as_u64().unwrap() * l["expert_bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(held, experts, "{g}");
    }
    // `--mtp off` loads no MTP layer, so the plan gives none of its matrices VRAM: the 1M
    // that held the MTP layer's now holds the LM head and an expert per layer.
    let (ok, text, err) = nectar(&[
        "fit",
        "--model",
        model,
        "--memory-budget",
        "27M",
        "--gpu-memory",
        "1M",
    ]);
    assert!(ok, "{err}");
    for line in [
        "MTP layer (0 of 0 matrices)",
        "LM heads (1 of 1 matrices)",
        "routed experts: 3 of 24 in VRAM",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    // The whole model at 2M: nothing stays in RAM.
    let v = json(&fit("2M", true));
    assert_eq!(v["gpu"]["spine_left"]["matrices"], 0);
    for l in v["gpu"]["experts_per_layer"].as_array().unwrap() {
        assert_eq!(l["in_vram"], l["experts"], "{l}");
    }
}

/// `fit --gpu-memory` plans RAM and VRAM as one (issue 14 item 3): a spine matrix in VRAM
/// releases its host copy (all but `kv_b_proj`), so the memory plan's spine terms count only
/// what stays in RAM and the budget gets the rest as LRU slots; the text and `--json` say so.
#[test]
fn fit_with_a_gpu_gives_the_released_spine_to_the_expert_slots() {
    let model = root().join("tests/fixtures/glm-tiny/glm5/model");
    let model = model.to_str().unwrap();
    let run = |budget: &str, extra: &[&str]| {
        // The MTP layer loaded, so every matrix the VRAM plan holds is in the RAM plan too.
        let mut args = vec![
            "fit",
            "--model",
            model,
            "--memory-budget",
            budget,
            "--mtp",
            "on",
        ];
        args.extend_from_slice(extra);
        nectar(&args)
    };
    let fit = |extra: &[&str]| {
        let (ok, out, err) = run("27M", extra);
        assert!(ok, "{err}");
        out
    };
    // 26M is short of the CPU plan's minimum (26.6 MiB) and enough with the spine in VRAM.
    let (ok, _, err) = run("26M", &[]);
    assert!(!ok && err.contains("needs at least"), "{err}");
    let (ok, _, err) = run("26M", &["--gpu-memory", "2M"]);
    assert!(ok, "{err}");
    let spine = |v: &serde_json::Value| -> u64 {
        v["terms"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["term"].as_str().unwrap().starts_with("spine: "))
            .map(|t| t["bytes"].as_u64().unwrap())
            .sum()
    };
    let cpu = json(&fit(&["--json"]));
    let gpu = json(&fit(&["--gpu-memory", "2M", "--json"]));
    let g = &gpu["gpu"];
    assert_eq!(g["spine_left"]["matrices"], 0, "{g}");
    let released = g["released_bytes"].as_u64().unwrap();
    let kept = g["kept_host_bytes"].as_u64().unwrap();
    // kv_b of 4 layers (3 main + MTP) keeps its host copy; the rest is released.
    assert!(kept > 0 && released > 4 * kept, "{g}");
    assert_eq!(released + kept, g["spine_bytes"].as_u64().unwrap());
    assert_eq!(spine(&cpu) - spine(&gpu), released, "{cpu}\n{gpu}");
    assert_eq!(g["ram_spine_bytes"].as_u64().unwrap(), spine(&gpu));
    let lru = |v: &serde_json::Value| v["lru_per_layer"].as_u64().unwrap();
    assert!(lru(&gpu) > lru(&cpu), "{} vs {}", lru(&gpu), lru(&cpu));
    let text = fit(&["--gpu-memory", "2M"]);
    assert!(
        text.contains("RAM spine after VRAM placement:") && text.contains("kept: kv_b"),
        "{text}"
    );
}

#[test]
fn serve_refuses_a_bad_gpu_memory() {
    let (ok, _, err) = nectar(&["serve", "--gpu-memory", "lots", "--port", "0"]);
    assert!(!ok);
    assert!(err.contains("--gpu-memory"), "{err}");
}
