//! Writes every target's seeds into `DIR/TARGET/seed-N` (libFuzzer's starting corpus):
//! `cargo run -p nectar-fuzz --example write_corpus -- fuzz/corpus`.
fn main() {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or("fuzz/corpus".into()));
    for (name, _) in nectar_fuzz::TARGETS {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).expect("corpus directory");
        for (i, s) in nectar_fuzz::seeds(name).iter().enumerate() {
            std::fs::write(d.join(format!("seed-{i}")), s).expect("seed file");
        }
    }
}
