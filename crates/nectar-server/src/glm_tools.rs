//! GLM output → text, reasoning and tool calls, incrementally.
//!
//! GLM writes reasoning as `<think>…</think>` and tool calls as
//!
//! ```text
//! <tool_call>get_weather
//! <arg_key>city</arg_key>
//! <arg_value>Paris</arg_value>
//! <arg_key>days</arg_key>
//! <arg_value>3</arg_value>
//! </tool_call>
//! ```
//!
//! (the format the chat template renders past calls in; see `colibri-format.md` §13). Argument
//! values that parse as JSON are typed (`3` → number), others are strings.
//!
//! The parser is fed the text deltas of a stream, whose boundaries fall anywhere (`<tool_` in one
//! delta, `call>` in the next), and emits [`Piece`]s as soon as their kind is certain: text that
//! could be the start of a tag is held back until it is or is not one. A tool call is emitted
//! whole, when `</tool_call>` arrives, so a malformed call can still be turned back into plain
//! text (recovery) instead of leaving a half-announced call behind. Nothing here panics on any
//! input; the unit tests split every case at every byte boundary.

use serde_json::{Map, Value};

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const TOOL_OPEN: &str = "<tool_call>";
const TOOL_CLOSE: &str = "</tool_call>";
const KEY_OPEN: &str = "<arg_key>";
const KEY_CLOSE: &str = "</arg_key>";
const VALUE_OPEN: &str = "<arg_value>";
const VALUE_CLOSE: &str = "</arg_value>";

/// A parsed tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// Function name.
    pub name: String,
    /// Arguments as a JSON object, serialised (key order as generated).
    pub arguments: String,
}

impl ToolCall {
    /// The arguments as a JSON object (Anthropic's `input`).
    pub fn input(&self) -> Value {
        serde_json::from_str(&self.arguments).unwrap_or_else(|_| Value::Object(Map::new()))
    }
}

/// One classified part of the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Answer text.
    Text(String),
    /// Reasoning text (inside `<think>`).
    Reasoning(String),
    /// A complete tool call.
    ToolCall(ToolCall),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Content,
    Reasoning,
    ToolCall,
}

/// The streaming parser. Feed deltas with [`OutputParser::push`], then call
/// [`OutputParser::finish`] once.
#[derive(Debug, Clone)]
pub struct OutputParser {
    mode: Mode,
    buf: String,
    parse_tools: bool,
    /// Drop whitespace at the start of the next content (after `</think>` or `</tool_call>`,
    /// where the template puts a newline that is layout, not answer).
    skip_ws: bool,
}

impl OutputParser {
    /// A parser. `opens_in_reasoning`: the prompt ended inside `<think>`, so output starts as
    /// reasoning. `parse_tools`: recognise `<tool_call>` (only when the request offered tools;
    /// otherwise the tag is text).
    pub fn new(opens_in_reasoning: bool, parse_tools: bool) -> OutputParser {
        OutputParser {
            mode: if opens_in_reasoning {
                Mode::Reasoning
            } else {
                Mode::Content
            },
            buf: String::new(),
            parse_tools,
            skip_ws: false,
        }
    }

    /// Adds a delta; returns the pieces it completes.
    pub fn push(&mut self, delta: &str) -> Vec<Piece> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        merge(out)
    }

    /// Ends the stream: whatever is held is emitted as what it is so far; an unterminated tool
    /// call becomes text.
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.buf);
        let mut out = Vec::new();
        match self.mode {
            Mode::Content => {
                let rest = if self.skip_ws {
                    rest.trim_start().to_owned()
                } else {
                    rest
                };
                push_piece(&mut out, Piece::Text(rest));
            }
            Mode::Reasoning => push_piece(&mut out, Piece::Reasoning(rest)),
            Mode::ToolCall => push_piece(&mut out, Piece::Text(format!("{TOOL_OPEN}{rest}"))),
        }
        self.mode = Mode::Content;
        out
    }

    /// One step over the buffer; `true` when a tag was consumed (run again).
    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match self.mode {
            Mode::Content => self.step_content(out),
            Mode::Reasoning => self.step_reasoning(out),
            Mode::ToolCall => self.step_tool(out),
        }
    }

    fn step_content(&mut self, out: &mut Vec<Piece>) -> bool {
        if self.skip_ws {
            let trimmed = self.buf.trim_start();
            if trimmed.is_empty() {
                self.buf.clear();
                return false;
            }
            let cut = self.buf.len() - trimmed.len();
            self.buf.drain(..cut);
            self.skip_ws = false;
        }
        let tags: &[&str] = if self.parse_tools {
            &[THINK_OPEN, TOOL_OPEN]
        } else {
            &[THINK_OPEN]
        };
        if let Some((i, tag)) = earliest(&self.buf, tags) {
            let before = &self.buf[..i];
            // Layout whitespace between the answer and a call is not part of the answer.
            let before = if tag == TOOL_OPEN {
                before.trim_end()
            } else {
                before
            };
            push_piece(out, Piece::Text(before.to_owned()));
            self.buf.drain(..i + tag.len());
            self.mode = if tag == TOOL_OPEN {
                Mode::ToolCall
            } else {
                Mode::Reasoning
            };
            return true;
        }
        let mut cut = partial_tag_start(&self.buf, tags);
        if self.parse_tools {
            // Hold trailing whitespace too: if a tool call follows, it is dropped.
            cut = self.buf[..cut].trim_end().len();
        }
        let emit: String = self.buf.drain(..cut).collect();
        push_piece(out, Piece::Text(emit));
        false
    }

    fn step_reasoning(&mut self, out: &mut Vec<Piece>) -> bool {
        if let Some(i) = self.buf.find(THINK_CLOSE) {
            push_piece(out, Piece::Reasoning(self.buf[..i].to_owned()));
            self.buf.drain(..i + THINK_CLOSE.len());
            self.mode = Mode::Content;
            self.skip_ws = true;
            return true;
        }
        let cut = partial_tag_start(&self.buf, &[THINK_CLOSE]);
        let emit: String = self.buf.drain(..cut).collect();
        push_piece(out, Piece::Reasoning(emit));
        false
    }

    fn step_tool(&mut self, out: &mut Vec<Piece>) -> bool {
        let close = self.buf.find(TOOL_CLOSE);
        // A second `<tool_call>` before this one closes: the first is malformed. Emit it as
        // text and start over at the second.
        if let Some(j) = self.buf.find(TOOL_OPEN) {
            if close.is_none_or(|c| j < c) {
                push_piece(out, Piece::Text(format!("{TOOL_OPEN}{}", &self.buf[..j])));
                self.buf.drain(..j + TOOL_OPEN.len());
                return true;
            }
        }
        let Some(c) = close else {
            return false;
        };
        let body = &self.buf[..c];
        match parse_call(body) {
            Some(call) => push_piece(out, Piece::ToolCall(call)),
            None => {
                tracing::debug!(body, "malformed tool call kept as text");
                push_piece(out, Piece::Text(format!("{TOOL_OPEN}{body}{TOOL_CLOSE}")));
            }
        }
        self.buf.drain(..c + TOOL_CLOSE.len());
        self.mode = Mode::Content;
        self.skip_ws = true;
        true
    }
}

/// Parses the body of a `<tool_call>` (between the tags). `None` when it is malformed.
pub fn parse_call(body: &str) -> Option<ToolCall> {
    let body = body.trim_start();
    let name_end = [body.find('\n'), body.find('<'), body.find('{')]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(body.len());
    let name = body[..name_end].trim();
    if name.is_empty() || name.contains(char::is_whitespace) || name.contains('>') {
        return None;
    }
    let rest = body[name_end..].trim();
    let arguments = if rest.starts_with('{') {
        // The JSON form (`<tool_call>name\n{"a": 1}</tool_call>`), which the template also
        // renders when a past call's arguments were a string.
        match serde_json::from_str::<Value>(rest).ok()? {
            Value::Object(m) => m,
            _ => return None,
        }
    } else {
        parse_pairs(rest)?
    };
    Some(ToolCall {
        name: name.to_owned(),
        arguments: Value::Object(arguments).to_string(),
    })
}

/// `<arg_key>k</arg_key><arg_value>v</arg_value>…` with only whitespace between tags.
fn parse_pairs(mut rest: &str) -> Option<Map<String, Value>> {
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            return Some(args);
        }
        rest = rest.strip_prefix(KEY_OPEN)?;
        let k_end = rest.find(KEY_CLOSE)?;
        let key = rest[..k_end].trim();
        if key.is_empty() || key.contains('<') {
            return None;
        }
        rest = rest[k_end + KEY_CLOSE.len()..].trim_start();
        rest = rest.strip_prefix(VALUE_OPEN)?;
        let v_end = rest.find(VALUE_CLOSE)?;
        let raw = &rest[..v_end];
        if raw.contains(VALUE_OPEN) || raw.contains(KEY_OPEN) {
            return None;
        }
        let value =
            serde_json::from_str::<Value>(raw.trim()).unwrap_or_else(|_| Value::String(raw.into()));
        args.insert(key.to_owned(), value);
        rest = &rest[v_end + VALUE_CLOSE.len()..];
    }
}

/// The earliest occurrence of any of `tags` in `s` (the longer tag wins a tie).
fn earliest<'t>(s: &str, tags: &[&'t str]) -> Option<(usize, &'t str)> {
    tags.iter()
        .filter_map(|t| s.find(t).map(|i| (i, *t)))
        .min_by_key(|&(i, t)| (i, usize::MAX - t.len()))
}

/// Start of the longest suffix of `s` that is a proper prefix of one of `tags` (`s.len()` when
/// none): that much must wait for the next delta.
fn partial_tag_start(s: &str, tags: &[&str]) -> usize {
    let longest = tags.iter().map(|t| t.len()).max().unwrap_or(0);
    let from = s.len().saturating_sub(longest.saturating_sub(1));
    (from..s.len())
        .filter(|&i| s.is_char_boundary(i))
        .find(|&i| tags.iter().any(|t| t.starts_with(&s[i..])))
        .unwrap_or(s.len())
}

/// Appends a piece, skipping empty text and merging with a neighbour of the same kind.
fn push_piece(out: &mut Vec<Piece>, p: Piece) {
    match (&p, out.last_mut()) {
        (Piece::Text(t), _) | (Piece::Reasoning(t), _) if t.is_empty() => {}
        (Piece::Text(t), Some(Piece::Text(last))) => last.push_str(t),
        (Piece::Reasoning(t), Some(Piece::Reasoning(last))) => last.push_str(t),
        _ => out.push(p),
    }
}

fn merge(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out = Vec::with_capacity(pieces.len());
    for p in pieces {
        push_piece(&mut out, p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, args: Value) -> Piece {
        Piece::ToolCall(ToolCall {
            name: name.into(),
            arguments: args.to_string(),
        })
    }

    /// Parses `text` whole, then split at every char boundary (two deltas), then char by char;
    /// all must agree after merging.
    fn parse_all(text: &str, reasoning: bool, tools: bool) -> Vec<Piece> {
        let run = |parts: &[&str]| {
            let mut p = OutputParser::new(reasoning, tools);
            let mut out = Vec::new();
            for part in parts {
                out.extend(p.push(part));
            }
            out.extend(p.finish());
            merge(out)
        };
        let whole = run(&[text]);
        for i in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(run(&[&text[..i], &text[i..]]), whole, "split at {i}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(run(&refs), whole, "char by char");
        whole
    }

    #[test]
    fn plain_text_passes_through() {
        assert_eq!(
            parse_all("hello <b>world</b> a<b", false, true),
            [Piece::Text("hello <b>world</b> a<b".into())]
        );
    }

    #[test]
    fn one_call_with_typed_arguments() {
        let out = parse_all(
            "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{\"unit\": \"C\"}</arg_value>\n</tool_call>",
            false,
            true,
        );
        assert_eq!(
            out,
            [
                Piece::Text("Let me check.".into()),
                call(
                    "get_weather",
                    json!({"city": "Paris", "days": 3, "opts": {"unit": "C"}})
                )
            ]
        );
    }

    #[test]
    fn argument_key_order_is_kept() {
        let c = parse_call("f\n<arg_key>z</arg_key><arg_value>1</arg_value><arg_key>a</arg_key><arg_value>2</arg_value>").unwrap();
        assert_eq!(c.arguments, r#"{"z":1,"a":2}"#);
    }

    #[test]
    fn several_calls_and_no_arguments() {
        let out = parse_all(
            "<tool_call>now\n</tool_call>\n<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
            false,
            true,
        );
        assert_eq!(out, [call("now", json!({})), call("add", json!({"a": 1}))]);
    }

    #[test]
    fn string_values_keep_their_whitespace_and_non_json_stays_string() {
        let out = parse_all(
            "<tool_call>write\n<arg_key>text</arg_key>\n<arg_value>line 1\nline 2</arg_value>\n<arg_key>flag</arg_key>\n<arg_value>true</arg_value>\n<arg_key>q</arg_key>\n<arg_value>\"quoted\"</arg_value>\n</tool_call>",
            false,
            true,
        );
        assert_eq!(
            out,
            [call(
                "write",
                json!({"text": "line 1\nline 2", "flag": true, "q": "quoted"})
            )]
        );
    }

    #[test]
    fn json_argument_form() {
        let out = parse_all("<tool_call>f\n{\"a\": [1, 2]}\n</tool_call>", false, true);
        assert_eq!(out, [call("f", json!({"a": [1, 2]}))]);
    }

    #[test]
    fn text_after_a_call_is_kept_without_layout_newline() {
        let out = parse_all("<tool_call>f\n</tool_call>\nDone.", false, true);
        assert_eq!(out, [call("f", json!({})), Piece::Text("Done.".into())]);
    }

    #[test]
    fn reasoning_then_answer() {
        let out = parse_all("<think>Think hard.</think>\nThe answer.", false, true);
        assert_eq!(
            out,
            [
                Piece::Reasoning("Think hard.".into()),
                Piece::Text("The answer.".into())
            ]
        );
    }

    #[test]
    fn output_that_opens_in_reasoning() {
        let out = parse_all("step 1</think>\nok", true, false);
        assert_eq!(
            out,
            [Piece::Reasoning("step 1".into()), Piece::Text("ok".into())]
        );
    }

    #[test]
    fn unterminated_reasoning_is_reasoning() {
        assert_eq!(
            parse_all("still thinking </thi", true, false),
            [Piece::Reasoning("still thinking </thi".into())]
        );
    }

    #[test]
    fn tool_tags_are_text_when_no_tools_were_offered() {
        let s = "<tool_call>f\n</tool_call>";
        assert_eq!(parse_all(s, false, false), [Piece::Text(s.into())]);
    }

    #[test]
    fn malformed_calls_become_text() {
        for body in [
            "\n<arg_key>a</arg_key><arg_value>1</arg_value>", // no name
            "two words\n",                                    // name with a space
            "f\n<arg_key>a</arg_key>\n",                      // key without value
            "f\n<arg_value>1</arg_value>",                    // value without key
            "f\ngarbage",                                     // stray text
            "f\n<arg_key>a</arg_key><arg_value>1",            // unclosed value
            "f\n{\"a\": ",                                    // broken JSON
            "f\n[1, 2]",                                      // JSON that is not an object
        ] {
            let text = format!("x<tool_call>{body}</tool_call>y");
            let out = parse_all(&text, false, true);
            assert_eq!(out, [Piece::Text(text.clone())], "{body:?}");
        }
    }

    #[test]
    fn unterminated_call_becomes_text() {
        let text = "a\n<tool_call>f\n<arg_key>k</arg_key>\n<arg_val";
        let out = parse_all(text, false, true);
        assert_eq!(
            out,
            [Piece::Text(
                "a<tool_call>f\n<arg_key>k</arg_key>\n<arg_val".into()
            )]
        );
    }

    #[test]
    fn nested_open_tag_recovers_at_the_second_call() {
        let out = parse_all(
            "<tool_call>broken <tool_call>g\n<arg_key>a</arg_key><arg_value>x</arg_value></tool_call>",
            false,
            true,
        );
        assert_eq!(
            out,
            [
                Piece::Text("<tool_call>broken ".into()),
                call("g", json!({"a": "x"}))
            ]
        );
    }

    #[test]
    fn partial_tags_are_held_back_until_decided() {
        let mut p = OutputParser::new(false, true);
        assert_eq!(p.push("Hi <tool_"), [Piece::Text("Hi".into())]);
        assert_eq!(p.push("cal"), []);
        assert_eq!(p.push("x"), [Piece::Text(" <tool_calx".into())]);
        assert_eq!(p.push("<thi"), []);
        assert_eq!(p.push("nk>r"), [Piece::Reasoning("r".into())]);
    }

    #[test]
    fn multibyte_text_around_tags() {
        let out = parse_all(
            "春风<tool_call>诗\n<arg_key>句</arg_key>\n<arg_value>明月光</arg_value>\n</tool_call>🐝",
            false,
            true,
        );
        assert_eq!(
            out,
            [
                Piece::Text("春风".into()),
                call("诗", json!({"句": "明月光"})),
                Piece::Text("🐝".into())
            ]
        );
    }

    #[test]
    fn trailing_whitespace_is_flushed_at_the_end() {
        assert_eq!(
            parse_all("answer \n", false, true),
            [Piece::Text("answer \n".into())]
        );
    }

    #[test]
    fn input_of_a_call_is_an_object() {
        let c = parse_call("f\n<arg_key>a</arg_key><arg_value>1</arg_value>").unwrap();
        assert_eq!(c.input(), json!({"a": 1}));
    }

    #[test]
    fn partial_tag_start_is_char_safe() {
        assert_eq!(partial_tag_start("ab<", &[TOOL_OPEN]), 2);
        assert_eq!(partial_tag_start("ab<tool_call", &[TOOL_OPEN]), 2);
        assert_eq!(partial_tag_start("ab", &[TOOL_OPEN]), 2);
        assert_eq!(partial_tag_start("é", &[TOOL_OPEN]), 2);
        assert_eq!(partial_tag_start("", &[TOOL_OPEN]), 0);
    }
}
