//! One plan for `fit`, `run` and `serve`: the minimum `fit` prints is accepted, and `fit`'s
//! verdict is the plan that runs (`run --json`, `serve`'s `/stats`).
mod common;

use common::server::Server;
use common::{json, nectar, needed};

#[test]
fn the_minimum_fit_prints_is_accepted_by_run() {
    let (ok, _, err) = nectar(&["fit", "--memory-budget", "1M"]);
    assert!(!ok, "1 MiB cannot hold the demo model");
    let need = needed(&err);
    let run = |budget: u64| {
        nectar(&[
            "run",
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "2",
            "--no-usage-save",
            "--json",
            "--memory-budget",
            &budget.to_string(),
        ])
    };
    let (ok, out, err) = run(need);
    assert!(ok, "fit's minimum {need} B was refused:\n{err}");
    assert_eq!(json(&out)["stats"]["residency"]["lru_per_layer"], 1);
    let (ok, _, err) = run(need - 1);
    assert!(!ok && err.contains("needs at least"), "{err}");
    // The rounded-up text is enough too.
    let text = err.split("needs at least ").nth(1).unwrap();
    let typed = text.split(" (").next().unwrap().replace(' ', "");
    let (ok, _, err) = nectar(&[
        "run",
        "--prompt-ids",
        "1",
        "--max-tokens",
        "1",
        "--no-usage-save",
        "--memory-budget",
        &typed,
    ]);
    assert!(ok, "{typed} refused: {err}");
}

#[test]
fn mtp_off_leaves_the_mtp_layer_out_of_the_plan_and_its_minimum_is_exact() {
    let min = |mtp: &str| {
        let (ok, _, err) = nectar(&["fit", "--memory-budget", "1M", "--mtp", mtp]);
        assert!(!ok);
        needed(&err)
    };
    let (off, on) = (min("off"), min("on"));
    // The demo's MTP layer (its attention, int8 experts' slot row and working bank) is not
    // planned with --mtp off.
    assert!(off < on, "off {off} on {on}");
    // `fit` without --mtp plans `run`'s default, off.
    let (_, _, err) = nectar(&["fit", "--memory-budget", "1M"]);
    assert_eq!(needed(&err), off);
    let run = |budget: u64, mtp: &str| {
        nectar(&[
            "run",
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "3",
            "--no-usage-save",
            "--json",
            "--mtp",
            mtp,
            "--memory-budget",
            &budget.to_string(),
        ])
    };
    // Each minimum is accepted by run in its mode, and one byte less is refused; the off
    // minimum cannot hold the MTP layer.
    for (mtp, need) in [("off", off), ("on", on)] {
        let (ok, out, err) = run(need, mtp);
        assert!(
            ok,
            "--mtp {mtp}: fit's minimum {need} B was refused:\n{err}"
        );
        let stats = &json(&out)["stats"];
        assert_eq!(stats["residency"]["lru_per_layer"], 1);
        assert_eq!(
            stats["residency"]["mtp_tier"].is_null(),
            mtp == "off",
            "{stats}"
        );
        let (ok, _, err) = run(need - 1, mtp);
        assert!(!ok && err.contains("needs at least"), "{err}");
    }
    let (ok, _, err) = run(off, "on");
    assert!(!ok && err.contains("needs at least"), "{err}");
}

#[test]
fn fit_serve_is_the_plan_serve_runs() {
    let fit = |extra: &[&str]| {
        let mut args = vec![
            "fit",
            "--memory-budget",
            "400M",
            "--parallel",
            "2",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (ok, out, err) = nectar(&args);
        assert!(ok, "{err}");
        json(&out)
    };
    let s = Server::start(&["--memory-budget", "400M", "--parallel", "2", "--mtp", "off"]);
    let (st, body) = s.http("GET", "/stats", None, None);
    assert_eq!(st, 200);
    let stats = json(&String::from_utf8_lossy(&body));
    let served = &stats["model_info"]["memory_plan"];
    // `serve --mtp off` leaves the MTP layer out of memory; so does `fit --mtp off`.
    let planned = fit(&["--serve", "--mtp", "off"]);
    assert_eq!(
        planned["lru_per_layer"], served["lru_per_layer"],
        "{served}"
    );
    let terms = |v: &serde_json::Value| -> u64 {
        v.as_array()
            .unwrap()
            .iter()
            .map(|t| {
                t.get("bytes")
                    .or_else(|| t.get(1))
                    .unwrap()
                    .as_u64()
                    .unwrap()
            })
            .sum()
    };
    assert_eq!(terms(&planned["terms"]), terms(&served["terms"]));
    // Without --serve the plan is run's: one sequence fewer, so more slots.
    let run_plan = fit(&["--mtp", "off"]);
    assert!(
        run_plan["lru_per_layer"].as_u64() > planned["lru_per_layer"].as_u64()
            || terms(&run_plan["terms"]) < terms(&planned["terms"])
    );
}

#[test]
fn run_keeps_to_the_context_its_plan_reserved() {
    let run = |ctx: &str, ids: &str, max: &str| {
        nectar(&[
            "run",
            "--memory-budget",
            "400M",
            "--ctx-size",
            ctx,
            "--prompt-ids",
            ids,
            "--max-tokens",
            max,
            "--no-usage-save",
            "--json",
        ])
    };
    let (ok, _, err) = run("4", "1,2,3,4", "2");
    assert!(!ok && err.contains("--ctx-size 4"), "{err}");
    let (ok, out, err) = run("8", "1,2,3", "20");
    assert!(ok, "{err}");
    assert!(err.contains("stopping after 5 tokens"), "{err}");
    assert_eq!(json(&out)["tokens"].as_array().unwrap().len(), 5, "{out}");
    // Without a budget nothing is planned, so --ctx-size does not limit the run.
    let (ok, out, err) = nectar(&[
        "run",
        "--ctx-size",
        "8",
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "12",
        "--no-usage-save",
        "--json",
    ]);
    assert!(ok, "{err}");
    assert_eq!(json(&out)["tokens"].as_array().unwrap().len(), 12, "{out}");
}
