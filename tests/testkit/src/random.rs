//! Replayable randomness for chaos: xorshift64*, enough to choose victims and
//! changes, and the same sequence again from the same seed.

/// A xorshift64* generator. Seed it with a non-zero value.
#[derive(Debug, Clone)]
pub struct Random(u64);

impl Random {
    /// A generator from `seed` (zero is made one: xorshift never leaves zero).
    pub fn new(seed: u64) -> Self {
        Random(seed.max(1))
    }

    /// A fresh random seed.
    pub fn fresh_seed() -> u64 {
        uuid::Uuid::new_v4().as_u64_pair().0 | 1
    }

    /// A seed from the environment variable `name` when it holds a number, else a
    /// fresh one.
    pub fn seed_from_env(name: &str) -> u64 {
        std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or_else(Random::fresh_seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_choices() {
        let (mut a, mut b) = (Random::new(42), Random::new(42));
        let first: Vec<usize> = (0..5).map(|_| a.below(7)).collect();
        assert_eq!(first, (0..5).map(|_| b.below(7)).collect::<Vec<_>>());
        assert!(first.iter().all(|&n| n < 7));
        assert_eq!(Random::new(0).next_u64(), Random::new(1).next_u64(), "zero is made one");
    }
}
