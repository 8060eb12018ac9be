//! The effective config as it may be shown (`/info`): secrets replaced wherever they sit, not at a hand-kept
//! list of paths. A value is a secret when its key names one (`token`, `password`, `secret`, `api_key`, but
//! not `api_key_env`, which names a variable), and a URL's password (`redis://:pw@host`) is one wherever the
//! URL appears.

use serde_json::Value;

/// What a secret is shown as.
pub const REDACTED: &str = "<redacted>";

/// `cfg` as JSON with its secrets replaced by [`REDACTED`].
pub fn redacted(cfg: &crate::Config) -> Value {
    let mut v = serde_json::to_value(cfg).unwrap_or_default();
    walk(&mut v, "");
    v
}

fn secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    !k.ends_with("_env")
        && ["token", "password", "secret", "api_key"]
            .iter()
            .any(|s| k.contains(s))
}

fn walk(v: &mut Value, key: &str) {
    match v {
        Value::Object(m) => m.iter_mut().for_each(|(k, x)| walk(x, k)),
        Value::Array(a) => a.iter_mut().for_each(|x| walk(x, key)),
        Value::String(s) if secret_key(key) && !s.is_empty() => *s = REDACTED.into(),
        Value::String(s) => {
            if let Some(r) = url_without_password(s) {
                *s = r;
            }
        }
        _ => {}
    }
}

/// `scheme://user:password@host…` with the password replaced (`None` when there is none).
pub fn url_without_password(s: &str) -> Option<String> {
    let (scheme, rest) = s.split_once("://")?;
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let at = rest[..authority_end].rfind('@')?;
    let (user, _password) = rest[..at].split_once(':')?;
    Some(format!("{scheme}://{user}:{REDACTED}{}", &rest[at..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_password_and_keep_the_rest() {
        assert_eq!(
            url_without_password("redis://:hunter2@10.0.0.5:6379/0").as_deref(),
            Some("redis://:<redacted>@10.0.0.5:6379/0")
        );
        assert_eq!(
            url_without_password("rediss://app:p%40ss@cache:6380").as_deref(),
            Some("rediss://app:<redacted>@cache:6380")
        );
        assert_eq!(url_without_password("redis://cache:6379"), None);
        assert_eq!(url_without_password("http://host/path?a=b@c"), None);
        assert_eq!(url_without_password("user@host"), None);
    }

    #[test]
    fn secrets_are_found_by_key_and_in_urls() {
        let mut cfg = crate::Config::default();
        cfg.server.admin_token = Some("t0ken".into());
        cfg.policy_store.url = "redis://:hunter2@127.0.0.1:6379/0".into();
        cfg.reranker.api_key_env = "OPENAI_API_KEY".into();
        let v = redacted(&cfg);
        let text = v.to_string();
        assert!(
            !text.contains("t0ken") && !text.contains("hunter2"),
            "{text}"
        );
        assert_eq!(v["server"]["admin_token"], REDACTED);
        assert_eq!(
            v["policy_store"]["url"],
            "redis://:<redacted>@127.0.0.1:6379/0"
        );
        assert_eq!(
            v["reranker"]["api_key_env"], "OPENAI_API_KEY",
            "a variable's name is not a secret"
        );
    }
}
