//! Tensor constructors: `empty`, `zeros`, `ones`, `full`, `randn`, `rand`, `arange`, `from_slice`,
//! `from_f64`.

use crate::backend::Backend;
use crate::compute::{Distribution, FillDesc, RandomDesc};
use crate::dtype::{DType, Element};
use crate::error::{BackendError, Result};
use crate::shape::checked_numel;
use crate::tensor::Tensor;

impl Backend {
    /// An uninitialised contiguous tensor (contents unspecified). `SizeOverflow` when the byte size does
    /// not fit in `usize`; `OutOfMemory` when the device cannot hold it.
    pub fn empty(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::alloc(self, shape, dtype)
    }

    /// A tensor filled with `value` (converted to `dtype` with Rust `as` semantics for integers).
    pub fn full(&self, shape: &[usize], value: f64, dtype: DType) -> Result<Tensor> {
        let t = Tensor::alloc(self, shape, dtype)?;
        self.compute().fill(&FillDesc {
            dtype,
            ptr: t.data_ptr(),
            len: t.numel(),
            value,
        })?;
        Ok(t)
    }

    /// A tensor of zeros.
    pub fn zeros(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.full(shape, 0.0, dtype)
    }

    /// A tensor of ones.
    pub fn ones(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.full(shape, 1.0, dtype)
    }

    fn random(
        &self,
        shape: &[usize],
        dtype: DType,
        distribution: Distribution,
        seed: u64,
    ) -> Result<Tensor> {
        let t = Tensor::alloc(self, shape, dtype)?;
        self.compute().random(&RandomDesc {
            dtype,
            ptr: t.data_ptr(),
            len: t.numel(),
            distribution,
            seed,
        })?;
        Ok(t)
    }

    /// Standard normal values from this backend's random stream (see [`Backend::manual_seed`]).
    /// Floating dtypes only (`Unsupported` otherwise).
    pub fn randn(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.random(
            shape,
            dtype,
            Distribution::Normal {
                mean: 0.0,
                std: 1.0,
            },
            self.next_seed(),
        )
    }

    /// Uniform values on `[0, 1)` from this backend's random stream. Floating dtypes only.
    pub fn rand(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.random(
            shape,
            dtype,
            Distribution::Uniform {
                low: 0.0,
                high: 1.0,
            },
            self.next_seed(),
        )
    }

    /// Values from `distribution` with an explicit seed: the same seed gives the same values on every
    /// backend kind (up to the dtype's rounding).
    pub fn random_seeded(
        &self,
        shape: &[usize],
        dtype: DType,
        distribution: Distribution,
        seed: u64,
    ) -> Result<Tensor> {
        self.random(shape, dtype, distribution, seed)
    }

    /// `start, start + step, ...` below `end` (above, for a negative step), as a 1-D tensor.
    /// `InvalidArgument` for a zero or non-finite step or bounds.
    pub fn arange(&self, start: f64, end: f64, step: f64, dtype: DType) -> Result<Tensor> {
        if step == 0.0 || !(start.is_finite() && end.is_finite() && step.is_finite()) {
            return Err(BackendError::invalid(
                "arange",
                format!("need finite bounds and a non-zero step, got {start}..{end} step {step}"),
            ));
        }
        let count = ((end - start) / step).ceil().max(0.0);
        if count > (usize::MAX / 8) as f64 {
            return Err(BackendError::overflow(
                "arange",
                format!("{count} elements"),
            ));
        }
        let count = count as usize;
        let mut values = Vec::new();
        values
            .try_reserve_exact(count)
            .map_err(|_| BackendError::OutOfMemory {
                requested: count.saturating_mul(8),
                available: 0,
            })?;
        values.extend((0..count).map(|i| start + i as f64 * step));
        self.from_f64(&values, &[values.len()], dtype)
    }

    /// A tensor holding `data` with `shape`. `ShapeMismatch` when the lengths differ.
    pub fn from_slice<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Tensor> {
        let n = checked_numel("from_slice", shape)?;
        if n != data.len() {
            return Err(BackendError::shape(
                "from_slice",
                format!(
                    "{} values cannot fill shape {shape:?} ({n} elements)",
                    data.len()
                ),
            ));
        }
        let t = Tensor::alloc(self, shape, T::DTYPE)?;
        self.compute()
            .copy_htod(t.data_ptr(), bytemuck::cast_slice(data))?;
        Ok(t)
    }

    /// A tensor of `dtype` holding `data` converted from f64 (rounded to nearest; Rust `as` semantics
    /// for integers). `ShapeMismatch` when the lengths differ.
    pub fn from_f64(&self, data: &[f64], shape: &[usize], dtype: DType) -> Result<Tensor> {
        use half::{bf16, f16};
        fn conv<T: Element>(b: &Backend, d: &[f64], s: &[usize]) -> Result<Tensor> {
            let v: Vec<T> = d.iter().map(|&x| T::from_f64(x)).collect();
            b.from_slice(&v, s)
        }
        match dtype {
            DType::F32 => conv::<f32>(self, data, shape),
            DType::F64 => conv::<f64>(self, data, shape),
            DType::F16 => conv::<f16>(self, data, shape),
            DType::BF16 => conv::<bf16>(self, data, shape),
            DType::I32 => conv::<i32>(self, data, shape),
            DType::I64 => conv::<i64>(self, data, shape),
            DType::U8 => conv::<u8>(self, data, shape),
        }
    }
}
