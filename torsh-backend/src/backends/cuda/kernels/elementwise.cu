// Elementwise kernels: unary and binary math, casts between every pair of dtypes, fill and strided copy
// by element width, and the crate's counter-based random fill.
//
// The meaning of every op is the reference backend's (backends/reference/elementwise.rs, math.rs,
// memory.rs, rng.rs). Math runs in `Num<T>::acc` (f64 for f64, f32 otherwise); casts and random values
// go through f64 (or i64 for integer sources) exactly as the reference does.
//
// Every kernel is a grid-stride loop with 64-bit indices. Outputs are dense (`y[i]`) except for the
// strided copy. The host merges dims that are contiguous in every operand, so a contiguous view arrives
// as rank 1 and `elem_offset` skips the index divisions.

typedef int i32;
typedef unsigned char u8;

// ------------------------------------------------------------------------------------------ helpers

// Element offset of the `i`-th element of `s`. Rank 0 and 1 need no division: beyond `rank` the host
// sets strides to 0, so `strides[0]` is 0 for a rank-0 view (whose only index is 0).
__device__ __forceinline__ i64 elem_offset(const Strided& s, i64 i) {
    if (s.rank <= 1) {
        return s.offset + i * s.strides[0];
    }
    return strided_offset(s, i);
}

// f32 and f64 overloads of the device math functions (no toolkit headers, so no C++ overloads).
#define TORSH_MATH1(NAME, F32, F64)                                      \
    __device__ __forceinline__ float NAME(float x) { return F32(x); }   \
    __device__ __forceinline__ double NAME(double x) { return F64(x); }
TORSH_MATH1(m_abs, fabsf, fabs)
TORSH_MATH1(m_exp, expf, exp)
TORSH_MATH1(m_log, logf, log)
TORSH_MATH1(m_sqrt, sqrtf, sqrt)
TORSH_MATH1(m_tanh, tanhf, tanh)
TORSH_MATH1(m_sin, sinf, sin)
TORSH_MATH1(m_cos, cosf, cos)
TORSH_MATH1(m_erf, erff, erf)
#undef TORSH_MATH1

__device__ __forceinline__ float m_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double m_pow(double a, double b) { return pow(a, b); }

// A quiet NaN of the argument's type.
__device__ __forceinline__ float m_nan(float) { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ double m_nan(double) { return __longlong_as_double(0x7ff8000000000000LL); }

// ------------------------------------------------------------------------------------------ unary

// Unary op codes: the numbers `unary_code` in elementwise.rs passes (the order of `UnaryOp`).
#define UNARY_NEG 0
#define UNARY_ABS 1
#define UNARY_EXP 2
#define UNARY_LOG 3
#define UNARY_SQRT 4
#define UNARY_RSQRT 5
#define UNARY_RECIP 6
#define UNARY_SQUARE 7
#define UNARY_RELU 8
#define UNARY_GELU 9
#define UNARY_GELU_TANH 10
#define UNARY_SIGMOID 11
#define UNARY_SILU 12
#define UNARY_TANH 13
#define UNARY_SIN 14
#define UNARY_COS 15
#define UNARY_ERF 16

// The logistic function, split by sign as in math.rs so neither branch overflows.
template <typename A> __device__ __forceinline__ A sigmoid(A x) {
    if (x >= A(0)) {
        return A(1) / (A(1) + m_exp(-x));
    }
    A e = m_exp(x);
    return e / (A(1) + e);
}

// `op(x)` with the formulas of math.rs::unary. Relu keeps NaN; gelu is the erf form.
template <typename A> __device__ __forceinline__ A unary_op(int op, A x) {
    switch (op) {
    case UNARY_NEG: return -x;
    case UNARY_ABS: return m_abs(x);
    case UNARY_EXP: return m_exp(x);
    case UNARY_LOG: return m_log(x);
    case UNARY_SQRT: return m_sqrt(x);
    case UNARY_RSQRT: return A(1) / m_sqrt(x);
    case UNARY_RECIP: return A(1) / x;
    case UNARY_SQUARE: return x * x;
    case UNARY_RELU: return (x > A(0) || x != x) ? x : A(0);
    case UNARY_GELU: return A(0.5) * x * (A(1) + m_erf(x / A(1.4142135623730951)));
    case UNARY_GELU_TANH: {
        const A c = A(0.7978845608028654); // sqrt(2 / pi)
        return A(0.5) * x * (A(1) + m_tanh(c * (x + A(0.044715) * x * x * x)));
    }
    case UNARY_SIGMOID: return sigmoid(x);
    case UNARY_SILU: return x * sigmoid(x);
    case UNARY_TANH: return m_tanh(x);
    case UNARY_SIN: return m_sin(x);
    case UNARY_COS: return m_cos(x);
    case UNARY_ERF: return m_erf(x);
    default: return m_nan(x);
    }
}

// y[i] = OP(x[i]) for one op fixed at compile time, so the switch folds away inside the loop.
template <typename T, int OP>
__device__ __forceinline__ void unary_loop(const T* x, const Strided& xs, T* y, i64 n) {
    typedef typename Num<T>::acc A;
    TORSH_GRID_STRIDE(i, n) {
        y[i] = Num<T>::store(unary_op<A>(OP, Num<T>::load(x[elem_offset(xs, i)])));
    }
}

// Dispatches the run-time op code to its loop. An unknown code writes nothing (the host never sends one).
template <typename T>
__device__ void unary_body(const T* x, const Strided& xs, T* y, i64 n, int op) {
    switch (op) {
#define CASE(K) case K: unary_loop<T, K>(x, xs, y, n); break;
    CASE(UNARY_NEG) CASE(UNARY_ABS) CASE(UNARY_EXP) CASE(UNARY_LOG) CASE(UNARY_SQRT)
    CASE(UNARY_RSQRT) CASE(UNARY_RECIP) CASE(UNARY_SQUARE) CASE(UNARY_RELU) CASE(UNARY_GELU)
    CASE(UNARY_GELU_TANH) CASE(UNARY_SIGMOID) CASE(UNARY_SILU) CASE(UNARY_TANH) CASE(UNARY_SIN)
    CASE(UNARY_COS) CASE(UNARY_ERF)
#undef CASE
    default: break;
    }
}

// unary_<dtype>(x, xs, y, n, op): y[0..n) dense, x strided.
#define ENTRY(S, T)                                                                  \
    extern "C" __global__ void unary_##S(const T* x, Strided xs, T* y, i64 n, int op) { \
        unary_body<T>(x, xs, y, n, op);                                              \
    }
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY

// ------------------------------------------------------------------------------------------ binary

// Binary op codes: the numbers `binary_code` in elementwise.rs passes (the order of `BinaryOp`).
#define BINARY_ADD 0
#define BINARY_SUB 1
#define BINARY_MUL 2
#define BINARY_DIV 3
#define BINARY_MAXIMUM 4
#define BINARY_MINIMUM 5
#define BINARY_POW 6

// `op(a, b)` as math.rs::binary: maximum and minimum are NaN when either operand is NaN.
template <typename A> __device__ __forceinline__ A binary_op(int op, A a, A b) {
    switch (op) {
    case BINARY_ADD: return a + b;
    case BINARY_SUB: return a - b;
    case BINARY_MUL: return a * b;
    case BINARY_DIV: return a / b;
    case BINARY_MAXIMUM: return (a != a || b != b) ? m_nan(a) : (a > b ? a : b);
    case BINARY_MINIMUM: return (a != a || b != b) ? m_nan(a) : (a < b ? a : b);
    case BINARY_POW: return m_pow(a, b);
    default: return m_nan(a);
    }
}

// y[i] = OP(a[i], b[i]) for one op fixed at compile time.
template <typename T, int OP>
__device__ __forceinline__ void binary_loop(const T* a, const Strided& as, const T* b,
                                            const Strided& bs, T* y, i64 n) {
    typedef typename Num<T>::acc A;
    TORSH_GRID_STRIDE(i, n) {
        A va = Num<T>::load(a[elem_offset(as, i)]);
        A vb = Num<T>::load(b[elem_offset(bs, i)]);
        y[i] = Num<T>::store(binary_op<A>(OP, va, vb));
    }
}

// Dispatches the run-time op code to its loop. An unknown code writes nothing.
template <typename T>
__device__ void binary_body(const T* a, const Strided& as, const T* b, const Strided& bs, T* y,
                            i64 n, int op) {
    switch (op) {
#define CASE(K) case K: binary_loop<T, K>(a, as, b, bs, y, n); break;
    CASE(BINARY_ADD) CASE(BINARY_SUB) CASE(BINARY_MUL) CASE(BINARY_DIV) CASE(BINARY_MAXIMUM)
    CASE(BINARY_MINIMUM) CASE(BINARY_POW)
#undef CASE
    default: break;
    }
}

// binary_<dtype>(a, as, b, bs, y, n, op): y[0..n) dense; a and b strided (broadcast dims: stride 0).
#define ENTRY(S, T)                                                                         \
    extern "C" __global__ void binary_##S(const T* a, Strided as, const T* b, Strided bs, T* y, \
                                          i64 n, int op) {                                  \
        binary_body<T>(a, as, b, bs, y, n, op);                                             \
    }
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY

// ------------------------------------------------------------------------------------------ cast

// Conversions of one dtype, as memory.rs's decode/encode: a float source is read as f64 (exactly), an
// integer source as i64; `from_f64` is Rust's `as` (floats: round to nearest even; integers: truncate
// toward zero, saturate, NaN -> 0) and `from_i64` wraps for integers and goes through f64 for floats.
template <typename T> struct Cvt;

// The float dtypes, over `Num<T>`: `from_double` rounds once, correctly, to f32, f16 and bf16.
template <typename T> struct CvtFloat {
    static constexpr bool is_int = false;
    static __device__ __forceinline__ double to_f64(T x) { return (double)Num<T>::load(x); }
    static __device__ __forceinline__ T from_f64(double d) { return Num<T>::from_double(d); }
    static __device__ __forceinline__ T from_i64(i64 v) { return from_f64(__ll2double_rn(v)); }
};
template <> struct Cvt<float> : CvtFloat<float> {};
template <> struct Cvt<double> : CvtFloat<double> {};
template <> struct Cvt<f16_t> : CvtFloat<f16_t> {};
template <> struct Cvt<bf16_t> : CvtFloat<bf16_t> {};

template <> struct Cvt<i32> {
    static constexpr bool is_int = true;
    static __device__ __forceinline__ i64 to_i64(i32 x) { return (i64)x; }
    static __device__ __forceinline__ i32 from_f64(double d) {
        if (d != d) return 0;
        if (d >= 2147483647.0) return 2147483647;
        if (d <= -2147483648.0) return -2147483647 - 1;
        return __double2int_rz(d);
    }
    static __device__ __forceinline__ i32 from_i64(i64 v) { return (i32)(u32)(u64)v; }
};

template <> struct Cvt<i64> {
    static constexpr bool is_int = true;
    static __device__ __forceinline__ i64 to_i64(i64 x) { return x; }
    static __device__ __forceinline__ i64 from_f64(double d) {
        if (d != d) return 0;
        if (d >= 9223372036854775808.0) return 0x7fffffffffffffffLL;
        if (d <= -9223372036854775808.0) return -0x7fffffffffffffffLL - 1;
        return __double2ll_rz(d);
    }
    static __device__ __forceinline__ i64 from_i64(i64 v) { return v; }
};

template <> struct Cvt<u8> {
    static constexpr bool is_int = true;
    static __device__ __forceinline__ i64 to_i64(u8 x) { return (i64)x; }
    static __device__ __forceinline__ u8 from_f64(double d) {
        if (d != d || d <= 0.0) return 0;
        if (d >= 255.0) return 255;
        return (u8)__double2uint_rz(d);
    }
    static __device__ __forceinline__ u8 from_i64(i64 v) { return (u8)(u64)v; }
};

// y[i] = x[i] converted from S to D.
template <typename S, typename D>
__device__ void cast_body(const S* x, const Strided& xs, D* y, i64 n) {
    TORSH_GRID_STRIDE(i, n) {
        S v = x[elem_offset(xs, i)];
        if constexpr (Cvt<S>::is_int) {
            y[i] = Cvt<D>::from_i64(Cvt<S>::to_i64(v));
        } else {
            y[i] = Cvt<D>::from_f64(Cvt<S>::to_f64(v));
        }
    }
}

// X-macro over all seven dtypes, and over the destination dtypes for one source.
#define TORSH_ALL_TYPES(X) \
    X(f32, float) X(f64, double) X(f16, f16_t) X(bf16, bf16_t) X(i32, i32) X(i64, i64) X(u8, u8)
#define CAST_TO_EACH(X, S, ST)                                                                \
    X(S, ST, f32, float) X(S, ST, f64, double) X(S, ST, f16, f16_t) X(S, ST, bf16, bf16_t) \
    X(S, ST, i32, i32) X(S, ST, i64, i64) X(S, ST, u8, u8)

// cast_<src>_<dst>(x, xs, y, n): y[0..n) dense, x strided; 49 entry points.
#define CAST_ENTRY(S, ST, D, DT)                                                               \
    extern "C" __global__ void cast_##S##_##D(const ST* x, Strided xs, DT* y, i64 n) {         \
        cast_body<ST, DT>(x, xs, y, n);                                                        \
    }
#define CAST_FROM(S, ST) CAST_TO_EACH(CAST_ENTRY, S, ST)
TORSH_ALL_TYPES(CAST_FROM)
#undef CAST_FROM
#undef CAST_ENTRY
#undef CAST_TO_EACH
#undef TORSH_ALL_TYPES

// ------------------------------------------------------------------------------------------ fill, copy

// The unsigned integer type of each element width, for the width-generic kernels.
#define TORSH_WIDTHS(X) X(u8, u8) X(u16, u16) X(u32, u32) X(u64, u64)

// y[0..n) = the low bits of `bits` (the host encodes the value as the reference does).
template <typename W> __device__ void fill_body(W* y, i64 n, u64 bits) {
    const W v = (W)bits;
    TORSH_GRID_STRIDE(i, n) {
        y[i] = v;
    }
}

// Element by element from one strided view to another of the same shape.
template <typename W>
__device__ void copy_body(const W* x, const Strided& xs, W* y, const Strided& ys, i64 n) {
    TORSH_GRID_STRIDE(i, n) {
        y[elem_offset(ys, i)] = x[elem_offset(xs, i)];
    }
}

// fill_<width>(y, n, bits) and copy_<width>(x, xs, y, ys, n), width one of u8, u16, u32, u64.
#define ENTRY(S, W)                                                                         \
    extern "C" __global__ void fill_##S(W* y, i64 n, u64 bits) { fill_body<W>(y, n, bits); } \
    extern "C" __global__ void copy_##S(const W* x, Strided xs, W* y, Strided ys, i64 n) {  \
        copy_body<W>(x, xs, y, ys, n);                                                      \
    }
TORSH_WIDTHS(ENTRY)
#undef ENTRY
#undef TORSH_WIDTHS

// ------------------------------------------------------------------------------------------ random

// Distribution codes: the numbers `distribution_args` in elementwise.rs passes.
#define RANDOM_UNIFORM 0
#define RANDOM_NORMAL 1

#define RNG_GOLDEN 0x9E3779B97F4A7C15ULL

// rng.rs::mix64, the SplitMix64 finaliser (unsigned arithmetic wraps like Rust's wrapping_mul).
__device__ __forceinline__ u64 rng_mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// rng.rs::bits: 64 random bits for element `index` of stream `seed`.
__device__ __forceinline__ u64 rng_bits(u64 seed, u64 index) {
    return rng_mix64(rng_mix64(seed ^ RNG_GOLDEN) + index * RNG_GOLDEN);
}

// rng.rs::uniform: the top 53 bits times 2^-53, exact.
__device__ __forceinline__ double rng_uniform(u64 seed, u64 index) {
    return __dmul_rn(__ull2double_rn(rng_bits(seed, index) >> 11), 1.0 / 9007199254740992.0);
}

// rng.rs::normal: Box-Muller on uniforms 2i and 2i + 1, cosine branch. Explicit roundings keep the
// compiler from fusing; log and cos are within an ulp or two of the host's libm.
__device__ __forceinline__ double rng_normal(u64 seed, u64 index) {
    const double tau = __longlong_as_double(0x401921FB54442D18LL); // std::f64::consts::TAU
    double u1 = __dsub_rn(1.0, rng_uniform(seed, index * 2));
    double u2 = rng_uniform(seed, index * 2 + 1);
    return __dmul_rn(sqrt(__dmul_rn(-2.0, log(u1))), cos(__dmul_rn(tau, u2)));
}

// y[i] = low + (high - low) * uniform(seed, i)  (dist 0, a = low, b = high), or
// y[i] = mean + std * normal(seed, i)           (dist 1, a = mean, b = std), in f64, rounded once.
template <typename T> __device__ void random_body(T* y, i64 n, u64 seed, int dist, double a, double b) {
    TORSH_GRID_STRIDE(i, n) {
        double v;
        if (dist == RANDOM_NORMAL) {
            v = __dadd_rn(a, __dmul_rn(b, rng_normal(seed, (u64)i)));
        } else {
            v = __dadd_rn(a, __dmul_rn(__dsub_rn(b, a), rng_uniform(seed, (u64)i)));
        }
        y[i] = Num<T>::from_double(v);
    }
}

// random_<dtype>(y, n, seed, dist, a, b): y[0..n) dense.
#define ENTRY(S, T)                                                                              \
    extern "C" __global__ void random_##S(T* y, i64 n, u64 seed, int dist, double a, double b) { \
        random_body<T>(y, n, seed, dist, a, b);                                                  \
    }
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY
