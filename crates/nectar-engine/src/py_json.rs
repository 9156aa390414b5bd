//! A `tojson` filter that writes what Python's `json.dumps` writes.
//!
//! HF's chat-template environment replaces Jinja's `tojson` with
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)`. minijinja's own `tojson` differs in ways that change the
//! prompt and therefore the tokens: it writes compact JSON (`{"a":1}` where
//! Python writes `{"a": 1}`), and it HTML-escapes `<`, `>`, `&` and `'` as
//! `\u003c` etc., which Python does not. Tool schemas go through this filter,
//! so any difference is a different prompt from the one the model was trained
//! on.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// How to write JSON; mirrors `json.dumps`' keyword arguments.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Options {
    pub ensure_ascii: bool,
    /// Per-level indent; `None` writes everything on one line.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl Default for Options {
    fn default() -> Self {
        // HF's defaults: ensure_ascii=False, separators=None.
        Options {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
        }
    }
}

/// The `tojson` filter: `tojson(ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, positionally or by keyword (HF's
/// order; `sort_keys` by keyword only, as minijinja caps filter arity).
pub(crate) fn tojson_filter(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    separators: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let ensure_ascii = or_kwarg(ensure_ascii, &kwargs, "ensure_ascii")?;
    let indent = or_kwarg(indent, &kwargs, "indent")?;
    let separators = or_kwarg(separators, &kwargs, "separators")?;
    let sort_keys: Option<Value> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;

    let mut opts = Options::default();
    if let Some(v) = ensure_ascii {
        opts.ensure_ascii = v.is_true();
    }
    opts.indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        // Python: an int indents by that many spaces, a str by that string.
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => {
                let n = usize::try_from(v.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: indent must be an int or str, got {v}"),
                    )
                })?;
                Some(" ".repeat(n))
            }
        },
    };
    // Python switches the default item separator to "," when indenting, so
    // lines do not end in a trailing space.
    if opts.indent.is_some() {
        opts.item_separator = ",".into();
    }
    if let Some(v) = separators.filter(|v| !v.is_none() && !v.is_undefined()) {
        let (item, key) = separator_pair(&v)?;
        opts.item_separator = item;
        opts.key_separator = key;
    }
    if let Some(v) = sort_keys {
        opts.sort_keys = v.is_true();
    }
    let mut out = String::new();
    write_value(&mut out, value, &opts, 0)?;
    Ok(Value::from_safe_string(out))
}

fn or_kwarg(
    positional: Option<Value>,
    kwargs: &Kwargs,
    name: &str,
) -> Result<Option<Value>, Error> {
    match positional {
        Some(v) => Ok(Some(v)),
        None => kwargs.get(name),
    }
}

fn separator_pair(v: &Value) -> Result<(String, String), Error> {
    let bad = || {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: separators must be a pair of strings, got {v}"),
        )
    };
    let items: Vec<Value> = v.try_iter().map_err(|_| bad())?.collect();
    match items.as_slice() {
        [a, b] => match (a.as_str(), b.as_str()) {
            (Some(a), Some(b)) => Ok((a.to_owned(), b.to_owned())),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// Serialise `value` as `json.dumps` would, appending to `out`.
pub(crate) fn write_value(
    out: &mut String,
    value: &Value,
    opts: &Options,
    depth: usize,
) -> Result<(), Error> {
    // Recursion bound: a pathological value must fail the render, not
    // overflow the stack (serde_json's own parser stops at 128 levels).
    const MAX_DEPTH: usize = 256;
    if depth > MAX_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: value nested deeper than {MAX_DEPTH} levels"),
        ));
    }
    match value.kind() {
        // Jinja's Undefined is not serialisable in Python either, but an
        // absent optional field rendering as `null` is the kinder failure.
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), opts),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, '[', ']', items.len(), opts, depth, |out, i| {
                write_value(out, &items[i], opts, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_string(&key)?, item));
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, '{', '}', entries.len(), opts, depth, |out, i| {
                let (key, item) = &entries[i];
                write_string(out, key, opts);
                out.push_str(&opts.key_separator);
                write_value(out, item, opts, depth + 1)
            })?;
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {kind} value is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    open: char,
    close: char,
    len: usize,
    opts: &Options,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..len {
        if i > 0 {
            out.push_str(&opts.item_separator);
        }
        if let Some(indent) = &opts.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth + 1));
        }
        item(out, i)?;
    }
    if let Some(indent) = &opts.indent {
        out.push('\n');
        out.push_str(&indent.repeat(depth));
    }
    out.push(close);
    Ok(())
}

/// Python converts non-string dict keys: ints and floats to their repr,
/// booleans to `true`/`false`, None to `null`.
fn key_string(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key);
            Ok(s)
        }
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
        ValueKind::None => Ok("null".into()),
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        // Display of an integer Value is its exact decimal form (i128/u128
        // included), like Python's int repr.
        out.push_str(&value.to_string());
    } else {
        let x = f64::try_from(value.clone()).unwrap_or(f64::NAN);
        out.push_str(&python_float_repr(x));
    }
}

/// Python's `repr(float)` as used by `json.dumps`: shortest round-trip
/// digits, scientific notation below 1e-4 or from 1e16 up, and `.0` on
/// integral values; non-finite values as JavaScript literals.
pub(crate) fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits Python uses.
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if x != 0.0 && !(-4..16).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.unsigned_abs());
    }
    // Rust's Display never uses an exponent and prints the same digits.
    let fixed = format!("{x}");
    if fixed.contains('.') {
        fixed
    } else {
        fixed + ".0"
    }
}

/// A JSON string literal as Python writes it: only `"`, `\` and control
/// characters escaped (lowercase `\u00XX`), plus everything outside
/// printable ASCII (as UTF-16 escapes) when `ensure_ascii` is set.
fn write_string(out: &mut String, s: &str, opts: &Options) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => push_u_escape(out, c as u16),
            c if opts.ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    push_u_escape(out, *unit);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn push_u_escape(out: &mut String, unit: u16) {
    out.push_str(&format!("\\u{unit:04x}"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::Environment;
    use serde_json::json;

    fn render(template: &str, ctx: serde_json::Value) -> Result<String, Error> {
        let mut env = Environment::new();
        env.add_filter("tojson", tojson_filter);
        env.render_str(template, ctx)
    }

    #[test]
    fn default_spacing_matches_json_dumps() {
        let out = render(
            "{{ x | tojson }}",
            json!({"x": {"b": [1, 2.5, true, null], "a": "s"}}),
        )
        .unwrap();
        // Insertion order kept (preserve_order), Python separators.
        assert_eq!(out, r#"{"b": [1, 2.5, true, null], "a": "s"}"#);
    }

    #[test]
    fn no_html_escaping_and_no_ascii_escaping_by_default() {
        let out = render("{{ x | tojson }}", json!({"x": "<a href='x'>&</a> 春"})).unwrap();
        assert_eq!(out, r#""<a href='x'>&</a> 春""#);
    }

    #[test]
    fn ensure_ascii_escapes_like_python() {
        let out = render(
            "{{ x | tojson(ensure_ascii=true) }}",
            json!({"x": "é🐝\u{7f}"}),
        )
        .unwrap();
        assert_eq!(out, r#""\u00e9\ud83d\udc1d\u007f""#);
    }

    #[test]
    fn control_characters() {
        let out = render("{{ x | tojson }}", json!({"x": "a\"b\\c\n\t\u{1}"})).unwrap();
        assert_eq!(out, r#""a\"b\\c\n\t\u0001""#);
    }

    #[test]
    fn indent_matches_json_dumps() {
        let out = render(
            "{{ x | tojson(indent=2) }}",
            json!({"x": {"a": [1, {}], "b": []}}),
        )
        .unwrap();
        assert_eq!(out, "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
    }

    #[test]
    fn separators_and_sort_keys() {
        let out = render(
            "{{ x | tojson(separators=[',', ':'], sort_keys=true) }}",
            json!({"x": {"b": 1, "a": [1, 2]}}),
        )
        .unwrap();
        assert_eq!(out, r#"{"a":[1,2],"b":1}"#);
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let mut v = json!(1);
        for _ in 0..1000 {
            v = json!([v]);
        }
        let mut out = String::new();
        let value = Value::from_serialize(&v);
        assert!(write_value(&mut out, &value, &Options::default(), 0).is_err());
    }

    #[test]
    fn unknown_kwarg_is_an_error() {
        assert!(render("{{ 1 | tojson(bogus=1) }}", json!({})).is_err());
    }

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.5e-7, "1.5e-07"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (123456789.125, "123456789.125"),
            (1e100, "1e+100"),
            (f64::INFINITY, "Infinity"),
            (f64::NAN, "NaN"),
        ];
        for (x, want) in cases {
            assert_eq!(python_float_repr(x), want, "{x}");
        }
    }
}
