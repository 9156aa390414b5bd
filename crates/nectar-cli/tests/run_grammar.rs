//! `nectar run` structured-output flags end to end on the demo model.
mod common;
use common::{json, nectar};

#[test]
fn json_schema_file_gives_valid_json() {
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type":"object","properties":{"n":{"type":"integer","minimum":1,"maximum":9},
            "ok":{"type":"boolean"}},"required":["n","ok"],"additionalProperties":false}"#,
    )
    .unwrap();
    let (ok, out, err) = nectar(&[
        "run",
        "--chat",
        "hi",
        "--json",
        "--json-schema",
        schema.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(v["finish_reason"], "stop", "{v}");
    let doc = json(v["text"].as_str().unwrap());
    assert!((1..=9).contains(&doc["n"].as_i64().unwrap()), "{doc}");
    assert!(doc["ok"].is_boolean(), "{doc}");
    // `{"n":` is forced from the start.
    assert!(v["stats"]["forced_tokens"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn regex_and_grammar_flags_constrain_the_text() {
    let (ok, out, err) = nectar(&["run", "--json", "--regex", "(yes|no)![0-9]"]);
    assert!(ok, "{err}");
    let text = json(&out)["text"].as_str().unwrap().to_string();
    assert!(
        regex::Regex::new("^(yes|no)![0-9]$")
            .unwrap()
            .is_match(&text),
        "{text}"
    );
    let dir = tempfile::tempdir().unwrap();
    let lark = dir.path().join("g.lark");
    std::fs::write(&lark, "start: \"ab\" /[0-9]/\n").unwrap();
    let (ok, out, err) = nectar(&["run", "--json", "--grammar", lark.to_str().unwrap()]);
    assert!(ok, "{err}");
    let text = json(&out)["text"].as_str().unwrap().to_string();
    assert!(text.len() == 3 && text.starts_with("ab"), "{text}");
}

#[test]
fn bad_or_conflicting_structured_flags_fail_cleanly() {
    for (args, want) in [
        (&["--regex", "("][..], "regex"),
        (
            &["--regex", "a", "--json-object"][..],
            "cannot be used with",
        ),
        (
            &["--json-schema", "/nonexistent/s.json"][..],
            "/nonexistent/s.json",
        ),
    ] {
        let (ok, out, err) = nectar(&[&["run"][..], args].concat());
        assert!(!ok && err.contains(want), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?} printed {out}");
    }
}
