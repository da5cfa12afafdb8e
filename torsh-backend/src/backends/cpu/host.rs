//! What every CPU kernel stands on: typed operand pointers that the tasks of a team may share, the
//! element types and the arithmetic they compute in, strided gathers, work splitting over the
//! backend's team, and running a loop compiled for the SIMD level detected at run time.
//!
//! A kernel gets its operands from [`HostMemory`] after the op's regions were checked (bounds against
//! live allocations, aliasing between outputs and inputs), so it only has to stay inside the element
//! counts it asked for. f32 and f64 compute in their own precision; f16 and bf16 are widened to f32
//! a block at a time and rounded once on store, which is the crate's numerics rule for half types.

use std::marker::PhantomData;
use std::ops::{Add, AddAssign, Div, Mul, Neg, Sub};

use half::{bf16, f16};

use super::simd::SimdLevel;
use super::vector::Registers;
use crate::backends::reference::memory::HostMemory;
use crate::compute::{DevicePtr, StridedBuf};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// Elements a kernel processes per block: widened copies of this many elements stay in L1.
pub(crate) const BLOCK: usize = 2048;

/// The arithmetic type a kernel computes in: f32 (for f32, f16 and bf16) or f64.
pub(crate) trait Real:
    Copy
    + Send
    + Sync
    + PartialOrd
    + Default
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + 'static
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// −∞.
    const NEG_INFINITY: Self;
    /// `v` rounded to this type.
    fn from_f64(v: f64) -> Self;
    /// This value as f64 (exact).
    fn to_f64(self) -> f64;
    /// `self · a + b` with one rounding where the target has FMA.
    fn mul_add(self, a: Self, b: Self) -> Self;
    /// √self.
    fn sqrt(self) -> Self;
    /// True for NaN.
    fn is_nan(self) -> bool;
}

macro_rules! real {
    ($t:ty) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn mul_add(self, a: Self, b: Self) -> Self {
                <$t>::mul_add(self, a, b)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
        }
    };
}
real!(f32);
real!(f64);

/// A float element type the CPU kernels take: f32, f64, f16 or bf16, with the type it computes in.
pub(crate) trait Element: Copy + Send + Sync + bytemuck::Pod + 'static {
    /// The arithmetic type: f64 for f64, f32 for the others.
    type Acc: Registers;
    /// The dtype tag.
    const DTYPE: DType;
    /// This element widened (exact).
    fn widen(self) -> Self::Acc;
    /// `v` rounded to nearest even.
    fn narrow(v: Self::Acc) -> Self;
}

impl Element for f32 {
    type Acc = f32;
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    fn narrow(v: f32) -> f32 {
        v
    }
}

impl Element for f64 {
    type Acc = f64;
    const DTYPE: DType = DType::F64;
    #[inline(always)]
    fn widen(self) -> f64 {
        self
    }
    #[inline(always)]
    fn narrow(v: f64) -> f64 {
        v
    }
}

impl Element for f16 {
    type Acc = f32;
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn narrow(v: f32) -> f16 {
        f16::from_f32(v)
    }
}

impl Element for bf16 {
    type Acc = f32;
    const DTYPE: DType = DType::BF16;
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn narrow(v: f32) -> bf16 {
        bf16::from_f32(v)
    }
}

/// Runs `$body` with the type alias `$t` bound to the element type of float `$dtype`; any other dtype
/// evaluates `$other`.
macro_rules! with_float {
    ($dtype:expr, $t:ident => $body:expr, _ => $other:expr) => {
        match $dtype {
            $crate::dtype::DType::F32 => {
                type $t = f32;
                $body
            }
            $crate::dtype::DType::F64 => {
                type $t = f64;
                $body
            }
            $crate::dtype::DType::F16 => {
                type $t = half::f16;
                $body
            }
            $crate::dtype::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            _ => $other,
        }
    };
}
pub(crate) use with_float;

/// Widens `src` into `dst` (equal lengths).
#[inline(always)]
pub(crate) fn widen_into<T: Element>(src: &[T], dst: &mut [T::Acc]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.widen();
    }
}

/// Rounds `src` into `dst` (equal lengths).
#[inline(always)]
pub(crate) fn narrow_into<T: Element>(src: &[T::Acc], dst: &mut [T]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = T::narrow(s);
    }
}

/// `len` elements of `T` in host memory, as a raw pointer that the tasks of a team may share. Kernels
/// hand disjoint ranges of an output to different tasks; the memory lock keeps the buffer alive meanwhile.
#[derive(Debug)]
pub(crate) struct Span<T> {
    ptr: *mut T,
    len: usize,
}

impl<T> Clone for Span<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Span<T> {}

// SAFETY: a Span is an address and a length; what may be done through it is governed by the unsafe
// accessors below, whose callers guarantee disjointness of concurrent mutable ranges.
unsafe impl<T: Send> Send for Span<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for Span<T> {}

impl<T: bytemuck::Pod> Span<T> {
    /// The `len` elements at `ptr`, after a bounds check against the live allocations. `InvalidPointer`
    /// when out of bounds, `InvalidArgument` when `ptr` is not aligned to the element size (the raw
    /// trait allows any byte address; typed kernels need element alignment, so callers route
    /// misaligned operands to the reference kernels before they get here).
    pub(crate) fn of(
        mem: &mut HostMemory,
        op: &'static str,
        ptr: DevicePtr,
        len: usize,
    ) -> Result<Span<T>> {
        let size = std::mem::size_of::<T>();
        let bytes = len.checked_mul(size).ok_or_else(|| {
            BackendError::overflow(op, format!("{len} elements of {size} bytes overflow"))
        })?;
        let raw = mem.host_address(ptr, bytes)?;
        if !(raw as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(BackendError::invalid(
                op,
                format!(
                    "pointer {:#x} is not aligned to its {size}-byte elements",
                    ptr.0
                ),
            ));
        }
        Ok(Span {
            ptr: raw.cast(),
            len,
        })
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The elements in `range`, shared.
    ///
    /// # Safety
    /// `range` is inside `0..len`, no task writes any of these elements while the slice lives, and the
    /// slice does not outlive the op (the caller picks its lifetime).
    #[inline]
    pub(crate) unsafe fn slice<'a>(self, range: std::ops::Range<usize>) -> &'a [T] {
        debug_assert!(range.start <= range.end && range.end <= self.len);
        std::slice::from_raw_parts(self.ptr.add(range.start), range.end - range.start)
    }

    /// The elements in `range`, exclusively.
    ///
    /// # Safety
    /// `range` is inside `0..len` and no other slice of these elements (from any Span over the same
    /// memory) lives at the same time, and the slice does not outlive the op.
    #[inline]
    pub(crate) unsafe fn slice_mut<'a>(self, range: std::ops::Range<usize>) -> &'a mut [T] {
        debug_assert!(range.start <= range.end && range.end <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.end - range.start)
    }

    /// Reads element `at`.
    ///
    /// # Safety
    /// `at < len`, and no task writes that element meanwhile.
    #[inline(always)]
    pub(crate) unsafe fn read(self, at: usize) -> T {
        debug_assert!(at < self.len);
        self.ptr.add(at).read()
    }

    /// Writes `value` to element `at`.
    ///
    /// # Safety
    /// `at < len`, and no slice of that element lives and no other task writes it meanwhile.
    #[inline(always)]
    pub(crate) unsafe fn write(self, at: usize, value: T) {
        debug_assert!(at < self.len);
        self.ptr.add(at).write(value)
    }

    /// The address of element `at`, as a raw pointer (no claim on the elements).
    ///
    /// # Safety
    /// `at ≤ len`.
    #[inline(always)]
    pub(crate) unsafe fn ptr(self, at: usize) -> *mut T {
        debug_assert!(at <= self.len);
        self.ptr.add(at)
    }

    /// True when `self` and `other` start at the same address (an exact in-place op).
    pub(crate) fn same_as<U>(&self, other: &Span<U>) -> bool {
        std::ptr::eq(self.ptr.cast::<u8>(), other.ptr.cast::<u8>())
    }
}

/// A strided view in host memory, readable in row-major order of the view from any element on.
#[derive(Debug, Clone)]
pub(crate) struct View<T> {
    /// From the view's lowest addressed element to its highest.
    span: Span<T>,
    shape: Vec<usize>,
    /// Strides relative to `span`, in elements.
    strides: Vec<usize>,
    contiguous: bool,
}

impl<T: Element> View<T> {
    /// The view `buf` of dtype `T`, bounds-checked. Errors as [`Span::of`].
    pub(crate) fn of(mem: &mut HostMemory, op: &'static str, buf: &StridedBuf) -> Result<View<T>> {
        let layout = &buf.layout;
        let start = layout.offset();
        let span_end = layout.span_elements()?;
        let first = DevicePtr(buf.ptr.0 + (start * std::mem::size_of::<T>()) as u64);
        let span = Span::of(mem, op, first, span_end - start)?;
        Ok(View {
            span,
            shape: layout.shape().to_vec(),
            strides: layout.strides().to_vec(),
            contiguous: layout.is_contiguous(),
        })
    }

    /// Elements in the view.
    pub(crate) fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when element `i` of the view is element `i` of its span.
    pub(crate) fn is_contiguous(&self) -> bool {
        self.contiguous
    }

    /// The underlying span (for contiguous views: exactly the view's elements).
    pub(crate) fn span(&self) -> Span<T> {
        self.span
    }

    /// Reads elements `start .. start + out.len()` of the view, widened, into `out`.
    ///
    /// # Safety
    /// No task writes the view's memory while this runs (outputs never overlap inputs unless they
    /// are exactly the same dense region, and then only the elements already read are written).
    pub(crate) unsafe fn gather(&self, start: usize, out: &mut [T::Acc]) {
        if out.is_empty() {
            return;
        }
        if self.contiguous {
            widen_into(self.span.slice(start..start + out.len()), out);
            return;
        }
        let rank = self.shape.len();
        // Multi-index of `start`.
        let mut idx = vec![0usize; rank];
        let mut rem = start;
        let mut pos = 0;
        for d in (0..rank).rev() {
            idx[d] = rem % self.shape[d];
            rem /= self.shape[d];
            pos += idx[d] * self.strides[d];
        }
        let base = self.span.ptr as *const T;
        let last = rank - 1;
        let (inner_len, inner_stride) = (self.shape[last], self.strides[last]);
        let mut written = 0;
        while written < out.len() {
            // Run along the innermost dim.
            let run = (inner_len - idx[last]).min(out.len() - written);
            let dst = &mut out[written..written + run];
            if inner_stride == 1 {
                widen_into(std::slice::from_raw_parts(base.add(pos), run), dst);
            } else {
                for (k, d) in dst.iter_mut().enumerate() {
                    *d = (*base.add(pos + k * inner_stride)).widen();
                }
            }
            written += run;
            pos += run * inner_stride;
            idx[last] += run;
            // Carry into the outer dims.
            let mut d = last;
            while idx[d] == self.shape[d] && d > 0 {
                pos -= self.shape[d] * self.strides[d];
                idx[d] = 0;
                d -= 1;
                idx[d] += 1;
                pos += self.strides[d];
            }
        }
    }
}

/// Splits `0..n` into chunks of at least `min_chunk` elements (a multiple of [`BLOCK`] where the
/// range allows) and runs `f` on each, shared over the current team (module `team`) when there is
/// enough work for more than one chunk and `threads > 1`, else inline.
pub(crate) fn for_chunks(
    n: usize,
    threads: usize,
    min_chunk: usize,
    f: impl Fn(std::ops::Range<usize>) + Sync + Send,
) {
    if n == 0 {
        return;
    }
    let min_chunk = min_chunk.max(1);
    let tasks = if threads <= 1 {
        1
    } else {
        (n / min_chunk).clamp(1, threads * 4)
    };
    if tasks == 1 {
        f(0..n);
        return;
    }
    let chunk = n.div_ceil(tasks).next_multiple_of(BLOCK.min(min_chunk));
    super::team::par_for(
        n.div_ceil(chunk),
        |t| f(t * chunk..((t + 1) * chunk).min(n)),
    );
}

/// A slice to bring into cache a piece at a time, alongside a loop over something else: for a
/// kernel whose next input would otherwise first be read from memory in a loop too short to hide
/// the latency, while the current loop is arithmetic-bound and leaves the memory system idle.
/// Prefetches are hints: no effect on results, and none off x86-64.
pub(crate) struct Ahead<'a> {
    /// The next byte to prefetch.
    at: *const u8,
    /// Bytes left.
    left: usize,
    /// The slice the pointer came from.
    of: PhantomData<&'a [u8]>,
}

impl<'a> Ahead<'a> {
    /// All of `xs`, from its start.
    pub(crate) fn new<A>(xs: &'a [A]) -> Ahead<'a> {
        Ahead {
            at: xs.as_ptr().cast(),
            left: std::mem::size_of_val(xs),
            of: PhantomData,
        }
    }

    /// Nothing to prefetch.
    pub(crate) fn none() -> Ahead<'a> {
        Ahead::new::<u8>(&[])
    }

    /// Bytes left to prefetch.
    pub(crate) fn len(&self) -> usize {
        self.left
    }

    /// Prefetches the next `bytes` bytes (fewer at the end) into L1.
    #[inline(always)]
    pub(crate) fn step(&mut self, bytes: usize) {
        let n = bytes.min(self.left);
        #[cfg(target_arch = "x86_64")]
        for off in (0..n).step_by(64) {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            // SAFETY: a prefetch never faults and changes nothing the program sees; the address
            // is inside the slice.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(self.at.wrapping_add(off).cast()) };
        }
        self.at = self.at.wrapping_add(n);
        self.left -= n;
    }
}

/// Runs `f` in a function compiled with the target features of `level`, so that loops inlined into
/// `f` are vectorised with those instructions. Mark the closure itself `#[inline(always)]` as well
/// as its helpers: a closure left out of line is compiled without the features, and there every
/// `mul_add` becomes a call to the software `fmaf` (about 100× slower). Falls back to
/// a plain call for `Scalar`, NEON (always on for AArch64) and on other architectures.
#[inline(always)]
pub(crate) fn with_simd<R>(level: SimdLevel, f: impl FnOnce() -> R) -> R {
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `SimdLevel::detect` returned Avx512 only after detecting every feature enabled here.
        SimdLevel::Avx512 => unsafe { x86::avx512(f) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above for AVX2, FMA and F16C.
        SimdLevel::Avx2Fma => unsafe { x86::avx2(f) },
        _ => f(),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    /// `f` compiled for AVX-512 (F, BW, DQ, VL) with FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
        f()
    }

    /// `f` compiled for AVX2 with FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

/// What a kernel needs to know about the backend that runs it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ctx {
    /// Threads in the backend's pool (the kernel runs inside it).
    pub threads: usize,
    /// The SIMD level the loops are compiled for.
    pub simd: SimdLevel,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::Layout;

    fn view_of(mem: &mut HostMemory, data: &[f32], layout: Layout) -> View<f32> {
        let ptr = mem.alloc(data.len() * 4).unwrap();
        mem.bytes_mut(ptr, data.len() * 4)
            .unwrap()
            .copy_from_slice(bytemuck::cast_slice(data));
        View::of(mem, "test", &StridedBuf { ptr, layout }).unwrap()
    }

    #[test]
    fn gather_walks_strided_views_from_any_start() {
        let mut mem = HostMemory::default();
        let data: Vec<f32> = (0..60).map(|i| i as f32).collect();
        // A [3, 4, 5] buffer viewed as a permuted, narrowed, offset view: shape [2, 3, 3].
        let layout = Layout::new(vec![2, 3, 3], vec![1, 20, 5], 1).unwrap();
        let view = view_of(&mut mem, &data, layout.clone());
        let mut expected = Vec::new();
        layout.for_each_index(|e| expected.push(data[e]));
        for start in 0..expected.len() {
            for len in 0..=expected.len() - start {
                let mut out = vec![f32::NAN; len];
                // SAFETY: nothing writes the buffer.
                unsafe { view.gather(start, &mut out) };
                assert_eq!(out, expected[start..start + len], "start {start} len {len}");
            }
        }
    }

    #[test]
    fn gather_reads_broadcast_views() {
        let mut mem = HostMemory::default();
        let data = [1.0f32, 2.0, 3.0];
        let layout = Layout::new(vec![4, 3], vec![0, 1], 0).unwrap();
        let view = view_of(&mut mem, &data, layout);
        let mut out = vec![0.0; 12];
        // SAFETY: nothing writes the buffer.
        unsafe { view.gather(0, &mut out) };
        assert_eq!(out, [1., 2., 3., 1., 2., 3., 1., 2., 3., 1., 2., 3.]);
    }

    #[test]
    fn chunks_cover_the_range_once() {
        let team = super::super::team::Team::new(3).unwrap();
        for n in [0, 1, 7, BLOCK + 1, 100_003] {
            let seen = std::sync::Mutex::new(vec![0u8; n]);
            team.enter(|| {
                for_chunks(n, 3, 1000, |r| {
                    let mut s = seen.lock().unwrap();
                    for i in r {
                        s[i] += 1;
                    }
                })
            });
            assert!(seen.into_inner().unwrap().iter().all(|&c| c == 1), "n {n}");
        }
    }

    #[test]
    fn simd_wrapper_computes_the_same_values() {
        let level = SimdLevel::detect();
        let x: Vec<f32> = (0..1000).map(|i| i as f32 * 0.37).collect();
        let plain: f32 = x.iter().map(|v| v * v).sum();
        let wrapped: f32 = with_simd(
            level,
            #[inline(always)]
            || x.iter().map(|v| v * v).sum(),
        );
        assert_eq!(plain, wrapped);
    }

    #[test]
    fn ahead_walks_its_slice_once_and_stops_at_the_end() {
        let xs = [1.5f32; 100];
        let mut ahead = Ahead::new(&xs[..]);
        assert_eq!(ahead.left, 400);
        for _ in 0..3 {
            ahead.step(128);
        }
        assert_eq!(ahead.left, 16);
        ahead.step(128);
        ahead.step(128);
        assert_eq!(ahead.left, 0);
        assert_eq!(ahead.at, xs.as_ptr().wrapping_add(100).cast());
        let mut none = Ahead::none();
        none.step(64);
        assert_eq!(none.left, 0);
    }
}
