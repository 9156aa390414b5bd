//! Crash safety: a process killed (SIGKILL) at a random moment while it saves a session over and
//! over leaves a file that loads and equals one of the snapshots it was saving. The child is this
//! test binary itself, running the ignored `child_saves_in_a_loop` test.

use nectar_engine::{ModelBundle, ModelIdentity, Session, SessionFormat};
use nectar_model::{NoObserver, SeqStep};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/nectar-demo-glm5");
const CHILD_ENV: &str = "NECTAR_TEST_SESSION_CRASH_FILE";

/// Two different sessions (different lengths and tokens) to alternate between.
fn snapshots(b: &ModelBundle) -> Vec<Session> {
    let toks = b
        .encode_text(
            "And God said, Let the waters under the heaven be gathered together unto one \
            place, and let the dry land appear: and it was so. And God called the dry land Earth; \
            and the gathering together of the waters called he Seas: and God saw that it was good.",
        )
        .unwrap();
    [toks.len() / 2, toks.len()]
        .iter()
        .map(|&n| {
            let mut cache = b.model.new_cache();
            b.model
                .forward(
                    &mut [SeqStep {
                        cache: &mut cache,
                        tokens: &toks[..n],
                    }],
                    &mut NoObserver,
                )
                .unwrap();
            Session::from_cache(toks[..n].to_vec(), cache).unwrap()
        })
        .collect()
}

#[test]
#[ignore = "the child half of killed_while_saving_leaves_a_loadable_snapshot"]
fn child_saves_in_a_loop() {
    let path =
        std::env::var(CHILD_ENV).expect("run by killed_while_saving_leaves_a_loadable_snapshot");
    let format = SessionFormat::from_path(Path::new(&path));
    let b = ModelBundle::open(Path::new(DEMO)).unwrap();
    let id = ModelIdentity::of(Path::new(DEMO), &b.model).unwrap();
    let snaps = snapshots(&b);
    for i in 0.. {
        snaps[i % 2]
            .save(Path::new(&path), format, &b.model, &id)
            .unwrap();
        println!("saved {i}");
    }
}

#[test]
fn killed_while_saving_leaves_a_loadable_snapshot() {
    let b = ModelBundle::open(Path::new(DEMO)).unwrap();
    let id = ModelIdentity::of(Path::new(DEMO), &b.model).unwrap();
    let snaps = snapshots(&b);
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    for name in ["crash.nkv", "crash.coli_kv"] {
        let path = dir.path().join(name);
        let format = SessionFormat::from_path(&path);
        let mut seen = [false; 2];
        for round in 0..8u64 {
            let mut child = Command::new(&exe)
                .args([
                    "--exact",
                    "child_saves_in_a_loop",
                    "--ignored",
                    "--nocapture",
                ])
                .args(["--test-threads", "1"])
                .env(CHILD_ENV, &path)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            // Wait for the first complete save, then let it run into a random point of a later one.
            let first = lines.find(|l| l.as_ref().is_ok_and(|l| l.starts_with("saved")));
            assert!(first.is_some(), "the child never saved");
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .subsec_nanos() as u64;
            std::thread::sleep(Duration::from_micros(
                (nanos / 1000 + round * 3_917) % 40_000,
            ));
            child.kill().unwrap(); // SIGKILL on Unix: no destructor, no flush.
            child.wait().unwrap();
            let loaded = Session::load(&path, format, &b.model, &id)
                .unwrap_or_else(|e| panic!("round {round}: {e}"))
                .session;
            let i = snaps
                .iter()
                .position(|s| s.tokens() == loaded.tokens())
                .unwrap_or_else(|| panic!("round {round}: tokens match no snapshot"));
            seen[i] = true;
            let (x, y) = (snaps[i].cache(), loaded.cache());
            for (l, (p, q)) in x.layers.iter().zip(&y.layers).enumerate() {
                assert!(
                    p.latent == q.latent && p.k_pe == q.k_pe,
                    "round {round} layer {l}"
                );
                assert_eq!(p.index_k, q.index_k, "round {round} layer {l}");
            }
        }
        eprintln!("{name}: loaded snapshots seen {seen:?}");
    }
}
