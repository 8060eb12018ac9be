//! The latency bands of DESIGN.md: where a channel's P95 puts it.

/// Each band's name, its short key and its upper bound in milliseconds, fastest first.
pub const BANDS: [(&str, &str, f64); 5] = [
    ("Tier-0", "tier0", 80.0),
    ("Tier-1", "tier1", 300.0),
    ("Tier-2", "tier2", 1200.0),
    ("Tier-3", "tier3", 4500.0),
    ("Tier-4", "tier4", 12000.0),
];

/// The band of a P95 in milliseconds (`"none"` beyond Tier-4).
pub fn band(p95_ms: f64) -> &'static str {
    BANDS
        .iter()
        .find(|(_, _, max)| p95_ms <= *max)
        .map_or("none", |(name, _, _)| name)
}

/// A band's upper bound in milliseconds, by name (`Tier-2`).
pub fn bound_ms(name: &str) -> Option<f64> {
    BANDS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, _, max)| *max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_follow_the_design_table() {
        assert_eq!(band(0.5), "Tier-0");
        assert_eq!(band(80.0), "Tier-0");
        assert_eq!(band(80.1), "Tier-1");
        assert_eq!(band(1200.0), "Tier-2");
        assert_eq!(band(12000.0), "Tier-4");
        assert_eq!(band(12000.5), "none");
        assert_eq!(bound_ms("Tier-3"), Some(4500.0));
        assert_eq!(bound_ms("Tier-9"), None);
    }
}
