//! FNV-1a (64 bits): the project's stable hash for fingerprints and seeded draws — the same on every replica,
//! every platform and across restarts (std's hasher is none of these).

/// An FNV-1a state.
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self::new()
    }
}

impl Fnv {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;

    pub fn new() -> Self {
        Self(Self::OFFSET)
    }

    /// A state whose draws differ by `seed`.
    pub fn seeded(seed: u64) -> Self {
        Self(Self::OFFSET ^ seed)
    }

    /// Hashes `bytes` in.
    pub fn eat(&mut self, bytes: &[u8]) -> &mut Self {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
        self
    }

    /// The hash.
    pub fn finish(&self) -> u64 {
        self.0
    }

    /// The hash as 16 hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }

    /// The hash as a uniform draw in [0, 1), its bits mixed by splitmix64's finaliser first (FNV's high bits
    /// barely move between inputs that differ in their last bytes).
    pub fn unit(&self) -> f64 {
        let mut h = self.0;
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
        (h >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_and_seeds() {
        // FNV-1a's published test vectors.
        assert_eq!(Fnv::new().finish(), 0xcbf2_9ce4_8422_2325);
        assert_eq!(Fnv::new().eat(b"a").finish(), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(Fnv::new().eat(b"foobar").hex(), "85944171f73967e8");
        assert_ne!(
            Fnv::seeded(1).eat(b"x").unit(),
            Fnv::seeded(2).eat(b"x").unit()
        );
        let u = Fnv::new().eat(b"x").unit();
        assert!((0.0..1.0).contains(&u));
    }
}
