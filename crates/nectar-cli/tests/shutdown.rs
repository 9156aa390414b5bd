//! Shutdown joins the model thread: the usage ledger's last flush happens before the process
//! ends (it used to race the process exit and was lost whenever fewer than 10 s of serving had
//! passed since the last periodic flush).
mod common;

use common::root;
use common::server::Server;

#[test]
fn sigterm_flushes_the_usage_ledger_before_exit() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("demo");
    std::fs::create_dir(&model).unwrap();
    for e in std::fs::read_dir(root().join("models/nectar-demo-glm5")).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        // The model's files, not its ledger or stale temps.
        if e.file_type().unwrap().is_file() && !name.to_string_lossy().starts_with('.') {
            std::fs::copy(e.path(), model.join(&name)).unwrap();
        }
    }
    let ledger = model.join(".coli_usage");
    assert!(!ledger.exists());
    let m = model.to_str().unwrap();
    let mut s = Server::start(&["--model", m, "--memory-budget", "300M", "--parallel", "1"]);
    let body = r#"{"model":"demo","max_tokens":4,"messages":[{"role":"user","content":"Hi"}]}"#;
    let (st, out) = s.http("POST", "/v1/chat/completions", None, Some(body));
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&out));
    let status = s.terminate();
    assert!(status.success(), "{status:?}");
    let text = std::fs::read_to_string(&ledger).expect("the ledger was written at shutdown");
    assert!(text.lines().count() > 1, "{text}");
}
