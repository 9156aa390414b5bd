//! Structured output and forced tool calls, shared by the protocols: `response_format` /
//! `text.format` become a [`Constraint`], and a `tool_choice` that forces a call becomes a Lark
//! grammar of GLM's tool-call syntax, so the model can only answer with a well-formed call.
//!
//! A forced call is written the way the chat template renders past calls (and
//! `glm_tools` parses them):
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
//! `%json`), which `glm_tools` types back into the arguments object. Constrained requests run
//! with thinking off: the constraint applies to the answer, and a `<think>` block would not
//! match it.

use crate::backend::Constraint;
use crate::error::{ApiError, ApiResult};
use serde_json::Value;

/// What `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (the default).
    Auto,
    /// No tools: they are not even shown.
    None,
    /// Some call must be made.
    Required,
    /// This function must be called.
    Named(String),
}

impl ToolChoice {
    /// OpenAI's forms: `"auto" | "none" | "required"`, `{"type":"function","function":{"name"}}`
    /// (Chat) or `{"type":"function","name"}` (Responses).
    pub fn openai(v: Option<&Value>) -> ApiResult<ToolChoice> {
        let bad = |msg: String| Err(ApiError::invalid_param("tool_choice", msg));
        match v {
            None | Some(Value::Null) => Ok(ToolChoice::Auto),
            Some(Value::String(s)) => match s.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                other => bad(format!(
                    "unknown tool_choice `{other}`; expected auto, none, required or a function"
                )),
            },
            Some(o @ Value::Object(_)) if o["type"] == "function" => {
                let name = o["function"]["name"].as_str().or(o["name"].as_str());
                match name {
                    Some(n) => Ok(ToolChoice::Named(n.to_owned())),
                    None => bad("a function tool_choice needs the function's name".into()),
                }
            }
            Some(other) => bad(format!("unsupported tool_choice {other}")),
        }
    }

    /// Anthropic's form: `{"type": "auto" | "any" | "none" | "tool", "name"?}`.
    pub fn anthropic(v: Option<&Value>) -> ApiResult<ToolChoice> {
        let Some(v) = v.filter(|v| !v.is_null()) else {
            return Ok(ToolChoice::Auto);
        };
        match v["type"].as_str() {
            Some("auto") => Ok(ToolChoice::Auto),
            Some("none") => Ok(ToolChoice::None),
            Some("any") => Ok(ToolChoice::Required),
            Some("tool") => match v["name"].as_str() {
                Some(n) => Ok(ToolChoice::Named(n.to_owned())),
                None => Err(ApiError::invalid_param(
                    "tool_choice.name",
                    "tool_choice `tool` needs the tool's name",
                )),
            },
            _ => Err(ApiError::invalid_param(
                "tool_choice",
                format!("unsupported tool_choice {v}; expected auto, any, tool or none"),
            )),
        }
    }
}

/// What a request's tools and output constraint resolve to.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// Tools are shown to the model (and its tool-call output parsed).
    pub tools_on: bool,
    /// The output constraint, if any.
    pub constraint: Option<Constraint>,
}

impl Resolved {
    /// Thinking must be off when the output is constrained (see the module docs).
    pub fn enable_thinking(&self, asked: Option<bool>) -> Option<bool> {
        if self.constraint.is_some() {
            Some(false)
        } else {
            asked
        }
    }
}

/// Combines a tool choice over `tools` (template form: `{"type":"function","function":{name,
/// description?, parameters?}}`) with a response-format constraint.
pub fn resolve(
    choice: &ToolChoice,
    tools: &[Value],
    format: Option<Constraint>,
) -> ApiResult<Resolved> {
    let forced = match choice {
        ToolChoice::Auto | ToolChoice::None => None,
        ToolChoice::Required if tools.is_empty() => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                "tool_choice forces a tool call, but the request has no tools",
            ))
        }
        ToolChoice::Required => Some(tool_call_grammar(tools, None)?),
        ToolChoice::Named(n) => Some(tool_call_grammar(tools, Some(n))?),
    };
    if forced.is_some() && format.is_some() {
        return Err(ApiError::invalid_param(
            "tool_choice",
            "a forced tool call and a structured response format cannot both apply",
        ));
    }
    Ok(Resolved {
        tools_on: *choice != ToolChoice::None && !tools.is_empty(),
        constraint: forced.map(Constraint::Lark).or(format),
    })
}

/// OpenAI `response_format` (Chat): `text`, `json_object`, or `json_schema` with
/// `json_schema.schema`.
pub fn response_format(rf: Option<&Value>) -> ApiResult<Option<Constraint>> {
    let Some(rf) = rf.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    format_of(rf, &rf["json_schema"]["schema"], "response_format")
}

/// Responses `text.format`: `text`, `json_object`, or `json_schema` with `schema` beside `type`.
pub fn text_format(text: Option<&Value>) -> ApiResult<Option<Constraint>> {
    match text.and_then(|t| t.get("format")).filter(|f| !f.is_null()) {
        None => Ok(None),
        Some(f) => format_of(f, &f["schema"], "text.format"),
    }
}

fn format_of(f: &Value, schema: &Value, param: &str) -> ApiResult<Option<Constraint>> {
    match f["type"].as_str() {
        None | Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonObject)),
        Some("json_schema") if schema.is_object() => {
            Ok(Some(Constraint::JsonSchema(schema.clone())))
        }
        Some("json_schema") => Err(ApiError::invalid_param(
            param,
            "`json_schema` needs a schema object",
        )),
        Some(other) => Err(ApiError::invalid_param(
            param,
            format!("unknown format type `{other}`; expected text, json_object or json_schema"),
        )),
    }
}

/// The Lark grammar of one GLM tool call to `only` (or any of `tools`).
pub fn tool_call_grammar(tools: &[Value], only: Option<&str>) -> ApiResult<String> {
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
        let mut args = String::new();
        if let Some(props) = params["properties"].as_object() {
            for (j, (key, schema)) in props.iter().enumerate() {
                let value = value_rule(schema);
                rules.push(format!(
                    "arg_{i}_{j}: \"<arg_key>\" {} \"</arg_key>\\n<arg_value>\" {value} \"</arg_value>\\n\"",
                    lark_str(key)
                ));
                let opt = if required.contains(&key.as_str()) {
                    ""
                } else {
                    "?"
                };
                args.push_str(&format!(" arg_{i}_{j}{opt}"));
            }
        }
        rules.push(format!("call_{i}: {} \"\\n\"{args}", lark_str(name)));
        alts.push(format!("call_{i}"));
    }
    if alts.is_empty() {
        return Err(ApiError::invalid_param(
            "tool_choice",
            match only {
                Some(n) => format!("tool_choice names `{n}`, which is not among the tools"),
                None => "no tool has a name".into(),
            },
        ));
    }
    let mut g = format!(
        "start: \"<tool_call>\" ({}) \"</tool_call>\"\n",
        alts.join(" | ")
    );
    for r in rules {
        g.push_str(&r);
        g.push('\n');
    }
    Ok(g)
}

/// The value of one argument: free text without `<` for strings (their enum, or their length
/// bounds, when given), JSON under the parameter's schema otherwise.
fn value_rule(schema: &Value) -> String {
    if schema["type"] == "string" {
        if let Some(e) = schema["enum"].as_array() {
            let alts: Vec<String> = e.iter().filter_map(Value::as_str).map(lark_str).collect();
            if !alts.is_empty() {
                return format!("({})", alts.join(" | "));
            }
        }
        // `minLength` / `maxLength` bound the text (a weak model may otherwise never close it).
        let min = schema["minLength"].as_u64().unwrap_or(0);
        return match schema["maxLength"].as_u64() {
            Some(max) => format!("/[^<]{{{min},{}}}/", max.max(min)),
            None if min > 0 => format!("/[^<]{{{min},}}/"),
            None => "/[^<]*/".into(),
        };
    }
    let s = if schema.is_object() {
        schema.clone()
    } else {
        serde_json::json!({})
    };
    format!("%json {s}")
}

/// A Lark string literal (JSON's escaping is a subset Lark reads).
fn lark_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer"},
                           "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"]}}})
    }

    #[test]
    fn choices_parse_in_each_protocol_form() {
        let o = |v: Value| ToolChoice::openai(Some(&v)).unwrap();
        assert_eq!(o(json!("required")), ToolChoice::Required);
        assert_eq!(
            o(json!({"type": "function", "function": {"name": "f"}})),
            ToolChoice::Named("f".into())
        );
        assert_eq!(
            o(json!({"type": "function", "name": "g"})),
            ToolChoice::Named("g".into())
        );
        assert!(ToolChoice::openai(Some(&json!("always"))).is_err());
        let a = |v: Value| ToolChoice::anthropic(Some(&v)).unwrap();
        assert_eq!(a(json!({"type": "any"})), ToolChoice::Required);
        assert_eq!(
            a(json!({"type": "tool", "name": "h"})),
            ToolChoice::Named("h".into())
        );
        assert!(ToolChoice::anthropic(Some(&json!({"type": "tool"}))).is_err());
    }

    #[test]
    fn grammar_names_each_argument_with_its_type() {
        let g = tool_call_grammar(&[weather()], None).unwrap();
        assert!(
            g.starts_with("start: \"<tool_call>\" (call_0) \"</tool_call>\""),
            "{g}"
        );
        assert!(
            g.contains("call_0: \"get_weather\" \"\\n\" arg_0_0 arg_0_1? arg_0_2?"),
            "{g}"
        );
        assert!(
            g.contains("/[^<]{0,20}/") && g.contains("%json {\"type\":\"integer\"}"),
            "{g}"
        );
        assert!(g.contains("(\"c\" | \"f\")"), "{g}");
        let e = tool_call_grammar(&[weather()], Some("nope")).unwrap_err();
        assert!(e.message.contains("nope"));
    }

    #[test]
    fn formats_and_conflicts() {
        assert_eq!(
            response_format(Some(&json!({"type": "text"}))).unwrap(),
            None
        );
        assert_eq!(
            response_format(Some(&json!({"type": "json_object"}))).unwrap(),
            Some(Constraint::JsonObject)
        );
        let s = json!({"type": "object"});
        assert_eq!(
            response_format(Some(
                &json!({"type": "json_schema", "json_schema": {"name": "x", "schema": s}})
            ))
            .unwrap(),
            Some(Constraint::JsonSchema(s.clone()))
        );
        assert!(response_format(Some(&json!({"type": "json_schema"}))).is_err());
        assert_eq!(
            text_format(Some(
                &json!({"format": {"type": "json_schema", "name": "x", "schema": s}})
            ))
            .unwrap(),
            Some(Constraint::JsonSchema(s))
        );
        let r = resolve(&ToolChoice::Required, &[weather()], None).unwrap();
        assert!(r.tools_on && matches!(r.constraint, Some(Constraint::Lark(_))));
        assert_eq!(r.enable_thinking(Some(true)), Some(false));
        assert!(resolve(&ToolChoice::Required, &[], None).is_err());
        assert!(resolve(
            &ToolChoice::Required,
            &[weather()],
            Some(Constraint::JsonObject)
        )
        .is_err());
        let r = resolve(&ToolChoice::None, &[weather()], None).unwrap();
        assert!(!r.tools_on && r.constraint.is_none());
    }
}
