//! What the model writes, turned into what the client receives: stop sequences cut the text (the matched one is
//! reported), and Hermes-style calls (`<tool_call>{"name": …, "arguments": …}</tool_call>`) become
//! [`ToolCall`]s. Text that may still turn out to start a stop sequence or a call is held back, so neither ever
//! reaches the client as content.

use serde_json::Value;
use tiergate_queue::ToolCall;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// One thing for the client.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    Text(String),
    Call(ToolCall),
}

/// The output filter of one generation.
pub struct Output {
    stops: Vec<String>,
    calls: bool,
    /// Text not yet released (a possible stop or call opening at its end).
    held: String,
    /// Inside a call: its body so far.
    call: Option<String>,
    /// Whitespace after a call, released only if text (not another call) follows.
    gap: String,
    made: usize,
    /// Text released so far (bytes).
    released: usize,
    /// The offered functions' names (a bare JSON call must name one).
    names: Vec<String>,
    /// The stop sequence that ended the text.
    pub stopped: Option<String>,
}

impl Output {
    /// `stops`: the request's stop sequences; `calls`: parse Hermes calls.
    pub fn new(stops: &[String], calls: bool) -> Self {
        Self::with_tools(stops, calls, &[])
    }

    /// As [`Self::new`]; `names`: the offered functions, so that an answer that is only a bare JSON call of one of
    /// them (`{"name": …, "arguments": …}` without the tags, as small models often write it) is a call too.
    pub fn with_tools(stops: &[String], calls: bool, names: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            calls,
            held: String::new(),
            call: None,
            gap: String::new(),
            made: 0,
            released: 0,
            names: names.to_vec(),
            stopped: None,
        }
    }

    /// Calls made so far.
    pub fn calls_made(&self) -> usize {
        self.made
    }

    /// Takes the next decoded text; returns what can be released. After a stop sequence, nothing more.
    pub fn push(&mut self, text: &str) -> Vec<Out> {
        if self.stopped.is_some() {
            return Vec::new();
        }
        self.held.push_str(text);
        let mut out = Vec::new();
        self.drain(&mut out, false);
        out
    }

    /// The end of the generation: releases what was held (an unclosed call that parses is still a call).
    pub fn finish(&mut self) -> Vec<Out> {
        let mut out = Vec::new();
        if self.bare_call_possible() {
            let held = std::mem::take(&mut self.held);
            match parse_call(unfenced(&held), self.made).filter(|c| self.names.contains(&c.name)) {
                Some(call) => {
                    self.made += 1;
                    out.push(Out::Call(call));
                    return out;
                }
                None => self.held = held,
            }
        }
        if self.stopped.is_none() {
            self.drain(&mut out, true);
        }
        if let Some(body) = self.call.take() {
            self.emit_call(&body, &mut out);
        }
        out
    }

    fn drain(&mut self, out: &mut Vec<Out>, end: bool) {
        loop {
            if let Some(body) = &mut self.call {
                body.push_str(&std::mem::take(&mut self.held));
                let Some(at) = body.find(CLOSE) else { return };
                let rest = body[at + CLOSE.len()..].to_string();
                body.truncate(at);
                let body = self.call.take().unwrap_or_default();
                self.emit_call(&body, out);
                self.held = rest;
                continue;
            }
            // A stop sequence ends the text wherever it is.
            if let Some((at, stop)) = self.first_stop() {
                let before = self.held[..at].to_string();
                self.text(&before, out);
                self.stopped = Some(stop);
                self.held.clear();
                return;
            }
            if self.calls {
                if let Some(at) = self.held.find(OPEN) {
                    let before = self.held[..at].to_string();
                    self.text(&before, out);
                    self.gap.clear();
                    self.call = Some(String::new());
                    self.held = self.held[at + OPEN.len()..].to_string();
                    continue;
                }
            }
            if !end && self.bare_call_possible() {
                return;
            }
            let keep = if end { 0 } else { self.held_back() };
            let cut = self.held.len() - keep;
            let release = self.held[..cut].to_string();
            self.held.drain(..cut);
            self.text(&release, out);
            return;
        }
    }

    /// Nothing released yet and the answer so far may be a bare JSON call: hold it all until the end.
    fn bare_call_possible(&self) -> bool {
        !self.names.is_empty()
            && self.released == 0
            && self.made == 0
            && self.call.is_none()
            && self.stopped.is_none()
            && {
                let t = self.held.trim_start();
                t.starts_with('{') || t.starts_with("```") || "```".starts_with(t)
            }
    }

    /// The earliest stop sequence in the held text.
    fn first_stop(&self) -> Option<(usize, String)> {
        self.stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s.clone())))
            .min_by_key(|(at, _)| *at)
    }

    /// Bytes at the end of the held text that may begin a stop sequence or a call.
    fn held_back(&self) -> usize {
        let mut marks: Vec<&str> = self.stops.iter().map(String::as_str).collect();
        if self.calls {
            marks.push(OPEN);
        }
        marks
            .iter()
            .map(|m| longest_prefix_suffix(&self.held, m))
            .max()
            .unwrap_or(0)
    }

    fn text(&mut self, text: &str, out: &mut Vec<Out>) {
        if text.is_empty() {
            return;
        }
        // After a call, whitespace waits to see whether another call follows.
        if self.made > 0 && text.trim().is_empty() {
            self.gap.push_str(text);
            return;
        }
        let mut t = std::mem::take(&mut self.gap);
        t.push_str(text);
        self.released += t.len();
        match out.last_mut() {
            Some(Out::Text(prev)) => prev.push_str(&t),
            _ => out.push(Out::Text(t)),
        }
    }

    fn emit_call(&mut self, body: &str, out: &mut Vec<Out>) {
        match parse_call(body, self.made) {
            Some(call) => {
                self.made += 1;
                out.push(Out::Call(call));
            }
            // Not a call after all: the client sees what the model wrote.
            None => {
                let raw = format!("{OPEN}{body}");
                self.text(&raw, out);
            }
        }
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `mark` (at a char boundary).
fn longest_prefix_suffix(text: &str, mark: &str) -> usize {
    (1..mark.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n)
                && mark.is_char_boundary(n)
                && text.ends_with(&mark[..n])
        })
        .unwrap_or(0)
}

/// The text inside a Markdown code fence (```` ```json … ``` ````), or the text.
fn unfenced(text: &str) -> &str {
    let t = text.trim();
    match t.strip_prefix("```") {
        Some(rest) => {
            let rest = rest.strip_prefix("json").unwrap_or(rest);
            rest.strip_suffix("```").unwrap_or(rest)
        }
        None => t,
    }
}

/// `{"name": …, "arguments": {…}}` as a call (`arguments` kept as JSON text).
fn parse_call(body: &str, index: usize) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        Some(Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
        None => "{}".into(),
    };
    Some(ToolCall {
        id: call_id(index),
        name,
        arguments,
    })
}

/// A call id unique enough for a conversation (`call_` and 24 hex digits).
fn call_id(index: usize) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(index);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    format!("call_{:016x}{:08x}", h.finish(), index as u32)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    fn run(pieces: &[&str], stops: &[&str], calls: bool) -> (Vec<Out>, Option<String>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut o = Output::new(&stops, calls);
        let mut all = Vec::new();
        for p in pieces {
            all.extend(o.push(p));
        }
        all.extend(o.finish());
        (all, o.stopped.clone())
    }

    fn text(outs: &[Out]) -> String {
        outs.iter()
            .filter_map(|o| match o {
                Out::Text(t) => Some(t.as_str()),
                Out::Call(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_call_split_across_tokens_never_shows_as_text() {
        let (outs, _) = run(
            &[
                "Sure.",
                "<tool",
                "_call>\n{\"name\": \"get",
                "_weather\", \"arguments\": {\"city\": ",
                "\"Paris\"}}\n</tool_call>",
            ],
            &[],
            true,
        );
        assert_eq!(text(&outs), "Sure.");
        let calls: Vec<&ToolCall> = outs
            .iter()
            .filter_map(|o| match o {
                Out::Call(c) => Some(c),
                Out::Text(_) => None,
            })
            .collect();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        assert!(calls[0].id.starts_with("call_"));
    }

    #[test]
    fn whitespace_between_calls_is_dropped_and_both_calls_come() {
        let (outs, _) = run(
            &["<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n"],
            &[],
            true,
        );
        assert_eq!(outs.len(), 2, "{outs:?}");
        assert!(matches!(&outs[1], Out::Call(c) if c.name == "b"));
    }

    #[test]
    fn an_unclosed_call_that_parses_is_a_call_and_one_that_does_not_is_text() {
        let (outs, _) = run(
            &["<tool_call>{\"name\": \"a\", \"arguments\": {}}"],
            &[],
            true,
        );
        assert!(matches!(&outs[..], [Out::Call(c)] if c.name == "a"));
        let (outs, _) = run(&["<tool_call>not json"], &[], true);
        assert_eq!(text(&outs), "<tool_call>not json");
    }

    #[test]
    fn a_bare_json_call_of_an_offered_function_is_a_call() {
        let names = vec!["get_weather".to_string()];
        let run = |pieces: &[&str]| {
            let mut o = Output::with_tools(&[], true, &names);
            let mut all = Vec::new();
            for p in pieces {
                all.extend(o.push(p));
            }
            all.extend(o.finish());
            all
        };
        let outs = run(&[
            "{\"name\": \"get_",
            "weather\", \"arguments\": {\"city\": \"Paris\"}}",
        ]);
        assert!(
            matches!(&outs[..], [Out::Call(c)] if c.name == "get_weather"),
            "{outs:?}"
        );
        // JSON that is not a call of an offered function is the answer's text.
        let outs = run(&["{\"name\": \"other\", \"arguments\": {}}"]);
        assert_eq!(text(&outs), "{\"name\": \"other\", \"arguments\": {}}");
        // In a Markdown fence, as the 0.5B model writes it without a system prompt.
        let outs = run(&[
            "```json\n{\"name\": \"get_weather\", ",
            "\"arguments\": {}}\n```",
        ]);
        assert!(
            matches!(&outs[..], [Out::Call(c)] if c.name == "get_weather"),
            "{outs:?}"
        );
        // Text that does not start with `{` is released as it comes.
        let mut o = Output::with_tools(&[], true, &names);
        assert_eq!(text(&o.push("Hello")), "Hello");
    }

    #[test]
    fn without_tools_the_tag_is_plain_text() {
        let (outs, _) = run(&["a <tool_call>{}</tool_call>"], &[], false);
        assert_eq!(text(&outs), "a <tool_call>{}</tool_call>");
    }

    #[test]
    fn a_stop_sequence_split_across_tokens_cuts_the_text_and_is_reported() {
        let (outs, stopped) = run(&["one two ST", "OP three"], &["STOP", "zzz"], false);
        assert_eq!(text(&outs), "one two ");
        assert_eq!(stopped.as_deref(), Some("STOP"));
        // A held prefix that never completes is released at the end.
        let (outs, stopped) = run(&["one ST"], &["STOP"], false);
        assert_eq!(text(&outs), "one ST");
        assert_eq!(stopped, None);
    }

    #[test]
    fn held_back_respects_char_boundaries() {
        let (outs, _) = run(&["é", "ü"], &["üx"], false);
        assert_eq!(text(&outs), "éü");
    }
}
