//! A small seeded generator (SplitMix64): the same seed gives the same
//! victims, attackers and name variants on every machine and version.

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(hi > lo);
        lo + self.next_u64() % (hi - lo)
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.range(0, n.max(1) as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Up to `n` distinct items, in a seeded order.
    pub fn sample<T: Clone>(&mut self, items: &[T], n: usize) -> Vec<T> {
        let mut idx: Vec<usize> = (0..items.len()).collect();
        for i in (1..idx.len()).rev() {
            let j = self.below(i + 1);
            idx.swap(i, j);
        }
        idx.into_iter().take(n).map(|i| items[i].clone()).collect()
    }

    /// `n` characters of `[A-Za-z0-9]`.
    pub fn alnum(&mut self, n: usize) -> String {
        const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..n).map(|_| *self.pick(CHARS) as char).collect()
    }
}

/// The run's seed: `ADVERSARY_SEED` (decimal or 0x-hex), else from the clock.
pub fn seed_from_env() -> u64 {
    match std::env::var("ADVERSARY_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("ADVERSARY_SEED={s:?} is not a number"))
        }
        Err(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            Rng::new(nanos ^ u64::from(std::process::id())).next_u64() >> 16
        }
    }
}

/// `ADVERSARY_CASES` (default `default`): generated name variants per
/// attacker and table entry.
pub fn cases_from_env(default: usize) -> usize {
    match std::env::var("ADVERSARY_CASES") {
        Ok(s) => s
            .trim()
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| panic!("ADVERSARY_CASES={s:?} is not a positive number")),
        Err(_) => default,
    }
}
