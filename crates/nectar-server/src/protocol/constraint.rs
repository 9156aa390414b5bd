//! Structured output and forced tool calls, shared by the protocols: `response_format` /
//! `text.format` / Anthropic's `output_config.format` become a [`Constraint`], and a
//! `tool_choice` that forces a call becomes [`Constraint::ToolCall`], which the backend turns
//! into the grammar of GLM's tool-call syntax planned for the request's token budget
//! (`nectar_engine::glm`), so the model can only answer with a well-formed call.
//!
//! A forced call and a response format may come together (OpenAI accepts both, and instructor
//! sends both): the call is forced, and the format would apply to text the call leaves no room
//! for. `allowed_tools` narrows the tools shown to the model to those it names (`mode: auto`
//! lets the model choose to call one, `required` forces one). Constrained requests run with
//! thinking off: the constraint applies to the answer, and a `<think>` block would not match it.

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
    /// Only these tools may be called; `required`: one of them must be.
    Allowed {
        /// The tools' names.
        names: Vec<String>,
        /// A call is forced (`mode: required`).
        required: bool,
    },
}

impl ToolChoice {
    /// OpenAI's forms: `"auto" | "none" | "required"`, `{"type":"function","function":{"name"}}`
    /// (Chat) or `{"type":"function","name"}` (Responses), and `{"type": "allowed_tools",
    /// "mode", "tools"}` (Responses) or `{"type": "allowed_tools", "allowed_tools": {"mode",
    /// "tools"}}` (Chat).
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
            Some(o @ Value::Object(_)) if o["type"] == "allowed_tools" => {
                let spec = if o["allowed_tools"].is_object() {
                    &o["allowed_tools"]
                } else {
                    o
                };
                let required = match spec["mode"].as_str() {
                    Some("auto") | None => false,
                    Some("required") => true,
                    Some(m) => {
                        return bad(format!(
                            "unknown allowed_tools mode `{m}`; expected auto or required"
                        ))
                    }
                };
                let Some(tools) = spec["tools"].as_array() else {
                    return bad("allowed_tools needs a list of `tools`".into());
                };
                let mut names = Vec::new();
                for t in tools {
                    match t["function"]["name"].as_str().or(t["name"].as_str()) {
                        Some(n) => names.push(n.to_owned()),
                        None => return bad(format!("allowed_tools entry {t} names no function")),
                    }
                }
                Ok(ToolChoice::Allowed { names, required })
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
    /// The tools shown (all of them, or those `allowed_tools` names).
    pub tools: Vec<Value>,
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
    let name_of = |t: &Value| t["function"]["name"].as_str().unwrap_or("").to_owned();
    let has = |n: &str| tools.iter().any(|t| name_of(t) == n);
    let mut shown = tools.to_vec();
    let forced = match choice {
        ToolChoice::Auto | ToolChoice::None => None,
        ToolChoice::Required if tools.is_empty() => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                "tool_choice forces a tool call, but the request has no tools",
            ))
        }
        ToolChoice::Required => Some(None),
        ToolChoice::Named(n) if !has(n) => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                format!("tool_choice names `{n}`, which is not among the tools"),
            ))
        }
        ToolChoice::Named(n) => Some(Some(n.clone())),
        ToolChoice::Allowed { names, required } => {
            if let Some(n) = names.iter().find(|n| !has(n)) {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    format!("allowed_tools names `{n}`, which is not among the tools"),
                ));
            }
            shown.retain(|t| names.contains(&name_of(t)));
            if *required && shown.is_empty() {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    "allowed_tools forces a tool call, but names no tool",
                ));
            }
            required.then_some(None)
        }
    };
    let tools_on = *choice != ToolChoice::None && !shown.is_empty();
    // A forced call wins over a response format: the answer is the call.
    let constraint = match forced {
        Some(only) => Some(Constraint::ToolCall {
            tools: shown.clone(),
            only,
        }),
        None => format,
    };
    Ok(Resolved {
        tools_on,
        tools: if tools_on { shown } else { vec![] },
        constraint,
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

/// Anthropic structured outputs: `output_config.format` (or the beta's top-level
/// `output_format`), `{"type": "json_schema", "schema": {…}}`.
pub fn anthropic_format(
    output_format: Option<&Value>,
    output_config: Option<&Value>,
) -> ApiResult<Option<Constraint>> {
    let (f, param) = match output_config.map(|c| &c["format"]).filter(|f| !f.is_null()) {
        Some(f) => (f, "output_config.format"),
        None => match output_format.filter(|f| !f.is_null()) {
            Some(f) => (f, "output_format"),
            None => return Ok(None),
        },
    };
    if f["type"] != "json_schema" {
        return Err(ApiError::invalid_param(
            param,
            format!("unknown format type {}; expected json_schema", f["type"]),
        ));
    }
    format_of(f, &f["schema"], param)
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        assert!(
            r.tools_on && matches!(r.constraint, Some(Constraint::ToolCall { only: None, .. }))
        );
        assert_eq!(r.enable_thinking(Some(true)), Some(false));
        assert!(resolve(&ToolChoice::Required, &[], None).is_err());
        // A forced call and a response format together: the call is forced (OpenAI accepts both).
        let r = resolve(
            &ToolChoice::Named("get_weather".into()),
            &[weather()],
            Some(Constraint::JsonObject),
        )
        .unwrap();
        assert_eq!(
            r.constraint,
            Some(Constraint::ToolCall {
                tools: vec![weather()],
                only: Some("get_weather".into())
            })
        );
        let e = resolve(&ToolChoice::Named("nope".into()), &[weather()], None).unwrap_err();
        assert!(e.message.contains("nope"));
        let r = resolve(&ToolChoice::None, &[weather()], None).unwrap();
        assert!(!r.tools_on && r.constraint.is_none());
    }

    #[test]
    fn allowed_tools_narrow_what_is_shown() {
        let other = json!({"type": "function", "function": {"name": "other"}});
        let tools = [weather(), other];
        let chat = json!({"type": "allowed_tools", "allowed_tools": {"mode": "required",
            "tools": [{"type": "function", "function": {"name": "get_weather"}}]}});
        let c = ToolChoice::openai(Some(&chat)).unwrap();
        assert_eq!(
            c,
            ToolChoice::Allowed {
                names: vec!["get_weather".into()],
                required: true
            }
        );
        let r = resolve(&c, &tools, None).unwrap();
        assert_eq!(r.tools, vec![weather()]);
        assert!(
            matches!(r.constraint, Some(Constraint::ToolCall { ref tools, only: None }) if tools.len() == 1)
        );
        let responses = json!({"type": "allowed_tools", "mode": "auto",
            "tools": [{"type": "function", "name": "other"}]});
        let r = resolve(&ToolChoice::openai(Some(&responses)).unwrap(), &tools, None).unwrap();
        assert_eq!(r.tools.len(), 1);
        assert!(r.tools_on && r.constraint.is_none());
        let bad = json!({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "x"}]});
        assert!(resolve(&ToolChoice::openai(Some(&bad)).unwrap(), &tools, None).is_err());
    }
}
