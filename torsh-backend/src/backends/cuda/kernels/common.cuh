// Shared declarations, prepended to every kernel source. No toolkit headers: 16-bit floats are raw bits.
//
// Conventions every kernel follows:
// - One `extern "C"` entry point per (op, dtype), named `<op>_<dtype>` with dtype one of f32, f64, f16,
//   bf16; the body is a template over the storage type T and its accumulator `typename Num<T>::acc`
//   (double for f64, float otherwise).
// - Element counts and offsets are 64-bit (`i64`); loops are grid-stride so any grid size is correct.
// - Strided operands arrive as a `Strided` by value: shape and strides in elements, row-major order of
//   the logical index, plus an element offset from the base pointer.

typedef unsigned char u8;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define TORSH_MAX_RANK 8

// IEEE binary16, stored as bits.
struct f16_t { u16 bits; };
// bfloat16, stored as bits.
struct bf16_t { u16 bits; };

__device__ __forceinline__ float f16_to_float(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f16_from_float(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf16_to_float(u16 b) {
    return __uint_as_float(((u32)b) << 16);
}

// Round to nearest even; NaN stays NaN (quiet), infinities stay infinite.
__device__ __forceinline__ u16 bf16_from_float(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((u >> 16) | 0x0040u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// The element of type T held in the low bytes of `bits` (little-endian, as the host encodes it).
template <typename T> __device__ __forceinline__ T from_bits(u64 bits) {
    union {
        u64 word;
        T value;
    } u;
    u.word = bits;
    return u.value;
}

// double -> float rounded to odd: with the 29 extra bits this keeps, a later round-to-nearest-even to a
// narrower type (f16, bf16) gives the correctly rounded result of the double, with no double rounding.
__device__ __forceinline__ float float_round_to_odd(double d) {
    float f = __double2float_rz(d);
    if (d == d && (double)f != d && !isinf(f)) {
        f = __uint_as_float(__float_as_uint(f) | 1u);
    }
    return f;
}

// Storage type T <-> accumulator type. `load` widens, `store` rounds once (to nearest even).
template <typename T> struct Num;

template <> struct Num<float> {
    typedef float acc;
    static __device__ __forceinline__ float load(float x) { return x; }
    static __device__ __forceinline__ float store(float a) { return a; }
    static __device__ __forceinline__ float from_double(double d) { return (float)d; }
};

template <> struct Num<double> {
    typedef double acc;
    static __device__ __forceinline__ double load(double x) { return x; }
    static __device__ __forceinline__ double store(double a) { return a; }
    static __device__ __forceinline__ double from_double(double d) { return d; }
};

template <> struct Num<f16_t> {
    typedef float acc;
    static __device__ __forceinline__ float load(f16_t x) { return f16_to_float(x.bits); }
    static __device__ __forceinline__ f16_t store(float a) { f16_t r; r.bits = f16_from_float(a); return r; }
    static __device__ __forceinline__ f16_t from_double(double d) {
        f16_t r; r.bits = f16_from_float(float_round_to_odd(d)); return r;
    }
};

template <> struct Num<bf16_t> {
    typedef float acc;
    static __device__ __forceinline__ float load(bf16_t x) { return bf16_to_float(x.bits); }
    static __device__ __forceinline__ bf16_t store(float a) { bf16_t r; r.bits = bf16_from_float(a); return r; }
    static __device__ __forceinline__ bf16_t from_double(double d) {
        bf16_t r; r.bits = bf16_from_float(float_round_to_odd(d)); return r;
    }
};

// A strided view: element (i_0, ..., i_{rank-1}) lives at offset + sum(i_d * strides[d]).
struct Strided {
    i64 shape[TORSH_MAX_RANK];
    i64 strides[TORSH_MAX_RANK];
    i64 offset;
    int rank;
    int pad_;
};

// Element offset of the `linear`-th element (row-major over the logical shape).
__device__ __forceinline__ i64 strided_offset(const Strided& s, i64 linear) {
    i64 off = s.offset;
    for (int d = s.rank - 1; d >= 0; --d) {
        i64 extent = s.shape[d];
        i64 i = linear % extent;
        linear /= extent;
        off += i * s.strides[d];
    }
    return off;
}

// Element offset of the `i`-th element of `s`. Rank 0 and 1 need no division: beyond `rank` the host
// sets strides to 0, so `strides[0]` is 0 for a rank-0 view (whose only index is 0).
__device__ __forceinline__ i64 elem_offset(const Strided& s, i64 i) {
    if (s.rank <= 1) {
        return s.offset + i * s.strides[0];
    }
    return strided_offset(s, i);
}

// Grid-stride loop over [0, n).
#define TORSH_GRID_STRIDE(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// ------------------------------------------------------------------------------- group reductions

#define TORSH_FULL_MASK 0xffffffffu

// Negative infinity of an accumulator type.
template <typename A> __device__ __forceinline__ A torsh_neg_inf();
template <> __device__ __forceinline__ float torsh_neg_inf<float>() { return __uint_as_float(0xff800000u); }
template <> __device__ __forceinline__ double torsh_neg_inf<double>() {
    return __longlong_as_double(0xfff0000000000000LL);
}

// NaN-ignoring maximum (C's fmax), as Rust's f64::max.
__device__ __forceinline__ float torsh_fmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double torsh_fmax(double a, double b) { return fmax(a, b); }

// Combine operations for `torsh_group_reduce`: `combine(running, other)` and its identity.
// Sum; the identity is -0, the exact identity of + (as Rust's f64 sum starts).
template <typename A> struct TorshSum {
    static __device__ __forceinline__ A combine(A a, A b) { return a + b; }
    static __device__ __forceinline__ A identity() { return (A)-0.0; }
};
// NaN-ignoring maximum; the identity is -inf.
template <typename A> struct TorshFmax {
    static __device__ __forceinline__ A combine(A a, A b) { return torsh_fmax(a, b); }
    static __device__ __forceinline__ A identity() { return torsh_neg_inf<A>(); }
};

// Combines `v` over a group of G consecutive threads with `Op` (TorshSum, TorshFmax); every thread of
// the group receives the result. G is 1, 32 (one warp), or blockDim.x (a multiple of 32, at most 1024:
// the whole block). The order of combination is fixed: within each warp a shuffle-down tree (offsets 16,
// 8, 4, 2, 1, `v = combine(v, v of lane + offset)`), then for a block the same tree in warp 0 over the
// warps' partials, with the identity in the slots past the last warp. The block form synchronises the
// block twice, so every thread of the block must call it.
template <int G, typename Op, typename A>
__device__ __forceinline__ A torsh_group_reduce(A v) {
    if constexpr (G == 1) {
        return v;
    } else {
        for (int off = 16; off > 0; off >>= 1) {
            v = Op::combine(v, __shfl_down_sync(TORSH_FULL_MASK, v, off));
        }
        if constexpr (G == 32) {
            return __shfl_sync(TORSH_FULL_MASK, v, 0);
        } else {
            static_assert(G % 32 == 0 && G <= 1024, "a group is one thread, one warp or the whole block");
            // Slots 0..G/32-1: one partial per warp; slot 32: the result.
            __shared__ A sh[33];
            const int warp = threadIdx.x >> 5;
            const int lane = threadIdx.x & 31;
            if (lane == 0) {
                sh[warp] = v;
            }
            __syncthreads();
            if (warp == 0) {
                v = lane < G / 32 ? sh[lane] : Op::identity();
                for (int off = 16; off > 0; off >>= 1) {
                    v = Op::combine(v, __shfl_down_sync(TORSH_FULL_MASK, v, off));
                }
                if (lane == 0) {
                    sh[32] = v;
                }
            }
            __syncthreads();
            return sh[32];
        }
    }
}

// The type each element compares and sorts as: f16 and bf16 widened to float exactly, the
// others as they are.
template <typename T> struct Key {
    typedef T K;
    static __device__ __forceinline__ T of(T x) { return x; }
};
template <> struct Key<f16_t> {
    typedef float K;
    static __device__ __forceinline__ float of(f16_t x) { return f16_to_float(x.bits); }
};
template <> struct Key<bf16_t> {
    typedef float K;
    static __device__ __forceinline__ float of(bf16_t x) { return bf16_to_float(x.bits); }
};

// Per-dtype variants: a module compiled with `-DTORSH_ONLY_<DTYPE>` (TORSH_ONLY_F32, _F64, _F16, _BF16,
// _I32, _I64, _U8) declares the entry points of that one dtype only, so the first use of a dtype
// compiles (NVRTC, then the driver's JIT) a fraction of the module. Without such a define every dtype is
// declared: that full module is what the NVRTC test compiles. `TORSH_HAS_<DTYPE>` is 1 when the dtype's
// entry points are part of this compilation (for entry points outside the X-macros).
#if defined(TORSH_ONLY_F32) || defined(TORSH_ONLY_F64) || defined(TORSH_ONLY_F16) ||                 \
    defined(TORSH_ONLY_BF16) || defined(TORSH_ONLY_I32) || defined(TORSH_ONLY_I64) ||                \
    defined(TORSH_ONLY_U8)
#define TORSH_ONLY_ONE 1
#else
#define TORSH_ONLY_ONE 0
#endif

#if !TORSH_ONLY_ONE || defined(TORSH_ONLY_F32)
#define TORSH_HAS_F32 1
#define TORSH_TYPE_F32(X) X(f32, float)
#else
#define TORSH_HAS_F32 0
#define TORSH_TYPE_F32(X)
#endif
#if !TORSH_ONLY_ONE || defined(TORSH_ONLY_F64)
#define TORSH_HAS_F64 1
#define TORSH_TYPE_F64(X) X(f64, double)
#else
#define TORSH_HAS_F64 0
#define TORSH_TYPE_F64(X)
#endif
#if !TORSH_ONLY_ONE || defined(TORSH_ONLY_F16)
#define TORSH_HAS_F16 1
#define TORSH_TYPE_F16(X) X(f16, f16_t)
#else
#define TORSH_HAS_F16 0
#define TORSH_TYPE_F16(X)
#endif
#if !TORSH_ONLY_ONE || defined(TORSH_ONLY_BF16)
#define TORSH_HAS_BF16 1
#define TORSH_TYPE_BF16(X) X(bf16, bf16_t)
#else
#define TORSH_HAS_BF16 0
#define TORSH_TYPE_BF16(X)
#endif
#if !TORSH_ONLY_ONE || defined(TORSH_ONLY_I32)
#define TORSH_HAS_I32 1
#define TORSH_TYPE_I32(X) X(i32, i32)
#else
#define TORSH_HAS_I32 0
#define TORSH_TYPE_I32(X)
#endif
#if !TORSH_ONLY_ONE || defined(TORSH_ONLY_I64)
#define TORSH_HAS_I64 1
#define TORSH_TYPE_I64(X) X(i64, i64)
#else
#define TORSH_HAS_I64 0
#define TORSH_TYPE_I64(X)
#endif
#if !TORSH_ONLY_ONE || defined(TORSH_ONLY_U8)
#define TORSH_HAS_U8 1
#define TORSH_TYPE_U8(X) X(u8, u8)
#else
#define TORSH_HAS_U8 0
#define TORSH_TYPE_U8(X)
#endif

// X-macro over the float dtypes: `TORSH_FLOAT_TYPES(ENTRY)` expands `ENTRY(suffix, type)` once per float
// dtype of this compilation (four times in the full module, at most once in a per-dtype variant).
// A source defines ENTRY to declare one `extern "C"` entry point per dtype that calls its template body:
//   #define ENTRY(S, T) extern "C" __global__ void neg_##S(const T* x, T* y, i64 n) { neg_body<T>(x, y, n); }
//   TORSH_FLOAT_TYPES(ENTRY)
//   #undef ENTRY
#define TORSH_FLOAT_TYPES(X) TORSH_TYPE_F32(X) TORSH_TYPE_F64(X) TORSH_TYPE_F16(X) TORSH_TYPE_BF16(X)

// The same over all seven dtypes (floats, then i32, i64, u8), filtered the same way.
#define TORSH_ALL_TYPES(X) TORSH_FLOAT_TYPES(X) TORSH_TYPE_I32(X) TORSH_TYPE_I64(X) TORSH_TYPE_U8(X)

// Records index `v` of op `op` along a dim of `size` in the device's error flag (`flag`: [0] how
// many raised it, [1] the op's code, [2] the first reported index, [3] the size; `ErrorFlag` in
// index.rs); the first thread to raise it writes the details.
__device__ __forceinline__ void raise_index_error(u64* flag, i64 v, i64 op, i64 size) {
    if (atomicAdd(&flag[0], 1ull) == 0ull) {
        flag[1] = (u64)op;
        flag[2] = (u64)v;
        flag[3] = (u64)size;
    }
}
