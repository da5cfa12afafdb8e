//! The text on the host: Macbeth as shipped in `examples/data/`, its characters as tokens, a fixed
//! 90/10 split into training and validation text, and batches of windows drawn at random offsets.

use torsh_backend::rng;

/// The play's spoken lines, as `examples/data/make_text.py` writes them.
const TEXT: &str = include_str!("../data/macbeth.txt");

/// The text as token ids, and the characters the ids stand for.
pub struct Corpus {
    /// Every distinct character of the text, sorted: token `i` is `chars[i]`.
    pub chars: Vec<char>,
    /// The first 90 % of the text, as token ids.
    pub train: Vec<i64>,
    /// The last 10 %.
    pub validation: Vec<i64>,
}

impl Corpus {
    /// The shipped text, tokenised and split.
    pub fn load() -> Corpus {
        let mut chars: Vec<char> = TEXT.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        let ids: Vec<i64> = TEXT
            .chars()
            .map(|c| chars.binary_search(&c).unwrap_or(0) as i64)
            .collect();
        let cut = ids.len() * 9 / 10;
        Corpus {
            chars,
            validation: ids[cut..].to_vec(),
            train: ids[..cut].to_vec(),
        }
    }

    /// Tokens in the vocabulary.
    pub fn vocab(&self) -> usize {
        self.chars.len()
    }

    /// The ids of `text`'s characters; `None` when one is not in the vocabulary.
    pub fn encode(&self, text: &str) -> Option<Vec<i64>> {
        text.chars()
            .map(|c| self.chars.binary_search(&c).ok().map(|i| i as i64))
            .collect()
    }

    /// The characters of `ids` (ids out of range are skipped).
    pub fn decode(&self, ids: &[i64]) -> String {
        ids.iter()
            .filter_map(|&i| usize::try_from(i).ok().and_then(|i| self.chars.get(i)))
            .collect()
    }
}

/// `batch` windows of `context` tokens from `text` and, for each, the window one token later (the
/// targets), both `batch · context` ids row by row. Window `j` of draw `draw` starts at an offset
/// taken from element `draw · batch + j` of the crate's random stream `seed`, so a run is the same
/// on every backend. `text` must be longer than `context`.
pub fn batch(text: &[i64], batch: usize, context: usize, seed: u64, draw: u64) -> [Vec<i64>; 2] {
    let starts = (text.len() - context) as u64;
    let mut inputs = Vec::with_capacity(batch * context);
    let mut targets = Vec::with_capacity(batch * context);
    for j in 0..batch as u64 {
        let start = (rng::bits(seed, draw * batch as u64 + j) % starts) as usize;
        inputs.extend_from_slice(&text[start..start + context]);
        targets.extend_from_slice(&text[start + 1..start + context + 1]);
    }
    [inputs, targets]
}
