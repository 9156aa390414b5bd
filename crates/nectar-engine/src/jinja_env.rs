//! A minijinja environment that behaves like HF's chat-template environment.
//!
//! HF's `_compile_jinja_template` uses an `ImmutableSandboxedEnvironment`
//! with `trim_blocks=True, lstrip_blocks=True`, the `loopcontrols`
//! extension, a Python-`json.dumps` `tojson`, and two globals:
//! `raise_exception(msg)` and `strftime_now(fmt)`. Templates are written
//! against Python, so they also call `str`/`dict` methods (`.strip()`,
//! `.items()`, `.startswith()`), which minijinja-contrib's pycompat supplies.

use std::fmt;

use minijinja::{Environment, Error, ErrorKind};

use crate::py_json::tojson_filter;
use crate::strftime::{strftime, DateTime};

/// The message of a `raise_exception(...)` call, attached as the minijinja
/// error's source so the renderer can tell a template's deliberate refusal
/// from a template bug.
#[derive(Debug, Clone)]
pub(crate) struct RaisedException(pub String);

impl fmt::Display for RaisedException {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

/// A fresh environment with HF's settings and helpers installed.
pub(crate) fn hf_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    // Jinja's default; HF does not change it.
    env.set_keep_trailing_newline(false);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson_filter);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

fn raise_exception(message: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedException(message)))
}

fn strftime_now(format: String) -> String {
    strftime(&format, &DateTime::now_utc())
}

/// The message of a `raise_exception` anywhere in `err`'s source chain.
pub(crate) fn raised_message(err: &Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<RaisedException>() {
            return Some(raised.0.clone());
        }
        source = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(template: &str, ctx: serde_json::Value) -> Result<String, Error> {
        hf_environment().render_str(template, ctx)
    }

    #[test]
    fn trims_blocks_like_hf() {
        let out = render("  {% if true %}\nx\n  {% endif %}\ny\n", json!({})).unwrap();
        // lstrip_blocks removes the indentation before tags, trim_blocks the
        // newline after them; the final newline is dropped.
        assert_eq!(out, "x\ny");
    }

    #[test]
    fn python_methods_work() {
        let out = render(
            "{{ s.strip().startswith('a') }} {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
            json!({"s": "  abc ", "d": {"z": 1, "a": 2}}),
        )
        .unwrap();
        // Booleans print the Python way, dict order is insertion order.
        assert_eq!(out, "True z=1;a=2;");
    }

    #[test]
    fn loop_controls_are_enabled() {
        let out = render(
            "{% for i in [1, 2, 3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}",
            json!({}),
        )
        .unwrap();
        assert_eq!(out, "1");
    }

    #[test]
    fn raise_exception_is_recognisable() {
        let err = render("a{{ raise_exception('roles must alternate') }}", json!({})).unwrap_err();
        assert_eq!(
            raised_message(&err).as_deref(),
            Some("roles must alternate")
        );
        let other = render("{{ 1 + }}", json!({})).unwrap_err();
        assert_eq!(raised_message(&other), None);
    }

    #[test]
    fn strftime_now_renders_a_date() {
        let out = render("{{ strftime_now('%Y-%m-%d') }}", json!({})).unwrap();
        assert_eq!(out.len(), 10, "{out}");
        assert_eq!(out.as_bytes()[4], b'-');
    }
}
