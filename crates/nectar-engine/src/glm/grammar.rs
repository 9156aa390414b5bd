//! The Lark grammar of one forced GLM tool call, planned for the token budget.
//!
//! A forced call (`tool_choice` required / named) is written the way the chat template renders
//! past calls (and [`super::parse`] reads them):
//!
//! ```text
//! <tool_call>NAME
//! <arg_key>KEY</arg_key>
//! <arg_value>VALUE</arg_value>
//! </tool_call>
//! ```
//!
//! Each declared parameter is an argument (required ones must appear, optional ones may), in
//! declaration order. String values are free text without `<` (so a value cannot run into the
//! closing tag); any other type is JSON valid under the parameter's own schema (llguidance's
//! `%json`), except unbounded numbers, which are a bounded-digit pattern (a weak model otherwise
//! writes `7777…` until the budget runs out).
//!
//! **Budget planning.** With a [`CallBudget`], each alternative is planned to close within
//! `max_tokens` whatever tokens the model picks: the tags are asked for as their single
//! vocabulary tokens (`<[id]>`, so a tag costs exactly one token — a model left free to spell
//! `<arg_value>` as `<`, `arg`, `_value`, `>` would), and every other fixed character (names,
//! keys, newlines, enum and boolean values) is counted as one token, the most a character can
//! cost. What is left is shared among the free values: a string value gets that many tokens at
//! most (llguidance's `max_tokens=` on its rule), an unbounded number that many characters at
//! most; optional parameters are offered only while they fit. So a forced call whose minimal
//! form — counted that way, with one-character free values — fits `max_tokens` always closes
//! and parses. Values of object, array or range-bounded number type are not shortened (their
//! JSON must complete to be valid): a call with such a parameter is planned as if that value
//! took its minimal form, and may still be cut, in which case the parser closes it with what
//! was generated.

use super::{KEY_CLOSE, KEY_OPEN, TOOL_CLOSE, TOOL_OPEN, VALUE_CLOSE, VALUE_OPEN};
use crate::error::{Error, Result};
use serde_json::{json, Value};

/// Digits of a number whose schema gives no bounds (an `i64` holds 18).
pub const DEFAULT_MAX_DIGITS: usize = 15;

/// Fraction digits of a number whose schema gives no bounds.
const MAX_FRACTION_DIGITS: usize = 6;

/// The budget a forced call must close within.
pub struct CallBudget<'a> {
    /// Tokens the call may take.
    pub max_tokens: usize,
    /// The id of a tag that is one token of the vocabulary (GLM's tags are), if it is.
    pub tag_id: &'a dyn Fn(&str) -> Option<u32>,
}

/// How the grammar spells a tag, and what it costs at most.
fn tag(t: &str, budget: Option<&CallBudget>) -> (String, usize) {
    match budget.and_then(|b| (b.tag_id)(t)) {
        Some(id) => (format!("<[{id}]>"), 1),
        None => (lark_str(t), t.len()),
    }
}

/// How one argument's value is written.
enum ValueRule {
    /// Tokens counted, nothing to shorten (enums, booleans, bounded integers, whole JSON).
    Fixed { rule: String, tokens: usize },
    /// Free text, `min..=max` characters, shortened to the plan's share.
    Text { min: u64, max: Option<u64> },
    /// A number without bounds: `digits` at most, shortened to the plan's share.
    Number { integer: bool },
}

struct Arg {
    key: String,
    required: bool,
    value: ValueRule,
    /// Tokens of the markup and key, plus a fixed value's tokens.
    fixed: usize,
}

/// The Lark grammar of one GLM tool call to `only` (or any of `tools`, in the chat template's
/// form `{"type":"function","function":{name, parameters}}`), planned for `budget` when given.
pub fn tool_call_grammar(
    tools: &[Value],
    only: Option<&str>,
    budget: Option<&CallBudget>,
) -> Result<String> {
    // At most one token per byte: every token of the vocabulary spells at least one.
    let count = |s: &str| s.len();
    let (tool_open, tool_open_cost) = tag(TOOL_OPEN, budget);
    let (tool_close, tool_close_cost) = tag(TOOL_CLOSE, budget);
    let (key_open, key_open_cost) = tag(KEY_OPEN, budget);
    let (key_close, key_close_cost) = tag(KEY_CLOSE, budget);
    let (value_open, value_open_cost) = tag(VALUE_OPEN, budget);
    let (value_close, value_close_cost) = tag(VALUE_CLOSE, budget);
    let mut rules = Vec::new();
    let mut alts = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let f = &t["function"];
        let Some(name) = f["name"].as_str() else {
            continue;
        };
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let params = &f["parameters"];
        let required: Vec<&str> = params["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        // `<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n`, less the key and value.
        let markup = key_open_cost + key_close_cost + 1 + value_open_cost + value_close_cost + 1;
        let mut args: Vec<Arg> = params["properties"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(key, schema)| {
                let value = value_rule(schema, &count);
                let value_fixed = match &value {
                    ValueRule::Fixed { tokens, .. } => *tokens,
                    _ => 0,
                };
                Arg {
                    key: key.clone(),
                    required: required.contains(&key.as_str()),
                    fixed: markup + count(key) + value_fixed,
                    value,
                }
            })
            .collect();
        let mut share = None;
        if let Some(b) = budget {
            let call = tool_open_cost + count(name) + 1 + tool_close_cost;
            let avail = b.max_tokens;
            let is_free = |a: &Arg| !matches!(a.value, ValueRule::Fixed { .. });
            // A free value needs a token at least; a few more before an optional one is offered.
            let mut used = call
                + args
                    .iter()
                    .filter(|a| a.required)
                    .map(|a| a.fixed + usize::from(is_free(a)))
                    .sum::<usize>();
            let mut free = args.iter().filter(|a| a.required && is_free(a)).count();
            args.retain(|a| {
                if a.required {
                    return true;
                }
                let need = a.fixed + if is_free(a) { 4 } else { 0 };
                let fits = used + need + 4 * free <= avail;
                if fits {
                    used += a.fixed;
                    free += usize::from(is_free(a));
                }
                fits
            });
            let fixed: usize = call + args.iter().map(|a| a.fixed).sum::<usize>();
            share = Some(
                avail
                    .saturating_sub(fixed)
                    .checked_div(free)
                    .map_or(0, |k| k.max(1)),
            );
        }
        let mut seq = String::new();
        for (j, a) in args.iter().enumerate() {
            let v = format!("val_{i}_{j}");
            rules.push(value_lark(&v, &a.value, share));
            rules.push(format!(
                "arg_{i}_{j}: {key_open} {} {key_close} \"\\n\" {value_open} {v} {value_close} \"\\n\"",
                lark_str(&a.key),
            ));
            let opt = if a.required { "" } else { "?" };
            seq.push_str(&format!(" arg_{i}_{j}{opt}"));
        }
        rules.push(format!("call_{i}: {} \"\\n\"{seq}", lark_str(name)));
        alts.push(format!("call_{i}"));
    }
    if alts.is_empty() {
        return Err(Error::InvalidParam {
            param: "tool_choice",
            reason: match only {
                Some(n) => format!("tool_choice names `{n}`, which is not among the tools"),
                None => "no tool has a name".into(),
            },
        });
    }
    let mut g = format!("start: {tool_open} ({}) {tool_close}\n", alts.join(" | "));
    for r in rules {
        g.push_str(&r);
        g.push('\n');
    }
    Ok(g)
}

/// How a parameter's value is written, by its schema.
fn value_rule(schema: &Value, count: &dyn Fn(&str) -> usize) -> ValueRule {
    let ty = schema["type"].as_str();
    if ty == Some("string") {
        if let Some(e) = schema["enum"].as_array() {
            let alts: Vec<&str> = e.iter().filter_map(Value::as_str).collect();
            if !alts.is_empty() {
                let tokens = alts.iter().map(|a| count(a)).max().unwrap_or(0);
                let rule = alts.iter().map(|a| lark_str(a)).collect::<Vec<_>>();
                return ValueRule::Fixed {
                    rule: format!("({})", rule.join(" | ")),
                    tokens,
                };
            }
        }
        return ValueRule::Text {
            min: schema["minLength"].as_u64().unwrap_or(0),
            max: schema["maxLength"].as_u64(),
        };
    }
    let bounded = schema.get("minimum").is_some_and(Value::is_number)
        && schema.get("maximum").is_some_and(Value::is_number);
    let plain = schema.get("enum").is_none() && schema.get("const").is_none();
    match ty {
        Some("integer") if !bounded && plain => return ValueRule::Number { integer: true },
        Some("number") if !bounded && plain => return ValueRule::Number { integer: false },
        _ => {}
    }
    let s = if schema.is_object() {
        schema.clone()
    } else {
        json!({})
    };
    let tokens = match ty {
        Some("integer") | Some("number") => {
            let widest = |k: &str| schema[k].to_string();
            count(&widest("minimum")).max(count(&widest("maximum")))
        }
        Some("boolean") => count("false"),
        Some("null") => count("null"),
        _ => count(&minimal_json(schema)),
    };
    ValueRule::Fixed {
        rule: format!("%json {s}"),
        tokens,
    }
}

/// The rule of a value named `v`; `share` is the plan's tokens per free value.
fn value_lark(v: &str, value: &ValueRule, share: Option<usize>) -> String {
    match value {
        ValueRule::Fixed { rule, .. } => format!("{v}: {rule}"),
        ValueRule::Text { min, max } => {
            let body = match max {
                Some(max) => format!("/[^<]{{{min},{}}}/", (*max).max(*min)),
                None if *min > 0 => format!("/[^<]{{{min},}}/"),
                None => "/[^<]*/".into(),
            };
            match share {
                Some(k) => format!("{v}[max_tokens={k}]: {body}"),
                None => format!("{v}: {body}"),
            }
        }
        ValueRule::Number { integer } => {
            // A character is a token at most: the sign, the digits (and the point, and the
            // fraction's digits) fit the share.
            let digits = share
                .map_or(DEFAULT_MAX_DIGITS, |k| {
                    if *integer {
                        k.saturating_sub(1)
                    } else {
                        k.saturating_sub(2) / 2
                    }
                })
                .clamp(1, DEFAULT_MAX_DIGITS);
            // No room for a sign when the share is one character.
            let sign = if share.is_some_and(|k| k < 2) {
                ""
            } else {
                "-?"
            };
            // `-0` is not an integer in JSON readers (it reads back as a float).
            let int = if digits == 1 {
                format!("(0|{sign}[1-9])")
            } else {
                format!("(0|{sign}[1-9][0-9]{{0,{}}})", digits - 1)
            };
            let fraction = share.map_or(MAX_FRACTION_DIGITS, |k| {
                k.saturating_sub(2 + digits).min(MAX_FRACTION_DIGITS)
            });
            if *integer || fraction == 0 {
                format!("{v}: /{int}/")
            } else {
                format!("{v}: /{int}(\\.[0-9]{{1,{fraction}}})?/")
            }
        }
    }
}

/// A small JSON instance of `schema` (to count what a value costs at least).
fn minimal_json(schema: &Value) -> String {
    fn min(s: &Value) -> Value {
        if let Some(c) = s.get("const") {
            return c.clone();
        }
        if let Some(e) = s["enum"].as_array().and_then(|e| e.first()) {
            return e.clone();
        }
        match s["type"].as_str() {
            Some("object") => {
                let req: Vec<&str> = s["required"]
                    .as_array()
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let props = s["properties"].as_object();
                Value::Object(
                    req.iter()
                        .map(|k| {
                            let sub = props.and_then(|p| p.get(*k)).unwrap_or(&Value::Null);
                            ((*k).to_owned(), min(sub))
                        })
                        .collect(),
                )
            }
            Some("array") => json!([]),
            Some("string") => json!(""),
            Some("boolean") => json!(false),
            Some("integer") | Some("number") => json!(0),
            _ => Value::Null,
        }
    }
    min(schema).to_string()
}

/// A Lark string literal (JSON's escaping is a subset Lark reads).
fn lark_str(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// `schema` with every integer that has no bounds given ±(10^[`DEFAULT_MAX_DIGITS`] − 1), so
/// structured output cannot run away in digits.
pub fn bound_integers(schema: &Value) -> Value {
    let limit = 10i64.pow(DEFAULT_MAX_DIGITS as u32) - 1;
    let mut s = schema.clone();
    fn walk(v: &mut Value, limit: i64) {
        match v {
            Value::Object(m) => {
                if m.get("type").and_then(Value::as_str) == Some("integer") {
                    m.entry("minimum").or_insert(json!(-limit));
                    m.entry("maximum").or_insert(json!(limit));
                }
                for (_, sub) in m.iter_mut() {
                    walk(sub, limit);
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| walk(x, limit)),
            _ => {}
        }
    }
    walk(&mut s, limit);
    s
}
