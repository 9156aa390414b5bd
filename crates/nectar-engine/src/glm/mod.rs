//! GLM's output format, in one place: its reasoning and tool-call tags, the streaming parser of
//! its output ([`OutputParser`]: text, reasoning, tool calls) and the grammar of a forced tool
//! call ([`tool_call_grammar`], planned for the token budget).
//!
//! GLM writes reasoning as `<think>…</think>` and tool calls as
//!
//! ```text
//! <tool_call>get_weather
//! <arg_key>city</arg_key>
//! <arg_value>Paris</arg_value>
//! </tool_call>
//! ```
//!
//! — the form the model's chat template (rendered by [`crate::ChatTemplate`], which stays
//! generic: the template itself comes with the model) renders past calls in; see
//! `colibri-format.md` §13. The HTTP layer only maps the [`Piece`]s to each protocol's shapes.

mod grammar;
mod parse;

pub use grammar::{bound_integers, tool_call_grammar, CallBudget, DEFAULT_MAX_DIGITS};
pub use parse::{parse_call, OutputParser, Piece, StringParams, ToolCall};

pub(crate) const THINK_OPEN: &str = "<think>";
pub(crate) const THINK_CLOSE: &str = "</think>";
pub(crate) const TOOL_OPEN: &str = "<tool_call>";
pub(crate) const TOOL_CLOSE: &str = "</tool_call>";
pub(crate) const KEY_OPEN: &str = "<arg_key>";
pub(crate) const KEY_CLOSE: &str = "</arg_key>";
pub(crate) const VALUE_OPEN: &str = "<arg_value>";
pub(crate) const VALUE_CLOSE: &str = "</arg_value>";

/// Whether a rendered prompt leaves the assistant inside `<think>` (thinking on), so the output
/// starts as reasoning.
pub fn opens_in_reasoning(rendered: &str) -> bool {
    rendered.trim_end().ends_with(THINK_OPEN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grammar::{GrammarCompiler, GrammarSpec};
    use crate::tokenizer::tests::demo;
    use serde_json::{json, Value};

    /// The weather tool shared by the engine's and the server's tool-call tests
    /// (`tests/fixtures/tools/weather.json`: a bounded string, an unbounded integer, an enum).
    fn weather() -> Value {
        serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/tools/weather.json"
        )))
        .expect("the weather tool fixture is JSON")
    }

    #[test]
    fn grammar_names_each_argument_with_its_type() {
        let g = tool_call_grammar(&[weather()], None, None).unwrap();
        assert!(
            g.starts_with("start: \"<tool_call>\" (call_0) \"</tool_call>\""),
            "{g}"
        );
        assert!(
            g.contains("call_0: \"get_weather\" \"\\n\" arg_0_0 arg_0_1? arg_0_2?"),
            "{g}"
        );
        assert!(g.contains("val_0_0: /[^<]{0,20}/"), "{g}");
        // An unbounded integer has bounded digits.
        assert!(g.contains("val_0_1: /(0|-?[1-9][0-9]{0,14})/"), "{g}");
        assert!(g.contains("(\"c\" | \"f\")"), "{g}");
        let e = tool_call_grammar(&[weather()], Some("nope"), None).unwrap_err();
        assert!(e.to_string().contains("nope"));
    }

    #[test]
    fn the_plan_shortens_values_and_drops_optional_arguments_that_do_not_fit() {
        let one = |_: &str| Some(7);
        let plan = |max_tokens| {
            tool_call_grammar(
                &[weather()],
                None,
                Some(&CallBudget {
                    max_tokens,
                    tag_id: &one,
                }),
            )
            .unwrap()
        };
        // The call: 2 tags, the name (11 characters) and a newline; an argument: 4 tags, its
        // key and 2 newlines. `city` with a one-token value: 14 + 10 + 1.
        let tight = plan(26);
        assert!(tight.starts_with("start: <[7]> (call_0) <[7]>"), "{tight}");
        assert!(
            tight.contains("call_0: \"get_weather\" \"\\n\" arg_0_0\n"),
            "{tight}"
        );
        assert!(tight.contains("val_0_0[max_tokens="), "{tight}");
        let roomy = plan(200);
        assert!(roomy.contains("arg_0_1? arg_0_2?"), "{roomy}");
    }

    #[test]
    fn integers_without_bounds_get_bounds() {
        let s = bound_integers(&json!({"type": "object", "properties": {
            "n": {"type": "integer"}, "m": {"type": "integer", "maximum": 5}, "x": {"type": "number"}}}));
        assert_eq!(
            s["properties"]["n"]["maximum"],
            json!(999_999_999_999_999i64)
        );
        assert_eq!(s["properties"]["m"]["maximum"], json!(5));
        assert_eq!(
            s["properties"]["m"]["minimum"],
            json!(-999_999_999_999_999i64)
        );
        assert!(s["properties"]["x"].get("maximum").is_none());
    }

    /// Drives a planned grammar with an adversary that never ends a value it can continue
    /// (it prefers tokens without `<`, the longest first): the call still closes within the
    /// budget, and parses, for every budget its minimal form fits.
    #[test]
    fn a_planned_call_closes_within_the_budget_against_a_runaway_model() {
        let tok = demo();
        let vocab = tok.vocab_size();
        let eos = [tok.token_to_id("<|user|>").unwrap()];
        let compiler = GrammarCompiler::new(&tok, vocab, &eos).unwrap();
        let tools = [
            json!({"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string"}, "limit": {"type": "integer"},
                           "score": {"type": "number"}, "note": {"type": "string"}},
            "required": ["word", "limit", "score"]}}}),
        ];
        let tag_id = |s: &str| tok.token_to_id(s);
        let texts: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| tok.decode(&[id], false).unwrap_or_default().into_bytes())
            .collect();
        // The minimal call, each tag one token and every other character one: the smallest
        // budget the plan promises to close in.
        let minimal = 2 + "lookup\n".len() + 3 * 4 + 3 * 2 + "wordlimitscore".len() + 3;
        for max_tokens in (minimal..minimal + 12).chain([64, 80, 128]) {
            let g = tool_call_grammar(
                &tools,
                None,
                Some(&CallBudget {
                    max_tokens,
                    tag_id: &tag_id,
                }),
            )
            .unwrap();
            let mut m = compiler.compile(&GrammarSpec::Lark(g.clone())).unwrap();
            let mut out = Vec::new();
            let mut n = 0;
            while !m.is_complete() {
                let forced = m.forced().unwrap();
                let next = match forced.first() {
                    Some(&id) => id,
                    None => {
                        let mask = m.mask().unwrap();
                        (0..vocab as u32)
                            .filter(|&id| mask[id as usize] && !eos.contains(&id))
                            .max_by_key(|&id| {
                                let t = &texts[id as usize];
                                (!t.contains(&b'<'), t.len())
                            })
                            .expect("the grammar allows a token")
                    }
                };
                if eos.contains(&next) {
                    break;
                }
                m.advance(next).unwrap();
                out.push(next);
                n += 1;
                assert!(
                    n <= max_tokens,
                    "budget {max_tokens} exceeded: {:?}\n{g}",
                    tok.decode(&out, false)
                );
                if m.mask()
                    .unwrap()
                    .iter()
                    .enumerate()
                    .all(|(i, &ok)| !ok || eos.contains(&(i as u32)))
                {
                    break;
                }
            }
            let text = tok.decode(&out, false).unwrap();
            let body = text
                .strip_prefix("<tool_call>")
                .and_then(|t| t.strip_suffix("</tool_call>"))
                .unwrap_or_else(|| panic!("not a closed call: {text:?}"));
            let call = parse_call(body).unwrap();
            let args = call.input();
            assert!(args["word"].is_string() && args["limit"].is_i64(), "{text}");
            assert!(args["score"].is_number(), "{text}");
        }
    }
}
