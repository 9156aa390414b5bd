//! Fuzz harnesses: one function per target, each taking arbitrary bytes and checking that the
//! code under test answers with a value or an error — never a panic, a hang or unbounded
//! memory — plus the invariants it promises on success.
//!
//! The same functions run under libFuzzer (`fuzz/`, `cargo +nightly fuzz run TARGET`) and under
//! the stable smoke test (`tests/smoke.rs`, part of the test suite: every seed of [`seeds`] and
//! a few thousand seeded mutations of them), so CI exercises every target without nightly.
//! Targets: [`coli_usage`], [`session_nectar`], [`session_coli_kv`], [`openai_chat`],
//! [`openai_completions`], [`anthropic_messages`], [`responses`], [`tool_calls`].
use nectar_engine::{coli_kv, session_format, ModelIdentity};
use nectar_model::{CacheDims, LayerCache, SeqCache};
use nectar_residency::usage::Ledger;
use nectar_server::error::Flavour;
use nectar_server::protocol::parse_body;
use std::io::Write;
use std::path::PathBuf;

/// A harness: runs one input.
pub type Harness = fn(&[u8]);

/// Every target, by name (the names of `fuzz/fuzz_targets/*.rs`).
pub const TARGETS: &[(&str, Harness)] = &[
    ("coli_usage", coli_usage),
    ("session_nectar", session_nectar),
    ("session_coli_kv", session_coli_kv),
    ("openai_chat", openai_chat),
    ("openai_completions", openai_completions),
    ("anthropic_messages", anthropic_messages),
    ("responses", responses),
    ("tool_calls", tool_calls),
];

/// `.coli_usage` text: parsed into a ledger of 4 layers × 8 experts; what it accepts renders
/// and parses back to the same ledger.
pub fn coli_usage(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for trusted in [false, true] {
        let mut l = Ledger::new(4, 8, "glm_moe_dsa");
        if l.parse_into(text, "fuzz.coli_usage", trusted).is_ok() {
            let mut back = Ledger::new(4, 8, "glm_moe_dsa");
            back.parse_into(&l.render(), "rendered", true)
                .expect("a rendered ledger parses");
            assert_eq!(back, l);
        }
    }
}

/// The small cache geometry the session targets read files for: 2 main layers (the second with
/// an indexer), vocabulary 50.
pub fn dims() -> CacheDims {
    CacheDims {
        latent: 4,
        rope: 2,
        index: vec![0, 3],
        mtp_index: None,
    }
}

/// Vocabulary of the session targets.
pub const VOCAB: usize = 50;

/// The identity the session targets expect (seeds carry it).
pub fn identity() -> ModelIdentity {
    ModelIdentity {
        config: [1; 32],
        quant: [2; 32],
        tokenizer: [3; 32],
    }
}

/// A scratch file for this process (the session readers take a path).
fn scratch(name: &str) -> PathBuf {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("nectar-fuzz-{}-{name}", std::process::id()))
}

/// Removes this process's scratch files (the smoke test calls it at the end; a libFuzzer run
/// leaves its few small files in `/dev/shm` or the temp directory).
pub fn remove_scratch() {
    for name in ["s.nkv", "s.coli_kv", "seed.coli_kv"] {
        let p = scratch(name);
        let _ = std::fs::remove_file(coli_kv::sidecar(&p));
        let _ = std::fs::remove_file(p);
    }
}

fn write_scratch(name: &str, data: &[u8]) -> PathBuf {
    let p = scratch(name);
    std::fs::File::create(&p)
        .and_then(|mut f| f.write_all(data))
        .expect("scratch file");
    p
}

fn check_cache(tokens: &[u32], cache: &SeqCache) {
    let d = dims();
    assert!(tokens.iter().all(|&t| (t as usize) < VOCAB));
    assert_eq!(cache.layers.len(), d.index.len());
    for l in &cache.layers {
        assert_eq!(l.len(), tokens.len());
    }
}

/// A Nectar-format session file.
pub fn session_nectar(data: &[u8]) {
    let p = write_scratch("s.nkv", data);
    if let Ok((tokens, cache)) = session_format::read(&p, &identity(), &dims(), VOCAB) {
        check_cache(&tokens, &cache);
    }
}

/// A `.coli_kv` file, with (the first byte odd) or without an identity sidecar listing the
/// checksum of the rest.
pub fn session_coli_kv(data: &[u8]) {
    let Some((&flag, body)) = data.split_first() else {
        return;
    };
    let p = write_scratch("s.coli_kv", body);
    let side = coli_kv::sidecar(&p);
    let _ = std::fs::remove_file(&side);
    if flag & 1 == 1 {
        // A sidecar as Nectar writes it, for a file saved from a real session of these dims
        // (made once: saving syncs to disk).
        static SIDECAR: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let bytes = SIDECAR.get_or_init(|| {
            let src = scratch("seed.coli_kv");
            seed_session(
                |path, id, d, tokens, cache| coli_kv::write(path, id, d, VOCAB, tokens, cache),
                &src,
            );
            let b = std::fs::read(coli_kv::sidecar(&src)).expect("seed sidecar");
            let _ = std::fs::remove_file(coli_kv::sidecar(&src));
            let _ = std::fs::remove_file(&src);
            b
        });
        std::fs::write(&side, bytes).expect("scratch sidecar");
    }
    if let Ok(kv) = coli_kv::read(&p, &identity(), &dims(), VOCAB) {
        if let Some(c) = &kv.cache {
            check_cache(&kv.tokens, c);
        }
    }
}

/// A session writer (the Nectar format's or `.coli_kv`'s, with [`VOCAB`]).
type Save = fn(
    &std::path::Path,
    &ModelIdentity,
    &CacheDims,
    &[u32],
    &SeqCache,
) -> Result<(), nectar_engine::SessionError>;

/// Saves a 3-token session of [`dims`] to `path` with `write`.
fn seed_session(write: Save, path: &std::path::Path) {
    let d = dims();
    let tokens = [7u32, 1, 49];
    let n = tokens.len();
    let mut cache = SeqCache::new(0);
    for (l, &ix) in d.index.iter().enumerate() {
        let f = |k: usize| {
            (0..k)
                .map(|i| (i + l) as f32 * 0.5 - 1.0)
                .collect::<Vec<f32>>()
        };
        cache.layers.push(
            LayerCache::from_parts(
                n,
                [d.latent, d.rope, ix],
                f(n * d.latent),
                f(n * d.rope),
                f(n * ix),
            )
            .expect("seed cache"),
        );
    }
    write(path, &identity(), &d, &tokens, &cache).expect("seed session saves");
}

fn json_target<T: serde::de::DeserializeOwned>(data: &[u8], flavour: Flavour) {
    let body = Ok(bytes::Bytes::copy_from_slice(data));
    let _ = parse_body::<T>(body, flavour, 1 << 20);
}

/// An OpenAI Chat Completions request body.
pub fn openai_chat(data: &[u8]) {
    json_target::<nectar_server::protocol::openai_chat::ChatRequest>(data, Flavour::OpenAi);
}

/// An OpenAI Completions request body.
pub fn openai_completions(data: &[u8]) {
    json_target::<nectar_server::protocol::openai_completions::CompletionRequest>(
        data,
        Flavour::OpenAi,
    );
}

/// An Anthropic Messages request body.
pub fn anthropic_messages(data: &[u8]) {
    json_target::<nectar_server::protocol::anthropic::MessagesRequest>(data, Flavour::Anthropic);
}

/// An OpenAI Responses request body.
pub fn responses(data: &[u8]) {
    json_target::<nectar_server::protocol::responses::ResponsesRequest>(data, Flavour::OpenAi);
}

/// GLM model output through the streaming tool-call / reasoning parser (`nectar_engine::glm`),
/// split into deltas at the positions the first bytes choose: the pieces must not depend on the
/// split, streamed arguments must join to the call's, and every call `parse_call` accepts has a
/// name.
pub fn tool_calls(data: &[u8]) {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let run = |step: usize| {
        let mut p = nectar_engine::glm::OutputParser::new(split & 1 == 1, split & 2 == 2);
        let mut pieces = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(step.max(1)) {
            pieces.extend(p.push(&chunk.iter().collect::<String>()));
        }
        pieces.extend(p.finish());
        pieces
    };
    let whole = run(usize::MAX);
    let split_run = run((split >> 2) as usize + 1);
    assert_eq!(
        merge(whole),
        merge(split_run),
        "the split changed the parse"
    );
    if let Some(c) = nectar_engine::glm::parse_call(&text) {
        assert!(!c.name.is_empty());
    }
}

/// Adjacent text, reasoning and argument pieces joined (streaming may cut them anywhere). The
/// streamed arguments of a call must join to exactly the arguments its end reports.
fn merge(pieces: Vec<nectar_engine::glm::Piece>) -> Vec<nectar_engine::glm::Piece> {
    use nectar_engine::glm::Piece;
    let mut out: Vec<Piece> = Vec::new();
    for p in pieces {
        match (p, out.last_mut()) {
            (Piece::Text(t), Some(Piece::Text(last))) => last.push_str(&t),
            (Piece::Reasoning(t), Some(Piece::Reasoning(last))) => last.push_str(&t),
            (Piece::CallArgs(t), Some(Piece::CallArgs(last))) => last.push_str(&t),
            (Piece::Text(t), _) if t.is_empty() => {}
            (Piece::Reasoning(t), _) if t.is_empty() => {}
            (p, _) => out.push(p),
        }
    }
    for w in out.windows(2) {
        if let [Piece::CallArgs(streamed), Piece::CallEnd(call)] = w {
            assert_eq!(
                streamed, &call.arguments,
                "streamed arguments differ from the call's"
            );
        }
    }
    out
}

/// Valid inputs of `target` to start from (the smoke test's seeds; `fuzz/corpus/TARGET/`).
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    let s = |v: &[&str]| v.iter().map(|x| x.as_bytes().to_vec()).collect();
    match target {
        "coli_usage" => s(&[
            "-2 1 2852970069\n0 3 17\n3 7 1\n",
            "-2 1 42\n1 2 9\n",
            "",
        ]),
        "session_nectar" | "session_coli_kv" => {
            let p = scratch(&format!("seed-{target}"));
            let mut out = Vec::new();
            if target == "session_nectar" {
                seed_session(session_format::write, &p);
                out.push(std::fs::read(&p).expect("seed"));
            } else {
                seed_session(
                    |path, id, d, t, c| coli_kv::write(path, id, d, VOCAB, t, c),
                    &p,
                );
                let bytes = std::fs::read(&p).expect("seed");
                let _ = std::fs::remove_file(coli_kv::sidecar(&p));
                out.push([&[1u8][..], &bytes].concat());
                out.push([&[0u8][..], &bytes].concat());
            }
            let _ = std::fs::remove_file(&p);
            out
        }
        "openai_chat" => s(&[
            r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer"}}}}}],"tool_choice":"required","stream":true,"stream_options":{"include_usage":true},"temperature":0.5,"top_p":0.9,"max_tokens":16,"stop":["x"],"logprobs":true,"top_logprobs":2,"logit_bias":{"5":-100},"seed":1,"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object"}}}}"#,
        ]),
        "openai_completions" => s(&[
            r#"{"model":"m","prompt":"hello","max_tokens":8,"echo":true,"logprobs":2,"stop":"\n","stream":false}"#,
            r#"{"prompt":[1,2,3],"temperature":0}"#,
        ]),
        "anthropic_messages" => s(&[
            r#"{"model":"m","max_tokens":32,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":""},{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"r"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"},"thinking":{"type":"enabled","budget_tokens":1024},"stop_sequences":["x"],"stream":true}"#,
        ]),
        "responses" => s(&[
            r#"{"model":"m","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"r"}],"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"text":{"format":{"type":"json_object"}},"reasoning":{"effort":"none"},"store":false,"stream":true,"max_output_tokens":20}"#,
            r#"{"input":"hello","previous_response_id":"resp_1"}"#,
        ]),
        "tool_calls" => s(&[
            "\x03<think>plan</think>Hello <tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
            "\x02text <tool_call>f</tool_call> more",
            "\x01reasoning only</think>answer",
            "\x06<tool_call>broken<arg_key>k</arg_value>",
        ]),
        _ => Vec::new(),
    }
}
