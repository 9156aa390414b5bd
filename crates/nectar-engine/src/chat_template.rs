//! The chat template: OpenAI-shaped messages to the prompt text the model was
//! trained on, rendered the way HF's `apply_chat_template` renders it.

use std::fmt;
use std::path::{Path, PathBuf};

use minijinja::Environment;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::jinja_env::{hf_environment, raised_message};

/// Name the template is registered under; it shows up in minijinja's error
/// locations (`in chat_template:3`).
const TEMPLATE_NAME: &str = "chat_template";

/// Context variables the renderer sets itself; `extra` may not override them
/// (HF would fail the same way, with a duplicate keyword argument).
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// A compiled chat template plus the special tokens HF exposes to it.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Kept beside the environment, which only lends its copy for the
    /// lifetime of a template handle.
    source: String,
    origin: PathBuf,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl fmt::Debug for ChatTemplate {
    // The environment's Debug dumps the whole template source.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl ChatTemplate {
    /// Compile `source`. `origin` is where it came from, used in errors.
    pub fn new(source: &str, origin: impl Into<PathBuf>) -> Result<ChatTemplate> {
        let origin = origin.into();
        let mut env = hf_environment();
        // Compile now so a broken template fails at load, naming its file,
        // rather than on the first request.
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|source| Error::TemplateSyntax {
                path: origin.clone(),
                source,
            })?;
        Ok(ChatTemplate {
            env,
            source: source.to_owned(),
            origin,
            bos_token: None,
            eos_token: None,
        })
    }

    /// Set the `bos_token`/`eos_token` strings the template can refer to.
    pub fn with_special_tokens(
        mut self,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> ChatTemplate {
        self.bos_token = bos_token;
        self.eos_token = eos_token;
        self
    }

    /// Load the template from a `tokenizer_config.json`.
    ///
    /// `chat_template` may be a string or a list of `{name, template}`
    /// objects, of which the one named `"default"` is used. Returns `None`
    /// when the file has no template (a base model).
    pub fn from_tokenizer_config(path: impl AsRef<Path>) -> Result<Option<ChatTemplate>> {
        let path = path.as_ref();
        let config = read_json(path)?;
        let Some(source) = template_source(path, &config)? else {
            return Ok(None);
        };
        let (bos, eos) = special_tokens(path, &config)?;
        Ok(Some(
            ChatTemplate::new(&source, path)?.with_special_tokens(bos, eos),
        ))
    }

    /// Load the template of a model directory the way `transformers` does:
    /// a `chat_template.jinja` file takes precedence over the
    /// `chat_template` field of `tokenizer_config.json` (recent GLM releases
    /// ship the former); special tokens come from `tokenizer_config.json`.
    /// Returns `None` when neither holds a template.
    pub fn from_model_dir(dir: impl AsRef<Path>) -> Result<Option<ChatTemplate>> {
        let dir = dir.as_ref();
        let config_path = dir.join("tokenizer_config.json");
        let jinja_path = dir.join("chat_template.jinja");
        if !jinja_path.is_file() {
            if !config_path.is_file() {
                return Ok(None);
            }
            return ChatTemplate::from_tokenizer_config(&config_path);
        }
        let source = std::fs::read_to_string(&jinja_path).map_err(|source| Error::Io {
            path: jinja_path.clone(),
            source,
        })?;
        let (bos, eos) = if config_path.is_file() {
            special_tokens(&config_path, &read_json(&config_path)?)?
        } else {
            (None, None)
        };
        Ok(Some(
            ChatTemplate::new(&source, &jinja_path)?.with_special_tokens(bos, eos),
        ))
    }

    /// Where the template came from.
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The `bos_token` string exposed to the template, if any.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The `eos_token` string exposed to the template, if any.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Render a conversation to prompt text.
    ///
    /// `messages` is a JSON array of OpenAI-shaped messages (`role`,
    /// `content` as a string or a list of parts, `reasoning_content`,
    /// `tool_calls`). `tools` is the list of tool schemas, if any.
    /// `add_generation_prompt` appends the assistant turn's opening. `extra`
    /// adds template variables (e.g. `enable_thinking`) and may override
    /// `bos_token`/`eos_token`, but not the four variables set here
    /// (`messages`, `tools`, `documents`, `add_generation_prompt`).
    pub fn render(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
        extra: &Map<String, Value>,
    ) -> Result<String> {
        let messages = normalise_messages(messages)?;
        if let Some(tools) = tools {
            if !tools.is_array() && !tools.is_null() {
                return Err(Error::InvalidChatInput {
                    field: "tools".into(),
                    reason: format!("must be a list of tool schemas, got {}", kind(tools)),
                });
            }
        }

        // Same variables HF passes: the special-token strings, the caller's
        // kwargs, then messages/tools/documents/add_generation_prompt.
        let mut ctx = Map::new();
        if let Some(bos) = &self.bos_token {
            ctx.insert("bos_token".into(), Value::String(bos.clone()));
        }
        if let Some(eos) = &self.eos_token {
            ctx.insert("eos_token".into(), Value::String(eos.clone()));
        }
        for (key, value) in extra {
            if RESERVED.contains(&key.as_str()) {
                return Err(Error::InvalidChatInput {
                    field: format!("extra.{key}"),
                    reason: "is set by the renderer and cannot be overridden".into(),
                });
            }
            ctx.insert(key.clone(), value.clone());
        }
        ctx.insert("messages".into(), messages);
        ctx.insert("tools".into(), tools.cloned().unwrap_or(Value::Null));
        // HF passes documents=None when there are none; templates test it.
        ctx.insert("documents".into(), Value::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            Value::Bool(add_generation_prompt),
        );

        let render_error = |source: minijinja::Error| match raised_message(&source) {
            Some(message) => Error::TemplateRaised {
                path: self.origin.clone(),
                message,
            },
            None => Error::TemplateRender {
                path: self.origin.clone(),
                source,
            },
        };
        let template = self.env.get_template(TEMPLATE_NAME).map_err(render_error)?;
        template
            .render(minijinja::Value::from_serialize(&ctx))
            .map_err(render_error)
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// The template text from a parsed `tokenizer_config.json`.
fn template_source(path: &Path, config: &Value) -> Result<Option<String>> {
    let invalid = |field: String, reason: &str| Error::InvalidField {
        path: path.to_path_buf(),
        field,
        reason: reason.into(),
    };
    match config.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(list)) if list.is_empty() => Ok(None),
        Some(Value::Array(list)) => {
            for (i, item) in list.iter().enumerate() {
                let name = item.get("name").and_then(Value::as_str).ok_or_else(|| {
                    invalid(format!("chat_template[{i}].name"), "must be a string")
                })?;
                let template = item
                    .get("template")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        invalid(format!("chat_template[{i}].template"), "must be a string")
                    })?;
                if name == "default" {
                    return Ok(Some(template.to_owned()));
                }
            }
            // HF refuses to guess too ("multiple chat templates with no
            // default specified").
            Err(invalid(
                "chat_template".into(),
                "lists named templates but none is named \"default\"",
            ))
        }
        Some(other) => Err(invalid(
            "chat_template".into(),
            &format!(
                "must be a string or a list of {{name, template}} objects, got {}",
                kind(other)
            ),
        )),
    }
}

/// `bos_token` and `eos_token` from a parsed `tokenizer_config.json`; each
/// may be a string, an `AddedToken` object (`{"content": ...}`), or null.
fn special_tokens(path: &Path, config: &Value) -> Result<(Option<String>, Option<String>)> {
    let token = |field: &str| -> Result<Option<String>> {
        match config.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Object(obj)) => match obj.get("content") {
                Some(Value::String(s)) => Ok(Some(s.clone())),
                _ => Err(Error::InvalidField {
                    path: path.to_path_buf(),
                    field: format!("{field}.content"),
                    reason: "must be a string".into(),
                }),
            },
            Some(other) => Err(Error::InvalidField {
                path: path.to_path_buf(),
                field: field.into(),
                reason: format!(
                    "must be a string, an object with `content`, or null, got {}",
                    kind(other)
                ),
            }),
        }
    };
    Ok((token("bos_token")?, token("eos_token")?))
}

/// Check the messages' shape and parse tool-call arguments given as JSON
/// strings (the OpenAI wire format) into objects. Templates iterate the
/// arguments as a mapping (GLM writes one `<arg_key>`/`<arg_value>` pair per
/// argument), and transformers documents objects as the expected form; vLLM
/// and SGLang do the same conversion. Strings that are not a JSON object are
/// left alone for the template to write verbatim.
fn normalise_messages(messages: &Value) -> Result<Value> {
    let Some(list) = messages.as_array() else {
        return Err(Error::InvalidChatInput {
            field: "messages".into(),
            reason: format!("must be a list of message objects, got {}", kind(messages)),
        });
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, message) in list.iter().enumerate() {
        let Some(message) = message.as_object() else {
            return Err(Error::InvalidChatInput {
                field: format!("messages[{i}]"),
                reason: format!("must be an object, got {}", kind(message)),
            });
        };
        let mut message = message.clone();
        if let Some(Value::Array(calls)) = message.get_mut("tool_calls") {
            for call in calls.iter_mut() {
                // OpenAI nests the call under `function`; some clients don't.
                let target = match call.get_mut("function") {
                    Some(f) if f.is_object() => f,
                    _ => call,
                };
                if let Some(arguments) = target.get_mut("arguments") {
                    if let Some(Value::Object(parsed)) = arguments
                        .as_str()
                        .and_then(|s| serde_json::from_str::<Value>(s).ok())
                    {
                        *arguments = Value::Object(parsed);
                    }
                }
            }
        }
        out.push(Value::Object(message));
    }
    Ok(Value::Array(out))
}

/// A JSON value's type name for error messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Write;

    fn config_file(contents: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(contents.as_bytes()).unwrap();
        f
    }

    fn simple() -> ChatTemplate {
        ChatTemplate::new(
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}\
             {% if add_generation_prompt %}<assistant>{% endif %}",
            "inline",
        )
        .unwrap()
    }

    #[test]
    fn string_template_and_special_tokens() {
        let f = config_file(
            r#"{"chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
                "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>"}"#,
        );
        let t = ChatTemplate::from_tokenizer_config(f.path())
            .unwrap()
            .unwrap();
        assert_eq!(t.bos_token(), Some("<s>"));
        let out = t
            .render(
                &json!([{"role": "user", "content": "hi"}]),
                None,
                false,
                &Map::new(),
            )
            .unwrap();
        assert_eq!(out, "<s>hi</s>");
    }

    #[test]
    fn named_templates_use_default() {
        let f = config_file(
            r#"{"chat_template": [{"name": "tool_use", "template": "T"},
                                  {"name": "default", "template": "D"}]}"#,
        );
        let t = ChatTemplate::from_tokenizer_config(f.path())
            .unwrap()
            .unwrap();
        assert_eq!(t.source(), "D");
    }

    #[test]
    fn named_templates_without_default_is_an_error() {
        let f = config_file(r#"{"chat_template": [{"name": "rag", "template": "R"}]}"#);
        let err = ChatTemplate::from_tokenizer_config(f.path()).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidField { field, .. } if field == "chat_template"),
            "{err}"
        );
    }

    #[test]
    fn no_template_is_none() {
        let f = config_file(r#"{"eos_token": "</s>", "chat_template": null}"#);
        assert!(ChatTemplate::from_tokenizer_config(f.path())
            .unwrap()
            .is_none());
        let f = config_file(r#"{"eos_token": "</s>"}"#);
        assert!(ChatTemplate::from_tokenizer_config(f.path())
            .unwrap()
            .is_none());
    }

    #[test]
    fn bad_shapes_name_the_field() {
        let f = config_file(r#"{"chat_template": 3}"#);
        let err = ChatTemplate::from_tokenizer_config(f.path()).unwrap_err();
        assert!(err.to_string().contains("chat_template"), "{err}");
        let f = config_file(r#"{"chat_template": "x", "eos_token": {"lstrip": true}}"#);
        let err = ChatTemplate::from_tokenizer_config(f.path()).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidField { field, .. } if field == "eos_token.content"),
            "{err}"
        );
    }

    #[test]
    fn syntax_error_names_the_origin() {
        let err = ChatTemplate::new("{% if %}", "/models/x/tokenizer_config.json").unwrap_err();
        assert!(matches!(err, Error::TemplateSyntax { .. }));
        assert!(err.to_string().contains("/models/x/tokenizer_config.json"));
    }

    #[test]
    fn messages_must_be_a_list_of_objects() {
        let t = simple();
        let err = t
            .render(&json!({"role": "user"}), None, false, &Map::new())
            .unwrap_err();
        assert!(matches!(&err, Error::InvalidChatInput { field, .. } if field == "messages"));
        let err = t
            .render(&json!(["hi"]), None, false, &Map::new())
            .unwrap_err();
        assert!(matches!(&err, Error::InvalidChatInput { field, .. } if field == "messages[0]"));
    }

    #[test]
    fn extra_cannot_override_reserved_variables() {
        let mut extra = Map::new();
        extra.insert("messages".into(), json!([]));
        let err = simple()
            .render(&json!([]), None, false, &extra)
            .unwrap_err();
        assert!(matches!(err, Error::InvalidChatInput { .. }));
    }

    #[test]
    fn extra_variables_reach_the_template() {
        let t = ChatTemplate::new("{{ flavour }}|{{ tools is none }}", "inline").unwrap();
        let mut extra = Map::new();
        extra.insert("flavour".into(), json!("mint"));
        let out = t.render(&json!([]), None, false, &extra).unwrap();
        assert_eq!(out, "mint|True");
    }

    #[test]
    fn raise_exception_becomes_template_raised() {
        let t = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}",
            "inline",
        )
        .unwrap();
        let err = t
            .render(&json!([{"role": "assistant"}]), None, false, &Map::new())
            .unwrap_err();
        assert!(
            matches!(&err, Error::TemplateRaised { message, .. } if message == "first must be user"),
            "{err}"
        );
    }

    #[test]
    fn undefined_attribute_of_undefined_is_a_render_error() {
        let t = ChatTemplate::new("{{ nothing.here }}", "inline").unwrap();
        let err = t.render(&json!([]), None, false, &Map::new()).unwrap_err();
        assert!(matches!(err, Error::TemplateRender { .. }), "{err}");
    }

    #[test]
    fn string_arguments_are_parsed_into_objects() {
        let messages = json!([
            {"role": "assistant", "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": 2}"}},
                {"name": "g", "arguments": "not json"}
            ]}
        ]);
        let out = normalise_messages(&messages).unwrap();
        let calls = &out[0]["tool_calls"];
        assert_eq!(calls[0]["function"]["arguments"], json!({"b": 1, "a": 2}));
        // Key order is the client's, not sorted.
        let keys: Vec<&String> = calls[0]["function"]["arguments"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(keys, ["b", "a"]);
        assert_eq!(calls[1]["arguments"], json!("not json"));
    }

    #[test]
    fn template_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ChatTemplate>();
    }
}
