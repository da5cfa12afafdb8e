//! Host side of the elementwise kernels: unary and binary math, fill, cast, strided copy and random fill,
//! with the reference backend's semantics. The kernels are five modules (`kernels/<module>.cu`), so the
//! first op of a kind compiles only its own kernels: `unary`, `binary`, `cast` and `random`, each
//! loaded per dtype (the variant of a cast is its source dtype), and `copy` (fill and strided copy by
//! element width), loaded whole.
//!
//! - Unary and binary ops compute in the dtype's accumulator (f64 for f64, f32 otherwise) with the
//!   formulas of `reference/math.rs`; the op travels as its `i32` code ([`UnaryOp::code`], [`BinaryOp::code`]).
//! - Casts decode a float source as f64 and an integer source as i64, then encode as `reference/memory.rs`
//!   does: Rust `as` semantics for float → integer (truncate, saturate, NaN → 0), wrapping for
//!   integer → integer, round to nearest for any → float. One kernel per (source, destination) pair.
//! - Fill encodes the value here, on the host, with the reference's own conversions, and the kernel
//!   writes its bits; fill and strided copy are kernels per element width (1, 2, 4, 8 bytes).
//! - Random fill reproduces [`crate::rng`]: element `i` is `low + (high - low) · uniform(seed, i)` or
//!   `mean + std · normal(seed, i)` in f64, rounded once to the dtype.
//!
//! Strided operands are coalesced first (unit dims dropped, dims that are contiguous in every operand
//! merged), so contiguous views reach the kernels as rank 1 and skip the index divisions. Every pointer
//! must be aligned to its element size: a misaligned one is `InvalidArgument`, not a device fault.
//!
//! Memory-bound fast paths: when every coalesced operand is dense (rank 0, or rank 1 with unit stride;
//! so no broadcast) and every first-element address is a multiple of 16 bytes, unary, binary,
//! float-to-float cast and fill run `unary_vec_<dtype>`, `binary_vec_<dtype>`, `cast_vec_<src>_<dst>` and
//! `fill_vec_<width>`: 16-byte loads and stores with the same per-element computation, so the results
//! are bit-identical to the strided kernels'.

use cudarc::driver::{result as drv, CudaFunction, LaunchConfig, PushKernelArg};

use super::launch::{check_aligned, suffix, to_i64, StridedArg};
use super::{driver_error, Gpu};
use crate::backends::cuda::CudaBackend;
use crate::compute::op::OpImpl;
use crate::compute::*;
use crate::dtype::{element_bits, DType};
use crate::error::{BackendError, Result};
use crate::shape::{coalesce, Layout};

/// `output[i] = op(input[i])` in the dtype's accumulator.
pub(crate) fn unary(gpu: &Gpu, d: &UnaryDesc) -> Result<()> {
    const OP: &str = "unary";
    if d.input.layout.numel() == 0 {
        return Ok(());
    }
    check_aligned(OP, d.dtype, &[d.input.ptr, d.output])?;
    let tail = Tail::code(d.op.code() as i32);
    let dtypes = (d.dtype, d.dtype);
    launch_elementwise(gpu, OP, unary_plan(d)?, [&d.input], d.output, dtypes, tail)
}

/// `output[i] = op(lhs[i], rhs[i])` over the (broadcast) views, in the dtype's accumulator; a
/// scalar `rhs` travels as its element bits, encoded here as the reference encodes it.
pub(crate) fn binary(gpu: &Gpu, d: &BinaryDesc) -> Result<()> {
    const OP: &str = "binary";
    if d.lhs.layout.numel() == 0 {
        return Ok(());
    }
    let dtypes = (d.dtype, d.dtype);
    let code = d.op.code() as i32;
    match &d.rhs {
        Value::Tensor(rhs) => {
            check_aligned(OP, d.dtype, &[d.lhs.ptr, rhs.ptr, d.output])?;
            let tail = Tail::code(code);
            let plan = binary_plan(d, rhs)?;
            launch_elementwise(gpu, OP, plan, [&d.lhs, rhs], d.output, dtypes, tail)
        }
        &Value::Scalar(s) => {
            check_aligned(OP, d.dtype, &[d.lhs.ptr, d.output])?;
            let tail = Tail {
                code: Some(code),
                scalar: Some(element_bits(d.dtype, s)),
            };
            let plan = binary_scalar_plan(d)?;
            launch_elementwise(gpu, OP, plan, [&d.lhs], d.output, dtypes, tail)
        }
    }
}

/// `output[i] = grad[i] · op'(saved[i])` over the (broadcast) views, in the dtype's accumulator
/// (`unary_backward_<dtype>` in `unary.cu`, strided operands).
pub(crate) fn unary_backward(gpu: &Gpu, d: &UnaryBackwardDesc) -> Result<()> {
    const OP: &str = "unary_backward";
    if d.saved.layout.numel() == 0 {
        return Ok(());
    }
    check_aligned(OP, d.dtype, &[d.saved.ptr, d.grad.ptr, d.output])?;
    let inputs = [&d.saved, &d.grad];
    let operands = operands(OP, d.dtype, inputs, d.output, false)?;
    let entry = unary_backward_entry(d.dtype);
    let (tail, dtypes) = (Tail::code(d.op.code() as i32), (d.dtype, d.dtype));
    launch_elementwise(gpu, OP, (entry, operands), inputs, d.output, dtypes, tail)
}

/// Sets `len` elements to `value`, encoded on the host exactly as the reference encodes it.
pub(crate) fn fill(gpu: &Gpu, d: &FillDesc) -> Result<()> {
    const OP: &str = "fill";
    if d.len == 0 {
        return Ok(());
    }
    check_aligned(OP, d.dtype, &[d.ptr])?;
    let (entry, vector) = fill_plan(d);
    let cfg = if vector {
        vector_grid(gpu, d.len, d.dtype, d.dtype)
    } else {
        gpu.grid(d.len)
    };
    let f = kernel(gpu, entry)?;
    let n = to_i64(OP, d.len)?;
    let bits = crate::dtype::element_bits(d.dtype, d.value);
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&d.ptr.0).arg(&n).arg(&bits);
    // SAFETY: the region was checked by the caller; the arguments match `fill_<width>(W*, i64, u64)`
    // and `fill_vec_<width>(W*, i64, u64)` (the latter only for a 16-byte aligned pointer).
    unsafe { b.launch(cfg) }.map_err(|e| driver_error(OP, e))?;
    Ok(())
}

/// Copies a strided view into another of the same shape, element by element (any dtype).
pub(crate) fn copy_strided(gpu: &Gpu, d: &CopyDesc) -> Result<()> {
    const OP: &str = "copy_strided";
    let numel = d.src.layout.numel();
    if numel == 0 {
        return Ok(());
    }
    check_aligned(OP, d.dtype, &[d.src.ptr, d.dst.ptr])?;
    let (shape, [ss, ds]) = coalesce(OP, [&d.src.layout, &d.dst.layout])?;
    if shape.len() <= 1 && ss.iter().chain(&ds).all(|&s| s == 1) {
        // Both views are one dense run: the copy engine's memcpy (the kernel's index arithmetic
        // reached about 60 % of copy bandwidth on an H200).
        let size = d.dtype.size_in_bytes();
        let start = |b: &StridedBuf| b.ptr.0 + (b.layout.offset() * size) as u64;
        let (src, dst) = (start(&d.src), start(&d.dst));
        if src == dst {
            return Ok(()); // the same dense region: nothing moves
        }
        // SAFETY: both regions were checked against live allocations by the caller, and they do not
        // overlap unless they are the same region (handled above).
        return unsafe { drv::memcpy_dtod_async(dst, src, numel * size, gpu.stream().cu_stream()) }
            .map_err(|e| driver_error("cuMemcpyDtoDAsync", e));
    }
    let src = strided_arg(OP, &shape, ss, &d.src)?;
    let dst = strided_arg(OP, &shape, ds, &d.dst)?;
    let f = kernel(gpu, copy_entry(d.dtype))?;
    let n = to_i64(OP, numel)?;
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&d.src.ptr.0)
        .arg(&src)
        .arg(&d.dst.ptr.0)
        .arg(&dst)
        .arg(&n);
    // SAFETY: regions checked by the caller (the destination view is injective, and it overlaps the
    // source only when both are the same dense region); the arguments match
    // `copy_<width>(const W*, Strided, W*, Strided, i64)`.
    unsafe { b.launch(gpu.grid(numel)) }.map_err(|e| driver_error(OP, e))?;
    Ok(())
}

/// Fills `len` elements from the crate's counter-based generator.
pub(crate) fn random(gpu: &Gpu, d: &RandomDesc) -> Result<()> {
    const OP: &str = "random";
    if d.len == 0 {
        return Ok(());
    }
    check_aligned(OP, d.dtype, &[d.ptr])?;
    let f = kernel(gpu, random_entry(d.dtype))?;
    let n = to_i64(OP, d.len)?;
    let (dist, a, b_param) = distribution_args(d.distribution);
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&d.ptr.0)
        .arg(&n)
        .arg(&d.seed)
        .arg(&dist)
        .arg(&a)
        .arg(&b_param);
    // SAFETY: the region was checked by the caller; the arguments match
    // `random_<dtype>(T*, i64, u64, int, double, double)`.
    unsafe { b.launch(gpu.grid(d.len)) }.map_err(|e| driver_error(OP, e))?;
    Ok(())
}

/// Dropout by the counter-based mask, the reference's values (`dropout_<dtype>` in `random.cu`).
pub(crate) fn dropout(gpu: &Gpu, d: &DropoutDesc) -> Result<()> {
    const OP: &str = "dropout";
    if d.len == 0 {
        return Ok(());
    }
    check_aligned(OP, d.dtype, &[d.input, d.output])?;
    let f = kernel(gpu, dropout_entry(d.dtype))?;
    let n = to_i64(OP, d.len)?;
    let (threshold, scale) = (d.threshold(), d.scale());
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&d.input.0)
        .arg(&d.output.0)
        .arg(&n)
        .arg(&d.seed)
        .arg(&threshold)
        .arg(&scale);
    // SAFETY: the regions were checked by the caller (the output is the input or overlaps no
    // input); the arguments match `dropout_<dtype>(const T*, T*, i64, u64, u64, double)`.
    unsafe { b.launch(gpu.grid(d.len)) }.map_err(|e| driver_error(OP, e))?;
    Ok(())
}

/// Converts a strided input of one dtype into a dense output of another (any pair of dtypes).
pub(crate) fn cast(gpu: &Gpu, d: &CastDesc) -> Result<()> {
    const OP: &str = "cast";
    if d.input.layout.numel() == 0 {
        return Ok(());
    }
    check_aligned(OP, d.src_dtype, &[d.input.ptr])?;
    check_aligned(OP, d.dst_dtype, &[d.output])?;
    let dtypes = (d.src_dtype, d.dst_dtype);
    let tail = Tail::default();
    launch_elementwise(gpu, OP, cast_plan(d)?, [&d.input], d.output, dtypes, tail)
}

/// The arguments of an elementwise kernel after `n`.
#[derive(Clone, Copy, Debug, Default)]
struct Tail {
    /// The op's code, for the unary and binary kernels.
    code: Option<i32>,
    /// A scalar right operand's element bits, for the `binary_scalar*` kernels.
    scalar: Option<u64>,
}

impl Tail {
    /// The op's code alone.
    fn code(code: i32) -> Tail {
        Tail {
            code: Some(code),
            scalar: None,
        }
    }
}

/// Launches an elementwise kernel over the elements of `inputs` (each of the output's shape): on
/// [`Operands::Dense`] ones `entry(x₀, …, output, n[, code][, scalar])`, on [`Operands::Strided`]
/// ones `entry(ptr₀, strided₀, …, output, n[, code][, scalar])`, with the [`Tail`]'s arguments;
/// `(src, dst)` are the input and output dtypes, which size the vector kernels' grid. The caller
/// checked the regions and the pointers' alignment.
fn launch_elementwise<const K: usize>(
    gpu: &Gpu,
    op: &'static str,
    (entry, operands): (Entry, Operands<K>),
    inputs: [&StridedBuf; K],
    output: DevicePtr,
    (src, dst): (DType, DType),
    tail: Tail,
) -> Result<()> {
    let numel = inputs.first().map_or(0, |b| b.layout.numel());
    let f = kernel(gpu, entry)?;
    let n = to_i64(op, numel)?;
    let mut b = gpu.stream().launch_builder(&f);
    let cfg = match &operands {
        Operands::Dense(addresses) => {
            for x in addresses {
                b.arg(x);
            }
            vector_grid(gpu, numel, src, dst)
        }
        Operands::Strided(views) => {
            for (buf, view) in inputs.iter().zip(views) {
                b.arg(&buf.ptr.0).arg(view);
            }
            gpu.grid(numel)
        }
    };
    b.arg(&output.0).arg(&n);
    if let Some(code) = &tail.code {
        b.arg(code);
    }
    if let Some(bits) = &tail.scalar {
        b.arg(bits);
    }
    // SAFETY: the caller checked every region against live allocations and for aliasing, and every
    // pointer's alignment; the arguments match the kernels' signatures:
    // `unary_vec_<dtype>(const T*, T*, i64, int)`, `unary_<dtype>(const T*, Strided, T*, i64, int)`,
    // `binary_vec_<dtype>(const T*, const T*, T*, i64, int)`,
    // `binary_<dtype>(const T*, Strided, const T*, Strided, T*, i64, int)`,
    // `binary_scalar_vec_<dtype>(const T*, T*, i64, int, u64)`,
    // `unary_backward_<dtype>(const T*, Strided, const T*, Strided, T*, i64, int)`,
    // `binary_scalar_<dtype>(const T*, Strided, T*, i64, int, u64)`,
    // `cast_vec_<src>_<dst>(const S*, D*, i64)` and `cast_<src>_<dst>(const S*, Strided, D*, i64)`.
    unsafe { b.launch(cfg) }.map_err(|e| driver_error(op, e))?;
    Ok(())
}

/// Alignment in bytes of the vector kernels' accesses, required of every first-element address.
const VECTOR_ALIGN: u64 = 16;

/// The operands of an elementwise kernel with `K` inputs.
#[derive(Debug)]
enum Operands<const K: usize> {
    /// Every input dense and not broadcast, every first-element address (the output's too)
    /// 16-byte aligned: each input's first-element address, for the `*_vec_*` kernels.
    Dense([u64; K]),
    /// Anything else: each input as a strided view of the common coalesced shape.
    Strided([StridedArg; K]),
}

/// The kernel and operands of a unary op: `unary_vec_<dtype>` when [`operands`] finds them dense and
/// aligned, else `unary_<dtype>`.
fn unary_plan(d: &UnaryDesc) -> Result<(Entry, Operands<1>)> {
    let operands = operands("unary", d.dtype, [&d.input], d.output, true)?;
    let entry = match operands {
        Operands::Dense(_) => unary_vec_entry(d.dtype),
        Operands::Strided(_) => unary_entry(d.dtype),
    };
    Ok((entry, operands))
}

/// The kernel and operands of a binary op with the view `rhs`: `binary_vec_<dtype>` when
/// [`operands`] finds them dense (no broadcast) and aligned, else `binary_<dtype>`.
fn binary_plan(d: &BinaryDesc, rhs: &StridedBuf) -> Result<(Entry, Operands<2>)> {
    let operands = operands("binary", d.dtype, [&d.lhs, rhs], d.output, true)?;
    let entry = match operands {
        Operands::Dense(_) => binary_entry(d.dtype, "binary_vec"),
        Operands::Strided(_) => binary_entry(d.dtype, "binary"),
    };
    Ok((entry, operands))
}

/// The kernel and operand of a binary op with a scalar `rhs`: `binary_scalar_vec_<dtype>` when
/// [`operands`] finds `lhs` dense and aligned, else `binary_scalar_<dtype>`.
fn binary_scalar_plan(d: &BinaryDesc) -> Result<(Entry, Operands<1>)> {
    let operands = operands("binary", d.dtype, [&d.lhs], d.output, true)?;
    let entry = match operands {
        Operands::Dense(_) => binary_entry(d.dtype, "binary_scalar_vec"),
        Operands::Strided(_) => binary_entry(d.dtype, "binary_scalar"),
    };
    Ok((entry, operands))
}

/// The kernel and operands of a cast: `cast_vec_<src>_<dst>` for a float-to-float cast whose operands
/// [`operands`] finds dense and aligned, else `cast_<src>_<dst>`.
fn cast_plan(d: &CastDesc) -> Result<(Entry, Operands<1>)> {
    let vector = cast_vec_entry(d.src_dtype, d.dst_dtype);
    let operands = operands("cast", d.src_dtype, [&d.input], d.output, vector.is_some())?;
    let entry = match (vector, &operands) {
        (Some(entry), Operands::Dense(_)) => entry,
        _ => cast_entry(d.src_dtype, d.dst_dtype),
    };
    Ok((entry, operands))
}

/// The kernel of a fill and whether it is the vector kernel: `fill_vec_<width>` when the pointer is
/// 16-byte aligned, else `fill_<width>`.
fn fill_plan(d: &FillDesc) -> (Entry, bool) {
    if d.ptr.0.is_multiple_of(VECTOR_ALIGN) {
        (fill_vec_entry(d.dtype), true)
    } else {
        (fill_entry(d.dtype), false)
    }
}

/// How `inputs` (of `dtype`) and the dense `output` reach a kernel: [`Operands::Dense`] when `vector`
/// (the op has a vector kernel) and, after coalescing, every input is rank 0 or rank 1 with unit
/// stride and every first-element address, the output's included, is a multiple of 16; else
/// [`Operands::Strided`].
fn operands<const K: usize>(
    op: &'static str,
    dtype: DType,
    inputs: [&StridedBuf; K],
    output: DevicePtr,
    vector: bool,
) -> Result<Operands<K>> {
    let (shape, strides) = coalesce(op, inputs.map(|b| &b.layout))?;
    let dense = shape.len() <= 1 && strides.iter().all(|s| s.iter().all(|&s| s == 1));
    let addresses = inputs.map(|b| first_address(b, dtype));
    let aligned =
        output.0.is_multiple_of(VECTOR_ALIGN) && addresses.iter().all(|a| a % VECTOR_ALIGN == 0);
    if vector && dense && aligned {
        return Ok(Operands::Dense(addresses));
    }
    let mut args = Vec::with_capacity(K);
    for (s, buf) in strides.into_iter().zip(inputs) {
        args.push(strided_arg(op, &shape, s, buf)?);
    }
    let args: [StridedArg; K] = args
        .try_into()
        .map_err(|_| BackendError::invalid(op, "operand count mismatch"))?;
    Ok(Operands::Strided(args))
}

/// The device address of `buf`'s first element: its base plus the layout's offset in elements of
/// `dtype`. Saturates (to an address no vector kernel accepts) where a region the caller checked
/// cannot be.
fn first_address(buf: &StridedBuf, dtype: DType) -> u64 {
    let bytes = (buf.layout.offset() as u64).saturating_mul(dtype.size_in_bytes() as u64);
    buf.ptr.0.saturating_add(bytes)
}

/// Elements of `src` converted to `dst` per thread and step in the vector kernels: 16 bytes of the
/// narrower dtype.
fn vector_lanes(src: DType, dst: DType) -> usize {
    16 / src.size_in_bytes().min(dst.size_in_bytes())
}

/// The grid of a vector kernel over `numel` elements: one thread per vector of [`vector_lanes`]
/// elements (the tail of fewer than that many elements is taken by the first threads).
fn vector_grid(gpu: &Gpu, numel: usize, src: DType, dst: DType) -> LaunchConfig {
    gpu.grid(numel.div_ceil(vector_lanes(src, dst)))
}

/// Where a kernel lives: its module, the variant to load (`Some(dtype)`: the module compiled for that
/// dtype only; `None`: the full module) and its entry point.
type Entry = (&'static str, Option<DType>, String);

/// Loads the kernel at `entry`.
fn kernel(gpu: &Gpu, (module, variant, name): Entry) -> Result<CudaFunction> {
    match variant {
        Some(dtype) => gpu.function_for(module, dtype, &name),
        None => gpu.function(module, &name),
    }
}

/// `unary_<dtype>` in `unary.cu`.
fn unary_entry(dtype: DType) -> Entry {
    ("unary", Some(dtype), format!("unary_{}", suffix(dtype)))
}

/// `unary_vec_<dtype>` in `unary.cu`.
fn unary_vec_entry(dtype: DType) -> Entry {
    ("unary", Some(dtype), format!("unary_vec_{}", suffix(dtype)))
}

/// `<kernel>_<dtype>` in `binary.cu` (`binary`, `binary_vec`, `binary_scalar`, `binary_scalar_vec`).
fn binary_entry(dtype: DType, kernel: &str) -> Entry {
    ("binary", Some(dtype), format!("{kernel}_{}", suffix(dtype)))
}

/// `unary_backward_<dtype>` in `unary.cu`.
fn unary_backward_entry(dtype: DType) -> Entry {
    (
        "unary",
        Some(dtype),
        format!("unary_backward_{}", suffix(dtype)),
    )
}

/// `dropout_<dtype>` in `random.cu`.
fn dropout_entry(dtype: DType) -> Entry {
    ("random", Some(dtype), format!("dropout_{}", suffix(dtype)))
}

/// `random_<dtype>` in `random.cu`.
fn random_entry(dtype: DType) -> Entry {
    ("random", Some(dtype), format!("random_{}", suffix(dtype)))
}

/// `cast_<src>_<dst>` in `cast.cu`, in the variant of its source dtype.
fn cast_entry(src: DType, dst: DType) -> Entry {
    let name = format!("cast_{}_{}", suffix(src), suffix(dst));
    ("cast", Some(src), name)
}

/// `cast_vec_<src>_<dst>` in `cast.cu`, in the variant of its source dtype: float to float only.
fn cast_vec_entry(src: DType, dst: DType) -> Option<Entry> {
    (src.is_float() && dst.is_float()).then(|| {
        let name = format!("cast_vec_{}_{}", suffix(src), suffix(dst));
        ("cast", Some(src), name)
    })
}

/// `fill_vec_<width>` in `copy.cu` (no dtype variants).
fn fill_vec_entry(dtype: DType) -> Entry {
    ("copy", None, format!("fill_vec_{}", width_suffix(dtype)))
}

/// `fill_<width>` in `copy.cu` (no dtype variants).
fn fill_entry(dtype: DType) -> Entry {
    ("copy", None, format!("fill_{}", width_suffix(dtype)))
}

/// `copy_<width>` in `copy.cu` (no dtype variants).
fn copy_entry(dtype: DType) -> Entry {
    ("copy", None, format!("copy_{}", width_suffix(dtype)))
}

/// The random kernel's `(dist, a, b)`: `(RANDOM_UNIFORM, low, high)` or `(RANDOM_NORMAL, mean, std)`.
fn distribution_args(d: Distribution) -> (i32, f64, f64) {
    match d {
        Distribution::Uniform { low, high } => (0, low, high),
        Distribution::Normal { mean, std } => (1, mean, std),
    }
}

/// The suffix of the width-generic kernels (`fill_*`, `copy_*`) for `dtype`'s element size.
fn width_suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::U8 => "u8",
        DType::F16 | DType::BF16 => "u16",
        DType::F32 | DType::I32 => "u32",
        DType::F64 | DType::I64 => "u64",
    }
}

/// The kernel argument for `buf` seen through its coalesced `shape` and `strides`.
fn strided_arg(
    op: &'static str,
    shape: &[usize],
    strides: Vec<usize>,
    buf: &StridedBuf,
) -> Result<StridedArg> {
    let layout = Layout::new(shape.to_vec(), strides, buf.layout.offset())?;
    StridedArg::new(op, &layout)
}

impl OpImpl<UnaryDesc> for CudaBackend {
    fn op(&self, desc: &UnaryDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("unary", desc.dtype)?;
        self.run(acc, |gpu| unary(gpu, desc))
    }
}

impl OpImpl<BinaryDesc> for CudaBackend {
    fn op(&self, desc: &BinaryDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("binary", desc.dtype)?;
        self.run(acc, |gpu| binary(gpu, desc))
    }
}

impl OpImpl<UnaryBackwardDesc> for CudaBackend {
    fn op(&self, desc: &UnaryBackwardDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("unary_backward", desc.dtype)?;
        self.run(acc, |gpu| unary_backward(gpu, desc))
    }
}

impl OpImpl<DropoutDesc> for CudaBackend {
    fn op(&self, desc: &DropoutDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("dropout", desc.dtype)?;
        self.run(acc, |gpu| dropout(gpu, desc))
    }
}

impl OpImpl<FillDesc> for CudaBackend {
    fn op(&self, desc: &FillDesc) -> Result<()> {
        self.run(desc.accesses()?, |gpu| fill(gpu, desc))
    }
}

impl OpImpl<CastDesc> for CudaBackend {
    fn op(&self, desc: &CastDesc) -> Result<()> {
        self.run(desc.accesses()?, |gpu| cast(gpu, desc))
    }
}

impl OpImpl<CopyDesc> for CudaBackend {
    fn op(&self, desc: &CopyDesc) -> Result<()> {
        self.run(desc.accesses()?, |gpu| copy_strided(gpu, desc))
    }
}

impl OpImpl<RandomDesc> for CudaBackend {
    fn op(&self, desc: &RandomDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("random", desc.dtype)?;
        self.run(acc, |gpu| random(gpu, desc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `#define <prefix><NAME> <code>` lines of the kernel source `src`.
    fn defines(src: &str, prefix: &str) -> Vec<(String, i32)> {
        src.lines()
            .filter_map(|l| l.strip_prefix("#define "))
            .filter_map(|l| l.strip_prefix(prefix))
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let name = it.next()?.to_string();
                let code = it.next()?.parse().ok()?;
                Some((name, code))
            })
            .collect()
    }

    #[test]
    fn unary_codes_match_the_kernel_source() {
        let table = defines(include_str!("kernels/unary.cu"), "UNARY_");
        assert_eq!(table.len(), UnaryOp::ALL.len());
        for &op in UnaryOp::ALL {
            let name = op.name().to_uppercase();
            assert!(
                table.contains(&(name.clone(), op.code() as i32)),
                "UNARY_{name} is not {} in unary.cu",
                op.code()
            );
        }
    }

    #[test]
    fn binary_codes_match_the_kernel_source() {
        let table = defines(include_str!("kernels/binary.cu"), "BINARY_");
        assert_eq!(table.len(), BinaryOp::ALL.len());
        for &op in BinaryOp::ALL {
            let name = op.name().to_uppercase();
            assert!(
                table.contains(&(name.clone(), op.code() as i32)),
                "BINARY_{name}"
            );
        }
    }

    #[test]
    fn distribution_codes_match_the_kernel_source() {
        let table = defines(include_str!("kernels/random.cu"), "RANDOM_");
        let uniform = distribution_args(Distribution::Uniform {
            low: -1.0,
            high: 2.0,
        });
        let normal = distribution_args(Distribution::Normal {
            mean: 0.5,
            std: 3.0,
        });
        assert_eq!(uniform, (0, -1.0, 2.0));
        assert_eq!(normal, (1, 0.5, 3.0));
        assert!(table.contains(&("UNIFORM".into(), uniform.0)));
        assert!(table.contains(&("NORMAL".into(), normal.0)));
    }

    #[test]
    fn cast_entries_cover_every_pair_once() {
        let mut names: Vec<String> = DType::ALL
            .iter()
            .flat_map(|&s| DType::ALL.iter().map(move |&d| cast_entry(s, d).2))
            .collect();
        assert_eq!(
            cast_entry(DType::F16, DType::U8),
            ("cast", Some(DType::F16), "cast_f16_u8".to_string())
        );
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 49);
    }

    #[test]
    fn widths_follow_element_sizes() {
        for dtype in DType::ALL {
            let bits = 8 * dtype.size_in_bytes();
            assert_eq!(width_suffix(dtype), format!("u{bits}"));
        }
    }

    #[test]
    fn misaligned_pointers_are_rejected() {
        assert!(check_aligned("t", DType::F32, &[DevicePtr(256), DevicePtr(260)]).is_ok());
        assert!(check_aligned("t", DType::F32, &[DevicePtr(256), DevicePtr(258)]).is_err());
        assert!(check_aligned("t", DType::U8, &[DevicePtr(257)]).is_ok());
        assert!(check_aligned("t", DType::F64, &[DevicePtr(260)]).is_err());
    }

    #[test]
    fn contiguous_views_coalesce_to_one_dim() {
        let l = Layout::contiguous(&[4, 1, 3, 5]);
        let (shape, [s]) = coalesce("t", [&l]).unwrap();
        assert_eq!((shape, s), (vec![60], vec![1]));
        let scalar = Layout::contiguous(&[1, 1]);
        let (shape, [s]) = coalesce("t", [&scalar]).unwrap();
        assert!(shape.is_empty() && s.is_empty());
    }

    #[test]
    fn strided_views_keep_their_order() {
        // A transpose cannot merge; a narrowed inner dim merges only the outer pair.
        let t = Layout::contiguous(&[3, 4]).transpose(0, 1).unwrap();
        let (shape, [s]) = coalesce("t", [&t]).unwrap();
        assert_eq!((shape, s), (vec![4, 3], vec![1, 4]));
        let n = Layout::new(vec![2, 3, 4], vec![30, 10, 2], 7).unwrap();
        let (shape, [s]) = coalesce("t", [&n]).unwrap();
        assert_eq!((shape, s), (vec![6, 4], vec![10, 2]));
    }

    #[test]
    fn broadcast_operands_coalesce_jointly() {
        // lhs [2, 3, 4] contiguous; rhs broadcast along the middle dim.
        let lhs = Layout::contiguous(&[2, 3, 4]);
        let rhs = Layout::new(vec![2, 3, 4], vec![4, 0, 1], 0).unwrap();
        let (shape, [a, b]) = coalesce("t", [&lhs, &rhs]).unwrap();
        assert_eq!(shape, vec![2, 3, 4]);
        assert_eq!((a, b), (vec![12, 4, 1], vec![4, 0, 1]));
        // A scalar broadcast over a contiguous operand: one dim, stride 0.
        let scalar = Layout::new(vec![2, 3], vec![0, 0], 5).unwrap();
        let dense = Layout::contiguous(&[2, 3]);
        let (shape, [a, b]) = coalesce("t", [&dense, &scalar]).unwrap();
        assert_eq!((shape, a, b), (vec![6], vec![1], vec![0]));
        let other = Layout::contiguous(&[3, 2]);
        assert!(coalesce("t", [&dense, &other]).is_err());
    }

    #[test]
    fn coalescing_preserves_every_element_offset() {
        let cases = [
            Layout::new(vec![2, 1, 3, 4, 2], vec![48, 7, 16, 2, 1], 3).unwrap(),
            Layout::contiguous(&[3, 4, 5]).permute(&[2, 0, 1]).unwrap(),
            Layout::new(vec![3, 2, 2], vec![0, 2, 1], 1).unwrap(),
        ];
        for l in &cases {
            let (shape, [s]) = coalesce("t", [l]).unwrap();
            let merged = Layout::new(shape, s, l.offset()).unwrap();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            l.for_each_index(|e| a.push(e));
            merged.for_each_index(|e| b.push(e));
            assert_eq!(a, b, "{l:?} -> {merged:?}");
        }
    }

    #[test]
    fn the_host_rng_matches_the_formulas_the_kernel_mirrors() {
        // The kernel mirrors rng.rs operation by operation; this pins the constants it copies.
        let z = crate::rng::bits(42, 7);
        let key = crate::rng::mix64(42 ^ 0x9E37_79B9_7F4A_7C15);
        assert_eq!(
            z,
            crate::rng::mix64(key.wrapping_add(7u64.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
        );
        assert_eq!(std::f64::consts::TAU.to_bits(), 0x4019_21FB_5444_2D18);
        assert_eq!(1.0 / 9_007_199_254_740_992.0, 1.0 / (1u64 << 53) as f64);
    }

    /// An exp of `dtype` from `input` into `output`.
    fn unary_desc(dtype: DType, input: StridedBuf, output: u64) -> UnaryDesc {
        UnaryDesc {
            op: UnaryOp::Exp,
            dtype,
            input,
            output: DevicePtr(output),
        }
    }

    /// A contiguous view of `shape` at `ptr`, starting `offset` elements in.
    fn view(ptr: u64, shape: &[usize], offset: usize) -> StridedBuf {
        let l = Layout::contiguous(shape);
        StridedBuf {
            ptr: DevicePtr(ptr),
            layout: Layout::new(l.shape().to_vec(), l.strides().to_vec(), offset).unwrap(),
        }
    }

    #[test]
    fn dense_aligned_unary_takes_the_vector_kernel() {
        let (e, ops) = unary_plan(&unary_desc(DType::F32, view(256, &[3, 5, 7], 0), 4096)).unwrap();
        assert_eq!(e, ("unary", Some(DType::F32), "unary_vec_f32".to_string()));
        assert!(matches!(ops, Operands::Dense([256])));
        // The offset counts: 4 f32 = 16 bytes keeps the alignment, 8 f16 too, 1 f64 does not.
        let (e, ops) = unary_plan(&unary_desc(DType::F32, view(256, &[9], 4), 4096)).unwrap();
        assert_eq!(e.2, "unary_vec_f32");
        assert!(matches!(ops, Operands::Dense([272])));
        let (e, _) = unary_plan(&unary_desc(DType::F16, view(256, &[9], 8), 4096)).unwrap();
        assert_eq!(e.2, "unary_vec_f16");
        let (e, _) = unary_plan(&unary_desc(DType::F64, view(256, &[9], 1), 4096)).unwrap();
        assert_eq!(e.2, "unary_f64");
        // A single element (rank 0 after coalescing) is dense too.
        let (e, _) = unary_plan(&unary_desc(DType::BF16, view(512, &[1, 1], 0), 4096)).unwrap();
        assert_eq!(
            e,
            ("unary", Some(DType::BF16), "unary_vec_bf16".to_string())
        );
    }

    #[test]
    fn misaligned_or_strided_unary_takes_the_strided_kernel() {
        // Input offset of one f32, misaligned input base, misaligned output.
        for (input, output) in [
            (view(256, &[64], 1), 4096),
            (view(260, &[64], 0), 4096),
            (view(256, &[64], 0), 4100),
        ] {
            let (e, ops) = unary_plan(&unary_desc(DType::F32, input, output)).unwrap();
            assert_eq!(e, ("unary", Some(DType::F32), "unary_f32".to_string()));
            assert!(matches!(ops, Operands::Strided(_)));
        }
        // Transposed and step-2 views, though aligned.
        let t = StridedBuf {
            ptr: DevicePtr(256),
            layout: Layout::contiguous(&[8, 4]).transpose(0, 1).unwrap(),
        };
        let step = StridedBuf {
            ptr: DevicePtr(256),
            layout: Layout::new(vec![8], vec![2], 0).unwrap(),
        };
        for input in [t, step] {
            let (e, _) = unary_plan(&unary_desc(DType::F32, input, 4096)).unwrap();
            assert_eq!(e.2, "unary_f32");
        }
    }

    #[test]
    fn binary_vectorises_only_dense_aligned_unbroadcast_operands() {
        let plan = |lhs: StridedBuf, rhs: StridedBuf| {
            let d = BinaryDesc {
                op: BinaryOp::Add,
                dtype: DType::F64,
                lhs,
                rhs: Value::Tensor(rhs.clone()),
                output: DevicePtr(8192),
            };
            binary_plan(&d, &rhs)
        };
        let (e, ops) = plan(view(256, &[4, 6], 0), view(1024, &[4, 6], 2)).unwrap();
        assert_eq!(
            e,
            ("binary", Some(DType::F64), "binary_vec_f64".to_string())
        );
        assert!(matches!(ops, Operands::Dense([256, 1040])));
        // One operand misaligned (offset of one f64).
        let (e, _) = plan(view(256, &[4, 6], 0), view(1024, &[4, 6], 1)).unwrap();
        assert_eq!(e.2, "binary_f64");
        // Broadcast: a row along the outer dim, and a scalar.
        let row = StridedBuf {
            ptr: DevicePtr(1024),
            layout: Layout::new(vec![4, 6], vec![0, 1], 0).unwrap(),
        };
        let scalar = StridedBuf {
            ptr: DevicePtr(1024),
            layout: Layout::new(vec![4, 6], vec![0, 0], 0).unwrap(),
        };
        for rhs in [row, scalar] {
            let (e, ops) = plan(view(256, &[4, 6], 0), rhs).unwrap();
            assert_eq!(e.2, "binary_f64");
            assert!(matches!(ops, Operands::Strided(_)));
        }
    }

    #[test]
    fn scalar_operands_take_the_scalar_kernels() {
        let plan = |lhs: StridedBuf| {
            binary_scalar_plan(&BinaryDesc {
                op: BinaryOp::Mul,
                dtype: DType::F32,
                lhs,
                rhs: Value::Scalar(2.5),
                output: DevicePtr(8192),
            })
        };
        let (e, ops) = plan(view(256, &[4, 6], 4)).unwrap();
        assert_eq!(
            e,
            ("binary", Some(DType::F32), "binary_scalar_vec_f32".into())
        );
        assert!(matches!(ops, Operands::Dense([272])));
        // Misaligned (offset of one f32), and transposed.
        let t = StridedBuf {
            ptr: DevicePtr(256),
            layout: Layout::contiguous(&[6, 4]).transpose(0, 1).unwrap(),
        };
        for lhs in [view(256, &[4, 6], 1), t] {
            let (e, ops) = plan(lhs).unwrap();
            assert_eq!(e.2, "binary_scalar_f32");
            assert!(matches!(ops, Operands::Strided(_)));
        }
    }

    #[test]
    fn casts_vectorise_between_floats_only() {
        let desc = |src, dst, input| CastDesc {
            src_dtype: src,
            dst_dtype: dst,
            input,
            output: DevicePtr(8192),
        };
        let (e, ops) = cast_plan(&desc(DType::F32, DType::F16, view(256, &[100], 0))).unwrap();
        assert_eq!(
            e,
            ("cast", Some(DType::F32), "cast_vec_f32_f16".to_string())
        );
        assert!(matches!(ops, Operands::Dense([256])));
        let (e, _) = cast_plan(&desc(DType::BF16, DType::F32, view(256, &[100], 8))).unwrap();
        assert_eq!(e.2, "cast_vec_bf16_f32");
        // Integer side: the scalar kernel, with a strided view although dense.
        let (e, ops) = cast_plan(&desc(DType::F32, DType::I32, view(256, &[100], 0))).unwrap();
        assert_eq!(e.2, "cast_f32_i32");
        assert!(matches!(ops, Operands::Strided(_)));
        // Misaligned source (offset of one f16).
        let (e, _) = cast_plan(&desc(DType::F16, DType::F32, view(256, &[100], 1))).unwrap();
        assert_eq!(e.2, "cast_f16_f32");
    }

    #[test]
    fn fills_vectorise_when_aligned() {
        let desc = |dtype, ptr| FillDesc {
            dtype,
            ptr: DevicePtr(ptr),
            len: 10,
            value: 1.0,
        };
        assert_eq!(
            fill_plan(&desc(DType::F32, 256)),
            (fill_vec_entry(DType::F32), true)
        );
        assert_eq!(fill_plan(&desc(DType::U8, 256)).0 .2, "fill_vec_u8");
        assert_eq!(
            fill_plan(&desc(DType::F32, 260)),
            (fill_entry(DType::F32), false)
        );
        assert_eq!(fill_plan(&desc(DType::U8, 257)).0 .2, "fill_u8");
    }

    #[test]
    fn vector_lanes_move_16_bytes_of_the_narrower_dtype() {
        assert_eq!(vector_lanes(DType::F32, DType::F32), 4);
        assert_eq!(vector_lanes(DType::F64, DType::F64), 2);
        assert_eq!(vector_lanes(DType::BF16, DType::BF16), 8);
        assert_eq!(vector_lanes(DType::F32, DType::F16), 8);
        assert_eq!(vector_lanes(DType::F64, DType::F32), 4);
    }

    /// Every entry point the host fetches, by (module, variant), compiled as the backend compiles it:
    /// each kernel must be in the variant it is fetched from.
    #[test]
    fn every_entry_point_is_in_the_variant_it_is_fetched_from() {
        let mut entries: Vec<Entry> = Vec::new();
        for s in DType::ALL {
            if s.is_float() {
                entries.extend([unary_entry(s), unary_vec_entry(s), random_entry(s)]);
                entries.extend([unary_backward_entry(s), dropout_entry(s)]);
                entries.extend(
                    ["binary", "binary_vec", "binary_scalar", "binary_scalar_vec"]
                        .map(|k| binary_entry(s, k)),
                );
            }
            entries.extend([fill_entry(s), fill_vec_entry(s), copy_entry(s)]);
            entries.extend(DType::ALL.iter().map(|&d| cast_entry(s, d)));
            entries.extend(DType::ALL.iter().filter_map(|&d| cast_vec_entry(s, d)));
        }
        let mut modules: Vec<(&str, Option<DType>)> = entries.iter().map(|e| (e.0, e.1)).collect();
        modules.sort();
        modules.dedup();
        for (module, variant) in modules {
            let ptx = match super::super::kernels::compile(module, variant, "compute_80") {
                Ok(p) => p.to_src(),
                Err(BackendError::Unavailable { reason, .. }) => {
                    eprintln!("skipped: {reason}");
                    return;
                }
                Err(e) => panic!("{e}"),
            };
            // Exactly the kernels fetched from this variant: a per-dtype variant holds no other
            // dtype's kernels.
            let mut wanted: Vec<&str> = entries
                .iter()
                .filter(|e| (e.0, e.1) == (module, variant))
                .map(|e| e.2.as_str())
                .collect();
            wanted.sort();
            wanted.dedup();
            let mut found: Vec<&str> = ptx
                .lines()
                .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
                .filter_map(|l| l.split('(').next())
                .collect();
            found.sort();
            assert_eq!(found, wanted, "{module} {variant:?}");
        }
    }
}
