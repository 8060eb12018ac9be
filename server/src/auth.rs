//! Who may do what: the admin token (compared in constant time), loopback peers when no token is set, and the
//! per-request threshold override, which needs the admin token in a header of its own (a chat client's
//! `Authorization` carries its API key for the upstream, not ours).

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::HeaderMap;

use crate::error::ApiError;

/// The header that carries the admin token on chat requests that ask for a threshold override.
pub const OVERRIDE_TOKEN_HEADER: &str = "x-tiergate-admin-token";

/// Equal contents, in time that depends only on the lengths (a wrong guess reveals nothing of the token).
pub fn token_matches(given: &[u8], token: &[u8]) -> bool {
    let mut diff = given.len() ^ token.len();
    for (i, t) in token.iter().enumerate() {
        diff |= usize::from(given.get(i).copied().unwrap_or(0) ^ t);
    }
    std::hint::black_box(diff) == 0
}

/// The credentials of `Authorization: Bearer <token>` (scheme matched case-insensitively).
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get("authorization")?.to_str().ok()?.trim();
    let (scheme, rest) = v.split_once(char::is_whitespace)?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// A client's API key: `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>` (Anthropic's).
pub fn api_key(headers: &HeaderMap) -> Option<&str> {
    bearer(headers).or_else(|| headers.get("x-api-key")?.to_str().ok().map(str::trim))
}

/// A loopback peer, IPv4-mapped IPv6 (`::ffff:127.0.0.1`) included.
pub fn is_loopback(peer: SocketAddr) -> bool {
    peer.ip().to_canonical().is_loopback()
}

/// The client's address, when the connection recorded one (`ConnectInfo`).
pub struct Peer(pub Option<SocketAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Peer(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0),
        ))
    }
}

/// Admin access: the configured `token` (`server.admin_token`) as a bearer token, or, without one, a loopback
/// peer.
pub fn authorize_admin(
    token: Option<&str>,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
) -> Result<(), ApiError> {
    match token {
        Some(token) => match bearer(headers) {
            Some(given) if token_matches(given.as_bytes(), token.as_bytes()) => Ok(()),
            _ => Err(ApiError::Unauthorized(
                "admin endpoints need `Authorization: Bearer <server.admin_token>`".into(),
            )),
        },
        None if peer.is_some_and(is_loopback) => Ok(()),
        None => Err(ApiError::Unauthorized(
            "no admin token is configured: admin is open to loopback clients only".into(),
        )),
    }
}

/// The θ a request's `x-tiergate-threshold` asks for (in [0, 1]; `Ok(None)`: none asked), and whether the
/// request presents the admin token (`token`: `server.admin_token`) in `x-tiergate-admin-token`. Whether it
/// may force θ is the engine's to decide (the policy's `allow_header_override` and that credential): an
/// override asked for but not permitted is refused (403), never silently ignored.
pub fn threshold_asked(
    token: Option<&str>,
    headers: &HeaderMap,
) -> Result<Option<(f64, bool)>, ApiError> {
    let Some(raw) = headers.get(tiergate_core::outcome::header::THRESHOLD) else {
        return Ok(None);
    };
    let admin = match (token, headers.get(OVERRIDE_TOKEN_HEADER)) {
        (Some(token), Some(given)) => token_matches(given.as_bytes(), token.as_bytes()),
        _ => false,
    };
    let s = raw
        .to_str()
        .map_err(|_| {
            ApiError::invalid(tiergate_core::outcome::header::THRESHOLD, "not valid text")
        })?
        .trim();
    match s.parse::<f64>() {
        Ok(t) if (0.0..=1.0).contains(&t) => Ok(Some((t, admin))),
        _ => Err(ApiError::invalid(
            tiergate_core::outcome::header::THRESHOLD,
            format!("`{s}` is not a number in [0, 1]"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_by_content_and_length() {
        assert!(token_matches(b"s3cret-token", b"s3cret-token"));
        assert!(!token_matches(b"s3cret-tokeN", b"s3cret-token"));
        assert!(!token_matches(b"s3cret", b"s3cret-token"));
        assert!(!token_matches(b"s3cret-token-and-more", b"s3cret-token"));
        assert!(!token_matches(b"", b"s3cret-token"));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let mut h = HeaderMap::new();
        for v in ["Bearer abc", "bearer abc", "BEARER   abc ", "  Bearer abc"] {
            h.insert("authorization", v.parse().unwrap());
            assert_eq!(bearer(&h), Some("abc"), "{v}");
        }
        h.insert("authorization", "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
        h.insert("authorization", "Bearerabc".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }

    #[test]
    fn mapped_ipv4_loopback_is_loopback() {
        for (a, want) in [
            ("127.0.0.1:1", true),
            ("[::1]:1", true),
            ("[::ffff:127.0.0.1]:1", true),
            ("[::ffff:10.0.0.1]:1", false),
            ("10.0.0.1:1", false),
        ] {
            assert_eq!(is_loopback(a.parse().unwrap()), want, "{a}");
        }
    }
}
