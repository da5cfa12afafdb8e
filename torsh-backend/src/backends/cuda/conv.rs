//! Host side of the convolution kernels (`kernels/conv.cu`): an implicit-GEMM 2-D convolution of our
//! own. Per group the GEMM has `N·P·Q` rows (output pixels), `K / groups` columns (output channels)
//! and depth `C / groups · R · S`; each 256-thread block computes 64 × 64 output tiles. Its gradients
//! are direct kernels: one thread per input element (input gradient, which the transposed
//! convolution runs on) and one block per weight element (weight gradient). Where cuDNN serves the
//! backend (`cudnn.rs`), all three go to cuDNN first and these kernels run whenever it declines.

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::cudnn;
use super::launch::{beyond_reach, check_aligned, suffix, to_i32, to_i64};
use super::Gpu;
use crate::backends::cuda::CudaBackend;
use crate::compute::op::OpImpl;
use crate::compute::*;
use crate::error::{BackendError, Result};

/// Operation name in errors.
const OP: &str = "conv2d";

/// Output pixels per block tile (`CONV_BM` in `conv.cu`).
const TILE_M: usize = 64;

/// Output channels per block tile (`CONV_BN` in `conv.cu`).
const TILE_N: usize = 64;

/// Threads per block (`CONV_THREADS` in `conv.cu`).
const THREADS: u32 = 256;

/// Largest GEMM depth `C / groups · R · S`: slice offsets in the kernel stay far below `i32::MAX`.
const MAX_DEPTH: usize = 1 << 30;

/// Largest `gridDim.x`.
const MAX_GRID_X: usize = i32::MAX as usize;

/// Largest `gridDim.y` and `gridDim.z`.
const MAX_GRID_YZ: usize = 65_535;

/// Shapes and window parameters as the kernel receives them (`struct ConvParams` in `conv.cu`, same
/// layout: sixteen `i64` followed by ten 32-bit fields).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConvParams {
    /// `N·P·Q` output pixels (GEMM rows).
    m: i64,
    /// `P·Q`.
    pq: i64,
    /// Output width `Q`.
    q: i64,
    /// Input channels `C`.
    c: i64,
    /// Input height `H`.
    h: i64,
    /// Input width `W`.
    w: i64,
    /// `H·W`.
    hw: i64,
    /// Output channels `K`.
    k: i64,
    /// `K / groups` (GEMM columns).
    kg: i64,
    /// Channel groups.
    groups: i64,
    /// Vertical stride.
    sh: i64,
    /// Horizontal stride.
    sw: i64,
    /// Vertical padding.
    ph: i64,
    /// Horizontal padding.
    pw: i64,
    /// Vertical dilation.
    dh: i64,
    /// Horizontal dilation.
    dw: i64,
    /// `C / groups`.
    cg: i32,
    /// `C / groups · R · S` (GEMM depth).
    kdim: i32,
    /// `R·S`.
    rs: i32,
    /// Kernel width `S`.
    s: i32,
    /// Division by `R·S` in the kernel.
    rs_div: FastDiv,
    /// Division by `S` in the kernel.
    s_div: FastDiv,
    /// 1 when a bias is added.
    has_bias: i32,
    /// Padding to a multiple of 8 bytes.
    pad: i32,
}

// SAFETY: a plain `repr(C)` struct of integers with the same layout as the kernel's `ConvParams`.
unsafe impl DeviceRepr for ConvParams {}

impl ConvParams {
    /// The kernel parameters of `d` (already validated by `Conv2dDesc::accesses`). `SizeOverflow` when
    /// a count exceeds `i64`, `FeatureUnavailable` when the GEMM depth `C / groups · R · S` exceeds
    /// [`MAX_DEPTH`] (the kernel's 32-bit depth indices).
    pub(crate) fn new(d: &Conv2dDesc) -> Result<ConvParams> {
        let [n, c, h, w] = d.input_shape;
        let [k, cg, r, s] = d.weight_shape;
        let [_, _, p, q] = d.output_shape;
        let pq = mul(p, q)?;
        let rs = mul(r, s)?;
        Ok(ConvParams {
            m: to_i64(OP, mul(n, pq)?)?,
            pq: to_i64(OP, pq)?,
            q: to_i64(OP, q)?,
            c: to_i64(OP, c)?,
            h: to_i64(OP, h)?,
            w: to_i64(OP, w)?,
            hw: to_i64(OP, mul(h, w)?)?,
            k: to_i64(OP, k)?,
            kg: to_i64(OP, k / d.groups.max(1))?,
            groups: to_i64(OP, d.groups)?,
            sh: to_i64(OP, d.stride[0])?,
            sw: to_i64(OP, d.stride[1])?,
            ph: to_i64(OP, d.padding[0])?,
            pw: to_i64(OP, d.padding[1])?,
            dh: to_i64(OP, d.dilation[0])?,
            dw: to_i64(OP, d.dilation[1])?,
            cg: to_i32(OP, cg)?,
            kdim: depth(mul(cg, rs)?)?,
            rs: to_i32(OP, rs)?,
            s: to_i32(OP, s)?,
            rs_div: FastDiv::new(rs)?,
            s_div: FastDiv::new(s)?,
            has_bias: i32::from(d.bias.is_some()),
            pad: 0,
        })
    }

    /// The launch: one block per 64 × 64 tile of one group's GEMM, with each grid dim capped at its
    /// hardware limit (the kernel loops over the tiles beyond). At least one block in each dim.
    pub(crate) fn launch_config(&self) -> LaunchConfig {
        let m_tiles = (self.m.max(1) as usize).div_ceil(TILE_M);
        let n_tiles = (self.kg.max(1) as usize).div_ceil(TILE_N);
        let groups = self.groups.max(1) as usize;
        LaunchConfig {
            grid_dim: (
                m_tiles.min(MAX_GRID_X) as u32,
                n_tiles.min(MAX_GRID_YZ) as u32,
                groups.min(MAX_GRID_YZ) as u32,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// Division of `0 ≤ n < 2^31` by a fixed `d ≥ 1` as a multiply-high and a shift (`conv_div` in
/// `conv.cu`): `mul = ⌈2^(31 + l) / d⌉`, `shift = l − 1` with `l = ⌈log2 d⌉`; `mul = 0` stands for `d = 1`.
/// Exact because `mul · d − 2^(31 + l) < d`, so the error `n · (mul · d − 2^(31 + l)) / (d · 2^(31 + l))`
/// stays below `2^(−l) ≤ 1 / d`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FastDiv {
    /// The magic multiplier.
    mul: u32,
    /// The shift after the multiply-high.
    shift: u32,
}

impl FastDiv {
    /// The magic numbers of `d`; `InvalidArgument` for 0 or past `i32::MAX`.
    fn new(d: usize) -> Result<FastDiv> {
        let d = to_i32(OP, d)?.unsigned_abs();
        if d == 0 {
            return Err(BackendError::invalid(OP, "a kernel dim is 0"));
        }
        if d == 1 {
            return Ok(FastDiv { mul: 0, shift: 0 });
        }
        let l = 32 - (d - 1).leading_zeros();
        let magic = (1u64 << (31 + l)).div_ceil(u64::from(d));
        let mul = u32::try_from(magic)
            .map_err(|_| BackendError::invalid(OP, format!("no 32-bit magic divisor for {d}")))?;
        Ok(FastDiv { mul, shift: l - 1 })
    }

    /// `n / d` computed as the kernel does.
    #[cfg(test)]
    fn apply(self, n: u32) -> u32 {
        if self.mul == 0 {
            n
        } else {
            ((u64::from(n) * u64::from(self.mul)) >> 32) as u32 >> self.shift
        }
    }
}

/// The GEMM depth `C / groups · R · S` as the kernel's 32-bit count; `FeatureUnavailable` past
/// [`MAX_DEPTH`], a limit of this kernel rather than of the op.
fn depth(kdim: usize) -> Result<i32> {
    if kdim > MAX_DEPTH {
        return Err(beyond_reach(
            OP,
            format!(
                "C / groups · R · S = {kdim} exceeds {MAX_DEPTH}, the limit of the CUDA kernel"
            ),
        ));
    }
    to_i32(OP, kdim)
}

/// `a · b`, or `SizeOverflow`.
fn mul(a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| BackendError::overflow(OP, format!("{a} × {b} overflows")))
}

/// Enqueues the convolution `d` on the backend's stream. Nothing is launched when the output is empty.
pub(crate) fn conv2d(gpu: &Gpu, d: &Conv2dDesc) -> Result<()> {
    if d.output_shape.contains(&0) {
        return Ok(());
    }
    let ptrs: Vec<DevicePtr> = [d.input, d.weight, d.output]
        .into_iter()
        .chain(d.bias)
        .collect();
    check_aligned(OP, d.dtype, &ptrs)?;
    let params = ConvParams::new(d)?;
    let f = gpu.function_for("conv", d.dtype, &format!("conv2d_{}", suffix(d.dtype)))?;
    let bias = d.bias.map_or(0u64, |b| b.0);
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&d.input.0)
        .arg(&d.weight.0)
        .arg(&bias)
        .arg(&d.output.0)
        .arg(&params);
    // SAFETY: the regions were checked by the caller against live allocations; the arguments match
    // the kernel's parameters (four pointers as u64, then `ConvParams` by value, same layout).
    unsafe { b.launch(params.launch_config()) }.map_err(|e| super::driver_error(OP, e))?;
    Ok(())
}

impl OpImpl<Conv2dDesc> for CudaBackend {
    fn op(&self, desc: &Conv2dDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("conv2d", desc.dtype)?;
        self.run_with_memory(acc, |gpu, mem| {
            if desc.output_shape.contains(&0) {
                return Ok(());
            }
            // cuDNN when enabled and loadable; whenever it declines, the implicit-GEMM kernel.
            match gpu.cudnn().map(|dnn| dnn.conv2d(gpu, mem, desc, None)) {
                Some(Ok(())) => Ok(()),
                Some(Err(cudnn::Declined(_))) | None => conv2d(gpu, desc),
            }
        })
    }
}

/// Shapes and window of a convolution whose gradients are computed, as the gradient kernels receive
/// them (`struct ConvGradParams` in `conv.cu`, same layout: nineteen `i64`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConvGradParams {
    n: i64,
    c: i64,
    h: i64,
    w: i64,
    k: i64,
    cg: i64,
    r: i64,
    s: i64,
    oh: i64,
    ow: i64,
    sh: i64,
    sw: i64,
    ph: i64,
    pw: i64,
    dh: i64,
    dw: i64,
    kg: i64,
    /// Elements written: input elements, or weight elements.
    total: i64,
    /// 1 when a bias of the input's channels starts each input-gradient sum.
    has_bias: i64,
}

// SAFETY: a plain `repr(C)` struct of `i64` with the same layout as the kernels' `ConvGradParams`.
unsafe impl DeviceRepr for ConvGradParams {}

impl ConvGradParams {
    /// The parameters of the convolution of `input` with `weight` giving `output` (shapes validated
    /// by the descriptor), writing `total` elements. `SizeOverflow` when a count exceeds `i64`.
    fn new(
        op: &'static str,
        [input, weight, output]: [[usize; 4]; 3],
        window: ([usize; 2], [usize; 2], [usize; 2], usize),
        total: usize,
        has_bias: bool,
    ) -> Result<ConvGradParams> {
        let (stride, padding, dilation, groups) = window;
        let v = |x: usize| to_i64(op, x);
        // Every element offset the kernels form stays inside an operand; the coordinates they form
        // stay within (out · stride + taps · dilation + pad), which must fit as well.
        for (out, st, taps, dil, pad) in [
            (output[2], stride[0], weight[2], dilation[0], padding[0]),
            (output[3], stride[1], weight[3], dilation[1], padding[1]),
        ] {
            let reach = out
                .checked_mul(st)
                .and_then(|a| a.checked_add(taps.checked_mul(dil)?))
                .and_then(|a| a.checked_add(pad));
            v(reach.ok_or_else(|| BackendError::overflow(op, "the window's reach overflows"))?)?;
        }
        Ok(ConvGradParams {
            n: v(input[0])?,
            c: v(input[1])?,
            h: v(input[2])?,
            w: v(input[3])?,
            k: v(weight[0])?,
            cg: v(weight[1])?,
            r: v(weight[2])?,
            s: v(weight[3])?,
            oh: v(output[2])?,
            ow: v(output[3])?,
            sh: v(stride[0])?,
            sw: v(stride[1])?,
            ph: v(padding[0])?,
            pw: v(padding[1])?,
            dh: v(dilation[0])?,
            dw: v(dilation[1])?,
            kg: v(weight[0] / groups.max(1))?,
            total: v(total)?,
            has_bias: i64::from(has_bias),
        })
    }
}

/// Enqueues the input gradient (or transposed convolution) `d`: one thread per input element.
pub(crate) fn conv2d_backward_input(gpu: &Gpu, d: &Conv2dBackwardInputDesc) -> Result<()> {
    const OP: &str = "conv2d_backward_input";
    let total: usize = d.grad_input_shape.iter().product();
    if total == 0 {
        return Ok(());
    }
    let ptrs: Vec<DevicePtr> = [d.grad_input, d.grad_output, d.weight]
        .into_iter()
        .chain(d.bias)
        .collect();
    check_aligned(OP, d.dtype, &ptrs)?;
    let params = ConvGradParams::new(
        OP,
        [d.grad_input_shape, d.weight_shape, d.grad_output_shape],
        (d.stride, d.padding, d.dilation, d.groups),
        total,
        d.bias.is_some(),
    )?;
    let name = format!("conv2d_backward_input_{}", suffix(d.dtype));
    let f = gpu.function_for("conv", d.dtype, &name)?;
    let bias = d.bias.map_or(0u64, |b| b.0);
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&d.grad_input.0)
        .arg(&d.grad_output.0)
        .arg(&d.weight.0)
        .arg(&bias)
        .arg(&params);
    let config = gpu.grid(total);
    // SAFETY: the caller checked every region against live allocations and for aliasing; the
    // arguments match `conv2d_backward_input_<dtype>(T* dx, const T* dy, const T* w, const T* bias,
    // ConvGradParams)`.
    unsafe { b.launch(config) }.map_err(|e| super::driver_error(OP, e))?;
    Ok(())
}

/// Enqueues the weight gradient `d`: one 256-thread block per weight element.
pub(crate) fn conv2d_backward_weight(gpu: &Gpu, d: &Conv2dBackwardWeightDesc) -> Result<()> {
    const OP: &str = "conv2d_backward_weight";
    let total: usize = d.weight_shape.iter().product();
    if total == 0 {
        return Ok(());
    }
    check_aligned(OP, d.dtype, &[d.grad_weight, d.input, d.grad_output])?;
    let params = ConvGradParams::new(
        OP,
        [d.input_shape, d.weight_shape, d.grad_output_shape],
        (d.stride, d.padding, d.dilation, d.groups),
        total,
        false,
    )?;
    let name = format!("conv2d_backward_weight_{}", suffix(d.dtype));
    let f = gpu.function_for("conv", d.dtype, &name)?;
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&d.grad_weight.0)
        .arg(&d.input.0)
        .arg(&d.grad_output.0)
        .arg(&params);
    let config = LaunchConfig {
        grid_dim: (total.min(MAX_GRID_X) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the caller checked every region against live allocations and for aliasing; the
    // arguments match `conv2d_backward_weight_<dtype>(T* dw, const T* x, const T* dy,
    // ConvGradParams)`, launched with the 256 threads the kernel's block reduction assumes.
    unsafe { b.launch(config) }.map_err(|e| super::driver_error(OP, e))?;
    Ok(())
}

impl OpImpl<Conv2dBackwardInputDesc> for CudaBackend {
    fn op(&self, desc: &Conv2dBackwardInputDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("conv2d_backward_input", desc.dtype)?;
        self.run_with_memory(acc, |gpu, mem| {
            if desc.grad_input_shape.contains(&0) {
                return Ok(());
            }
            // cuDNN's backward data when enabled and loadable; whenever it declines, the kernel.
            match gpu
                .cudnn()
                .map(|dnn| dnn.conv2d_backward_input(gpu, mem, desc))
            {
                Some(Ok(())) => Ok(()),
                Some(Err(cudnn::Declined(_))) | None => conv2d_backward_input(gpu, desc),
            }
        })
    }
}

impl OpImpl<Conv2dBackwardWeightDesc> for CudaBackend {
    fn op(&self, desc: &Conv2dBackwardWeightDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("conv2d_backward_weight", desc.dtype)?;
        self.run_with_memory(acc, |gpu, mem| {
            if desc.weight_shape.contains(&0) {
                return Ok(());
            }
            // cuDNN's backward filter when enabled and loadable; whenever it declines, the kernel.
            match gpu
                .cudnn()
                .map(|dnn| dnn.conv2d_backward_weight(gpu, mem, desc))
            {
                Some(Ok(())) => Ok(()),
                Some(Err(cudnn::Declined(_))) | None => conv2d_backward_weight(gpu, desc),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    /// A descriptor with the given shapes and window; pointers are dummies.
    fn desc(
        input: [usize; 4],
        weight: [usize; 4],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
        bias: bool,
    ) -> Conv2dDesc {
        let output =
            Conv2dDesc::expected_output_shape(input, weight, stride, padding, dilation, groups)
                .unwrap();
        Conv2dDesc {
            dtype: DType::F32,
            input: DevicePtr(0x1000),
            input_shape: input,
            weight: DevicePtr(0x2000),
            weight_shape: weight,
            bias: bias.then_some(DevicePtr(0x3000)),
            output: DevicePtr(0x4000),
            output_shape: output,
            stride,
            padding,
            dilation,
            groups,
        }
    }

    #[test]
    fn gradient_params_match_the_kernel_struct_layout() {
        assert_eq!(std::mem::size_of::<ConvGradParams>(), 19 * 8);
        let d = desc([2, 4, 9, 7], [6, 2, 3, 2], [2, 1], [1, 1], [2, 1], 2, false);
        let p = ConvGradParams::new(
            OP,
            [d.input_shape, d.weight_shape, d.output_shape],
            (d.stride, d.padding, d.dilation, d.groups),
            2 * 4 * 9 * 7,
            true,
        )
        .unwrap();
        assert_eq!((p.kg, p.oh, p.ow, p.total, p.has_bias), (3, 4, 8, 504, 1));
    }

    #[test]
    fn params_match_the_kernel_struct_layout() {
        assert_eq!(std::mem::size_of::<ConvParams>(), 16 * 8 + 10 * 4);
        assert_eq!(std::mem::align_of::<ConvParams>(), 8);
    }

    #[test]
    fn params_pack_the_grouped_dilated_case() {
        let d = desc([2, 4, 9, 7], [6, 2, 3, 2], [2, 1], [1, 1], [2, 1], 2, true);
        assert_eq!(d.output_shape, [2, 6, 4, 8]);
        let p = ConvParams::new(&d).unwrap();
        let expected = ConvParams {
            m: 2 * 4 * 8,
            pq: 32,
            q: 8,
            c: 4,
            h: 9,
            w: 7,
            hw: 63,
            k: 6,
            kg: 3,
            groups: 2,
            sh: 2,
            sw: 1,
            ph: 1,
            pw: 1,
            dh: 2,
            dw: 1,
            cg: 2,
            kdim: 12,
            rs: 6,
            s: 2,
            rs_div: FastDiv::new(6).unwrap(),
            s_div: FastDiv::new(2).unwrap(),
            has_bias: 1,
            pad: 0,
        };
        assert_eq!(p, expected);
        let plain = ConvParams::new(&desc(
            [1, 1, 1, 1],
            [1, 1, 1, 1],
            [1, 1],
            [0, 0],
            [1, 1],
            1,
            false,
        ))
        .unwrap();
        assert_eq!((plain.m, plain.kdim, plain.has_bias), (1, 1, 0));
    }

    #[test]
    fn a_depth_beyond_the_limit_is_unavailable() {
        let mut d = desc([1, 2, 3, 3], [2, 1, 1, 1], [1, 1], [0, 0], [1, 1], 2, false);
        d.weight_shape = [2, (1 << 18) + 1, 1 << 6, 1 << 6];
        assert!(matches!(
            ConvParams::new(&d),
            Err(BackendError::FeatureUnavailable { .. })
        ));
        // The limit itself is served.
        d.weight_shape = [2, 1 << 18, 1 << 6, 1 << 6];
        assert_eq!(ConvParams::new(&d).unwrap().kdim, 1 << 30);
        // Past i32 in a single dim as well.
        d.weight_shape = [2, 1, 1 << 31, 1];
        assert!(matches!(
            ConvParams::new(&d),
            Err(BackendError::FeatureUnavailable { .. })
        ));
    }

    #[test]
    fn fast_division_is_exact_below_2_pow_31() {
        let top = (1u32 << 31) - 1;
        let mut divisors: Vec<u32> = (1..=300).collect();
        divisors.extend([
            511,
            512,
            513,
            4608,
            65_535,
            65_536,
            1 << 20,
            999_983,
            1 << 30,
            top,
        ]);
        for d in divisors {
            let f = FastDiv::new(d as usize).unwrap();
            let mut check = |n: u32| assert_eq!(f.apply(n), n / d, "{n} / {d}");
            (0..5000).for_each(&mut check);
            (top - 5000..=top).for_each(&mut check);
            let mut n = 1u64;
            while n <= u64::from(top) {
                for m in [n - 1, n, n + 1, n * u64::from(d), n * u64::from(d) - 1] {
                    if let Ok(m) = u32::try_from(m) {
                        if m <= top {
                            check(m);
                        }
                    }
                }
                n = n * 3 + 1;
            }
        }
        assert!(FastDiv::new(0).is_err());
        assert_eq!(FastDiv::new(1).unwrap(), FastDiv { mul: 0, shift: 0 });
    }

    #[test]
    fn launch_covers_tiles_and_groups() {
        let d = desc([2, 4, 9, 7], [6, 2, 3, 2], [2, 1], [1, 1], [2, 1], 2, false);
        let cfg = ConvParams::new(&d).unwrap().launch_config();
        assert_eq!(cfg.grid_dim, (1, 1, 2));
        assert_eq!(cfg.block_dim, (THREADS, 1, 1));
        let d = desc(
            [3, 8, 40, 50],
            [130, 8, 3, 3],
            [1, 1],
            [1, 1],
            [1, 1],
            1,
            false,
        );
        // M = 3·40·50 = 6000 → 94 tiles; Kg = 130 → 3 tiles.
        assert_eq!(
            ConvParams::new(&d).unwrap().launch_config().grid_dim,
            (94, 3, 1)
        );
    }

    #[test]
    fn launch_caps_every_grid_dim() {
        let p = ConvParams {
            m: i64::MAX,
            kg: 1 << 40,
            groups: 1 << 20,
            ..ConvParams::new(&desc(
                [1, 1, 1, 1],
                [1, 1, 1, 1],
                [1, 1],
                [0, 0],
                [1, 1],
                1,
                false,
            ))
            .unwrap()
        };
        let cfg = p.launch_config();
        assert_eq!(cfg.grid_dim, (i32::MAX as u32, 65_535, 65_535));
    }
}
