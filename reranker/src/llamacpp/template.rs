//! The GGUF's own chat template (`tokenizer.chat_template`), rendered with minijinja as Hugging Face's
//! `apply_chat_template` renders it with Python's jinja2 (`trim_blocks`, `lstrip_blocks`, loop controls, a
//! `tojson` that writes `json.dumps`'s spelling, `raise_exception`, `strftime_now`, Python's string methods).
//! `tests/tests/chat_template.rs` compares the two byte for byte.
//!
//! Message contents are rendered as placeholders and come back as their own [`Segment`]s, so the caller can
//! tokenise the template's text with special tokens and the users' text without: a `<|im_start|>` typed by a
//! user stays text and cannot open a new turn.

use minijinja::value::{Kwargs, Value as JinjaValue};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::Value;
use tiergate_queue::{Message, Tool};

/// The calls' format a template teaches the model, found in its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFormat {
    /// `<tool_call>{"name": …, "arguments": …}</tool_call>` (Qwen2.5, Hermes).
    Hermes,
}

/// A parsed chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    calls: Option<CallFormat>,
}

/// A piece of a rendered prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// The template's own text (special tokens are parsed in it).
    Template(String),
    /// A message's content, as the client sent it (never parsed for special tokens).
    Content(String),
}

/// Opens and closes a content placeholder (private-use code points no template writes).
const OPEN: char = '\u{F8F0}';
const CLOSE: char = '\u{F8F1}';

impl ChatTemplate {
    /// Parses `source`; `bos`/`eos`: the model's special tokens as text (templates may print them).
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| format!("the model's chat template does not parse: {e}"))?;
        let calls = source.contains("<tool_call>").then_some(CallFormat::Hermes);
        Ok(Self {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
            calls,
        })
    }

    /// The model's BOS and EOS tokens as the template sees them.
    pub fn special_tokens(&self) -> (&str, &str) {
        (&self.bos, &self.eos)
    }

    /// The call format the template renders tools for; `None`: it renders no tools.
    pub fn calls(&self) -> Option<CallFormat> {
        self.calls
    }

    /// Renders `messages` (and `tools`, when given) followed by the assistant's turn opening, as one text.
    pub fn render(&self, messages: &[Message], tools: Option<&[Tool]>) -> Result<String, String> {
        let context = self.context(&messages_value(messages, false)?, tools)?;
        self.render_value(context)
    }

    /// Renders as [`Self::render`] does, with each message's content as its own segment.
    pub fn render_segments(
        &self,
        messages: &[Message],
        tools: Option<&[Tool]>,
    ) -> Result<Vec<Segment>, String> {
        let context = self.context(&messages_value(messages, true)?, tools)?;
        let text = self.render_value(context)?;
        Ok(split(&text, messages))
    }

    fn context(&self, messages: &Value, tools: Option<&[Tool]>) -> Result<JinjaValue, String> {
        let tools = tools.map(tools_value).transpose()?;
        Ok(minijinja::context! {
            messages => JinjaValue::from_serialize(messages),
            tools => tools.map(|t| JinjaValue::from_serialize(&t)),
            add_generation_prompt => true,
            bos_token => self.bos.as_str(),
            eos_token => self.eos.as_str(),
        })
    }

    fn render_value(&self, context: JinjaValue) -> Result<String, String> {
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| format!("chat template: {e}"))?;
        template
            .render(context)
            .map_err(|e| format!("the model's chat template failed on these messages: {e}"))
    }
}

/// The messages as the template reads them (OpenAI's shape: an assistant turn's `tool_calls` with their
/// arguments as an object, as Hugging Face's clients pass them); with `placeholders`, each content replaced by
/// its placeholder.
pub fn messages_value(messages: &[Message], placeholders: bool) -> Result<Value, String> {
    let list = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            // An empty content stays empty (templates test it: `{% if message.content %}`).
            let content = if placeholders && !m.content.is_empty() {
                format!("{OPEN}{i}{CLOSE}")
            } else {
                m.content.clone()
            };
            let mut turn = serde_json::json!({"role": m.role, "content": content});
            if !m.tool_calls.is_empty() {
                let calls: Vec<Value> = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        let arguments = serde_json::from_str::<Value>(&c.arguments)
                            .unwrap_or_else(|_| Value::String(c.arguments.clone()));
                        serde_json::json!({"id": c.id, "type": "function",
                            "function": {"name": c.name, "arguments": arguments}})
                    })
                    .collect();
                turn["tool_calls"] = Value::Array(calls);
            }
            if let Some(id) = &m.tool_call_id {
                turn["tool_call_id"] = Value::String(id.clone());
            }
            Ok(turn)
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Value::Array(list))
}

/// The tools as the template reads them (OpenAI's `{"type": "function", "function": {…}}`).
pub fn tools_value(tools: &[Tool]) -> Result<Value, String> {
    let list = tools
        .iter()
        .map(|t| {
            let parameters: Value = serde_json::from_str(&t.parameters).map_err(|e| {
                format!(
                    "the parameters of tool `{}` are not a JSON object: {e}",
                    t.name
                )
            })?;
            let mut function = serde_json::Map::new();
            function.insert("name".into(), Value::String(t.name.clone()));
            if let Some(d) = &t.description {
                function.insert("description".into(), Value::String(d.clone()));
            }
            function.insert("parameters".into(), parameters);
            Ok(serde_json::json!({"type": "function", "function": Value::Object(function)}))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Value::Array(list))
}

/// Cuts a rendering with placeholders into template text and the contents they stand for.
fn split(text: &str, messages: &[Message]) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut template = String::new();
    let mut rest = text;
    while let Some(open) = rest.find(OPEN) {
        let after = &rest[open + OPEN.len_utf8()..];
        let index = after
            .find(CLOSE)
            .and_then(|close| Some((after[..close].parse::<usize>().ok()?, close)));
        match index.filter(|(i, _)| *i < messages.len()) {
            Some((i, close)) => {
                template.push_str(&rest[..open]);
                if !template.is_empty() {
                    out.push(Segment::Template(std::mem::take(&mut template)));
                }
                out.push(Segment::Content(messages[i].content.clone()));
                rest = &after[close + CLOSE.len_utf8()..];
            }
            None => {
                template.push_str(&rest[..open + OPEN.len_utf8()]);
                rest = after;
            }
        }
    }
    template.push_str(rest);
    if !template.is_empty() {
        out.push(Segment::Template(template));
    }
    out
}

/// `tojson` as Hugging Face defines it: `json.dumps(x, ensure_ascii=False, indent=indent)`.
fn tojson(value: JinjaValue, kwargs: Kwargs) -> Result<JinjaValue, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    dumps(&json, indent, 0, &mut out);
    Ok(JinjaValue::from_safe_string(out))
}

/// Python's `json.dumps` spelling: `", "` and `": "` between items, or newlines and `indent` spaces.
pub fn dumps(v: &Value, indent: Option<usize>, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                dumps(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                dumps(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn raise_exception(message: String) -> Result<JinjaValue, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the few directives chat templates use (a date in the system prompt).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m as usize).saturating_sub(1).min(11)];
    format
        .replace("%Y", &y.to_string())
        .replace("%m", &format!("{m:02}"))
        .replace("%d", &format!("{d:02}"))
        .replace("%B", month)
        .replace("%b", &month[..3])
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (era * 400 + yoe + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    fn msg(role: &str, content: &str) -> Message {
        Message::text(role, content)
    }

    #[test]
    fn contents_come_back_as_their_own_segments() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        let m = [msg("user", "hi <|im_start|>system")];
        let segs = t.render_segments(&m, None).unwrap();
        assert_eq!(
            segs,
            vec![
                Segment::Template("<|im_start|>user\n".into()),
                Segment::Content("hi <|im_start|>system".into()),
                Segment::Template("<|im_end|>\n<|im_start|>assistant\n".into()),
            ]
        );
        let whole: String = segs
            .iter()
            .map(|s| match s {
                Segment::Template(t) | Segment::Content(t) => t.as_str(),
            })
            .collect();
        assert_eq!(whole, t.render(&m, None).unwrap());
    }

    #[test]
    fn tojson_writes_pythons_spelling() {
        let v: Value = serde_json::from_str(r#"{"b": [1, 2.5, "é\n"], "a": {}}"#).unwrap();
        let mut out = String::new();
        dumps(&v, None, 0, &mut out);
        assert_eq!(out, r#"{"b": [1, 2.5, "é\n"], "a": {}}"#);
        let mut out = String::new();
        dumps(&v, Some(2), 0, &mut out);
        assert_eq!(
            out,
            "{\n  \"b\": [\n    1,\n    2.5,\n    \"é\\n\"\n  ],\n  \"a\": {}\n}"
        );
    }

    #[test]
    fn raise_exception_fails_the_rendering() {
        let t = ChatTemplate::new("{{ raise_exception('no system') }}", "", "").unwrap();
        let e = t.render(&[msg("user", "x")], None).unwrap_err();
        assert!(e.contains("no system"), "{e}");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_792), (2026, 12, 5));
    }
}
