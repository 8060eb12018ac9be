//! `tiergate-bench`: a load generator and report for tiergate's two channels (and for any OpenAI-compatible
//! chat endpoint).
//!
//! Load is open loop (constant or Poisson arrivals, latency counted from the *intended* send time, so a slow
//! server cannot hide its queueing by slowing the client down) or closed loop (N clients). Every answer is
//! put in a channel from tiergate's response headers — Tier-0, escalated, degraded — or in the error channel,
//! and each channel gets its own HDR histogram, time series, latency band and SLO lines.

pub mod args;
pub mod compare;
pub mod cost;
pub mod deadlines;
pub mod derive;
pub mod html;
pub mod http;
pub mod operator;
pub mod output;
pub mod patience;
pub mod report;
pub mod run;
pub mod schedule;
pub mod scrape;
pub mod slo;
pub mod stats;
pub mod tenants;
pub mod workload;

/// Parse `60s`, `1.5m`, `500ms`, `2h` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (examples: 60s, 1.5m, 500ms)"))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("`{s}`: a duration must be positive"));
    }
    Ok(std::time::Duration::from_secs_f64(v * scale))
}

#[cfg(test)]
mod tests {
    use super::args::parse_header;
    use super::parse_duration;

    #[test]
    fn headers() {
        assert_eq!(
            parse_header("x-tiergate-threshold: 0.5"),
            Ok(("x-tiergate-threshold".into(), "0.5".into()))
        );
        assert!(parse_header("no colon")
            .unwrap_err()
            .contains("Name: value"));
        assert!(parse_header("bad name: 1")
            .unwrap_err()
            .contains("not a header name"));
    }
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("soon")
            .unwrap_err()
            .contains("not a duration"));
    }
}
