//! A conversation's context for Tier-0 (`context_turns`): the route's head reads up to that many earlier user
//! turns with the last, the latest of them kept within `context_chars` and the last turn always whole, one
//! per line, oldest first. The text with its context is what the request is classified, cached and reranked
//! by; the outcome says how many turns it read.

use std::borrow::Cow;

use crate::model::request::Request;
use crate::routing::route::Route;

/// `v` as `route` classifies it (itself when the route reads no context or the conversation has no earlier
/// user turn), and the number of earlier turns read.
pub(crate) fn with_context<'a>(route: &Route, v: &'a Request) -> (Cow<'a, Request>, usize) {
    context_of(route.context_turns, route.context_chars, v)
}

/// `v` with up to `turns` earlier user turns, at most `chars` characters of them.
fn context_of(turns: usize, chars: usize, v: &Request) -> (Cow<'_, Request>, usize) {
    if turns == 0 {
        return (Cow::Borrowed(v), 0);
    }
    let users: Vec<&str> = v
        .messages
        .iter()
        .filter(|m| m.role == "user")
        .map(|m| m.content.as_str())
        .collect();
    // The last user turn is `v.text`; the ones before it, latest first.
    let earlier = users.iter().rev().skip(1).take(turns);
    let mut kept: Vec<&str> = Vec::new();
    let mut left = chars;
    for turn in earlier {
        let turn = turn.trim();
        if turn.is_empty() || left == 0 {
            continue;
        }
        let n = turn.chars().count();
        // The latest characters of a turn that does not fit whole.
        let part = if n <= left {
            turn
        } else {
            let skip = turn.char_indices().nth(n - left).map_or(0, |(i, _)| i);
            &turn[skip..]
        };
        left = left.saturating_sub(part.chars().count());
        kept.push(part);
    }
    if kept.is_empty() {
        return (Cow::Borrowed(v), 0);
    }
    let read = kept.len();
    kept.reverse();
    let mut text = kept.join("\n");
    text.push('\n');
    text.push_str(&v.text);
    let mut with = v.clone();
    with.text = text;
    (Cow::Owned(with), read)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversation(turns: &[(&str, &str)]) -> Request {
        Request::for_tests("r", tiergate_config::RouteKind::Classify, turns)
    }

    fn joined(turns: usize, chars: usize, v: &Request) -> (String, usize) {
        let (c, n) = crate::answer::context::context_of(turns, chars, v);
        (c.text.clone(), n)
    }

    #[test]
    fn earlier_user_turns_come_first_within_their_bound() {
        let v = conversation(&[
            ("system", "be nice"),
            ("user", "my card is stuck in the machine"),
            ("assistant", "which machine?"),
            ("user", "at the station"),
            ("assistant", "ok"),
            ("user", "cancel it"),
        ]);
        assert_eq!(joined(0, 400, &v), ("cancel it".into(), 0));
        assert_eq!(joined(1, 400, &v), ("at the station\ncancel it".into(), 1));
        assert_eq!(
            joined(5, 400, &v),
            (
                "my card is stuck in the machine\nat the station\ncancel it".into(),
                2
            )
        );
        // 20 characters: the latest turn whole (14), the latest 6 of the one before.
        assert_eq!(
            joined(5, 20, &v),
            ("achine\nat the station\ncancel it".into(), 2)
        );
        // A single turn has no context.
        let one = conversation(&[("user", "cancel it")]);
        assert_eq!(joined(3, 400, &one), ("cancel it".into(), 0));
    }
}
