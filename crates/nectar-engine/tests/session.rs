//! Sessions on the demo model: a restored session continues with bit-identical logits, a second
//! turn reuses the common prefix and decodes as a fresh run does, and files from another model,
//! truncated or damaged files are refused with errors that name the file.

use nectar_engine::{
    generate_with, ModelBundle, ModelIdentity, Request, Session, SessionFormat, Speculation,
    Speculator,
};
use nectar_model::{Glm5, MtpStep, NoObserver, SeqCache, SeqStep};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/nectar-demo-glm5");
const TEXT: &str = "In the beginning God created the heaven and the earth. And the earth was \
without form, and void; and darkness was upon the face of the deep. And the Spirit of God moved \
upon the face of the waters. And God said, Let there be light: and there was light. And God saw \
the light, that it was good: and God divided the light from the darkness. And God called the \
light Day, and the darkness he called Night. And the evening and the morning were the first day. \
And God said, Let there be a firmament in the midst of the waters, and let it divide the waters \
from the waters. And God made the firmament, and divided the waters which were under the \
firmament from the waters which were above the firmament: and it was so.";

fn bundle() -> &'static ModelBundle {
    static B: OnceLock<ModelBundle> = OnceLock::new();
    B.get_or_init(|| ModelBundle::open(Path::new(DEMO)).unwrap())
}

fn model() -> &'static Glm5 {
    &bundle().model
}

fn id() -> ModelIdentity {
    ModelIdentity::of(Path::new(DEMO), model()).unwrap()
}

/// More than `index_topk` (128) tokens, so the DSA indexer prunes.
fn long_prompt() -> Vec<u32> {
    let t = bundle().encode_text(TEXT).unwrap();
    assert!(t.len() > 170, "{} tokens", t.len());
    t
}

/// Runs `tokens` on `cache`; returns the post-norm hiddens.
fn run(cache: &mut SeqCache, tokens: &[u32]) -> Vec<f32> {
    model()
        .forward(&mut [SeqStep { cache, tokens }], &mut NoObserver)
        .unwrap()
}

/// Logits of each of `tokens`, one decode step at a time, as bit patterns.
fn decode_logits(cache: &mut SeqCache, tokens: &[u32]) -> Vec<Vec<u32>> {
    tokens
        .iter()
        .map(|&t| {
            let h = run(cache, &[t]);
            let l = model().logits(&h).unwrap();
            l.iter().map(|x| x.to_bits()).collect()
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn assert_cache_eq(a: &SeqCache, b: &SeqCache) {
    assert_eq!(a.layers.len(), b.layers.len());
    for (l, (x, y)) in a
        .layers
        .iter()
        .chain([&a.mtp])
        .zip(b.layers.iter().chain([&b.mtp]))
        .enumerate()
    {
        assert_eq!(x.len(), y.len(), "layer {l} length");
        assert_eq!(bits(&x.latent), bits(&y.latent), "layer {l} latent");
        assert_eq!(bits(&x.k_pe), bits(&y.k_pe), "layer {l} k_pe");
        assert_eq!(bits(&x.index_k), bits(&y.index_k), "layer {l} index_k");
        assert_eq!(x.gaps(), y.gaps(), "layer {l} gaps");
    }
}

/// The MTP layer's rows `from..to` of a sequence whose main forward gave hidden states `h`
/// (row i's next token is `toks[i + 1]`), appended to `c.mtp`.
fn mtp_rows(c: &mut SeqCache, h: &[f32], toks: &[u32], (from, to): (usize, usize)) {
    let hd = model().hidden_size();
    model()
        .mtp_forward(
            &mut [MtpStep {
                cache: c,
                hidden: &h[from * hd..to * hd],
                next_tokens: &toks[from + 1..=to],
            }],
            &mut NoObserver,
        )
        .unwrap();
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn restored_session_continues_with_identical_logits() {
    let toks = long_prompt();
    let dir = tmp();
    for (i, &len) in [1usize, 17, 128, 129, 160].iter().enumerate() {
        let next = &toks[len..len + 3];
        let mut a = model().new_cache();
        run(&mut a, &toks[..len]);
        let mut b = a.clone();
        let want = decode_logits(&mut a, next);

        // The MTP layer's cache travels too: absorb the prompt rows (row r: h_r, token r + 1).
        let h = run(&mut model().new_cache(), &toks[..len]);
        model()
            .mtp_forward(
                &mut [MtpStep {
                    cache: &mut b,
                    hidden: &h,
                    next_tokens: &toks[1..=len],
                }],
                &mut NoObserver,
            )
            .unwrap();
        let s = Session::from_cache(toks[..len].to_vec(), b).unwrap();
        assert_eq!(s.cache().mtp.len(), len - 1);
        for format in [SessionFormat::Nectar, SessionFormat::ColiKv] {
            let path = dir.path().join(format!("s{i}-{format:?}.coli_kv"));
            s.save(&path, format, model(), &id()).unwrap();
            let loaded = Session::load(&path, format, model(), &id()).unwrap();
            assert!(loaded.verified && !loaded.recomputed);
            let r = loaded.session;
            assert_eq!(r.tokens(), &toks[..len]);
            let mut want_cache = s.cache().clone();
            if format == SessionFormat::ColiKv {
                // .coli_kv carries no MTP cache.
                want_cache.mtp.truncate(0);
            }
            assert_cache_eq(r.cache(), &want_cache);
            let mut c = r.cache().clone();
            assert_eq!(
                decode_logits(&mut c, next),
                want,
                "{format:?} at {len} tokens"
            );
        }
    }
}

#[test]
fn a_session_with_mtp_rows_loads_into_a_process_that_skips_the_mtp_layer() {
    // `--mtp off` does not load the MTP layer; a session saved by a process that ran it keeps
    // its main-layer caches (the MTP rows are read, checksummed and dropped).
    let no_mtp = Glm5::load_with(
        Path::new(DEMO),
        &nectar_model::arch::glm5::LoadOptions {
            mtp: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!no_mtp.has_mtp() && model().has_mtp());
    let toks = long_prompt();
    let len = 40;
    let mut c = model().new_cache();
    let h = run(&mut c, &toks[..len]);
    mtp_rows(&mut c, &h, &toks, (0, len));
    let s = Session::from_cache(toks[..len].to_vec(), c).unwrap();
    assert_eq!(s.cache().mtp.len(), len - 1);
    let dir = tmp();
    let path = dir.path().join("with-mtp.nectar");
    s.save(&path, SessionFormat::Nectar, model(), &id())
        .unwrap();
    let loaded = Session::load(&path, SessionFormat::Nectar, &no_mtp, &id()).unwrap();
    assert!(loaded.verified && !loaded.recomputed);
    let r = loaded.session;
    assert!(r.cache().mtp.is_empty());
    let mut want = s.cache().clone();
    want.mtp.truncate(0);
    assert_cache_eq(r.cache(), &want);
    // The dropped rows were still checked: a flipped bit in them is refused.
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() - 32 - 4;
    bytes[at] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let err = Session::load(&path, SessionFormat::Nectar, &no_mtp, &id()).unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
}

#[test]
fn a_session_whose_mtp_cache_skips_rows_keeps_every_row_and_gap() {
    // The MTP drafter leaves rows out of its cache (spec/mtp.rs): rows 0..10, then 30..40.
    let toks = long_prompt();
    let len = 41;
    let mut c = model().new_cache();
    let h = run(&mut c, &toks[..len]);
    for span in [(0, 10), (30, 40)] {
        c.mtp.skip_to(span.0).unwrap();
        mtp_rows(&mut c, &h, &toks, span);
    }
    assert_eq!((c.mtp.len(), c.mtp.end(), c.mtp.contiguous()), (20, 40, 10));
    // A row's cache entries come from its own input and its true position (RoPE), not from
    // the rows before it: rows 30..40 equal those of a cache without the gap, bit for bit.
    let mut full = model().new_cache();
    run(&mut full, &toks[..len]);
    mtp_rows(&mut full, &h, &toks, (0, 40));
    let (m, f) = (&c.mtp, &full.mtp);
    let w = |v: &[f32]| v.len() / f.len();
    for (got, want) in [
        (&m.k_pe, &f.k_pe),
        (&m.latent, &f.latent),
        (&m.index_k, &f.index_k),
    ] {
        let d = w(want);
        assert_eq!(bits(&got[10 * d..]), bits(&want[30 * d..]));
    }
    let s = Session::from_cache(toks[..len].to_vec(), c).unwrap();
    assert_eq!(s.cache().mtp.end(), 40, "every row's next token is held");
    let dir = tmp();
    let path = dir.path().join("gap.nkv");
    s.save(&path, SessionFormat::Nectar, model(), &id())
        .unwrap();
    let r = Session::load(&path, SessionFormat::Nectar, model(), &id())
        .unwrap()
        .session;
    assert_cache_eq(r.cache(), s.cache());
    assert_eq!(r.cache().mtp.gaps(), [(10, 30)]);
    assert_eq!((r.cache().mtp.end(), r.cache().mtp.contiguous()), (40, 10));
    // A gap list that skip_to could not have made, or a position past the tokens, is refused
    // even with a valid checksum (the file's last 32 + 16 bytes: the checksum and the gap).
    let bytes = std::fs::read(&path).unwrap();
    for (pos, want) in [(5u64, "cache gap"), (41, "position 41")] {
        let mut b = bytes.clone();
        let at = b.len() - 32 - 8;
        b[at..at + 8].copy_from_slice(&pos.to_le_bytes());
        rehash(&mut b);
        std::fs::write(&path, &b).unwrap();
        let e = Session::load(&path, SessionFormat::Nectar, model(), &id()).unwrap_err();
        assert!(e.to_string().contains(want), "{e}");
    }
}

/// Recomputes a `.nkv` file's trailing SHA-256 after an edit.
fn rehash(b: &mut [u8]) {
    use sha2::Digest;
    let n = b.len() - 32;
    let sum = sha2::Sha256::digest(&b[..n]);
    b[n..].copy_from_slice(&sum);
}

/// A version-1 file (written before MTP gaps were saved: the same layout without a gap list)
/// still loads; its reserved field must be zero.
#[test]
fn a_version_1_session_still_loads() {
    let toks = long_prompt();
    let len = 20;
    let mut c = model().new_cache();
    let h = run(&mut c, &toks[..len]);
    mtp_rows(&mut c, &h, &toks, (0, len));
    let s = Session::from_cache(toks[..len].to_vec(), c).unwrap();
    let dir = tmp();
    let path = dir.path().join("v1.nkv");
    s.save(&path, SessionFormat::Nectar, model(), &id())
        .unwrap();
    let mut b = std::fs::read(&path).unwrap();
    assert_eq!(b[8..16], [2, 0, 0, 0, 0, 0, 0, 0], "version 2, no gaps");
    b[8] = 1;
    rehash(&mut b);
    std::fs::write(&path, &b).unwrap();
    let r = Session::load(&path, SessionFormat::Nectar, model(), &id())
        .unwrap()
        .session;
    assert_cache_eq(r.cache(), s.cache());
    assert_eq!(r.cache().mtp.len(), len - 1);
    b[12] = 1;
    rehash(&mut b);
    std::fs::write(&path, &b).unwrap();
    let e = Session::load(&path, SessionFormat::Nectar, model(), &id()).unwrap_err();
    assert!(e.to_string().contains("reserved"), "{e}");
}

fn greedy(prompt: &[u32], n: usize) -> Request {
    let mut r = Request::new(prompt.to_vec(), n);
    r.params.logprobs = Some(2);
    r
}

fn mtp() -> Speculation {
    Speculation {
        speculator: Speculator::Mtp { gamma: 2 },
        auto: false,
    }
}

#[test]
fn second_turn_reuses_the_prefix_and_matches_a_fresh_run() {
    let toks = long_prompt();
    let b = bundle();
    let dir = tmp();
    let path = dir.path().join("chat.nkv");
    for spec in [None, Some(mtp())] {
        let p1 = &toks[..140];
        let mut s = Session::new(model());
        let (g1, r1) = s
            .generate_spec(b, &greedy(p1, 6), spec.as_ref(), |_| Ok(true))
            .unwrap();
        assert_eq!(r1.main, 0);
        assert_eq!(g1.prompt_tokens, 140);
        assert_eq!(
            s.tokens().len(),
            140 + 6 - 1,
            "all but the last generated token"
        );
        s.save(&path, SessionFormat::Nectar, model(), &id())
            .unwrap();
        let mut restored = Session::load(&path, SessionFormat::Nectar, model(), &id())
            .unwrap()
            .session;
        let mut in_memory = s.clone();

        let mut p2 = p1.to_vec();
        p2.extend_from_slice(&g1.tokens);
        p2.extend_from_slice(&toks[140..150]);
        let (g2, r2) = restored
            .generate_spec(b, &greedy(&p2, 8), spec.as_ref(), |_| Ok(true))
            .unwrap();
        let (g2m, r2m) = in_memory
            .generate_spec(b, &greedy(&p2, 8), spec.as_ref(), |_| Ok(true))
            .unwrap();
        let fresh = generate_with(
            model(),
            b.tokenizer.as_ref(),
            &b.stop_ids,
            &greedy(&p2, 8),
            |_| Ok(true),
        )
        .unwrap();
        assert_eq!(r2.common, 140 + 5);
        // Every cached token is reused, MTP drafting or not: the MTP cache may skip rows, so
        // the main cache is not cut back to it.
        assert_eq!(r2.main, 140 + 5, "{spec:?}");
        assert!(r2.mtp <= r2.main, "{r2:?}");
        assert_eq!(g2.prompt_tokens, p2.len() - r2.main);
        // The file keeps every MTP row and its gaps (with MTP drafting the drafter skipped all
        // but the prompt's last rows), so the restored session reuses what the live one does.
        assert_eq!(r2, r2m);
        // Restored vs never saved: bit for bit.
        assert_eq!(g2.tokens, g2m.tokens);
        for (x, y) in g2.logprobs.iter().zip(&g2m.logprobs) {
            assert_eq!(x.logprob.to_bits(), y.logprob.to_bits());
            assert_eq!(x.top, y.top);
        }
        // Reused vs from scratch: the same greedy tokens; logits agree to rounding (a prefill
        // and single-token decoding take different attention forms).
        assert_eq!(g2.tokens, fresh.tokens, "{spec:?}");
        for (x, y) in g2.logprobs.iter().zip(&fresh.logprobs) {
            assert!(
                (x.logprob - y.logprob).abs() < 1e-3,
                "{} vs {}",
                x.logprob,
                y.logprob
            );
        }

        // A prompt the session holds entirely still runs its last token for the logits.
        let p3 = restored.tokens().to_vec();
        let (g3, r3) = restored
            .generate_spec(b, &greedy(&p3, 2), None, |_| Ok(true))
            .unwrap();
        assert_eq!((r3.common, r3.main), (p3.len(), p3.len() - 1));
        let fresh3 =
            generate_with(model(), None, &b.stop_ids, &greedy(&p3, 2), |_| Ok(true)).unwrap();
        assert_eq!(g3.tokens, fresh3.tokens);
    }
}

/// A copy of the demo directory with `edit` applied to one file (`model.safetensors` linked).
fn edited_dir(root: &Path, file: &str, edit: impl Fn(Vec<u8>) -> Vec<u8>) -> PathBuf {
    let d = root.join(file.replace('.', "_"));
    std::fs::create_dir_all(&d).unwrap();
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        let src = Path::new(DEMO).join(f);
        let bytes = std::fs::read(&src).unwrap();
        let bytes = if f == file { edit(bytes) } else { bytes };
        std::fs::write(d.join(f), bytes).unwrap();
    }
    d
}

#[test]
fn a_file_from_another_model_is_refused_naming_the_part() {
    let dir = tmp();
    let mut cache = model().new_cache();
    let toks = long_prompt();
    run(&mut cache, &toks[..20]);
    let s = Session::from_cache(toks[..20].to_vec(), cache).unwrap();
    let path = dir.path().join("s.nkv");
    let coli = dir.path().join("s.coli_kv");
    s.save(&path, SessionFormat::Nectar, model(), &id())
        .unwrap();
    s.save(&coli, SessionFormat::ColiKv, model(), &id())
        .unwrap();

    let config = edited_dir(dir.path(), "config.json", |b| {
        let mut v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        v["nectar_test_note"] = serde_json::json!("a different config file");
        serde_json::to_vec(&v).unwrap()
    });
    let tokenizer = edited_dir(dir.path(), "tokenizer.json", |mut b| {
        b.push(b'\n');
        b
    });
    // The same bytes with one bf16 tensor relabelled as f16: another storage layout.
    let quant = edited_dir(dir.path(), "model.safetensors", |mut b| {
        let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        let head = std::str::from_utf8(&b[8..8 + n]).unwrap();
        let at = 8 + head.find("\"BF16\"").unwrap();
        b[at..at + 6].copy_from_slice(b"\"F16\" ");
        b
    });
    let cases = [
        (ModelIdentity::of(&config, model()).unwrap(), "config.json"),
        (
            ModelIdentity::of(&tokenizer, model()).unwrap(),
            "tokenizer.json",
        ),
        (
            ModelIdentity::of_catalog(&quant, &nectar_format::Catalog::open(&quant).unwrap())
                .unwrap(),
            "quantisation layout",
        ),
    ];
    for (other, part) in cases {
        assert_ne!(other, id());
        for (p, f) in [
            (&path, SessionFormat::Nectar),
            (&coli, SessionFormat::ColiKv),
        ] {
            let e = Session::load(p, f, model(), &other)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(part) && e.contains(&p.display().to_string()),
                "{e}"
            );
        }
    }
    // Without its sidecar a .coli_kv cannot be checked: it loads, marked unverified.
    std::fs::remove_file(nectar_engine::coli_kv::sidecar(&coli)).unwrap();
    let l = Session::load(&coli, SessionFormat::ColiKv, model(), &id()).unwrap();
    assert!(!l.verified);
}

#[test]
fn truncated_and_corrupt_files_are_refused_naming_the_file() {
    let dir = tmp();
    let toks = long_prompt();
    let mut cache = model().new_cache();
    run(&mut cache, &toks[..30]);
    let s = Session::from_cache(toks[..30].to_vec(), cache).unwrap();
    for format in [SessionFormat::Nectar, SessionFormat::ColiKv] {
        let good = dir.path().join(format!("good-{format:?}"));
        s.save(&good, format, model(), &id()).unwrap();
        let bytes = std::fs::read(&good).unwrap();
        let bad = dir.path().join(format!("bad-{format:?}"));
        let side = nectar_engine::coli_kv::sidecar(&good);
        if side.exists() {
            std::fs::copy(&side, nectar_engine::coli_kv::sidecar(&bad)).unwrap();
        }
        let mut flipped = bytes.clone();
        let mid = bytes.len() / 2;
        flipped[mid] ^= 0x40;
        let mut magic = bytes.clone();
        magic[0] = b'X';
        let mut cases: Vec<(Vec<u8>, &str)> = vec![
            (Vec::new(), "truncated"),
            (bytes[..7].to_vec(), "truncated"),
            (bytes[..bytes.len() / 2].to_vec(), "truncated"),
            (bytes[..bytes.len() - 1].to_vec(), "truncated"),
            (magic, "bad magic"),
        ];
        if format == SessionFormat::Nectar {
            // The Nectar format's checksum catches a flipped bit anywhere.
            cases.push((flipped, "checksum"));
            let mut version = bytes.clone();
            version[8] = 9;
            cases.push((version, "version 9"));
            let mut tail = bytes.clone();
            tail.push(0);
            cases.push((tail, "after the data"));
            // A header announcing a huge session is refused before anything is allocated.
            let mut huge = bytes.clone();
            huge[128..136].copy_from_slice(&(u64::MAX / 8).to_le_bytes());
            cases.push((huge, "overflow"));
        } else {
            let mut nrec = bytes.clone();
            nrec[32..36].copy_from_slice(&i32::MAX.to_le_bytes());
            cases.push((nrec, "truncated"));
            // The sidecar's checksum catches a flipped bit in a record.
            cases.push((flipped, "SHA-256 differs"));
        }
        for (b, want) in cases {
            std::fs::write(&bad, &b).unwrap();
            let e = Session::load(&bad, format, model(), &id())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(want) && e.contains(&bad.display().to_string()),
                "{format:?}: {e}"
            );
        }
    }
}

#[test]
fn coli_kv_written_by_hand_per_the_spec_parses() {
    let dims = model().cache_dims();
    let vocab = model().vocab_size();
    let indexed: Vec<usize> = (0..dims.index.len())
        .filter(|&l| dims.index[l] > 0)
        .collect();
    let hd = dims.index[indexed[0]];
    let toks = [5u32, 7, 11];
    let val = |r: usize, l: usize, kind: usize, j: usize| {
        (r * 100_000 + l * 1000 + kind * 200 + j) as f32
    };
    let build = |with_keys: bool| {
        let mut b = b"COLIKV1\0".to_vec();
        let header = [
            dims.index.len(),
            dims.latent,
            dims.rope,
            if with_keys { hd } else { 0 },
            if with_keys { indexed.len() } else { 0 },
            vocab,
            toks.len(),
            0,
        ];
        for v in header {
            b.extend((v as i32).to_le_bytes());
        }
        for (r, &t) in toks.iter().enumerate() {
            b.extend((t as i32).to_le_bytes());
            for l in 0..dims.index.len() {
                (0..dims.latent).for_each(|j| b.extend(val(r, l, 0, j).to_le_bytes()));
                (0..dims.rope).for_each(|j| b.extend(val(r, l, 1, j).to_le_bytes()));
            }
            if with_keys {
                for &l in &indexed {
                    (0..hd).for_each(|j| b.extend(val(r, l, 2, j).to_le_bytes()));
                }
            }
        }
        // A torn append past nrec is ignored.
        b.extend([1, 2, 3, 4, 5]);
        b
    };
    let dir = tmp();
    let path = dir.path().join("hand.coli_kv");
    std::fs::write(&path, build(true)).unwrap();
    let l = Session::load(&path, SessionFormat::ColiKv, model(), &id()).unwrap();
    assert!(!l.verified && !l.recomputed);
    let s = l.session;
    assert_eq!(s.tokens(), toks);
    for (li, c) in s.cache().layers.iter().enumerate() {
        assert_eq!(c.len(), 3);
        for r in 0..3 {
            assert_eq!(c.latent[r * dims.latent + 5], val(r, li, 0, 5));
            assert_eq!(c.k_pe[r * dims.rope + 3], val(r, li, 1, 3));
            if dims.index[li] > 0 {
                assert_eq!(c.index_k[r * hd + 7], val(r, li, 2, 7));
            } else {
                assert!(c.index_k.is_empty());
            }
        }
    }
    assert!(s.cache().mtp.is_empty());

    // Without indexer keys the caches are recomputed from the tokens.
    std::fs::write(&path, build(false)).unwrap();
    let l = Session::load(&path, SessionFormat::ColiKv, model(), &id()).unwrap();
    assert!(l.recomputed);
    let mut want = model().new_cache();
    run(&mut want, &toks);
    assert_cache_eq(l.session.cache(), &want);
}

#[test]
fn format_follows_the_file_name() {
    assert_eq!(
        SessionFormat::from_path(Path::new("a/chat.coli_kv")),
        SessionFormat::ColiKv
    );
    assert_eq!(
        SessionFormat::from_path(Path::new("chat.coli_kv.3")),
        SessionFormat::ColiKv
    );
    assert_eq!(
        SessionFormat::from_path(Path::new("chat.nkv")),
        SessionFormat::Nectar
    );
}
