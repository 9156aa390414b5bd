//! The wire protocols. Each file owns one API family's request and response types, their
//! translation to a protocol-neutral [`GenRequest`](crate::backend::GenRequest), and the exact
//! streaming event sequence of that API. Helpers shared by all of them are here.

pub mod anthropic;
pub mod constraint;
pub mod openai_chat;
pub mod openai_completions;
pub mod responses;

use crate::backend::{Sampling, TokenLogprob};
use crate::error::{ApiError, ApiResult, Flavour};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Stop strings a request may give at most (OpenAI allows 4; a few more cost nothing).
pub const MAX_STOP_STRINGS: usize = 16;

/// Parses a JSON body. A body over the limit is 413; malformed JSON, or a field of the wrong
/// type, is 400 naming the field (`messages[0].content`).
pub fn parse_body<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    flavour: Flavour,
    limit: usize,
) -> ApiResult<T> {
    let bytes = body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::payload_too_large(limit)
        } else if crate::listen::is_body_timeout(&r) {
            ApiError::body_timeout(r.body_text())
        } else {
            ApiError::invalid(format!("cannot read the request body: {}", r.body_text()))
        }
        .flavour(flavour)
    })?;
    // Every request is an object; serde would read an array as a struct's fields in order
    // (`[1, 2]` → "invalid `[0]`: expected a string").
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{')
        && serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_ok()
    {
        return Err(ApiError::invalid(
            "the request body must be a JSON object (`{...}`)".to_string(),
        )
        .flavour(flavour));
    }
    let mut de = serde_json::Deserializer::from_slice(&bytes);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    // One JSON value and only whitespace after it: `{…}{…}` is not a request.
    if parsed.is_ok() {
        de.end().map_err(|e| {
            ApiError::invalid(format!("the request body is not valid JSON: {e}")).flavour(flavour)
        })?;
    }
    parsed.map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let err = if inner.is_syntax() || inner.is_eof() {
            ApiError::invalid(format!("the request body is not valid JSON: {inner}"))
        } else if path == "." {
            // Valid JSON that does not make a request: name the missing field where serde says
            // which (`missing field `messages``).
            let field = inner.to_string();
            let field = field
                .strip_prefix("missing field `")
                .and_then(|f| f.split('`').next())
                .map(str::to_string);
            let msg = format!("invalid request body: {inner}");
            match field {
                Some(f) => ApiError::invalid_param(f, msg),
                None => ApiError::invalid(msg),
            }
        } else {
            ApiError::invalid_param(path.clone(), format!("invalid `{path}`: {inner}"))
        };
        err.flavour(flavour)
    })
}

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    /// One string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl StopField {
    /// The strings, checked against [`MAX_STOP_STRINGS`].
    pub fn into_vec(self, param: &str) -> ApiResult<Vec<String>> {
        let v = match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        };
        if v.len() > MAX_STOP_STRINGS {
            return Err(ApiError::invalid_param(
                param,
                format!("at most {MAX_STOP_STRINGS} stop strings are accepted"),
            ));
        }
        Ok(v.into_iter().filter(|s| !s.is_empty()).collect())
    }
}

/// Checks sampling knobs against their ranges (the engine decodes greedily for now, but a value
/// no sampler could honour is still the client's error).
pub fn validate_sampling(s: &Sampling) -> ApiResult<()> {
    let range = |name: &str, v: Option<f32>, lo: f32, hi: f32| -> ApiResult<()> {
        match v {
            Some(x) if !(x.is_finite() && (lo..=hi).contains(&x)) => Err(ApiError::invalid_param(
                name,
                format!("`{name}` must be between {lo} and {hi}, got {x}"),
            )),
            _ => Ok(()),
        }
    };
    range("temperature", s.temperature, 0.0, 2.0)?;
    range("top_p", s.top_p, 0.0, 1.0)?;
    range("min_p", s.min_p, 0.0, 1.0)?;
    range("presence_penalty", s.presence_penalty, -2.0, 2.0)?;
    range("frequency_penalty", s.frequency_penalty, -2.0, 2.0)?;
    range("repetition_penalty", s.repetition_penalty, 0.01, 10.0)?;
    if let Some(p) = s.top_p {
        if p == 0.0 {
            return Err(ApiError::invalid_param(
                "top_p",
                "`top_p` must be greater than 0",
            ));
        }
    }
    Ok(())
}

/// The request's `model` must be the served id or one of its aliases (`--alias`): another name
/// is 404 `model_not_found`, as OpenAI and Anthropic answer, rather than being served by a
/// model the client did not ask for. An absent `model` means the served one.
pub fn check_model(state: &AppState, model: Option<&str>) -> ApiResult<()> {
    let Some(m) = model else { return Ok(()) };
    if m == state.backend.model_id() || state.config.aliases.iter().any(|a| a == m) {
        return Ok(());
    }
    let mut e = ApiError::not_found(format!(
        "the model `{m}` does not exist: this server serves `{}`",
        state.backend.model_id()
    ));
    e.param = Some("model".into());
    e.code = Some("model_not_found");
    Err(e)
}

/// A sampling value as JSON, written as its shortest decimal (`0.8`, not the `f32` widened to
/// `0.800000011920929`).
pub fn f32_json(x: f32) -> Value {
    x.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

/// `max_tokens`-style budgets: at least 1.
pub fn validate_max_tokens(param: &str, v: Option<u64>) -> ApiResult<Option<usize>> {
    match v {
        Some(0) => Err(ApiError::invalid_param(
            param,
            format!("`{param}` must be at least 1"),
        )),
        Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        None => Ok(None),
    }
}

/// OpenAI's `logit_bias`: token ids (as strings) to biases in [-100, 100].
pub fn parse_logit_bias(
    m: Option<&serde_json::Map<String, Value>>,
) -> ApiResult<BTreeMap<u32, f32>> {
    let mut out = BTreeMap::new();
    for (k, v) in m.into_iter().flatten() {
        let id: u32 = k.parse().map_err(|_| {
            ApiError::invalid_param("logit_bias", format!("key `{k}` is not a token id"))
        })?;
        let b = v
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| {
                ApiError::invalid_param(
                    "logit_bias",
                    format!("the bias of token {id} must be a number between -100 and 100"),
                )
            })?;
        out.insert(id, b as f32);
    }
    Ok(out)
}

/// OpenAI Chat's logprob entry of one token.
pub fn chat_logprob(t: &TokenLogprob) -> Value {
    let entry = |token: &str, lp: f32| serde_json::json!({"token": token, "logprob": lp, "bytes": token.as_bytes()});
    let mut e = entry(&t.token, t.logprob);
    e["top_logprobs"] = Value::Array(t.top.iter().map(|(_, s, lp)| entry(s, *lp)).collect());
    e
}

/// A fresh id with an API's prefix (`chatcmpl-`, `resp_`, `msg_`, ...).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The text of a message `content`: a string, null, or a list of parts of which only text parts
/// (`text`, `input_text`, `output_text`) are accepted; anything else (images, audio, files) is
/// refused naming the part, since the model reads text only.
pub fn content_text(content: &Value, param: &str) -> ApiResult<String> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                match (kind, p.get("text").and_then(Value::as_str)) {
                    ("text" | "input_text" | "output_text", Some(t)) => out.push_str(t),
                    _ => {
                        return Err(ApiError::invalid_param(
                            format!("{param}[{i}]"),
                            format!(
                                "content part of type `{kind}` is not supported: this model reads \
                                 text only"
                            ),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::invalid_param(
            param,
            "content must be a string or a list of text parts",
        )),
    }
}

/// An OpenAI-style function tool for the chat template.
pub fn function_tool(name: &str, description: Option<&Value>, parameters: Option<&Value>) -> Value {
    let mut f = serde_json::Map::new();
    f.insert("name".into(), Value::String(name.to_owned()));
    if let Some(d) = description.filter(|d| !d.is_null()) {
        f.insert("description".into(), d.clone());
    }
    if let Some(p) = parameters.filter(|p| !p.is_null()) {
        f.insert("parameters".into(), p.clone());
    }
    serde_json::json!({"type": "function", "function": Value::Object(f)})
}

/// A known field of a request: its name, its value if sent, and when that value asks for
/// something this server does not do.
pub type KnownField<'a> = (&'a str, Option<&'a Value>, fn(&Value) -> bool);

/// Refuses known request fields that this server does not implement and that would change the
/// answer if ignored (audio output, web search, server-side prompts, …): each `(name, value)`
/// whose value is present and asks for something (`refuses` says when) is a 400 naming the
/// field. Fields that do not change the answer are accepted and ignored (`docs/api.md` lists
/// both).
pub fn refuse_fields(fields: &[KnownField<'_>]) -> ApiResult<()> {
    for (name, v, refuses) in fields {
        if let Some(v) = v.filter(|v| refuses(v)) {
            return Err(ApiError::invalid_param(
                *name,
                format!("`{name}` ({v}) is not supported by this server"),
            ));
        }
    }
    Ok(())
}

/// Asks for something: not null, `false`, `{}`, `[]` or `""`.
pub fn asks(v: &Value) -> bool {
    !matches!(v, Value::Null | Value::Bool(false))
        && v.as_array().is_none_or(|a| !a.is_empty())
        && v.as_object().is_none_or(|o| !o.is_empty())
        && v.as_str().is_none_or(|s| !s.is_empty())
}

/// `modalities` asks for more than text.
pub fn beyond_text(v: &Value) -> bool {
    match v {
        Value::Array(a) => a.iter().any(|m| m != "text"),
        Value::Null => false,
        _ => true,
    }
}

/// The tool-call limit of an OpenAI `parallel_tool_calls`: `false` is at most one call.
pub fn call_limit(parallel_tool_calls: Option<bool>) -> Option<usize> {
    (parallel_tool_calls == Some(false)).then_some(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Req {
        messages: Vec<Msg>,
    }
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Msg {
        role: String,
    }

    #[test]
    fn wrong_type_names_the_field() {
        let e = parse_body::<Req>(
            Ok(Bytes::from_static(br#"{"messages":[{"role":1}]}"#)),
            Flavour::OpenAi,
            10,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        assert_eq!(e.kind.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn missing_field_and_bad_json() {
        let e = parse_body::<Req>(Ok(Bytes::from_static(b"{}")), Flavour::OpenAi, 10).unwrap_err();
        assert!(
            e.message.contains("missing field `messages`"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("not valid JSON"), "{}", e.message);
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = parse_body::<Req>(Ok(Bytes::from_static(b"{\"mess")), Flavour::Anthropic, 10)
            .unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        assert_eq!(e.body()["type"], "error");
        // Valid JSON that is not an object is named as such, not read as fields in order.
        for body in [&b"[[{\"role\":\"user\"}]]"[..], b" 7", b"\"hi\"", b"null"] {
            let e = parse_body::<Req>(Ok(Bytes::copy_from_slice(body)), Flavour::OpenAi, 10)
                .unwrap_err();
            assert!(e.message.contains("must be a JSON object"), "{}", e.message);
            assert_eq!(e.kind.status(), StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn sampling_ranges() {
        let ok = Sampling {
            temperature: Some(0.7),
            top_p: Some(0.9),
            ..Default::default()
        };
        assert!(validate_sampling(&ok).is_ok());
        let bad = Sampling {
            temperature: Some(3.0),
            ..Default::default()
        };
        assert_eq!(
            validate_sampling(&bad).unwrap_err().param.as_deref(),
            Some("temperature")
        );
        let bad = Sampling {
            top_p: Some(0.0),
            ..Default::default()
        };
        assert_eq!(
            validate_sampling(&bad).unwrap_err().param.as_deref(),
            Some("top_p")
        );
    }

    #[test]
    fn content_parts() {
        assert_eq!(
            content_text(
                &json!([{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}]),
                "c"
            )
            .unwrap(),
            "ab"
        );
        let e = content_text(&json!([{"type": "image_url"}]), "messages[0].content").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0]"));
    }
}
