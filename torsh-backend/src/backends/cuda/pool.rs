//! Host side of the 2-D pooling kernels (`kernels/pool.cu`): one launch of `pool2d_<dtype>` (or
//! `max_pool2d_indices_<dtype>`), one thread per output element, or of `pool2d_backward_<dtype>`, one
//! thread per input element, with the window geometry passed by value.

use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::launch::{check_aligned, suffix, to_i64};
use super::Gpu;
use crate::backends::cuda::CudaBackend;
use crate::compute::op::OpImpl;
use crate::compute::{Pool2dBackwardDesc, Pool2dDesc, PoolKind};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// The op's name in errors.
const OP: &str = "pool2d";

/// Maximum over the window (`POOL_MAX` in `pool.cu`).
const MODE_MAX: i32 = 0;
/// Mean with the window area as divisor (`POOL_AVG_INCLUDE_PAD`).
const MODE_AVG_INCLUDE_PAD: i32 = 1;
/// Mean over the taps inside the input (`POOL_AVG_EXCLUDE_PAD`).
const MODE_AVG_EXCLUDE_PAD: i32 = 2;

/// The launch's geometry, as the kernel receives it (`struct PoolGeometry` in `pool.cu`, same layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
struct PoolGeometry {
    /// `N·C·OH·OW` output elements.
    total: i64,
    /// `H`.
    height: i64,
    /// `W`.
    width: i64,
    /// `OH`.
    out_height: i64,
    /// `OW`.
    out_width: i64,
    /// Window rows.
    kernel_h: i64,
    /// Window columns.
    kernel_w: i64,
    /// Vertical stride.
    stride_h: i64,
    /// Horizontal stride.
    stride_w: i64,
    /// Rows of padding above (and below).
    pad_h: i64,
    /// Columns of padding left (and right).
    pad_w: i64,
    /// `kh·kw`, the divisor of an average that counts padding (the reference's `(kh·kw) as f64`).
    area: f64,
    /// One of the `MODE_*` constants.
    mode: i32,
    /// Explicit tail padding, always 0.
    pad: i32,
}

// SAFETY: a plain `repr(C)` struct of integers and a double with the same layout as the kernel's
// `PoolGeometry`.
unsafe impl DeviceRepr for PoolGeometry {}

impl PoolGeometry {
    /// The geometry of `d`, whose shapes have been validated, over its outputs. `SizeOverflow` when a
    /// size, or a padded extent `H + 2·ph` / `W + 2·pw` the kernel's index math reaches, does not fit
    /// in `i64`.
    fn of(d: &Pool2dDesc) -> Result<PoolGeometry> {
        Self::over(d.output_shape, d)
    }

    /// The geometry of the gradient `d`, over its input elements.
    fn of_backward(d: &Pool2dBackwardDesc) -> Result<PoolGeometry> {
        let forward = Pool2dDesc {
            kind: d.kind,
            dtype: d.dtype,
            input: d.output,
            input_shape: d.input_shape,
            output: d.grad,
            output_shape: d.grad_shape,
            kernel: d.kernel,
            stride: d.stride,
            padding: d.padding,
            indices: d.indices,
        };
        Self::over(d.input_shape, &forward)
    }

    /// The geometry of `d` with one thread per element of `threads` (a shape).
    fn over(threads: [usize; 4], d: &Pool2dDesc) -> Result<PoolGeometry> {
        let [_, _, h, w] = d.input_shape;
        let [_, _, oh, ow] = d.output_shape;
        let total = threads
            .iter()
            .try_fold(1usize, |acc, &x| acc.checked_mul(x))
            .ok_or_else(|| BackendError::overflow(OP, "the element count exceeds usize"))?;
        padded_fits(h, d.padding[0])?;
        padded_fits(w, d.padding[1])?;
        Ok(PoolGeometry {
            total: to_i64(OP, total)?,
            height: to_i64(OP, h)?,
            width: to_i64(OP, w)?,
            out_height: to_i64(OP, oh)?,
            out_width: to_i64(OP, ow)?,
            kernel_h: to_i64(OP, d.kernel[0])?,
            kernel_w: to_i64(OP, d.kernel[1])?,
            stride_h: to_i64(OP, used_stride(d.stride[0], oh))?,
            stride_w: to_i64(OP, used_stride(d.stride[1], ow))?,
            pad_h: to_i64(OP, d.padding[0])?,
            pad_w: to_i64(OP, d.padding[1])?,
            area: d.kernel[0] as f64 * d.kernel[1] as f64,
            mode: mode(d.kind),
            pad: 0,
        })
    }
}

/// The stride as the kernel uses it: a dim of one window never steps, so any stride gives the same
/// windows there and 1 stands in (a stride past `i64` is legal and means one window); a dim of more
/// windows steps within the padded extent, which `padded_fits` bounds by `i64`.
fn used_stride(stride: usize, windows: usize) -> usize {
    if windows <= 1 {
        1
    } else {
        stride
    }
}

/// `SizeOverflow` unless `extent + 2·padding` fits in `i64` (the kernel computes window coordinates
/// and clamps up to that bound).
fn padded_fits(extent: usize, padding: usize) -> Result<()> {
    padding
        .checked_mul(2)
        .and_then(|p| p.checked_add(extent))
        .and_then(|x| i64::try_from(x).ok())
        .map(|_| ())
        .ok_or_else(|| {
            BackendError::overflow(
                OP,
                format!("the padded extent {extent} + 2×{padding} exceeds i64"),
            )
        })
}

/// The kernel's mode for `kind`.
fn mode(kind: PoolKind) -> i32 {
    match kind {
        PoolKind::Max => MODE_MAX,
        PoolKind::Avg {
            count_include_pad: true,
        } => MODE_AVG_INCLUDE_PAD,
        PoolKind::Avg {
            count_include_pad: false,
        } => MODE_AVG_EXCLUDE_PAD,
    }
}

/// Enqueues `d` (validated by the caller) on the backend's stream; nothing for an empty output.
pub(crate) fn pool2d(gpu: &Gpu, d: &Pool2dDesc) -> Result<()> {
    if d.output_shape.contains(&0) {
        return Ok(());
    }
    check_aligned(OP, d.dtype, &[d.input, d.output])?;
    let geometry = PoolGeometry::of(d)?;
    let (output, input) = (d.output.0, d.input.0);
    if let Some(indices) = d.indices {
        check_aligned(OP, DType::I64, &[indices])?;
        let name = format!("max_pool2d_indices_{}", suffix(d.dtype));
        let f = gpu.function_for("pool", d.dtype, &name)?;
        let mut b = gpu.stream().launch_builder(&f);
        b.arg(&output).arg(&indices.0).arg(&input).arg(&geometry);
        let config = gpu.grid(geometry.total as usize);
        // SAFETY: the caller checked the three regions against live allocations and for aliasing;
        // the arguments match `max_pool2d_indices_<dtype>(T* y, i64* idx, const T* x, PoolGeometry g)`.
        unsafe { b.launch(config) }.map_err(|e| super::driver_error(OP, e))?;
        return Ok(());
    }
    let f = gpu.function_for("pool", d.dtype, &format!("pool2d_{}", suffix(d.dtype)))?;
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&output).arg(&input).arg(&geometry);
    // The output has at least one element, so the grid has at least one block.
    let config = gpu.grid(geometry.total as usize);
    // SAFETY: the caller checked both regions against live allocations and for aliasing; the arguments
    // match `pool2d_<dtype>(T* y, const T* x, PoolGeometry g)`.
    unsafe { b.launch(config) }.map_err(|e| super::driver_error(OP, e))?;
    Ok(())
}

/// The code `pool2d_backward_<dtype>` raises the error flag with (`index::FLAG_OPS`).
const FLAG_CODE: i64 = 2;

/// Enqueues the gradient `d` (validated by the caller); nothing for an empty input.
pub(crate) fn pool2d_backward(gpu: &Gpu, d: &Pool2dBackwardDesc) -> Result<()> {
    const OP: &str = "pool2d_backward";
    if d.input_shape.contains(&0) {
        return Ok(());
    }
    check_aligned(OP, d.dtype, &[d.grad, d.output])?;
    let geometry = PoolGeometry::of_backward(d)?;
    let stream = gpu.stream();
    // An average never reads the positions: the gradient's address stands in.
    let (indices, flag) = match d.indices {
        Some(p) => {
            check_aligned(OP, DType::I64, &[p])?;
            (p.0, gpu.errors.arm(stream)?)
        }
        None => (d.grad.0, 0u64),
    };
    let name = format!("pool2d_backward_{}", suffix(d.dtype));
    let f = gpu.function_for("pool", d.dtype, &name)?;
    let (output, grad) = (d.output.0, d.grad.0);
    let mut b = stream.launch_builder(&f);
    b.arg(&output)
        .arg(&grad)
        .arg(&indices)
        .arg(&geometry)
        .arg(&flag)
        .arg(&FLAG_CODE);
    let config = gpu.grid(geometry.total as usize);
    // SAFETY: the caller checked every region against live allocations and for aliasing; the flag
    // is the backend's live error flag (read only by a max); the arguments match
    // `pool2d_backward_<dtype>(T* dx, const T* dy, const i64* idx, PoolGeometry g, u64* flag, i64 op)`.
    unsafe { b.launch(config) }.map_err(|e| super::driver_error(OP, e))?;
    Ok(())
}

impl OpImpl<Pool2dBackwardDesc> for CudaBackend {
    fn op(&self, desc: &Pool2dBackwardDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("pool2d_backward", desc.dtype)?;
        self.run(acc, |gpu| pool2d_backward(gpu, desc))
    }
}

impl OpImpl<Pool2dDesc> for CudaBackend {
    fn op(&self, desc: &Pool2dDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("pool2d", desc.dtype)?;
        self.run(acc, |gpu| pool2d(gpu, desc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::DevicePtr;

    fn desc(
        kind: PoolKind,
        input_shape: [usize; 4],
        kernel: [usize; 2],
        padding: [usize; 2],
    ) -> Pool2dDesc {
        let stride = [2, 1];
        let output_shape =
            Pool2dDesc::expected_output_shape(input_shape, kernel, stride, padding).unwrap();
        Pool2dDesc {
            kind,
            dtype: DType::F32,
            input: DevicePtr(0x1000),
            input_shape,
            output: DevicePtr(0x2000),
            output_shape,
            kernel,
            stride,
            padding,
            indices: None,
        }
    }

    #[test]
    fn geometry_matches_the_kernel_struct_layout() {
        assert_eq!(std::mem::size_of::<PoolGeometry>(), 11 * 8 + 8 + 4 + 4);
        assert_eq!(std::mem::align_of::<PoolGeometry>(), 8);
    }

    #[test]
    fn geometry_carries_the_descriptor() {
        let d = desc(PoolKind::Max, [2, 3, 7, 5], [3, 2], [1, 1]);
        let g = PoolGeometry::of(&d).unwrap();
        // OH = (7 + 2 - 3) / 2 + 1 = 4, OW = (5 + 2 - 2) / 1 + 1 = 6.
        assert_eq!((g.out_height, g.out_width), (4, 6));
        assert_eq!(g.total, 2 * 3 * 4 * 6);
        assert_eq!((g.height, g.width), (7, 5));
        assert_eq!(
            (g.kernel_h, g.kernel_w, g.stride_h, g.stride_w),
            (3, 2, 2, 1)
        );
        assert_eq!((g.pad_h, g.pad_w), (1, 1));
        assert_eq!(g.area, 6.0);
        assert_eq!((g.mode, g.pad), (MODE_MAX, 0));
    }

    #[test]
    fn the_gradient_runs_one_thread_per_input_element() {
        let d = desc(PoolKind::Max, [2, 3, 7, 5], [3, 2], [1, 1]);
        let back = Pool2dBackwardDesc {
            kind: d.kind,
            dtype: d.dtype,
            grad: d.output,
            grad_shape: d.output_shape,
            indices: Some(DevicePtr(0x3000)),
            output: d.input,
            input_shape: d.input_shape,
            kernel: d.kernel,
            stride: d.stride,
            padding: d.padding,
        };
        let g = PoolGeometry::of_backward(&back).unwrap();
        assert_eq!(g.total, 2 * 3 * 7 * 5);
        assert_eq!((g.height, g.width, g.out_height, g.out_width), (7, 5, 4, 6));
        assert_eq!(g.mode, MODE_MAX);
    }

    #[test]
    fn modes_follow_the_kind() {
        assert_eq!(mode(PoolKind::Max), MODE_MAX);
        let include = PoolKind::Avg {
            count_include_pad: true,
        };
        let exclude = PoolKind::Avg {
            count_include_pad: false,
        };
        assert_eq!(mode(include), MODE_AVG_INCLUDE_PAD);
        assert_eq!(mode(exclude), MODE_AVG_EXCLUDE_PAD);
        let g = PoolGeometry::of(&desc(exclude, [1, 1, 4, 4], [2, 2], [0, 0])).unwrap();
        assert_eq!(g.mode, MODE_AVG_EXCLUDE_PAD);
    }

    #[test]
    fn modes_and_entry_points_match_the_kernel_source() {
        let src = include_str!("kernels/pool.cu");
        for (name, code) in [
            ("POOL_MAX", MODE_MAX),
            ("POOL_AVG_INCLUDE_PAD", MODE_AVG_INCLUDE_PAD),
            ("POOL_AVG_EXCLUDE_PAD", MODE_AVG_EXCLUDE_PAD),
        ] {
            let line = format!("#define {name} {code}\n");
            assert!(src.contains(&line), "pool.cu lacks `{}`", line.trim());
        }
        assert!(src.contains(
            "void pool2d_##S(T* __restrict__ y, const T* __restrict__ x, const PoolGeometry g)"
        ));
        assert!(
            src.contains("void max_pool2d_indices_##S(T* __restrict__ y, i64* __restrict__ idx,")
        );
        assert!(
            src.contains("void pool2d_backward_##S(T* __restrict__ dx, const T* __restrict__ dy,")
        );
        assert!(src.contains("u64* flag, i64 op)"));
        assert!(src.contains("TORSH_FLOAT_TYPES(ENTRY)"));
        assert_eq!(
            super::super::index::FLAG_OPS[FLAG_CODE as usize],
            "max_pool2d_backward"
        );
    }

    #[test]
    fn padded_extents_past_i64_are_refused() {
        assert!(padded_fits(10, 3).is_ok());
        assert!(padded_fits(0, (i64::MAX / 2) as usize).is_ok());
        assert!(padded_fits(1, (i64::MAX / 2) as usize).is_ok());
        assert!(padded_fits(2, (i64::MAX / 2) as usize).is_err());
        assert!(padded_fits(0, usize::MAX / 2 + 1).is_err());
        let mut d = desc(PoolKind::Max, [1, 1, 4, 4], [2, 2], [1, 1]);
        d.padding = [1, 1 << 62];
        assert!(matches!(
            PoolGeometry::of(&d),
            Err(BackendError::SizeOverflow { .. })
        ));
    }
}
