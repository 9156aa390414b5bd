//! GLM-5.2-shaped routing through the real code: `bench policy` (the slot policy against
//! Belady), `bench replay` (the model driven by a recorded trace) and `fit --project`.
mod common;
use common::{json, nectar, needed, root};

fn e256() -> String {
    root()
        .join("models/nectar-demo-glm5-e256-int4")
        .display()
        .to_string()
}

/// `nectar fit --geometry glm52 --project --json` with `args` (the budget and the machine's
/// speeds): the projection object.
fn glm52_projection(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["fit", "--geometry", "glm52", "--project", "--json"];
    all.extend_from_slice(args);
    let (ok, out, err) = nectar(&all);
    assert!(ok, "{err}");
    json(&out)["projection"].clone()
}

/// `fit --project --json` of the route256 model under 200M, calibrated on itself (the whole
/// output: machine and projection).
fn e256_projection(extra: &[&str]) -> serde_json::Value {
    let model = e256();
    let base = [
        "fit",
        "--model",
        &model,
        "--memory-budget",
        "200M",
        "--project",
        "--json",
    ];
    let (ok, out, err) = nectar(&[&base[..], extra].concat());
    assert!(ok, "{err}");
    json(&out)
}

/// The error of a GLM-5.2 projection (on a 7 GB/s disk) that `extra` makes `fit` refuse.
fn glm52_refused(extra: &[&str]) -> String {
    let base = [
        "fit",
        "--geometry",
        "glm52",
        "--project",
        "--disk-gbps",
        "7",
    ];
    let (ok, _, err) = nectar(&[&base[..], extra].concat());
    assert!(!ok, "accepted {extra:?}");
    err
}

/// A described machine for GLM-5.2 (PCIe4 NVMe, dual-channel DDR5): every speed but the
/// compute rates given, so nothing measured here enters the decode figure.
const PCIE4_DDR5: [&str; 6] = [
    "--disk-gbps",
    "7",
    "--mem-gbps",
    "65",
    "--kernel-share",
    "0.6",
];

/// [`PCIE4_DDR5`] with 32 GB of RAM.
fn glm52_32g(extra: &[&str]) -> serde_json::Value {
    glm52_projection(&[&["--memory-budget", "29G"], &PCIE4_DDR5[..], extra].concat())
}

/// `fit --project --parallel N`: N conversations decoded together, their experts' union asked
/// of the cache. Where the disk binds (32 GB) the batch reads nearly N rows' misses and gains
/// nothing; where RAM bandwidth binds and the slots are many (64 GB, a fast disk) one read of
/// the spine serves N rows and the batch moves more tokens; each sequence is slower than alone.
#[test]
fn fit_projects_sequences_decoded_together() {
    let fast = [
        "--memory-budget",
        "61G",
        "--disk-gbps",
        "14",
        "--mem-gbps",
        "65",
        "--kernel-share",
        "0.6",
    ];
    let at = |machine: &[&str], n: &str| {
        let extra = [
            "--moe-overlap",
            "0.76",
            "--layer-overhead-ms",
            "1.0",
            "--parallel",
            n,
        ];
        glm52_projection(&[machine, &extra[..]].concat())
    };
    let slow = glm52_32g_flags();
    let one = at(&slow, "1");
    assert!(one["parallel"].is_null(), "{one}");
    for (machine, more) in [(&slow[..], false), (&fast[..], true)] {
        let o = at(machine, "2");
        let b = &o["parallel"];
        let f = |v: &serde_json::Value| v.as_f64().unwrap();
        assert_eq!(b["sequences"], 2);
        // Two texts share few experts: nearly 16 a layer, never more.
        let u = f(&b["unique_experts_per_layer"]);
        assert!(u > 14.0 && u <= 16.0, "{b}");
        let single = f(&o["decode_tok_s"]["mtp_off"]);
        assert!(f(&b["hit_rate"]) < f(&o["hit_rate"]["mtp_off"]), "{o}");
        assert!(
            f(&b["ssd_gb_per_token"]) > f(&o["ssd_gb_per_token"]["mtp_off"]),
            "{o}"
        );
        assert!(f(&b["decode_tok_s_per_sequence"]) < single, "{o}");
        assert!((f(&b["decode_tok_s"]) - 2.0 * f(&b["decode_tok_s_per_sequence"])).abs() < 1e-9);
        assert!((f(&b["gain_over_one_sequence"]) - f(&b["decode_tok_s"]) / single).abs() < 1e-9);
        assert_eq!(f(&b["gain_over_one_sequence"]) > 1.0, more, "{o}");
    }
    // Planned as `serve --parallel 4`: the one-sequence figures are a lone client's, with the
    // idle rows' memory lent to its cache; the batch decodes at the full plan's slots.
    let served = at(&[&slow[..], &["--serve"][..]].concat(), "4");
    let b = &served["parallel"];
    assert!(
        b["lru_slots_per_layer"].as_u64() < served["lru_slots_per_layer"].as_u64(),
        "{served}"
    );
    // More sequences than the trace has conversations: nothing to serve side by side.
    let err = glm52_refused(&["--parallel", "25"]);
    assert!(
        err.contains("--parallel 25") && err.contains("holds 24"),
        "{err}"
    );
}

/// [`glm52_32g`]'s flags.
fn glm52_32g_flags() -> Vec<&'static str> {
    [&["--memory-budget", "29G"], &PCIE4_DDR5[..]].concat()
}

#[test]
fn fit_projects_decode_after_a_long_context() {
    // GLM-5.2's attention at 8,192 tokens of context (timed here on the model's own code):
    // slower than after a short prompt, the indexer's share present past its top 2,048.
    let long = glm52_32g(&["--context", "8192"]);
    let c = &long["context"];
    let f = |v: &serde_json::Value| v.as_f64().unwrap();
    assert_eq!(c["tokens"], 8192, "{c}");
    assert!(f(&c["attention_ms_per_row"]) > 0.0, "{c}");
    assert!(f(&c["index_ms_per_indexer_layer"]) > 0.0, "{c}");
    for k in ["mtp_off", "mtp_on"] {
        assert!(
            f(&c["decode_tok_s"][k]) < f(&long["decode_tok_s"][k]),
            "{k}: {c} against {}",
            long["decode_tok_s"]
        );
    }
    assert!(c["parallel_decode_tok_s"].is_null(), "{c}");
    // Below the top k the indexer does not select: no share of its own. Two sequences decoded
    // together each pay their rows' longer attention.
    let short = glm52_32g(&["--context", "1000", "--parallel", "2"]);
    let sc = &short["context"];
    assert_eq!(f(&sc["index_ms_per_indexer_layer"]), 0.0);
    let all = f(&short["parallel"]["decode_tok_s"]);
    let want = 1.0 / (1.0 / all + f(&sc["attention_ms_per_row"]) / 1e3);
    assert!(
        (f(&sc["parallel_decode_tok_s"]) - want).abs() < 1e-9 && want < all,
        "{short}"
    );
    // Past the model's longest context (GLM-5.2: 1,048,576) nothing is projected: refused by
    // name, as are speeds a projection cannot divide by.
    let refused = |extra: &[&str]| {
        let mut all = vec![
            "fit",
            "--geometry",
            "glm52",
            "--project",
            "--memory-budget",
            "29G",
        ];
        all.extend_from_slice(extra);
        let (ok, _, err) = nectar(&all);
        assert!(!ok, "{extra:?} accepted");
        err
    };
    let err = refused(&[&PCIE4_DDR5[..], &["--context", "1048577"]].concat());
    assert!(err.contains("at most 1048576 tokens"), "{err}");
    for bad in [
        ["--disk-gbps", "0"],
        ["--disk-gbps", "nan"],
        ["--mem-gbps", "inf"],
    ] {
        let err = refused(&bad);
        assert!(
            err.contains(bad[0]) && err.contains("finite number above 0"),
            "{err}"
        );
    }
    assert!(refused(&["--disk-gbps", "7", "--cores", "0"]).contains("at least 1"));
    let err = refused(&["--disk-gbps", "7", "--kernel-share", "0"]);
    assert!(err.contains("a share above 0, at most 1"), "{err}");
}

#[test]
fn bench_policy_reports_every_kind_and_slot_count_against_belady() {
    let (ok, out, err) = nectar(&["bench", "policy", "--slots", "12,16", "--json"]);
    assert!(ok, "{err}");
    let v = json(&out);
    let rows = v["results"].as_array().unwrap();
    // 4 trace kinds × 2 slot counts × 3 policies.
    assert_eq!(rows.len(), 24, "{out}");
    for r in rows {
        let (hit, opt) = (
            r["hit_rate"].as_f64().unwrap(),
            r["belady_hit_rate"].as_f64().unwrap(),
        );
        assert!(hit > 0.0 && hit <= opt && opt < 1.0, "{r}");
    }
    // The default policy's goal at GLM-5.2's shape: ≥ 0.85 of Belady at 12 and 16 slots on
    // the decode and session traces (it reaches 0.88-0.89), well above LRU's 0.57-0.59.
    for r in rows.iter().filter(|r| {
        matches!(r["trace"].as_str(), Some("decode" | "session")) && r["admission"] == "predictive"
    }) {
        assert!(r["ratio"].as_f64().unwrap() >= 0.85, "{r}");
    }
    let lru = rows
        .iter()
        .find(|r| r["trace"] == "decode" && r["admission"] == "lru" && r["slots"] == 12)
        .unwrap();
    assert!(lru["ratio"].as_f64().unwrap() < 0.7, "{lru}");
    let (ok, _, err) = nectar(&["bench", "policy", "--admission", "lfu"]);
    assert!(!ok && err.contains("unknown admission `lfu`"), "{err}");
    let (ok, _, err) = nectar(&["bench", "policy", "--slots", "8,0"]);
    assert!(!ok && err.contains("0 slots without --pin"), "{err}");
}

#[test]
fn bench_replay_is_deterministic_and_bounded_by_belady() {
    let args = [
        "bench",
        "replay",
        "--model",
        &e256(),
        // 49 LRU slots per layer with MTP off, 21 with it on (its int8 experts take slots):
        // the cache misses, so the hit rates below say something.
        "--memory-budget",
        "72M",
        "--conversations",
        "1",
        "--tokens",
        "24",
        "--raw-seconds",
        "0.05",
        "--mtp",
        "off,on",
        "--prefetch",
        "lookahead",
        "--json",
    ];
    let run = || {
        let (ok, out, err) = nectar(&args);
        assert!(ok, "{err}");
        json(&out)
    };
    let (a, b) = (run(), run());
    let runs = a["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (x, y) in runs.iter().zip(b["runs"].as_array().unwrap()) {
        // The cache's decisions never depend on I/O timing: the same trace gives the same hits.
        for k in [
            "hit_rate",
            "belady_hit_rate",
            "decode_tokens",
            "accepted",
            "expert_union",
        ] {
            assert_eq!(x[k], y[k], "{k}: {x} vs {y}");
        }
        let (hit, opt) = (
            x["hit_rate"].as_f64().unwrap(),
            x["belady_hit_rate"].as_f64().unwrap(),
        );
        assert!(hit > 0.0 && hit <= opt + 1e-9 && opt < 1.0, "{x}");
        // The runtime holds what its policy code holds replayed offline over the same steps
        // (the rest is I/O timing and the working bank's waves): a gap to `bench policy`'s
        // figures is then the workload's, not the runtime's.
        let offline = x["policy_replay_hit_rate"].as_f64().unwrap();
        assert!((hit - offline).abs() <= 0.01, "{x}");
        assert!(x["ratio"].as_f64().unwrap() <= 1.0 + 1e-9, "{x}");
        assert!(x["decode_tok_s"].as_f64().unwrap() > 0.0);
        // The disk's reference is the best rate seen: both raw samples and the decode's own
        // bytes per busy second, whichever is highest.
        let raw = &x["raw_gb_s"];
        let seen = ["before", "after", "decode_busy"].map(|k| raw[k].as_f64().unwrap());
        assert!(seen[2] > 0.0, "{x}");
        assert_eq!(
            x["disk_reference_gb_s"].as_f64(),
            Some(seen.into_iter().fold(0.0, f64::max)),
            "{x}"
        );
        // The layers' halves per decoded token, and the disk's busy time inside each: this
        // cache misses, so the MLP halves read (busy > 0), and no half holds more busy time
        // than it lasted.
        let h = &x["halves_ms_per_token"];
        let ms = |k: &str| h[k].as_f64().unwrap_or_else(|| panic!("{k}: {h}"));
        assert!(ms("attention") > 0.0 && ms("mlp") > 0.0, "{h}");
        assert!(ms("disk_busy_mlp") > 0.0, "{h}");
        for (busy, half) in [
            ("disk_busy_attention", "attention"),
            ("disk_busy_mlp", "mlp"),
        ] {
            assert!(ms(busy) >= 0.0 && ms(busy) <= ms(half) + 1e-6, "{h}");
        }
        // Look-ahead's share of reads hidden in attention (`fit --project`'s r): a share where
        // it read at least 8 experts ahead, else null (too few to tell).
        let r = &x["lookahead_hidden"];
        match x["prefetch_issued"].as_u64().unwrap() {
            n if n >= 8 => assert!((0.0..=1.0).contains(&r.as_f64().unwrap()), "{x}"),
            _ => assert!(r.is_null(), "{x}"),
        }
    }
    assert_eq!(runs[0]["decode_tokens"], 24);
    // The look-ahead controller reports its threshold and the windows it measured (23 decode
    // steps measured: 2 windows of 8).
    let c = &runs[0]["lookahead_control"];
    assert!(c["min_context"].as_u64().is_some(), "{c}");
    assert_eq!(c["windows"], 2, "{c}");
    assert_eq!(runs[1]["mtp"], "on");
    assert!(runs[1]["drafted"].as_u64().unwrap() > 0);
    // The union growth per verify. route256 routes each token to 8 distinct experts per layer:
    // one plain row's union is 8; a verify (the token and its draft) reads 8 to 16.
    let off = &runs[0]["expert_union"];
    assert_eq!(off["verify_steps"], 0, "{off}");
    assert_eq!(off["plain_experts_per_layer"], 8.0, "{off}");
    let on = &runs[1]["expert_union"];
    assert!(on["verify_steps"].as_u64().unwrap() > 0, "{on}");
    assert_eq!(on["verify_plain_experts_per_layer"], 8.0, "{on}");
    let all = on["verify_experts_per_layer"].as_f64().unwrap();
    assert!(all > 8.0 && all <= 16.0, "{on}");
    assert!(
        (on["growth"].as_f64().unwrap() - all / 8.0).abs() < 1e-9,
        "{on}"
    );
    // Refused by name: a trace of another expert shape (the demo's top-4 of 32 would replay a
    // smaller universe onto this model's 256), nothing to decode or no conversation.
    let demo = root().join("tests/fixtures/traces/demo");
    let demo = demo.to_str().unwrap();
    let model = e256();
    let refused = |trace: &str, conversations: &str, tokens: &str| {
        let (ok, _, err) = nectar(&[
            "bench",
            "replay",
            "--model",
            &model,
            "--memory-budget",
            "200M",
            "--raw-seconds",
            "0.05",
            "--trace",
            trace,
            "--conversations",
            conversations,
            "--tokens",
            tokens,
        ]);
        assert!(!ok, "{trace} {conversations} {tokens} accepted");
        err
    };
    let route256 = root().join("tests/fixtures/traces/route256");
    let route256 = route256.to_str().unwrap();
    let err = refused(demo, "1", "4");
    assert!(
        err.contains("top-4 of 32") && err.contains("own expert shape"),
        "{err}"
    );
    assert!(refused(route256, "1", "0").contains("--tokens must be at least 1"));
    assert!(refused(route256, "0", "4").contains("--conversations must be at least 1"));
    let (ok, _, err) = nectar(&["bench", "replay", "--model", &model, "--acceptance", "1.5"]);
    assert!(
        !ok && err.contains("'1.5' for '--acceptance") && err.contains("within 0..1"),
        "{err}"
    );
}

#[test]
fn bench_replay_pilot_prefetches_the_trace_models_predictions() {
    let (ok, out, err) = nectar(&[
        "bench",
        "replay",
        "--model",
        &e256(),
        "--memory-budget",
        "66M",
        "--conversations",
        "1",
        "--tokens",
        "24",
        "--raw-seconds",
        "0.05",
        "--prefetch",
        "off,pilot,both",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v = json(&out);
    let (off, pilot, both) = (&v["runs"][0], &v["runs"][1], &v["runs"][2]);
    // `both` replays the same predictions with look-ahead beside them, at PILOT's slots; reads
    // ahead never change what the cache holds, so its hit rate is PILOT's.
    assert_eq!(both["prefetch"], "both");
    assert_eq!(both["pilot"]["recall"], pilot["pilot"]["recall"], "{both}");
    assert!(both["lookahead_control"].is_object() && pilot["lookahead_control"].is_null());
    assert_eq!(both["lru_slots_per_layer"], pilot["lru_slots_per_layer"]);
    assert_eq!(both["hit_rate"], pilot["hit_rate"], "{both} {pilot}");
    let m = |k: &str| both[k].as_u64().unwrap_or_else(|| panic!("{k}: {both}"));
    assert_eq!(
        m("prefetch_issued"),
        m("prefetch_used") + m("prefetch_wasted")
    );
    assert!(
        off["pilot"].is_null() && off["prefetch_issued"] == 0,
        "{off}"
    );
    // The predictions are the trace model's own (the int4 model re-running the trace's texts:
    // most of its routes agree with the bf16-recorded trace, and its early router names more
    // than half of what the next layer chose).
    let p = &pilot["pilot"];
    assert!(
        p["route_agreement_with_trace"].as_f64().unwrap() > 0.85,
        "{p}"
    );
    assert!(p["recall"].as_f64().unwrap() > 0.5, "{p}");
    // Every read started ahead is requested or dropped; unstarted wrong guesses were cancelled.
    let n = |k: &str| pilot[k].as_u64().unwrap_or_else(|| panic!("{k}: {pilot}"));
    assert!(n("prefetch_used") > 0, "{pilot}");
    assert_eq!(
        n("prefetch_issued"),
        n("prefetch_used") + n("prefetch_wasted"),
        "{pilot}"
    );
    // Its slots come out of the LRU's budget.
    assert!(
        pilot["lru_slots_per_layer"].as_u64() < off["lru_slots_per_layer"].as_u64(),
        "{pilot}"
    );
}

#[test]
fn bench_replay_prefill_reads_each_touched_expert_once() {
    // Expert bytes read by a 96-token prefill ÷ one read of every expert it touches, under a
    // budget 8 MiB above the least the planner accepts (which depends on the core count): a
    // cache too small for the prompt's experts, so chunking shows.
    let bench = |budget: &str, chunk: &str| {
        nectar(&[
            "bench",
            "replay",
            "--model",
            &e256(),
            "--memory-budget",
            budget,
            "--prompt-rows",
            "96",
            "--prefill-chunk",
            chunk,
            "--json",
        ])
    };
    // (`serve`'s plan, which `--prefill-chunk` loads with, needs the most).
    let (refused, _, err) = bench("1M", "16");
    assert!(!refused, "{err}");
    let least = needed(&err);
    let budget = (least + (8 << 20)).to_string();
    let run = |chunk: &str| {
        let (ok, out, err) = bench(&budget, chunk);
        assert!(ok, "{err}");
        let r = json(&out)["prefill"][0].clone();
        (
            r["read_ratio_to_touched"].as_f64().unwrap(),
            r["steps"].as_u64().unwrap(),
        )
    };
    // One forward: every touched expert read exactly once per layer.
    let (whole, _) = run("0");
    assert!((0.999..=1.001).contains(&whole), "{whole}");
    // Through the server's batch with 16 tokens' worth of work per step: the prompt runs
    // layer-major over several steps and still reads each touched expert once per layer (fed
    // as 16-token chunks through the main forward, it read more than 1.2×: the old test).
    let (batched, steps) = run("16");
    assert!((0.999..=1.001).contains(&batched), "{batched}");
    assert!(steps > 4, "{steps}");
}

#[test]
fn fit_projects_decode_and_prefill_speed() {
    let v = e256_projection(&["--prefetch", "lookahead"]);
    let p = &v["projection"];
    assert!(p["lru_slots_per_layer"].as_u64().unwrap() >= 1);
    assert!(p["decode_tok_s"]["mtp_off"].as_f64().unwrap() > 0.0, "{p}");
    // The hit rate is route256 through the default policy at the plan's slots: the same figure
    // `bench policy` prints for that slot count.
    let slots = p["lru_slots_per_layer"].as_u64().unwrap().to_string();
    let (ok, out, err) = nectar(&[
        "bench",
        "policy",
        "--kinds",
        "decode",
        "--slots",
        &slots,
        "--admission",
        "predictive",
        "--json",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        p["hit_rate"]["mtp_off"],
        json(&out)["results"][0]["hit_rate"],
        "{p}"
    );
    assert!(v["machine"]["disk_gbps"].as_f64().unwrap() > 0.0);
    // The kernel's share of the read reference is a share: a reference that reads below the
    // kernel is measured again or replaced by the kernel's rate, and says which.
    let share = v["machine"]["kernel_share_of_read_bandwidth"]
        .as_f64()
        .unwrap();
    assert!(share > 0.0 && share <= 1.0, "{v}");
    let from = v["machine"]["read_reference"].as_str().unwrap();
    assert!(from == "read" || (from == "kernel" && share == 1.0), "{v}");
    // The calibration decodes with the trace's routes in place of the model's routers, under
    // the budget: it reads experts, and the overlap it measured (when it read enough to tell)
    // is a share, the one the projection used.
    let c = &v["machine"]["calibration"];
    assert!(c["routes"].as_str().unwrap().contains("route256"), "{c}");
    assert!(c["read_gb_per_token"].as_f64().unwrap() > 0.0, "{c}");
    let eta = v["machine"]["moe_overlap"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&eta), "{v}");
    assert_eq!(c["moe_overlap"].as_f64().unwrap_or(0.0), eta, "{v}");
    // η's denominator is measured: without prefetch every read is in flight inside a MoE
    // block, so the blocks last at least as long as the disk was busy.
    let secs = |k: &str| c[k].as_f64().unwrap();
    assert!(
        secs("moe_block_s_per_token") >= 0.98 * secs("disk_busy_s_per_token"),
        "{c}"
    );
    assert_eq!(v["projection"]["moe_overlap"].as_f64(), Some(eta), "{v}");
    // Look-ahead is calibrated by a second decode with it on, after the first prompt: the
    // share of its reads' disk time inside attention is a share, and the one the projection
    // credits (0 where it read too little ahead to tell).
    let la = &c["lookahead"];
    assert!(la["prompt_rows"].as_u64().unwrap() >= 8, "{c}");
    assert!(
        la["prefetched"].as_u64().unwrap() <= la["reads"].as_u64().unwrap(),
        "{c}"
    );
    let r = v["machine"]["lookahead_hidden"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&r), "{v}");
    assert_eq!(la["hidden"].as_f64().unwrap_or(0.0), r, "{v}");
    assert_eq!(
        p["prefetch"]["hidden_in_attention"].as_f64(),
        Some(r),
        "{p}"
    );
    // GLM-5.2's constants on a described machine (every speed given, so nothing measured here
    // enters the decode figure): 32 GB is disk-bound, so a faster disk projects faster.
    let glm = |disk: &str| {
        glm52_projection(&[
            "--memory-budget",
            "29G",
            "--disk-gbps",
            disk,
            "--mem-gbps",
            "65",
            "--kernel-share",
            "0.6",
            "--prefetch",
            "lookahead",
        ])
    };
    let (slow, fast) = (glm("7"), glm("14"));
    let tok_s = |p: &serde_json::Value| p["decode_tok_s"]["mtp_off"].as_f64().unwrap();
    assert!(tok_s(&fast) > tok_s(&slow));
    // With look-ahead the projection also gives the same machine without it, which is the
    // `--prefetch off` projection. Nothing calibrated and no --lookahead-hidden:
    // reads ahead get no credit, so their wasted reads make look-ahead no faster; with a share
    // of them hidden behind attention it helps this disk-bound plan.
    let off = glm52_32g(&["--prefetch", "off"]);
    let without = slow["decode_tok_s_without_lookahead"].as_f64().unwrap();
    assert!(
        (without - tok_s(&off)).abs() <= 1e-9 * without,
        "{slow} {off}"
    );
    assert_eq!(slow["prefetch"]["hidden_in_attention"], 0.0, "{slow}");
    assert!(tok_s(&slow) <= without, "{slow}");
    let hidden = glm52_32g(&["--prefetch", "lookahead", "--lookahead-hidden", "0.13"]);
    assert!(tok_s(&hidden) > without, "{hidden}");
    assert!(off["decode_tok_s_without_lookahead"].is_null(), "{off}");
    // The default is `run`'s, both (projected as PILOT); a look-ahead figure beside it, or a
    // PILOT figure beside look-ahead, would be ignored, so each is refused by name.
    assert_eq!(glm52_32g(&[])["prefetch"]["mode"], "both");
    let err = glm52_refused(&["--lookahead-hidden", "0.13"]);
    assert!(
        err.contains("--prefetch lookahead") && err.contains("`both`"),
        "{err}"
    );
    let err = glm52_refused(&["--prefetch", "lookahead", "--pilot-waste", "0.1"]);
    assert!(
        err.contains("--pilot-waste") && err.contains("`lookahead`"),
        "{err}"
    );
    // MTP off does not load the MTP layer: its ~1 GB buys the main layers an 11th slot at 29
    // GiB (the g64 spine, 10.6 GB, counted from GLM-5.2's matrices).
    assert_eq!(slow["lru_slots_per_layer"], 11, "{slow}");
    assert_eq!(slow["lru_slots_per_layer_mtp_on"], 10, "{slow}");
    let (ok, _, err) = nectar(&["fit", "--geometry", "glm52", "--project"]);
    assert!(!ok && err.contains("--disk-gbps"), "{err}");
}

/// Prefill projects attention beside the products: GLM-5.2's attention work (quadratic up to
/// the DSA top k, 2,048) at the attention rate given, so its share of the time grows with the
/// prompt, halves its seconds when the rate doubles, and a prompt past 2,340 tokens rebuilds
/// K/V in blocks.
#[test]
fn fit_projects_prefill_attention() {
    let at = |attn: &str| glm52_32g(&["--gflops", "1000", "--attn-gflops", attn]);
    let (slow, fast) = (at("50"), at("100"));
    let secs =
        |p: &serde_json::Value, n: &str, k: &str| p["prefill_seconds"][n][k].as_f64().unwrap();
    // 78 layers × Σ_{i<2048}(i + 1) keys × 64 heads × 2 × (192 + 64 + 256) FLOPs at 50 GFLOP/s.
    let want = 78.0 * 2048.0 * 2049.0 / 2.0 * 64.0 * 1024.0 / 50e9;
    assert!(
        (secs(&slow, "2048", "attention_s") - want).abs() < 1e-9 * want,
        "{slow}"
    );
    assert!(
        (secs(&fast, "2048", "attention_s") * 2.0 - want).abs() < 1e-9 * want,
        "{fast}"
    );
    let share = |n: &str| {
        secs(&slow, n, "attention_s")
            / (secs(&slow, n, "products_s")
                + secs(&slow, n, "attention_s")
                + secs(&slow, n, "reads_s"))
    };
    assert!(
        share("512") < share("2048") && share("2048") < share("8192"),
        "{slow}"
    );
    // K/V are rebuilt in blocks of 2,340 keys (256 MiB at GLM-5.2's width).
    assert_eq!(slow["prefill_seconds"]["2048"]["kv_blocks"], 1);
    assert_eq!(slow["prefill_seconds"]["8192"]["kv_blocks"], 4);
    let tok_s = |p: &serde_json::Value| p["prefill_tok_s"]["2048"].as_f64().unwrap();
    assert!(tok_s(&fast) > tok_s(&slow), "{slow} {fast}");
}

#[test]
fn run_reports_how_much_of_the_slab_huge_pages_back() {
    let (ok, out, err) = nectar(&[
        "run",
        "--model",
        &e256(),
        "--memory-budget",
        "200M",
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "2",
        "--no-usage-save",
        "--json",
    ]);
    assert!(ok, "{err}");
    let r = &json(&out)["stats"]["residency"];
    let slab = r["slab_bytes"].as_u64().unwrap();
    assert!(slab > 0, "{r}");
    // On Linux how much of it huge pages back is read from smaps (the kernel may grant none).
    assert_eq!(
        r["slab_huge_page_bytes"].is_u64(),
        cfg!(target_os = "linux"),
        "{r}"
    );
}

#[test]
fn fit_projects_per_layer_compute_and_look_ahead_overlap() {
    // GLM-5.2 on a described machine, every speed given: nothing measured here enters.
    let project = |extra: &[&str]| glm52_32g(&[&["--gflops", "500"], extra].concat());
    let tok = |p: &serde_json::Value| p["decode_tok_s"]["mtp_off"].as_f64().unwrap();
    let base = project(&["--layer-overhead-ms", "0", "--prefetch", "off"]);
    let slow = project(&["--layer-overhead-ms", "2", "--prefetch", "off"]);
    let lookahead = |extra: &[&str]| {
        let la = ["--layer-overhead-ms", "2", "--prefetch", "lookahead"];
        project(&[&la[..], extra].concat())
    };
    let ahead = |r: &str| lookahead(&["--lookahead-hidden", r]);
    let (ahead, all, none) = (ahead("0.5"), ahead("1"), ahead("0"));
    // Compute beyond the weights lengthens the serial part of every forward.
    assert!(tok(&slow) < tok(&base), "{slow} {base}");
    // Without --context, no long-context figure.
    assert!(base.get("context").is_none(), "{base}");
    assert_eq!(slow["layer_overhead_ms"], 2.0);
    // Look-ahead reads part of the misses behind attention: faster the more of
    // their disk time hides there, never above the overlap ceiling, and it pays with a few
    // wasted reads — all it does when none hides.
    let phi = ahead["prefetch"]["coverage"].as_f64().unwrap();
    let w = ahead["prefetch"]["wasted_per_miss"].as_f64().unwrap();
    assert!(phi > 0.3 && w > 0.0 && w < 0.1, "{ahead}");
    assert!(tok(&none) <= tok(&slow), "{none} {slow}");
    assert!(tok(&ahead) > tok(&slow), "{ahead} {slow}");
    assert!(tok(&all) > tok(&ahead), "{all} {ahead}");
    assert!(tok(&all) <= all["overlap_ceiling_tok_s"].as_f64().unwrap() + 1e-9);
    // MTP on has its own ceiling (τ tokens a verify and draft, each taking only its slower
    // resource), never below its own projection.
    for x in [&base, &slow, &ahead, &all, &none] {
        let c_on = x["overlap_ceiling_tok_s_mtp_on"].as_f64().unwrap();
        assert!(
            x["decode_tok_s"]["mtp_on"].as_f64().unwrap() <= c_on + 1e-9,
            "{x}"
        );
    }
    assert_eq!(slow["prefetch"]["coverage"], 0.0);
    // Nothing to calibrate on and no flag: the MoE block hides no reads (the serial end). Reads
    // hidden behind the whole block save its compute time on this disk-bound machine.
    assert_eq!(slow["moe_overlap"], 0.0);
    let hidden = project(&[
        "--layer-overhead-ms",
        "2",
        "--prefetch",
        "off",
        "--moe-overlap",
        "1",
    ]);
    let half = project(&[
        "--layer-overhead-ms",
        "2",
        "--prefetch",
        "off",
        "--moe-overlap",
        "0.5",
    ]);
    assert!(
        tok(&half) > tok(&slow) && tok(&hidden) > tok(&half),
        "{slow} {half} {hidden}"
    );
    assert!(tok(&hidden) <= hidden["overlap_ceiling_tok_s"].as_f64().unwrap() + 1e-9);
    // Wrong guesses cancelled before their read cost no disk time: with every one cancelled
    // the disk reads exactly what it reads without look-ahead, and the threshold may loosen.
    assert_eq!(ahead["prefetch"]["wrong_guesses_cancelled"], 0.0);
    let cancel = |c: &str| lookahead(&["--lookahead-hidden", "0.5", "--lookahead-cancelled", c]);
    let (most, every) = (cancel("0.9"), cancel("1"));
    let ssd = |p: &serde_json::Value| p["ssd_gb_per_token"]["mtp_off"].as_f64().unwrap();
    assert!((ssd(&every) - ssd(&slow)).abs() < 1e-9, "{every} {slow}");
    assert!(ssd(&most) < ssd(&ahead), "{most} {ahead}");
    assert!(tok(&most) > tok(&ahead), "{most} {ahead}");
    assert!(tok(&every) <= every["overlap_ceiling_tok_s"].as_f64().unwrap() + 1e-9);
    for (flag, bad) in [("--moe-overlap", "1.5"), ("--lookahead-cancelled", "2")] {
        let err = glm52_refused(&[flag, bad]);
        assert!(
            err.contains(&format!("'{bad}' for '{flag}")) && err.contains("within 0..1"),
            "{err}"
        );
    }
}

#[test]
fn fit_calibrates_pilot_on_the_trace_models_predictions() {
    for mode in ["pilot", "both"] {
        calibrates_pilot(mode);
    }
}

/// `mode`: `pilot`, or `both` (look-ahead beside PILOT, calibrated and projected alike).
fn calibrates_pilot(mode: &str) {
    // The route256 model is both the container and the trace's model: the PILOT calibration
    // decode replays that model's next-layer predictions over the trace's first conversation.
    let v = e256_projection(&["--prefetch", mode]);
    let (m, p) = (&v["machine"], &v["projection"]);
    let c = &m["calibration"]["pilot"];
    assert_eq!(c["mode"], mode, "{c}");
    assert_eq!(p["prefetch"]["mode"], mode, "{p}");
    let n = |k: &str| c[k].as_u64().unwrap();
    // It read ahead (the cache starts cold), and no more wrong guesses than it started.
    assert!(n("prefetched") >= 8 && n("prefetched") <= n("reads"), "{c}");
    assert!(n("wrong_guesses_read") <= n("prefetched"), "{c}");
    let (b, w) = (
        m["pilot_busy"].as_f64().unwrap(),
        m["pilot_waste"].as_f64().unwrap(),
    );
    assert!((0.0..=1.0).contains(&b) && b > 0.0, "{m}");
    assert_eq!(c["busy_in_attention"].as_f64(), Some(b), "{c}");
    // b is measured over the attention of the layers PILOT predicted (every MoE layer after
    // the first layer here: 7 of 8), whose halves are part of all the attention halves.
    let h = |k: &str| c["halves_ms_per_token"][k].as_f64().unwrap();
    assert!(h("predicted_attention") > 0.0, "{c}");
    assert!(h("predicted_attention") < h("attention"), "{c}");
    assert!(
        h("disk_busy_predicted_attention") <= h("disk_busy_attention") + 1e-9,
        "{c}"
    );
    let want_b = (h("disk_busy_predicted_attention") / h("predicted_attention")).min(1.0);
    assert!((b - want_b).abs() < 1e-9, "{c}");
    assert_eq!(
        p["prefetch"]["pilot"]["predicted_attention_share"].as_f64(),
        Some(7.0 / 8.0)
    );
    let want = n("wrong_guesses_read") as f64 / (n("reads") - n("wrong_guesses_read")) as f64;
    assert!((w - want).abs() < 1e-12, "{c}");
    // The projection uses what the calibration measured; no look-ahead decode ran.
    assert_eq!(
        p["prefetch"]["pilot"]["busy_in_attention"].as_f64(),
        Some(b)
    );
    assert_eq!(p["prefetch"]["pilot"]["wasted_per_read"].as_f64(), Some(w));
    assert!(m["calibration"]["lookahead"].is_null(), "{m}");
}

#[test]
fn fit_projects_pilot_from_its_busy_share_and_its_waste() {
    // GLM-5.2 on a described machine, every speed given: nothing measured here enters.
    // A budget whose plan keeps less spare than PILOT's 8 prefetch slots (170 MB) beside 12 LRU
    // slots a layer (the runtime reserve fixed by `--cores`).
    let project = |extra: &[&str]| {
        let machine = [
            "--memory-budget",
            "30400M",
            "--cores",
            "8",
            "--gflops",
            "500",
        ];
        let rest = ["--layer-overhead-ms", "2"];
        glm52_projection(&[&machine[..], &rest[..], &PCIE4_DDR5[..], extra].concat())
    };
    let tok = |p: &serde_json::Value| p["decode_tok_s"]["mtp_off"].as_f64().unwrap();
    let ssd = |p: &serde_json::Value| p["ssd_gb_per_token"]["mtp_off"].as_f64().unwrap();
    let pilot =
        |b: &str, w: &str| project(&["--prefetch", "pilot", "--pilot-busy", b, "--pilot-waste", w]);
    let off = project(&["--prefetch", "off"]);
    let (none, half, all) = (pilot("0", "0"), pilot("0.5", "0"), pilot("1", "0"));
    // PILOT's prefetch slots (one row's top-k) come out of the plan: one slot fewer per layer
    // here (12 at g64 without it).
    let slots = |p: &serde_json::Value| p["lru_slots_per_layer"].as_u64().unwrap();
    assert_eq!(slots(&off), 12, "{off}");
    assert_eq!(slots(&none), 11, "{none}");
    // Without busy time in attention PILOT is `off` at its slots (and says what that is);
    // the disk busy through more of attention hides more, never past the overlap ceiling.
    assert_eq!(none["prefetch"]["mode"], "pilot");
    assert_eq!(none["prefetch"]["pilot"]["busy_in_attention"], 0.0);
    // b is a share of the predicted layers' attention: GLM-5.2's MoE layers 3–77 of 78 (the
    // three dense layers before them have no prediction to read into their attention).
    assert_eq!(
        none["prefetch"]["pilot"]["predicted_attention_share"].as_f64(),
        Some(75.0 / 78.0)
    );
    let without = none["decode_tok_s_without_lookahead"].as_f64().unwrap();
    assert!((tok(&none) - without).abs() < 1e-12, "{none}");
    assert!(tok(&none) < tok(&off), "{none} {off}");
    assert!(
        tok(&half) > tok(&none) && tok(&all) > tok(&half),
        "{none} {half} {all}"
    );
    assert!(tok(&all) <= all["overlap_ceiling_tok_s"].as_f64().unwrap() + 1e-9);
    // Its wrong guesses read add their bytes and cost time on this disk-bound machine.
    let wasteful = pilot("0.5", "0.1");
    assert!(
        (ssd(&wasteful) - 1.1 * ssd(&half)).abs() < 1e-9 * ssd(&half),
        "{wasteful} {half}"
    );
    assert!(tok(&wasteful) < tok(&half), "{wasteful} {half}");
    // `both` is projected as PILOT at the b and w given (its own calibration measures them),
    // with the same slots taken.
    let both = project(&[
        "--prefetch",
        "both",
        "--pilot-busy",
        "0.5",
        "--pilot-waste",
        "0",
    ]);
    assert_eq!(both["prefetch"]["mode"], "both");
    assert_eq!(
        (slots(&both), tok(&both)),
        (slots(&half), tok(&half)),
        "{both} {half}"
    );
    // Look-ahead's figures do not enter a PILOT projection.
    assert_eq!(half["prefetch"]["lookahead"], false);
    assert_eq!(half["prefetch"]["coverage"], 0.0);
    for (flag, bad, why) in [
        ("--pilot-busy", "1.5", "within 0..1"),
        ("--pilot-waste", "inf", "0 or more"),
    ] {
        let err = glm52_refused(&["--prefetch", "pilot", flag, bad]);
        assert!(err.contains(flag) && err.contains(why), "{err}");
    }
}

#[test]
fn fit_projects_the_look_ahead_threshold_the_controller_settles_on() {
    // The same controller as the runtime's, on modelled windows: a saturated PCIe4 disk makes
    // it stricter than the start (8) and that pays; a 400 GB/s unified machine, whose serial
    // path needs the early reads, does not go stricter. Either way it settles on the fastest
    // threshold it visited. (The MoE block hides reads as designed and every read ahead hides
    // behind attention, so the small machine's disk is what binds.)
    let project = |budget: &str, disk: &str, mem: &str| {
        glm52_projection(&[
            "--memory-budget",
            budget,
            "--disk-gbps",
            disk,
            "--mem-gbps",
            mem,
            "--cores",
            "8",
            "--kernel-share",
            "0.6",
            "--layer-overhead-ms",
            "1.0",
            "--moe-overlap",
            "1",
            "--prefetch",
            "lookahead",
            "--lookahead-hidden",
            "1",
            "--gflops",
            "1000",
        ])
    };
    let tok = |p: &serde_json::Value| p["decode_tok_s"]["mtp_off"].as_f64().unwrap();
    let at = |p: &serde_json::Value, n: &str| {
        p["prefetch"]["per_threshold"][n]["decode_tok_s"]
            .as_f64()
            .unwrap()
    };
    let small = project("29G", "7", "65");
    let n = small["prefetch"]["min_context"].as_u64().unwrap();
    assert!(n > 8, "{small}");
    assert!(tok(&small) > at(&small, "8"), "{small}");
    let big = project("122G", "7", "400");
    assert!(
        big["prefetch"]["min_context"].as_u64().unwrap() <= 8,
        "{big}"
    );
    for p in [&small, &big] {
        let visited = p["prefetch"]["per_threshold"].as_object().unwrap();
        assert!(visited.len() >= 2, "{p}");
        for v in visited.values() {
            assert!(v["decode_tok_s"].as_f64().unwrap() <= tok(p) + 1e-12, "{p}");
        }
    }
}

#[test]
fn fit_projects_a_gpu_tier_from_the_card_described() {
    // GLM-5.2 with 64 GB of RAM, a PCIe4 disk and a 24 GB card, every speed given.
    let project = |extra: &[&str]| {
        let machine = [
            "--memory-budget",
            "61G",
            "--gflops",
            "1000",
            "--layer-overhead-ms",
            "1",
        ];
        glm52_projection(&[&machine[..], &PCIE4_DDR5[..], extra].concat())
    };
    let f = |v: &serde_json::Value| v.as_f64().unwrap();
    let cpu = project(&[]);
    let card = ["--gpu-memory", "21G", "--gpu-gbps", "380"];
    let fast = project(&[&card[..], &["--gpu-product-us", "15"]].concat());
    let slow = project(&[&card[..], &["--gpu-product-us", "60"]].concat());
    assert!(cpu["gpu"].is_null(), "{cpu}");
    let g = &fast["gpu"];
    // The spine (10.6 GB at g64) first, then whole experts evenly: (21 GiB − 10.6 GB) / 21.2
    // MB / 75 = 7.
    let spine = f(&g["spine_bytes"]);
    assert!((10.5e9..10.7e9).contains(&spine), "{g}");
    assert_eq!(g["experts_per_layer"], 7, "{g}");
    // Its host copies are released (all but kv_b's 0.64 GB): the 61G budget holds more slots.
    let released = f(&g["ram_released_bytes"]);
    assert!((released - (spine - 644_087_808.0)).abs() < 1.0, "{g}");
    let slots = |p: &serde_json::Value| p["lru_slots_per_layer"].as_u64().unwrap();
    assert!(slots(&fast) > slots(&cpu), "{fast} {cpu}");
    // Whole slot rows of the released bytes, and one more where they top up the CPU plan's
    // spare bytes to a row.
    let rows = released / 21.2e6 / 75.0;
    let more = (slots(&fast) - slots(&cpu)) as f64;
    assert!(more >= rows.floor() && more <= rows.ceil(), "{fast} {cpu}");
    assert!(
        g["vram_ranking"].as_str().unwrap().contains("prefill"),
        "{g}"
    );
    // The VRAM experts take part of every forward's requests off the RAM tier and the disk.
    let per = &g["experts_per_forward"];
    assert!(f(&per["gpu"]) > 0.0 && (f(&per["gpu"]) + f(&per["ram_tier"]) - 8.0).abs() < 1e-9);
    let gb = |p: &serde_json::Value| f(&p["ssd_gb_per_token"]["mtp_off"]);
    assert!(gb(&fast) < gb(&cpu), "{fast} {cpu}");
    // The spine off the CPU's memory bus raises the RAM wall; slower round trips lower it.
    let wall = |p: &serde_json::Value| f(&p["ram_wall_tok_s"]);
    assert!(
        wall(&fast) > wall(&cpu) && wall(&slow) < wall(&fast),
        "{fast} {slow} {cpu}"
    );
    let tok = |p: &serde_json::Value| f(&p["decode_tok_s"]["mtp_off"]);
    assert!(tok(&fast) > tok(&cpu), "{fast} {cpu}");
    // Experts not in VRAM stay on the CPU unless a copy rate is given; with one, part of each
    // layer's RAM-tier experts is copied to the card (where both sides finish soonest), which
    // raises the RAM wall; a link too slow to pay copies nothing.
    assert!(
        g["copies"].as_str().unwrap().contains("--gpu-copy-gbps"),
        "{g}"
    );
    let copying = |gbps: &str| {
        project(
            &[
                &card[..],
                &["--gpu-product-us", "15", "--gpu-copy-gbps", gbps],
            ]
            .concat(),
        )
    };
    let (link, crawl) = (copying("25"), copying("1"));
    let copied = |p: &serde_json::Value| f(&p["gpu"]["copies"]["copied_per_layer"]);
    let ram_tier = f(&link["gpu"]["experts_per_forward"]["ram_tier"]);
    assert!(copied(&link) > 0.0 && copied(&link) < ram_tier, "{link}");
    assert!(
        wall(&link) > wall(&fast) && tok(&link) >= tok(&fast),
        "{link} {fast}"
    );
    assert_eq!(copied(&crawl), 0.0, "{crawl}");
    assert_eq!(tok(&crawl), tok(&fast), "{crawl} {fast}");
    let err = glm52_refused(&["--gpu-copy-gbps", "25"]);
    assert!(err.contains("--gpu-memory"), "{err}");
    // The card's speeds are the user's to give (refused by name otherwise).
    let refused = |extra: &[&str]| {
        let base = [
            "fit",
            "--geometry",
            "glm52",
            "--memory-budget",
            "61G",
            "--project",
        ];
        let (ok, _, err) = nectar(&[&base[..], &["--disk-gbps", "7"], extra].concat());
        assert!(!ok, "{extra:?} accepted");
        err
    };
    let err = refused(&["--gpu-memory", "21G"]);
    assert!(err.contains("--gpu-gbps"), "{err}");
    // Prefill stays the CPU's unless the card's prefill speeds are given (and says so)...
    assert!(g["prefill"].as_str().unwrap().contains("CPU"), "{g}");
    let prefill = |us: &str, tflops: &str| {
        let extra = ["--gpu-prefill-us", us, "--gpu-attn-tflops", tflops];
        project(&[&card[..], &["--gpu-product-us", "30"], &extra[..]].concat())
    };
    let (base, slow_attn, slow_layers) = (
        prefill("20", "20"),
        prefill("20", "10"),
        prefill("40", "20"),
    );
    let at = |p: &serde_json::Value, n: &str, k: &str| f(&p["gpu"]["prefill"][n][k]);
    for n in ["512", "2048", "8192"] {
        let parts = ["compute_s", "attention_s", "reads_s"].map(|k| at(&base, n, k));
        let tokens: f64 = n.parse().unwrap();
        assert!(
            (at(&base, n, "tok_s") - tokens / parts.iter().sum::<f64>()).abs() < 1e-9,
            "{base}"
        );
        // ...each term from its own speed: 78 layers × P tokens × 20 µs; attention halves its
        // rate, doubles its seconds; reads are the CPU projection's, less the VRAM experts'
        // share (7 of 256), at the disk's rate.
        assert!((parts[0] - 78.0 * tokens * 20e-6).abs() < 1e-9, "{base}");
        assert!((at(&slow_attn, n, "attention_s") - 2.0 * parts[1]).abs() < 1e-9 * parts[1]);
        assert!((at(&slow_layers, n, "compute_s") - 2.0 * parts[0]).abs() < 1e-9);
        let cpu_reads = f(&base["prefill_seconds"][n]["reads_s"]);
        let vram = f(&base["gpu"]["experts_per_layer"]);
        assert!((parts[2] - cpu_reads * (1.0 - vram / 256.0)).abs() < 1e-9 * cpu_reads);
    }
    // One speed without the other, or without a GPU tier.
    let one = ["--gpu-product-us", "30", "--gpu-prefill-us", "20"];
    let err = refused(&[&card[..], &one[..]].concat());
    assert!(err.contains("--gpu-attn-tflops"), "{err}");
    let err = refused(&["--gpu-prefill-us", "20", "--gpu-attn-tflops", "20"]);
    assert!(err.contains("--gpu-memory"), "{err}");
}

/// `fit --geometry glm52` without `--project` prints GLM-5.2's memory plan (it used to plan the
/// demo model, ignoring the flag): the slots the projection uses at that budget, and the plan of
/// `serve --parallel N` with `--serve` (its rows' KV and working bank take slots).
/// The published per-row int4 artifact (`--geometry glm52-row`, 18.9 MB experts) against
/// Nectar's g64 conversion (21.2 MB) on the same 32 GB machine: more slots from the same RAM,
/// fewer bytes per miss, so more tokens per second — the plan's arithmetic, not a guess.
#[test]
fn fit_projects_the_per_row_artifact_from_its_expert_bytes() {
    let machine = [
        &["--memory-budget", "29G"][..],
        &PCIE4_DDR5[..],
        &[
            "--cores",
            "8",
            "--gflops",
            "1000",
            "--layer-overhead-ms",
            "1",
            "--moe-overlap",
            "0.76",
            // The plan of look-ahead (`both` keeps PILOT's 8 slots: 14 on 48 of the layers).
            "--prefetch",
            "lookahead",
        ],
    ]
    .concat();
    let project = |geometry: &str| {
        let mut all = vec!["fit", "--geometry", geometry, "--project", "--json"];
        all.extend_from_slice(&machine);
        let (ok, out, err) = nectar(&all);
        assert!(ok, "{err}");
        json(&out)
    };
    let (g64, row) = (project("glm52"), project("glm52-row"));
    let f = |v: &serde_json::Value, k: &str| v["projection"][k]["mtp_off"].as_f64().unwrap();
    let slots = |v: &serde_json::Value| v["projection"]["lru_slots_per_layer"].as_u64().unwrap();
    assert_eq!(slots(&g64), 11, "{g64}");
    assert_eq!(slots(&row), 13, "{row}");
    // What is left after the last whole row of slots holds a 12th (14th) on 45 (56) of the 75
    // layers, and the projection's hit rate counts them: 2 of 75 at a budget 300 MiB smaller.
    let share = |v: &serde_json::Value| f(v, "lru_extra_slot_share");
    assert!((share(&g64) - 45.0 / 75.0).abs() < 1e-9, "{g64}");
    assert!((share(&row) - 56.0 / 75.0).abs() < 1e-9, "{row}");
    let mut less = vec!["fit", "--geometry", "glm52-row", "--project", "--json"];
    less.extend_from_slice(&machine);
    less[6] = "28700M";
    let (ok, out, err) = nectar(&less);
    assert!(ok, "{err}");
    let less = json(&out);
    assert_eq!(slots(&less), 13, "{less}");
    assert!((share(&less) - 2.0 / 75.0).abs() < 1e-9, "{less}");
    assert!(
        f(&row, "hit_rate") > f(&less, "hit_rate") + 0.005,
        "{row} {less}"
    );
    assert!(
        row["geometry"].as_str().unwrap().contains("per row"),
        "{row}"
    );
    // Bytes per token from disk: (1 − hit) × 600 experts × the expert's bytes (a few per cent
    // more with look-ahead's wasted reads), so per miss the two differ by the experts' bytes.
    let per_miss = |v: &serde_json::Value| f(v, "ssd_gb_per_token") / (1.0 - f(v, "hit_rate"));
    assert!(per_miss(&g64) > 600.0 * 21.2e6 / 1e9, "{g64}");
    let ratio = per_miss(&row) / per_miss(&g64);
    assert!((ratio - 18.9 / 21.2).abs() < 0.01, "{ratio}");
    assert!(f(&row, "hit_rate") > f(&g64, "hit_rate"));
    let tok = |v: &serde_json::Value| v["projection"]["decode_tok_s"]["mtp_off"].as_f64().unwrap();
    assert!(
        tok(&row) > 1.05 * tok(&g64),
        "{} vs {}",
        tok(&row),
        tok(&g64)
    );
}

#[test]
fn fit_plans_the_geometry_it_is_given() {
    let plan = |extra: &[&str]| {
        let mut all = vec![
            "fit",
            "--geometry",
            "glm52",
            "--memory-budget",
            "29G",
            "--json",
        ];
        all.extend_from_slice(extra);
        let (ok, out, err) = nectar(&all);
        assert!(ok, "{err}");
        json(&out)
    };
    let run = plan(&[]);
    assert!(
        run["geometry"].as_str().unwrap().contains("GLM-5.2"),
        "{run}"
    );
    assert_eq!(run["sparse_layers"], 75, "{run}");
    assert_eq!(run["slot_bytes"], 21_200_000, "{run}");
    // `run`'s default is MTP off: the same slots as the projection's MTP-off plan.
    assert_eq!(run["lru_per_layer"], 11, "{run}");
    let on = plan(&["--mtp", "on"]);
    assert_eq!(on["lru_per_layer"], 10, "{on}");
    let serve = plan(&["--serve", "--parallel", "4"]);
    let slots = |v: &serde_json::Value| v["lru_per_layer"].as_u64().unwrap();
    assert!(slots(&serve) < slots(&on), "{serve}");
    let term = |v: &serde_json::Value, name: &str| {
        v["terms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["term"].as_str().unwrap().starts_with(name))
            .map(|t| t["bytes"].as_u64().unwrap())
            .unwrap()
    };
    assert_eq!(
        term(&serve, "KV cache"),
        5 * term(&on, "KV cache"),
        "{serve}"
    );
    // A lone client of that server (its row and the kept conversation) decodes, between
    // prompts, with the three idle rows' KV caches and activations, the prompt transients and
    // the bank's spare slots lent to the LRU: more slots than `--parallel 1`'s full plan, and
    // exactly a lone client of `--parallel 1` (which lends its transients).
    let lone = &serve["lone_client"];
    assert_eq!(lone["sequences_in_use"], 2, "{serve}");
    let lent = lone["lent_bytes"].as_u64().unwrap();
    assert!(lent > 3 * term(&on, "KV cache"), "{serve}");
    let one = plan(&["--serve", "--parallel", "1"]);
    let one_lone = &one["lone_client"];
    assert_eq!(
        one_lone["lent_bytes"].as_u64().unwrap() / 4096,
        term(&one, "prefill transients") / 4096,
        "{one}"
    );
    assert!(
        slots(lone) > slots(&serve) && slots(lone) >= slots(&one),
        "{serve}\n{one}"
    );
    for k in ["lru_per_layer", "lru_extra_layers"] {
        assert_eq!(lone[k], one_lone[k], "{serve}\n{one}");
    }
    assert!(plan(&[])["lone_client"].is_null(), "`run` is no server");
    let (ok, out, err) = nectar(&["fit", "--geometry", "glm52", "--memory-budget", "29G"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("GLM-5.2") && out.contains("75 layers"),
        "{out}"
    );
    let (ok, _, err) = nectar(&["fit", "--geometry", "glm5x", "--memory-budget", "29G"]);
    assert!(
        !ok && err.contains("unknown --geometry") && err.contains("glm52-row"),
        "{err}"
    );
    let (ok, _, err) = nectar(&["fit", "--geometry", "glm52", "--memory-budget", "8G"]);
    assert!(!ok && err.contains("needs at least"), "{err}");
}

/// A version-1 `.npy` file of `descr` and `shape` holding `data`.
fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(h.len() as u16).to_le_bytes());
    b.extend_from_slice(h.as_bytes());
    b.extend_from_slice(data);
    b
}

/// Two of route256's conversations served together, as `benchmarks/trace_interleave.py`'s
/// INTER writes them: both prompts, then the decode rows alternating (A1 B1 A2 B2 …), each
/// `decoded` long; with `streams`, `session.streams.npy` names each row's conversation. Every
/// expert id is moved by `shift` (mod 256): routes no model recorded.
fn interleaved_trace(dir: &std::path::Path, decoded: usize, streams: bool, shift: i16) {
    let src = root().join("tests/fixtures/traces/route256");
    let t = nectar_residency::trace::Trace::load(&src, "decode").unwrap();
    let tokens = t.tokens.as_ref().unwrap();
    let (a, b) = (&t.segments[0], &t.segments[1]);
    let decode = |s: &nectar_residency::trace::Segment| (s.start + s.warmup..).take(decoded);
    let mut rows: Vec<(usize, u16)> = Vec::new();
    rows.extend((a.start..a.start + a.warmup).map(|r| (r, 0)));
    rows.extend((b.start..b.start + b.warmup).map(|r| (r, 1)));
    for (x, y) in decode(a).zip(decode(b)) {
        rows.extend([(x, 0), (y, 1)]);
    }
    let (n, layers, k) = (rows.len(), t.layers.len(), t.top_k);
    let width = layers * k;
    let experts: Vec<u8> = rows
        .iter()
        .flat_map(|&(r, _)| &t.ids[r * width..(r + 1) * width])
        .map(|&e| match e {
            -1 => -1,
            e => (e as i16 + shift) % 256,
        })
        .flat_map(|e: i16| e.to_le_bytes())
        .collect();
    let toks: Vec<u8> = rows
        .iter()
        .flat_map(|&(r, _)| tokens[r].to_le_bytes())
        .collect();
    std::fs::create_dir_all(dir).unwrap();
    let shape = format!("({n}, {layers}, {k})");
    std::fs::write(
        dir.join("session.experts.npy"),
        npy("<i2", &shape, &experts),
    )
    .unwrap();
    std::fs::write(
        dir.join("session.tokens.npy"),
        npy("<u2", &format!("({n},)"), &toks),
    )
    .unwrap();
    let mut entry = serde_json::json!({
        "experts": "session.experts.npy",
        "tokens": "session.tokens.npy",
        "shape": [n, layers, k],
        "replay": {"reset": "never"},
        "segments": [{"start": 0, "end": n, "warmup": a.warmup + b.warmup}],
    });
    if streams {
        let s: Vec<u8> = rows.iter().flat_map(|&(_, s)| s.to_le_bytes()).collect();
        std::fs::write(
            dir.join("session.streams.npy"),
            npy("<u2", &format!("({n},)"), &s),
        )
        .unwrap();
        entry["streams"] = "session.streams.npy".into();
    }
    // The source's manifest (its format and model), with this one trace kind.
    let mut man: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("manifest.json")).unwrap()).unwrap();
    man["traces"] = serde_json::json!({ "session": entry });
    std::fs::write(dir.join("manifest.json"), man.to_string()).unwrap();
    std::fs::copy(src.join("model-config.json"), dir.join("model-config.json")).unwrap();
}

/// `bench replay --json` of the route256 model over a trace's `session` kind under 150M (a
/// budget where its experts stream), with a short raw-disk sample, plus `extra`.
fn replay_session(trace: &std::path::Path, extra: &[&str]) -> (bool, String, String) {
    let model = e256();
    let base = [
        "bench",
        "replay",
        "--model",
        &model,
        "--trace",
        trace.to_str().unwrap(),
        "--kind",
        "session",
        "--memory-budget",
        "150M",
        "--raw-seconds",
        "0.05",
        "--json",
    ];
    nectar(&[&base[..], extra].concat())
}

#[test]
fn bench_replay_decodes_a_batch_trace_one_row_per_sequence_a_step() {
    let tmp = tempfile::tempdir().unwrap();
    let (inter, flat) = (tmp.path().join("inter"), tmp.path().join("flat"));
    interleaved_trace(&inter, 12, true, 0);
    interleaved_trace(&flat, 12, false, 0);
    let replay = |trace: &std::path::Path, mtp: &str| {
        replay_session(
            trace,
            &[
                "--tokens",
                "12",
                "--mtp",
                mtp,
                "--prefetch",
                "off,lookahead,both",
            ],
        )
    };
    let (ok, out, err) = replay(&inter, "off");
    assert!(ok, "{err}");
    for run in json(&out)["runs"].as_array().unwrap() {
        // Two conversations of 12 tokens each, decoded together: 12 steps of two rows (one
        // token of each sequence), planned as `serve --parallel 2`.
        assert_eq!(run["batch"], 2, "{run}");
        assert_eq!(run["decode_tokens"], 24, "{run}");
        assert_eq!(run["decode_steps"], 12, "{run}");
        // A step's union holds both rows' experts: more than one row's 8, at most 16.
        let u = run["expert_union"]["plain_experts_per_layer"]
            .as_f64()
            .unwrap();
        assert!(u > 8.0 && u <= 16.0, "{run}");
        let (hit, opt) = (
            run["hit_rate"].as_f64().unwrap(),
            run["belady_hit_rate"].as_f64().unwrap(),
        );
        assert!(hit > 0.0 && hit <= opt + 1e-9, "{run}");
        // The runtime keeps each sequence's history apart as the policy's replay of the same
        // batch steps does (the trace's streams).
        let offline = run["policy_replay_hit_rate"].as_f64().unwrap();
        assert!((hit - offline).abs() <= 0.01, "{run}");
    }
    // PILOT's predictions come from the trace model re-running each sequence on its own
    // cache, as the server decodes them: its routes agree with the trace's as one
    // conversation's do (a run over the interleaved rows as one text agrees far less).
    let runs = json(&out)["runs"].as_array().unwrap().clone();
    let both = runs.iter().find(|r| r["prefetch"] == "both").unwrap();
    let p = &both["pilot"];
    assert!(
        p["route_agreement_with_trace"].as_f64().unwrap() > 0.85,
        "{p}"
    );
    assert!(p["recall"].as_f64().unwrap() > 0.5, "{p}");
    // The same rows without the streams file are one sequence: one row a step.
    let (ok, out, err) = replay(&flat, "off");
    assert!(ok, "{err}");
    let run = &json(&out)["runs"][0];
    assert_eq!(run["batch"], 1, "{run}");
    assert_eq!(run["decode_steps"], 12, "{run}");
    assert_eq!(run["expert_union"]["plain_experts_per_layer"], 8.0, "{run}");
    // A verify step is one sequence's: MTP on is refused for a batch trace, by name.
    let (ok, _, err) = replay(&inter, "on");
    assert!(
        !ok && err.contains("batch trace") && err.contains("--mtp off"),
        "{err}"
    );
    // One sequence planned as `serve --parallel 2` (a lone client of the server that decoded
    // the batch above) runs with the idle row's memory lent to the cache: two of three
    // sequences in use, more slots for its prompt than the batch's prompts had (this model's
    // KV cache is large beside its experts; between prompts both hold every expert, the
    // prompt transients lent too); fewer rows planned than the trace decodes is refused.
    let lone = |trace: &std::path::Path, parallel: &str| {
        let extra = ["--tokens", "4", "--prefetch", "off", "--parallel", parallel];
        replay_session(trace, &extra)
    };
    let (ok, out, err) = lone(&flat, "2");
    assert!(ok, "{err}");
    let alone = &json(&out)["runs"][0];
    let seqs = serde_json::json!({"in_use": 2, "planned": 3, "prompt": false});
    assert_eq!(alone["sequences"], seqs, "{alone}");
    let slots = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap();
    for r in [alone, &runs[0]] {
        let prompt = slots(r, "lru_slots_per_layer_prompt");
        assert!(prompt <= slots(r, "lru_slots_per_layer"), "{r}");
    }
    let prompt = "lru_slots_per_layer_prompt";
    assert!(
        slots(alone, prompt) > slots(&runs[0], prompt),
        "{alone}\n{}",
        runs[0]
    );
    let (ok, _, err) = lone(&inter, "1");
    assert!(!ok && err.contains("--parallel 1"), "{err}");
}

/// PILOT's arms replay the predictions of the model that recorded the trace: a predictor of
/// another expert universe is refused by name, and one whose own routes disagree with the
/// trace's (here: every expert id of the trace moved by 128) is named in a warning — its
/// predictions say nothing about these routes (before, both ran silently: recall 0.02).
#[test]
fn bench_replay_names_a_predictor_that_did_not_record_the_trace() {
    let tmp = tempfile::tempdir().unwrap();
    let (own, moved) = (tmp.path().join("own"), tmp.path().join("moved"));
    interleaved_trace(&own, 4, true, 0);
    interleaved_trace(&moved, 4, true, 128);
    let replay = |trace: &std::path::Path, predictor: &str| {
        let pilot = [
            "--tokens",
            "4",
            "--prefetch",
            "pilot",
            "--predictor",
            predictor,
        ];
        replay_session(trace, &pilot)
    };
    let demo = root().join("models/nectar-demo-glm5");
    let (ok, _, err) = replay(&own, demo.to_str().unwrap());
    assert!(
        !ok && err.contains("routes over 32 experts") && err.contains("over 256"),
        "{err}"
    );
    let (ok, out, err) = replay(&own, &e256());
    assert!(ok && !err.contains("warning: the predictor"), "{err}");
    let agree = |out: &str| json(out)["runs"][0]["pilot"]["route_agreement_with_trace"].as_f64();
    assert!(agree(&out).unwrap() > 0.85, "{out}");
    let (ok, out, err) = replay(&moved, &e256());
    assert!(ok, "{err}");
    assert!(agree(&out).unwrap() < 0.1, "{out}");
    assert!(
        err.contains("warning: the predictor") && err.contains("not the model that recorded"),
        "{err}"
    );
}
