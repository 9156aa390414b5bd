//! `nectar run --mtp on|off|auto` and `--prompt-lookup`: same greedy output
//! as plain decoding, telemetry in `--json` stats, conflicting flags refused.
mod common;
use common::{code_long_ids, json, nectar};

fn run(extra: &[&str]) -> serde_json::Value {
    let p = code_long_ids();
    let mut args = vec!["run", "--json", "--max-tokens", "48", "--prompt-ids", &p];
    args.extend_from_slice(extra);
    let (ok, out, err) = nectar(&args);
    assert!(ok, "{extra:?}: {err}");
    json(&out)
}

#[test]
fn mtp_modes_give_the_plain_output_and_report_telemetry() {
    let off = run(&[]);
    assert_eq!(off["stats"]["mtp"]["mode"], "off");
    assert_eq!(off["stats"]["mtp"]["tokens_per_forward"], 1.0);
    // (flags, the γ they give): `on` defaults to 1, auto and lookup to 3.
    for (extra, gamma) in [
        (&["--mtp", "on"][..], 1),
        (&["--mtp", "on", "--draft-tokens", "3"], 3),
        (&["--mtp", "auto"], 3),
        (&["--mtp", "auto", "--draft-tokens", "2"], 2),
        (&["--prompt-lookup", "2"], 3),
    ] {
        let v = run(extra);
        assert_eq!(v["stats"]["mtp"]["gamma"], gamma, "{extra:?}");
        assert_eq!(v["tokens"], off["tokens"], "{extra:?}");
        let m = &v["stats"]["mtp"];
        let mode = if extra[0] == "--mtp" {
            "mtp"
        } else {
            "prompt-lookup"
        };
        assert_eq!(m["mode"], mode, "{m}");
        assert_eq!(m["auto"], extra[1] == "auto", "{m}");
        for key in [
            "gamma",
            "drafted",
            "accepted",
            "acceptance_rate",
            "tokens_per_forward",
            "main_forwards",
            "forwards_saved",
            "tok_s",
            "decisions",
        ] {
            assert!(!m[key].is_null(), "{key} missing: {m}");
        }
    }
}

#[test]
fn mtp_summary_goes_to_stderr() {
    let (ok, _, err) = nectar(&["run", "--mtp", "on", "--max-tokens", "16"]);
    assert!(ok, "{err}");
    assert!(err.contains("[mtp: γ="), "{err}");
    assert!(err.contains("tokens per forward"), "{err}");
}

#[test]
fn conflicting_or_bad_speculation_flags_are_refused() {
    for args in [
        &["run", "--mtp", "on", "--prompt-lookup", "2"][..],
        &["run", "--mtp", "auto", "--prompt-lookup", "2"],
        &["run", "--mtp", "on", "--draft-tokens", "4"],
        &["run", "--mtp", "on", "--draft-tokens", "0"],
        &["run", "--prompt-lookup", "0"],
        &["run", "--mtp", "sometimes"],
    ] {
        let (ok, _, err) = nectar(args);
        assert!(!ok, "{args:?} was accepted");
        assert!(err.contains("error"), "{args:?}: {err}");
    }
}
