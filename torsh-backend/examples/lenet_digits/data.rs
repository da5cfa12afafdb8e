//! The digits data set on the host: parsing `examples/data/digits.csv`, the fixed-seed 80/20 split
//! and each epoch's shuffle. Pixels are scaled from 0..16 to [0, 1]; nothing else is done to them.

/// Side of the square images.
pub const SIDE: usize = 8;

/// Classes (the digits 0..9).
pub const CLASSES: usize = 10;

/// The data set as shipped: one line per image, its class then its 64 pixels.
const CSV: &str = include_str!("../data/digits.csv");

/// Images and labels of some part of the data set, on the host.
pub struct Digits {
    /// `len() · SIDE²` pixels in [0, 1], image after image, row by row.
    pub pixels: Vec<f32>,
    /// The class of each image, 0..[`CLASSES`].
    pub labels: Vec<i64>,
}

impl Digits {
    /// Every image of the shipped file. Errors: a malformed line, named by its number.
    pub fn load() -> Result<Digits, String> {
        let mut digits = Digits {
            pixels: Vec::new(),
            labels: Vec::new(),
        };
        for (n, line) in CSV.lines().enumerate() {
            let values: Vec<u8> = line
                .split(',')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("digits.csv line {}: {e}", n + 1))?;
            let (label, pixels) = values.split_first().ok_or("digits.csv: empty line")?;
            if pixels.len() != SIDE * SIDE || usize::from(*label) >= CLASSES {
                return Err(format!(
                    "digits.csv line {}: not a label and 64 pixels",
                    n + 1
                ));
            }
            digits.labels.push(i64::from(*label));
            digits
                .pixels
                .extend(pixels.iter().map(|&p| f32::from(p) / 16.0));
        }
        Ok(digits)
    }

    /// Images held.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// The images at `rows`, in that order.
    pub fn select(&self, rows: &[usize]) -> Digits {
        let size = SIDE * SIDE;
        Digits {
            pixels: rows
                .iter()
                .flat_map(|&r| &self.pixels[r * size..(r + 1) * size])
                .copied()
                .collect(),
            labels: rows.iter().map(|&r| self.labels[r]).collect(),
        }
    }

    /// A shuffled split into (training, test) sets, the test set holding `test_fraction` of the
    /// images; the same `seed` gives the same split.
    pub fn split(&self, test_fraction: f64, seed: u64) -> (Digits, Digits) {
        let order = SplitMix64(seed).permutation(self.len());
        let test = (self.len() as f64 * test_fraction).round() as usize;
        (self.select(&order[test..]), self.select(&order[..test]))
    }
}

/// SplitMix64 (Steele, Lea and Flood, 2014): a small, well-mixed generator, enough to shuffle data
/// reproducibly.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `0..n` in a random order (Fisher–Yates).
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        order
    }
}
