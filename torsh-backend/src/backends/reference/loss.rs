//! Cross-entropy per sample and its logits' gradient, in f64. Every target is checked before
//! anything is written.

use crate::backends::reference::ReferenceBackend;
use crate::compute::op::OpImpl;
use crate::compute::{CrossEntropyDesc, StridedBuf};
use crate::error::Result;

use super::index::load_indices;
use super::memory::HostMemory;

/// The losses (forward) or the logits' gradient (backward) of `d`.
pub fn cross_entropy(mem: &mut HostMemory, d: &CrossEntropyDesc) -> Result<()> {
    let (rows, classes) = (d.rows, d.classes);
    let targets = load_indices(
        mem,
        d.index_dtype,
        &StridedBuf::contiguous(d.target, &[rows]),
    )?;
    let picked: Vec<Option<usize>> = targets
        .iter()
        .map(|&t| d.class_of(t))
        .collect::<Result<_>>()?;
    let x = mem.load_dense(d.dtype, d.logits, rows * classes)?;
    let eps = d.label_smoothing;
    let weights = d
        .grad
        .map(|g| mem.load_dense(d.dtype, g, rows))
        .transpose()?;
    let mut out = vec![
        0.0f64;
        if weights.is_some() {
            rows * classes
        } else {
            rows
        }
    ];
    for (i, class) in picked.iter().enumerate() {
        let Some(t) = *class else { continue };
        let row = &x[i * classes..(i + 1) * classes];
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        match &weights {
            None => {
                let mut loss = lse;
                if eps < 1.0 {
                    loss -= (1.0 - eps) * row[t];
                }
                if eps > 0.0 {
                    loss -= eps * row.iter().sum::<f64>() / classes as f64;
                }
                out[i] = loss;
            }
            Some(w) => {
                for (c, (o, v)) in out[i * classes..(i + 1) * classes]
                    .iter_mut()
                    .zip(row)
                    .enumerate()
                {
                    let hot = if c == t { 1.0 - eps } else { 0.0 };
                    *o = w[i] * ((v - lse).exp() - eps / classes as f64 - hot);
                }
            }
        }
    }
    mem.store(d.dtype, d.output, &out)
}

impl OpImpl<CrossEntropyDesc> for ReferenceBackend {
    fn op(&self, desc: &CrossEntropyDesc) -> Result<()> {
        let acc = desc.accesses()?;
        self.float_only(desc.name(), desc.dtype)?;
        self.run(acc, |mem| cross_entropy(mem, desc))
    }
}
