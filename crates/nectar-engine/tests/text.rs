//! Text-side checks against the demo model's HF reference outputs.

use std::io::Write;
use std::path::{Path, PathBuf};

use nectar_engine::{stop_token_ids, ChatTemplate, Error, StreamDecoder, Tokenizer};
use serde_json::{json, Map, Value};

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/nectar-demo-glm5");

fn demo_path(file: &str) -> PathBuf {
    Path::new(DEMO).join(file)
}

fn read_json(file: &str) -> Value {
    let text = std::fs::read_to_string(demo_path(file)).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(demo_path("tokenizer.json")).unwrap()
}

fn template() -> ChatTemplate {
    ChatTemplate::from_tokenizer_config(demo_path("tokenizer_config.json"))
        .unwrap()
        .expect("demo model has a chat template")
}

fn prompts() -> Vec<Value> {
    read_json("reference.json")["prompts"]
        .as_array()
        .unwrap()
        .clone()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| u32::try_from(x.as_u64().unwrap()).unwrap())
        .collect()
}

fn render(messages: Value, tools: Option<&Value>, gen: bool, extra: &Map<String, Value>) -> String {
    template().render(&messages, tools, gen, extra).unwrap()
}

fn stream_decode(tok: &Tokenizer, ids: &[u32]) -> String {
    let mut dec = StreamDecoder::new(false);
    let mut out = String::new();
    for &id in ids {
        out += &dec.push(tok, id).unwrap();
    }
    out + &dec.finish(tok).unwrap()
}

#[test]
fn reference_prompts_tokenise_exactly() {
    let tok = tokenizer();
    let all = prompts();
    assert_eq!(all.len(), 4);
    for p in &all {
        let name = p["name"].as_str().unwrap();
        let text = p["text"].as_str().unwrap();
        let want = ids(&p["input_ids"]);
        let got = if name == "chat" {
            let prompt = render(
                json!([{"role": "user", "content": text}]),
                None,
                true,
                &Map::new(),
            );
            tok.encode(&prompt, false).unwrap()
        } else {
            tok.encode(text, false).unwrap()
        };
        assert_eq!(got, want, "prompt {name}");
    }
}

#[test]
fn greedy_ids_decode_to_greedy_text() {
    let tok = tokenizer();
    for p in &prompts() {
        let name = p["name"].as_str().unwrap();
        let got = tok.decode(&ids(&p["greedy_ids"]), false).unwrap();
        assert_eq!(got, p["greedy_text"].as_str().unwrap(), "prompt {name}");
    }
}

#[test]
fn stream_decoding_matches_full_decoding() {
    let tok = tokenizer();
    for p in &prompts() {
        let name = p["name"].as_str().unwrap();
        for field in ["input_ids", "greedy_ids"] {
            let ids = ids(&p[field]);
            let full = tok.decode(&ids, false).unwrap();
            assert_eq!(stream_decode(&tok, &ids), full, "prompt {name} {field}");
        }
    }
}

#[test]
fn chinese_prompt_has_byte_split_characters() {
    // Guards the previous test's value: the zh prompt must really contain
    // ids that decode to partial characters on their own.
    let tok = tokenizer();
    let zh = prompts().into_iter().find(|p| p["name"] == "zh").unwrap();
    let split = ids(&zh["input_ids"])
        .iter()
        .chain(ids(&zh["greedy_ids"]).iter())
        .any(|&id| tok.decode(&[id], false).unwrap().contains('\u{FFFD}'));
    assert!(split);
}

#[test]
fn tool_calls_and_tool_results_render_in_glm_format() {
    let tools = json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}
        }
    }]);
    let messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Oslo?"}]},
        {"role": "assistant", "content": "", "reasoning_content": "Two cities.", "tool_calls": [
            {"id": "a", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
            {"id": "b", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"units\": {\"t\": \"C\"}}"}}
        ]},
        {"role": "tool", "tool_call_id": "a", "content": "18C"},
        {"role": "tool", "tool_call_id": "b", "content": "9C"}
    ]);
    let out = render(messages, Some(&tools), true, &Map::new());
    let want = concat!(
        "[gMASK]<sop><|system|>\n# Tools\n\n",
        "You may call one or more functions to assist with the user query.\n\n",
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n",
        // Python json.dumps spacing and the client's key order.
        r#"{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "#,
        r#""parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}"#,
        "\n</tools>\n\n",
        "For each function call, output the function name and arguments within the following XML format:\n",
        "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n...\n</tool_call>",
        "<|system|>\nBe brief.",
        "<|user|>\nWeather in Paris and Oslo?",
        "<|assistant|>\n<think>Two cities.</think>",
        "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>",
        "\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
        "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>",
        "\n<arg_key>units</arg_key>\n<arg_value>{\"t\": \"C\"}</arg_value>\n</tool_call>",
        "<|observation|>\n<tool_response>\n18C\n</tool_response>",
        "\n<tool_response>\n9C\n</tool_response>",
        "<|assistant|>\n<think></think>\n",
    );
    assert_eq!(out, want);

    // The GLM markup tokenises to its dedicated ids.
    let tok = tokenizer();
    let ids = tok.encode(&out, false).unwrap();
    for t in [
        "<tool_call>",
        "</tool_call>",
        "<arg_key>",
        "<arg_value>",
        "<tool_response>",
        "<|observation|>",
    ] {
        let id = tok.token_to_id(t).unwrap();
        assert!(ids.contains(&id), "{t} not tokenised as a single id");
    }
}

#[test]
fn enable_thinking_opens_a_think_block() {
    let messages = json!([{"role": "user", "content": "hi"}]);
    let off = render(messages.clone(), None, true, &Map::new());
    assert!(off.ends_with("<|assistant|>\n<think></think>\n"), "{off:?}");
    let mut extra = Map::new();
    extra.insert("enable_thinking".into(), json!(true));
    let on = render(messages.clone(), None, true, &extra);
    assert!(on.ends_with("<|assistant|>\n<think>"), "{on:?}");
    extra.insert("enable_thinking".into(), json!(false));
    assert_eq!(render(messages, None, true, &extra), off);
}

#[test]
fn demo_stop_ids() {
    let config = read_json("config.json");
    let generation = read_json("generation_config.json");
    assert_eq!(
        stop_token_ids(&config, Some(&generation)),
        [8160, 8167, 8169]
    );
    assert_eq!(stop_token_ids(&config, None), [8160, 8167, 8169]);
    let tok = tokenizer();
    let names: Vec<String> = [8160, 8167, 8169]
        .iter()
        .map(|&id| tok.id_to_token(id).unwrap())
        .collect();
    assert_eq!(names, ["<|endoftext|>", "<|user|>", "<|observation|>"]);
}

#[test]
fn model_dir_loading_matches_tokenizer_config() {
    let from_dir = ChatTemplate::from_model_dir(DEMO).unwrap().unwrap();
    assert_eq!(from_dir.source(), template().source());
    assert_eq!(from_dir.eos_token(), Some("<|endoftext|>"));
    assert_eq!(from_dir.bos_token(), None);
}

#[test]
fn chat_template_jinja_takes_precedence() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        demo_path("tokenizer_config.json"),
        dir.path().join("tokenizer_config.json"),
    )
    .unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), "{{ eos_token }}!").unwrap();
    let t = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
    assert_eq!(
        t.render(&json!([]), None, false, &Map::new()).unwrap(),
        "<|endoftext|>!"
    );
    assert!(ChatTemplate::from_model_dir(dir.path().join("nope"))
        .unwrap()
        .is_none());
}

fn temp_file(contents: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(contents.as_bytes()).unwrap();
    f
}

fn assert_names(err: &Error, path: &Path) {
    let msg = err.to_string();
    assert!(msg.contains(&*path.to_string_lossy()), "{msg}");
}

#[test]
fn missing_files_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let tok_path = dir.path().join("tokenizer.json");
    let err = Tokenizer::from_file(&tok_path).unwrap_err();
    assert!(matches!(err, Error::Io { .. }));
    assert_names(&err, &tok_path);

    let cfg_path = dir.path().join("tokenizer_config.json");
    let err = ChatTemplate::from_tokenizer_config(&cfg_path).unwrap_err();
    assert!(matches!(err, Error::Io { .. }));
    assert_names(&err, &cfg_path);
}

#[test]
fn malformed_json_is_an_error_naming_the_file() {
    let f = temp_file(r#"{"chat_template": "x""#);
    let err = ChatTemplate::from_tokenizer_config(f.path()).unwrap_err();
    assert!(matches!(err, Error::Json { .. }), "{err}");
    assert_names(&err, f.path());

    let f = temp_file(r#"{"version": "1.0", "model": 7}"#);
    let err = Tokenizer::from_file(f.path()).unwrap_err();
    assert!(matches!(err, Error::TokenizerLoad { .. }), "{err}");
    assert_names(&err, f.path());
}

#[test]
fn template_syntax_error_names_the_file() {
    let f = temp_file(r#"{"chat_template": "{% for m in messages %}{{ m.content }"}"#);
    let err = ChatTemplate::from_tokenizer_config(f.path()).unwrap_err();
    assert!(matches!(err, Error::TemplateSyntax { .. }), "{err}");
    assert_names(&err, f.path());
}

#[test]
fn render_errors_name_the_file() {
    let f = temp_file(r#"{"chat_template": "{{ messages[0].content.nope.deeper }}"}"#);
    let t = ChatTemplate::from_tokenizer_config(f.path())
        .unwrap()
        .unwrap();
    let err = t
        .render(
            &json!([{"role": "user", "content": "x"}]),
            None,
            false,
            &Map::new(),
        )
        .unwrap_err();
    assert!(matches!(err, Error::TemplateRender { .. }), "{err}");
    assert_names(&err, f.path());
}
