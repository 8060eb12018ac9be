//! What the HTTP adapter reads off a request and adds to its response around the engine: the request's budget
//! (`x-tiergate-deadline-ms`), its tenant (the bearer key), the brownout step's mark and the experiment's
//! variant. The engine sees none of the headers.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use tiergate_core::outcome::header::DEADLINE as HEADER;
use tiergate_engine::model::outcome::Step;

use crate::error::ApiError;

/// The budget a request runs under: the header's (a positive integer of milliseconds, at most `max`), else the
/// route's default; `None` when neither is set (the LLM's deadlines by job kind apply).
pub fn budget(
    headers: &HeaderMap,
    default: Option<Duration>,
    max: Duration,
) -> Result<Option<Duration>, ApiError> {
    let Some(raw) = headers.get(HEADER) else {
        return Ok(default.map(|d| d.min(max)));
    };
    let text = raw
        .to_str()
        .map_err(|_| ApiError::invalid(HEADER, "not valid text"))?
        .trim();
    let ms = text
        .parse::<u64>()
        .ok()
        .filter(|ms| *ms > 0)
        .ok_or_else(|| {
            ApiError::invalid(
                HEADER,
                format!("`{text}` is not a positive integer of milliseconds"),
            )
        })?;
    let asked = Duration::from_millis(ms);
    if asked > max {
        return Err(ApiError::invalid(
            HEADER,
            format!(
                "{ms} ms is above this route's max_deadline_ms ({} ms)",
                max.as_millis()
            ),
        ));
    }
    Ok(Some(asked))
}

/// `resp` with `x-tiergate-brownout: <step>` while the ladder is above `normal`.
pub fn mark_brownout(mut resp: axum::response::Response, step: Step) -> axum::response::Response {
    if step != Step::Normal {
        resp.headers_mut().insert(
            tiergate_core::outcome::header::BROWNOUT,
            axum::http::HeaderValue::from_static(step.as_str()),
        );
    }
    resp
}

/// A header's value as trimmed text, when it is there, readable and not empty.
pub fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    let text = headers.get(name)?.to_str().ok()?.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// `resp` with the request's set-aside fields (`x-tiergate-set-aside`) and, when its `max_tokens` was lowered,
/// the ceiling it got (`x-tiergate-max-tokens`).
pub fn mark_request(mut resp: Response, v: &tiergate_engine::model::request::Request) -> Response {
    use tiergate_core::outcome::header;
    if let Some(h) = crate::fields::header_value(&v.set_aside) {
        resp.headers_mut().insert(header::SET_ASIDE, h);
    }
    if v.max_tokens_clamped {
        resp.headers_mut()
            .insert(header::MAX_TOKENS, HeaderValue::from(v.max_tokens));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(HEADER, v.parse().unwrap());
        h
    }

    #[test]
    fn the_budget_is_a_positive_integer_within_the_routes_maximum() {
        let max = Duration::from_secs(30);
        let d = Some(Duration::from_secs(2));
        assert_eq!(budget(&HeaderMap::new(), None, max).unwrap(), None);
        assert_eq!(budget(&HeaderMap::new(), d, max).unwrap(), d);
        assert_eq!(
            budget(&headers(" 250 "), d, max).unwrap(),
            Some(Duration::from_millis(250))
        );
        for bad in ["0", "-5", "1.5", "abc", "", "99999999999999999999"] {
            let e = budget(&headers(bad), d, max).unwrap_err();
            assert_eq!(e.parts().0.as_u16(), 400, "{bad}");
            assert!(e.body().to_string().contains(HEADER), "{bad}");
        }
        let e = budget(&headers("30001"), d, max).unwrap_err();
        assert!(e.to_string().contains("max_deadline_ms"), "{e}");
    }
}
