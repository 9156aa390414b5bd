//! GLM output → text, reasoning and tool calls, incrementally.
//!
//! The parser is fed the text deltas of a stream, whose boundaries fall anywhere (`<tool_` in one
//! delta, `call>` in the next), and emits [`Piece`]s as soon as their kind is certain: text that
//! could be the start of a tag is held back until it is or is not one.
//!
//! A tool call streams as it is generated: [`Piece::CallStart`] once its name is complete,
//! [`Piece::CallArgs`] fragments of its arguments object (each argument when its value closes;
//! a string-typed parameter's value character by character), then [`Piece::CallEnd`] with the
//! whole call, whose `arguments` are exactly the fragments joined. Once a call has started it
//! always ends as a call: stray text inside it is dropped, a value left open by `</tool_call>`
//! ends there, and a call cut short by the end of the output (the token budget) is closed with
//! what was generated. Template markup is never returned as text, except after a
//! `<tool_call>` whose name is not a name (`<tool_call> two words`), which was never a call.
//!
//! Argument values of a parameter the tool's schema declares a string are strings verbatim;
//! other values that parse as JSON are typed (`3` → number), the rest are strings. Nothing here
//! panics on any input; the unit tests split every case at every byte boundary.

use super::{
    KEY_CLOSE, KEY_OPEN, THINK_CLOSE, THINK_OPEN, TOOL_CLOSE, TOOL_OPEN, VALUE_CLOSE, VALUE_OPEN,
};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};

/// A name longer than this without its end is not a name: the call becomes text.
const MAX_NAME: usize = 256;

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
    /// A tool call begins; its name is known.
    CallStart {
        /// Function name.
        name: String,
    },
    /// More of the open call's arguments object (a JSON fragment).
    CallArgs(String),
    /// The open call is complete (or was cut short and closed): the whole call.
    CallEnd(ToolCall),
}

/// Which parameters of which tool are declared strings in their schema.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StringParams(HashMap<String, HashSet<String>>);

impl StringParams {
    /// From tools in the chat template's form (`{"type": "function", "function": {"name",
    /// "parameters"}}`).
    pub fn of_tools(tools: &[Value]) -> StringParams {
        let mut map = HashMap::new();
        for t in tools {
            let f = &t["function"];
            let Some(name) = f["name"].as_str() else {
                continue;
            };
            let strings = f["parameters"]["properties"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(_, s)| s["type"] == "string")
                .map(|(k, _)| k.clone())
                .collect();
            map.insert(name.to_owned(), strings);
        }
        StringParams(map)
    }

    fn is_string(&self, tool: &str, param: &str) -> bool {
        self.0.get(tool).is_some_and(|s| s.contains(param))
    }
}

/// Where inside a call the parser is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum At {
    /// Reading the name.
    Name,
    /// Between arguments.
    Args,
    /// After `</arg_key>`, before `<arg_value>`.
    AwaitValue(String),
    /// Inside `<arg_value>`; a string value has its opening quote sent already.
    Value { key: String, string: bool },
    /// The JSON form (`<tool_call>name\n{…}</tool_call>`).
    Json,
    /// Dropping stray text between arguments, up to the next `<` (which may be in a later
    /// delta: what follows the stray text must not depend on where the stream was split).
    Stray,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    name: String,
    /// The arguments sent so far (the object is open while `n_args > 0`).
    args: String,
    n_args: usize,
    /// The JSON form sent a whole object: nothing closes it.
    whole: bool,
    at: At,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    Content,
    Reasoning,
    Call(Call),
}

/// The streaming parser. Feed deltas with [`OutputParser::push`], then call
/// [`OutputParser::finish`] once.
#[derive(Debug, Clone)]
pub struct OutputParser {
    mode: Mode,
    buf: String,
    parse_tools: bool,
    strings: StringParams,
    /// Drop whitespace at the start of the next content (after `</think>` or `</tool_call>`,
    /// where the template puts a newline that is layout, not answer).
    skip_ws: bool,
    /// Tool calls at most (`parallel_tool_calls: false` is 1); later calls are dropped.
    max_calls: Option<usize>,
    /// Calls emitted so far.
    calls: usize,
    /// The open call is past `max_calls`: its pieces are dropped.
    dropping: bool,
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
            strings: StringParams::default(),
            skip_ws: false,
            max_calls: None,
            calls: 0,
            dropping: false,
        }
    }

    /// Emits at most `n` tool calls (OpenAI's `parallel_tool_calls: false`, Anthropic's
    /// `disable_parallel_tool_use`: 1). A later call is still parsed — so its markup never
    /// leaks as text — but none of its pieces is emitted.
    pub fn with_max_calls(mut self, n: usize) -> OutputParser {
        self.max_calls = Some(n);
        self
    }

    /// Drops the pieces of calls past `max_calls`.
    fn limit(&mut self, pieces: Vec<Piece>) -> Vec<Piece> {
        let Some(max) = self.max_calls else {
            return pieces;
        };
        let mut out = Vec::with_capacity(pieces.len());
        for p in pieces {
            match &p {
                Piece::CallStart { name } => {
                    self.dropping = self.calls >= max;
                    if self.dropping {
                        tracing::debug!(name, max, "tool call past the request's limit: dropped");
                        continue;
                    }
                }
                Piece::CallArgs(_) if self.dropping => continue,
                Piece::CallEnd(_) => {
                    if std::mem::take(&mut self.dropping) {
                        continue;
                    }
                    self.calls += 1;
                }
                _ => {}
            }
            out.push(p);
        }
        out
    }

    /// Types arguments by the tools' schemas: string parameters stay strings and stream as
    /// they are generated.
    pub fn with_string_params(mut self, strings: StringParams) -> OutputParser {
        self.strings = strings;
        self
    }

    /// Adds a delta; returns the pieces it completes.
    pub fn push(&mut self, delta: &str) -> Vec<Piece> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        let out = merge(out);
        self.limit(out)
    }

    /// Ends the stream: whatever is held is emitted as what it is so far; an open tool call is
    /// closed with the arguments generated so far (a call whose name was never complete is
    /// dropped).
    pub fn finish(&mut self) -> Vec<Piece> {
        let out = self.finish_unlimited();
        self.limit(out)
    }

    fn finish_unlimited(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.buf);
        let mut out = Vec::new();
        match std::mem::replace(&mut self.mode, Mode::Content) {
            Mode::Content => {
                let rest = if self.skip_ws {
                    rest.trim_start().to_owned()
                } else {
                    rest
                };
                push_piece(&mut out, Piece::Text(rest));
            }
            Mode::Reasoning => push_piece(&mut out, Piece::Reasoning(rest)),
            Mode::Call(mut c) => {
                let rest = &rest[..partial_tag_start(&rest, &[VALUE_CLOSE, TOOL_CLOSE])];
                match std::mem::replace(&mut c.at, At::Args) {
                    At::Name => {
                        tracing::debug!(
                            name = rest,
                            "tool call cut before its name ended: dropped"
                        );
                        return out;
                    }
                    At::Value { string: true, .. } => {
                        let s = escaped(rest) + "\"";
                        emit_args(&mut c, &mut out, &s);
                    }
                    At::Value { key, string: false } => value(&mut c, &mut out, &key, rest),
                    At::Json => json_form(&mut c, &mut out, rest),
                    At::Args | At::AwaitValue(_) | At::Stray => {}
                }
                end_call(c, &mut out);
            }
        }
        out
    }

    /// One step over the buffer; `true` when something was consumed (run again).
    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match self.mode {
            Mode::Content => self.step_content(out),
            Mode::Reasoning => self.step_reasoning(out),
            Mode::Call(_) => self.step_call(out),
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
                Mode::Call(new_call())
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

    fn step_call(&mut self, out: &mut Vec<Piece>) -> bool {
        let Mode::Call(c) = &mut self.mode else {
            return false;
        };
        let buf = &mut self.buf;
        match c.at.clone() {
            At::Name => {
                let Some(i) = buf.find(['\n', '<', '{']) else {
                    if buf.len() > MAX_NAME {
                        return self.not_a_call(out, 0);
                    }
                    return false;
                };
                // The length bound applies however the name arrived: streamed in small deltas it
                // is refused before its end is seen, so a name found whole must be refused too.
                if i > MAX_NAME {
                    return self.not_a_call(out, 0);
                }
                let name = buf[..i].trim();
                if name.is_empty() || name.contains(char::is_whitespace) || name.contains('>') {
                    return self.not_a_call(out, i);
                }
                c.name = name.to_owned();
                push_piece(
                    out,
                    Piece::CallStart {
                        name: c.name.clone(),
                    },
                );
                let skip = if buf[i..].starts_with('\n') { i + 1 } else { i };
                buf.drain(..skip);
                c.at = At::Args;
                true
            }
            At::Args => {
                trim_start(buf);
                if buf.starts_with(TOOL_CLOSE) {
                    buf.drain(..TOOL_CLOSE.len());
                    self.close_call(out);
                    return true;
                }
                if let Some(body) = buf.strip_prefix(KEY_OPEN) {
                    let Some(k) = body.find(KEY_CLOSE) else {
                        return false;
                    };
                    let key = body[..k].trim().to_owned();
                    buf.drain(..KEY_OPEN.len() + k + KEY_CLOSE.len());
                    if key.is_empty() || key.contains('<') {
                        tracing::debug!(key, "tool call argument with a bad key: dropped");
                    } else {
                        c.at = At::AwaitValue(key);
                    }
                    return true;
                }
                if buf.starts_with('{') && c.n_args == 0 && !c.whole {
                    c.at = At::Json;
                    return true;
                }
                if buf.starts_with(TOOL_OPEN) {
                    // A new call before this one closed: this one ends here.
                    buf.drain(..TOOL_OPEN.len());
                    self.close_call(out);
                    self.mode = Mode::Call(new_call());
                    return true;
                }
                if buf.is_empty() || partial_tag_start(buf, &[TOOL_CLOSE, KEY_OPEN, TOOL_OPEN]) == 0
                {
                    return false;
                }
                // Stray text between arguments: dropped up to the next tag.
                // Skip the first character whole (it may be several bytes).
                let first = buf.chars().next().map_or(1, char::len_utf8);
                tracing::debug!(stray = &buf[..first], "stray text in a tool call: dropped");
                buf.drain(..first);
                c.at = At::Stray;
                true
            }
            At::Stray => {
                let next = buf.find('<');
                buf.drain(..next.unwrap_or(buf.len()));
                if next.is_some() {
                    c.at = At::Args;
                }
                next.is_some()
            }
            At::AwaitValue(key) => {
                trim_start(buf);
                if buf.starts_with(VALUE_OPEN) {
                    buf.drain(..VALUE_OPEN.len());
                    let string = self.strings.is_string(&c.name, &key);
                    if string {
                        let open = format!("{}\"", arg_prefix(c, &key));
                        emit_args(c, out, &open);
                    }
                    c.at = At::Value { key, string };
                    return true;
                }
                if buf.is_empty() || partial_tag_start(buf, &[VALUE_OPEN]) == 0 {
                    return false;
                }
                tracing::debug!(key, "tool call key without a value: dropped");
                c.at = At::Args;
                true
            }
            At::Value { key, string } => {
                // A value ends at `</arg_value>`, or at `</tool_call>` when its close is missing.
                match earliest(buf, &[VALUE_CLOSE, TOOL_CLOSE]) {
                    Some((e, tag)) => {
                        let raw: String = buf.drain(..e).collect();
                        if tag == VALUE_CLOSE {
                            buf.drain(..VALUE_CLOSE.len());
                        }
                        if string {
                            emit_args(c, out, &(escaped(&raw) + "\""));
                        } else {
                            value(c, out, &key, &raw);
                        }
                        c.at = At::Args;
                        true
                    }
                    None if string => {
                        let cut = partial_tag_start(buf, &[VALUE_CLOSE, TOOL_CLOSE]);
                        let chunk: String = buf.drain(..cut).collect();
                        if !chunk.is_empty() {
                            emit_args(c, out, &escaped(&chunk));
                        }
                        false
                    }
                    None => false,
                }
            }
            At::Json => {
                let Some(e) = buf.find(TOOL_CLOSE) else {
                    return false;
                };
                let body: String = buf.drain(..e).collect();
                json_form(c, out, &body);
                c.at = At::Args;
                true
            }
        }
    }

    /// The `<tool_call>` read so far (and `upto` bytes of the buffer) was not a call: text.
    fn not_a_call(&mut self, out: &mut Vec<Piece>, upto: usize) -> bool {
        let text: String = self.buf.drain(..upto).collect();
        push_piece(out, Piece::Text(format!("{TOOL_OPEN}{text}")));
        self.mode = Mode::Content;
        true
    }

    fn close_call(&mut self, out: &mut Vec<Piece>) {
        if let Mode::Call(c) = std::mem::replace(&mut self.mode, Mode::Content) {
            end_call(c, out);
        }
        self.skip_ws = true;
    }
}

fn new_call() -> Call {
    Call {
        name: String::new(),
        args: String::new(),
        n_args: 0,
        whole: false,
        at: At::Name,
    }
}

/// `{"key":` for the first argument, `,"key":` after; counts the argument.
fn arg_prefix(c: &mut Call, key: &str) -> String {
    let sep = if c.n_args == 0 { "{" } else { "," };
    c.n_args += 1;
    format!("{sep}{}:", Value::String(key.to_owned()))
}

fn emit_args(c: &mut Call, out: &mut Vec<Piece>, s: &str) {
    c.args.push_str(s);
    push_piece(out, Piece::CallArgs(s.to_owned()));
}

/// A non-string value: JSON when it parses, a string otherwise.
fn value(c: &mut Call, out: &mut Vec<Piece>, key: &str, raw: &str) {
    let v = serde_json::from_str::<Value>(raw.trim()).unwrap_or_else(|_| Value::String(raw.into()));
    let s = format!("{}{v}", arg_prefix(c, key));
    emit_args(c, out, &s);
}

/// The JSON form's body: an object, or (malformed) nothing.
fn json_form(c: &mut Call, out: &mut Vec<Piece>, body: &str) {
    match serde_json::from_str::<Value>(body.trim()) {
        Ok(v @ Value::Object(_)) => {
            c.whole = true;
            emit_args(c, out, &v.to_string());
        }
        _ => tracing::debug!(body, "tool call with malformed JSON arguments: dropped"),
    }
}

fn end_call(mut c: Call, out: &mut Vec<Piece>) {
    if !c.whole {
        let close = if c.n_args == 0 { "{}" } else { "}" };
        emit_args(&mut c, out, close);
    }
    push_piece(
        out,
        Piece::CallEnd(ToolCall {
            name: c.name,
            arguments: c.args,
        }),
    );
}

/// `s` as the inside of a JSON string (escaping is per character, so pieces escape alike).
fn escaped(s: &str) -> String {
    let q = Value::String(s.to_owned()).to_string();
    q[1..q.len() - 1].to_owned()
}

fn trim_start(buf: &mut String) {
    let n = buf.len() - buf.trim_start().len();
    buf.drain(..n);
}

/// Parses a whole `<tool_call>` body (between the tags). `None` when it is not a call.
pub fn parse_call(body: &str) -> Option<ToolCall> {
    let mut p = OutputParser::new(false, true);
    let mut pieces = p.push(&format!("{TOOL_OPEN}{body}{TOOL_CLOSE}"));
    pieces.extend(p.finish());
    match pieces.as_slice() {
        [.., Piece::CallEnd(c)] => Some(c.clone()),
        _ => None,
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
        (Piece::Text(t), _) | (Piece::Reasoning(t), _) | (Piece::CallArgs(t), _)
            if t.is_empty() => {}
        (Piece::Text(t), Some(Piece::Text(last))) => last.push_str(t),
        (Piece::Reasoning(t), Some(Piece::Reasoning(last))) => last.push_str(t),
        (Piece::CallArgs(t), Some(Piece::CallArgs(last))) => last.push_str(t),
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
        Piece::CallEnd(ToolCall {
            name: name.into(),
            arguments: args.to_string(),
        })
    }

    /// Parses `text` whole, then split at every char boundary (two deltas), then char by char;
    /// all must agree after merging.
    fn parse_all(text: &str, reasoning: bool, tools: bool) -> Vec<Piece> {
        parse_typed(text, reasoning, tools, &StringParams::default())
    }

    /// Calls folded whole: each call's start and argument fragments are checked against its
    /// end (same name; fragments joined = its arguments, valid JSON) and dropped.
    fn fold(pieces: Vec<Piece>) -> Vec<Piece> {
        let mut out = Vec::new();
        let mut open: Option<(String, String)> = None;
        for p in pieces {
            match p {
                Piece::CallStart { name } => {
                    assert!(open.is_none(), "call started inside a call");
                    open = Some((name, String::new()));
                }
                Piece::CallArgs(a) => open
                    .as_mut()
                    .expect("arguments outside a call")
                    .1
                    .push_str(&a),
                Piece::CallEnd(c) => {
                    let (name, args) = open.take().expect("end without a start");
                    assert_eq!(
                        (name.as_str(), args.as_str()),
                        (c.name.as_str(), c.arguments.as_str())
                    );
                    assert!(
                        serde_json::from_str::<Map<String, Value>>(&c.arguments).is_ok(),
                        "{}",
                        c.arguments
                    );
                    out.push(Piece::CallEnd(c));
                }
                other => {
                    assert!(open.is_none(), "{other:?} inside a call");
                    push_piece(&mut out, other)
                }
            }
        }
        assert!(open.is_none(), "a call never ended");
        out
    }

    fn parse_typed(text: &str, reasoning: bool, tools: bool, strings: &StringParams) -> Vec<Piece> {
        let run = |parts: &[&str]| {
            let mut p = OutputParser::new(reasoning, tools).with_string_params(strings.clone());
            let mut out = Vec::new();
            for part in parts {
                out.extend(p.push(part));
            }
            out.extend(p.finish());
            fold(out)
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

    /// Stray text inside a call that starts with a multi-byte character is dropped whole
    /// (found by the `tool_calls` fuzz target: slicing at byte 1 panicked).
    #[test]
    fn stray_multibyte_text_inside_a_call_is_dropped() {
        let out = parse_all(
            "<tool_call>f\n\u{FFFD}_é<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>",
            false,
            true,
        );
        assert!(
            matches!(out.as_slice(), [Piece::CallEnd(c)] if c.name == "f" && c.arguments == r#"{"k":"v"}"#),
            "{out:?}"
        );
    }

    /// Stray text is dropped up to the next `<` even when that `<` comes in a later delta: a `{`
    /// after stray text is not the JSON form (libFuzzer's `tool_calls` find: split char by char,
    /// the `{` began a delta and opened a JSON body that swallowed the second call).
    #[test]
    fn stray_text_ends_at_the_next_tag_across_deltas() {
        let out = parse_all("<tool_call>f</x{t<tool_call>g</x{y", false, true);
        let calls: Vec<(&str, &str)> = out
            .iter()
            .map(|p| match p {
                Piece::CallEnd(c) => (c.name.as_str(), c.arguments.as_str()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(calls, [("f", "{}"), ("g", "{}")]);
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

    /// `parallel_tool_calls: false`: the first call is emitted, a second one is parsed and
    /// dropped (its markup never becomes text), whether it arrives whole or token by token.
    #[test]
    fn a_call_limit_drops_later_calls() {
        let text = "<tool_call>now\n</tool_call>\n<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>";
        let whole = {
            let mut p = OutputParser::new(false, true).with_max_calls(1);
            let mut v = p.push(text);
            v.extend(p.finish());
            fold(v)
        };
        assert_eq!(whole, [call("now", json!({}))]);
        let by_char = {
            let mut p = OutputParser::new(false, true).with_max_calls(1);
            let mut v = Vec::new();
            for c in text.chars() {
                v.extend(p.push(&c.to_string()));
            }
            v.extend(p.finish());
            fold(v)
        };
        assert_eq!(by_char, whole);
        // A second call cut short is dropped too.
        let mut p = OutputParser::new(false, true).with_max_calls(1);
        let mut v = p.push("<tool_call>now\n</tool_call><tool_call>add\n<arg_key>a</arg_key>");
        v.extend(p.finish());
        assert_eq!(fold(v), [call("now", json!({}))]);
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
    fn what_is_not_a_name_is_text() {
        for body in [
            "\n<arg_key>a</arg_key><arg_value>1</arg_value>", // no name
            "two words\n",                                    // name with a space
            // Longer than a name may be (in bytes), found whole or streamed (libFuzzer's find).
            format!("{}f\n", "\u{fffd}".repeat(MAX_NAME / 3 + 1)).as_str(),
        ] {
            let text = format!("x<tool_call>{body}</tool_call>y");
            let out = parse_all(&text, false, true);
            assert_eq!(out, [Piece::Text(text.clone())], "{body:?}");
        }
    }

    #[test]
    fn a_started_call_always_ends_as_a_call_without_markup() {
        for (body, args) in [
            ("f\n<arg_key>a</arg_key>\n", json!({})), // key without value
            ("f\n<arg_value>1</arg_value>", json!({})), // value without key
            ("f\ngarbage", json!({})),                // stray text
            ("f\n<arg_key>a</arg_key><arg_value>1", json!({"a": 1})), // unclosed value
            ("f\n{\"a\": ", json!({})),               // broken JSON
            ("f\n[1, 2]", json!({})),                 // JSON that is not an object
        ] {
            let text = format!("x<tool_call>{body}</tool_call>y");
            let out = parse_all(&text, false, true);
            assert_eq!(
                out,
                [
                    Piece::Text("x".into()),
                    call("f", args),
                    Piece::Text("y".into())
                ],
                "{body:?}"
            );
        }
    }

    #[test]
    fn a_call_cut_short_is_closed_with_what_was_generated() {
        let text = "a\n<tool_call>f\n<arg_key>k</arg_key>\n<arg_val";
        assert_eq!(
            parse_all(text, false, true),
            [Piece::Text("a".into()), call("f", json!({}))]
        );
        let strings =
            StringParams::of_tools(&[json!({"type": "function", "function": {"name": "f",
            "parameters": {"properties": {"s": {"type": "string"}, "n": {"type": "integer"}}}}})]);
        let text = "<tool_call>f\n<arg_key>n</arg_key><arg_value>12</arg_value><arg_key>s</arg_key><arg_value>Par</arg_v";
        assert_eq!(
            parse_typed(text, false, true, &strings),
            [call("f", json!({"n": 12, "s": "Par"}))]
        );
        let text = "<tool_call>f\n<arg_key>n</arg_key><arg_value>12";
        assert_eq!(
            parse_typed(text, false, true, &strings),
            [call("f", json!({"n": 12}))]
        );
        // A name never finished is no call at all, and no markup either.
        assert_eq!(parse_all("<tool_call>get_wea", false, true), []);
    }

    #[test]
    fn string_parameters_stream_as_generated_and_stay_strings() {
        let strings = StringParams::of_tools(&[
            json!({"type": "function", "function": {"name": "w",
            "parameters": {"properties": {"text": {"type": "string"}, "n": {"type": "number"}}}}}),
        ]);
        let text = "<tool_call>w\n<arg_key>text</arg_key><arg_value>3 \"q\"</arg_value><arg_key>n</arg_key><arg_value>3</arg_value></tool_call>";
        assert_eq!(
            parse_typed(text, false, true, &strings),
            [call("w", json!({"text": "3 \"q\"", "n": 3}))]
        );
        // Fed token by token, the string's characters arrive before its value closes.
        let mut p = OutputParser::new(false, true).with_string_params(strings);
        assert_eq!(
            p.push("<tool_call>w\n"),
            [Piece::CallStart { name: "w".into() }]
        );
        assert_eq!(
            p.push("<arg_key>text</arg_key><arg_value>He"),
            [Piece::CallArgs("{\"text\":\"He".into())]
        );
        assert_eq!(p.push("llo</arg"), [Piece::CallArgs("llo".into())]);
        assert_eq!(p.push("_value>"), [Piece::CallArgs("\"".into())]);
        assert_eq!(
            p.push("</tool_call>"),
            [
                Piece::CallArgs("}".into()),
                call("w", json!({"text": "Hello"}))
            ]
        );
    }

    #[test]
    fn a_new_call_ends_the_open_one() {
        let out = parse_all(
            "<tool_call>broken <tool_call>g\n<arg_key>a</arg_key><arg_value>x</arg_value></tool_call>",
            false,
            true,
        );
        assert_eq!(
            out,
            [call("broken", json!({})), call("g", json!({"a": "x"}))]
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
