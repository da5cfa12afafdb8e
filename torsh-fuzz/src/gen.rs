//! The seeded generator every case draws from, and random views of host data.
//!
//! A case is named by `(seed, index)`: [`case_rng`] mixes the two into the state of a SplitMix64
//! stream, so any case replays alone, on any backend, from those two numbers. Inputs are host `f64`
//! values plus the steps that turn a dense base tensor into a view ([`Input`]); building the same
//! input on two backends gives the same elements, so the reference's answer is comparable.

use torsh_backend::prelude::*;

/// A SplitMix64 stream: small, fast, and the same on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

/// The generator of case `index` of a run seeded with `seed`.
pub fn case_rng(seed: u64, index: u64) -> Rng {
    let mut r = Rng(seed ^ index.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    r.next_u64();
    r
}

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        debug_assert!(lo <= hi);
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A uniform value in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform value in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// A standard normal value (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u = self.unit().max(1e-300);
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    /// One of `items`.
    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.range(0, items.len() - 1)].clone()
    }

    /// A dimension: mostly small odd sizes, sometimes 1, a prime past a tile, or (with `empty`) 0.
    pub fn dim(&mut self, empty: bool) -> usize {
        match self.range(0, 19) {
            0 if empty => 0,
            0..=2 => 1,
            3..=11 => self.range(2, 9),
            12..=16 => self.pick(&[11, 13, 17, 31, 33, 63, 65]),
            _ => self.pick(&[97, 127, 129, 257]),
        }
    }

    /// A shape of `rank` dims whose element count stays at most `cap` (dims shrink to fit).
    pub fn shape(&mut self, rank: usize, empty: bool, cap: usize) -> Vec<usize> {
        let mut shape: Vec<usize> = (0..rank).map(|_| self.dim(empty)).collect();
        while shape.iter().product::<usize>() > cap {
            let i = self.range(0, rank - 1);
            shape[i] = (shape[i] / 2).max(1);
        }
        shape
    }

    /// A float dtype, f32 most often.
    pub fn float_dtype(&mut self) -> DType {
        self.pick(&[
            DType::F32,
            DType::F32,
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::F64,
        ])
    }
}

/// How element values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Values {
    /// Standard normal.
    Normal,
    /// Uniform in `[0.25, 2)`: the domain of log, sqrt, rsqrt, recip and pow's base.
    Positive,
    /// One repeated value (constant rows).
    Constant(f64),
    /// Distinct values (a shuffled ramp), so that argmax and ties are unambiguous.
    Distinct,
}

/// One step from a dense base tensor to a view.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Swap two dims.
    Transpose(usize, usize),
    /// Reorder the dims.
    Permute(Vec<usize>),
    /// Keep `len` elements of `dim` from `start`.
    Narrow(usize, usize, usize),
    /// Broadcast to a shape (dims of size 1 and new leading dims repeat).
    Broadcast(Vec<usize>),
}

/// A tensor input: host values of a dense base shape and the steps that make the view.
#[derive(Clone, Debug)]
pub struct Input {
    /// The base tensor's shape.
    pub base: Vec<usize>,
    /// The view's steps, applied in order.
    pub steps: Vec<Step>,
    /// The base tensor's elements, row-major.
    pub data: Vec<f64>,
}

impl Input {
    /// The view on `b` in `dtype`.
    pub fn build(&self, b: &Backend, dtype: DType) -> Result<Tensor> {
        let mut t = b.from_f64(&self.data, &self.base, dtype)?;
        for step in &self.steps {
            t = match step {
                Step::Transpose(i, j) => t.transpose(*i as isize, *j as isize)?,
                Step::Permute(p) => t.permute(p)?,
                Step::Narrow(d, start, len) => t.narrow(*d as isize, *start, *len)?,
                Step::Broadcast(shape) => t.broadcast_to(shape)?,
            };
        }
        Ok(t)
    }

    /// A short description: the base shape and the steps.
    pub fn describe(&self) -> String {
        if self.steps.is_empty() {
            format!("{:?}", self.base)
        } else {
            format!("{:?} {:?}", self.base, self.steps)
        }
    }
}

/// A random view whose shape is `shape`: dense, or (at random) transposed, permuted, narrowed,
/// broadcast, or two of those, over a base tensor of `values`.
pub fn view(rng: &mut Rng, shape: &[usize], values: Values) -> Input {
    let (base, steps) = steps_to(rng, shape, 2);
    let n: usize = base.iter().product();
    let data = match values {
        Values::Normal => (0..n).map(|_| rng.normal()).collect(),
        Values::Positive => (0..n).map(|_| rng.uniform(0.25, 2.0)).collect(),
        Values::Constant(v) => vec![v; n],
        Values::Distinct => {
            let mut ramp: Vec<f64> = (0..n).map(|i| i as f64 * 0.5 - n as f64 * 0.25).collect();
            for i in (1..n).rev() {
                ramp.swap(i, rng.range(0, i));
            }
            ramp
        }
    };
    Input { base, steps, data }
}

/// A base shape and steps that end at `shape`, with at most `depth` steps.
fn steps_to(rng: &mut Rng, shape: &[usize], depth: usize) -> (Vec<usize>, Vec<Step>) {
    let rank = shape.len();
    if depth == 0 || rng.chance(0.4) {
        return (shape.to_vec(), Vec::new());
    }
    let (before, step) = match rng.range(0, 3) {
        0 if rank >= 2 => {
            let i = rng.range(0, rank - 1);
            let j = (i + rng.range(1, rank - 1)) % rank;
            let mut before = shape.to_vec();
            before.swap(i, j);
            (before, Step::Transpose(i, j))
        }
        1 if rank >= 2 => {
            let mut perm: Vec<usize> = (0..rank).collect();
            for i in (1..rank).rev() {
                perm.swap(i, rng.range(0, i));
            }
            // permute(p) gives dim k the size of input dim p[k].
            let mut before = vec![0; rank];
            for (k, &p) in perm.iter().enumerate() {
                before[p] = shape[k];
            }
            (before, Step::Permute(perm))
        }
        2 if rank >= 1 => {
            let d = rng.range(0, rank - 1);
            let extra = rng.range(1, 3);
            let start = rng.range(0, extra);
            let mut before = shape.to_vec();
            before[d] += extra;
            (before, Step::Narrow(d, start, shape[d]))
        }
        _ => {
            // Some dims become 1 (repeated), and maybe the leading dim is new.
            let mut before = shape.to_vec();
            for d in before.iter_mut() {
                if rng.chance(0.35) {
                    *d = 1;
                }
            }
            if rank >= 1 && rng.chance(0.3) {
                before.remove(0);
            }
            if before == shape {
                return (shape.to_vec(), Vec::new());
            }
            (before, Step::Broadcast(shape.to_vec()))
        }
    };
    let (base, mut steps) = steps_to(rng, &before, depth - 1);
    steps.push(step);
    (base, steps)
}
