// Unary math (module `unary`): `unary_<dtype>` and `unary_vec_<dtype>`, one entry point each per float
// dtype with the op as a code.
//
// The meaning of every op is the reference backend's (backends/reference/elementwise.rs, math.rs). Math
// runs in `Num<T>::acc` (f64 for f64, f32 otherwise). Every kernel is a grid-stride loop with 64-bit
// indices; the output is dense (`y[i]`). In `unary_<dtype>` the input is strided: the host merges dims
// that are contiguous in every operand, so a contiguous view arrives as rank 1 and `elem_offset` skips
// the index divisions. `unary_vec_<dtype>` is the fast path for a dense input whose first element and the
// output are 16-byte aligned: 16-byte loads and stores, the same per-element computation.

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

// A quiet NaN of the argument's type.
__device__ __forceinline__ float m_nan(float) { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ double m_nan(double) { return __longlong_as_double(0x7ff8000000000000LL); }

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

// OP(x) for one element, in the accumulator, rounded once: the computation of both paths.
template <typename T, int OP> __device__ __forceinline__ T unary_elem(T x) {
    typedef typename Num<T>::acc A;
    return Num<T>::store(unary_op<A>(OP, Num<T>::load(x)));
}

// y[i] = OP(x[i]) for one op fixed at compile time, so the switch folds away inside the loop.
template <typename T, int OP>
__device__ __forceinline__ void unary_loop(const T* x, const Strided& xs, T* y, i64 n) {
    TORSH_GRID_STRIDE(i, n) {
        y[i] = unary_elem<T, OP>(x[elem_offset(xs, i)]);
    }
}

// L elements of T moved as one unit; 16-byte aligned and a multiple of 16 bytes, so every access to it
// is one or more 16-byte vector instructions (ld.global.v4 / v2).
template <typename T, int L> struct alignas(16) Pack { T e[L]; };

// Dense x and y, both 16-byte aligned: 16 bytes per thread and step (L = 16 / sizeof(T) elements),
// grid-stride over the n / L vectors, then the last n % L elements by the first threads of the grid.
template <typename T, int OP> __device__ __forceinline__ void unary_vec_loop(const T* x, T* y, i64 n) {
    constexpr int L = 16 / (int)sizeof(T);
    typedef Pack<T, L> P;
    const P* xv = reinterpret_cast<const P*>(x);
    P* yv = reinterpret_cast<P*>(y);
    const i64 nv = n / L;
    TORSH_GRID_STRIDE(v, nv) {
        P p = xv[v];
#pragma unroll
        for (int k = 0; k < L; ++k) {
            p.e[k] = unary_elem<T, OP>(p.e[k]);
        }
        yv[v] = p;
    }
    const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n - nv * L) {
        y[nv * L + t] = unary_elem<T, OP>(x[nv * L + t]);
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

// The vector path's dispatch of the run-time op code. An unknown code writes nothing.
template <typename T> __device__ void unary_vec_body(const T* x, T* y, i64 n, int op) {
    switch (op) {
#define CASE(K) case K: unary_vec_loop<T, K>(x, y, n); break;
    CASE(UNARY_NEG) CASE(UNARY_ABS) CASE(UNARY_EXP) CASE(UNARY_LOG) CASE(UNARY_SQRT)
    CASE(UNARY_RSQRT) CASE(UNARY_RECIP) CASE(UNARY_SQUARE) CASE(UNARY_RELU) CASE(UNARY_GELU)
    CASE(UNARY_GELU_TANH) CASE(UNARY_SIGMOID) CASE(UNARY_SILU) CASE(UNARY_TANH) CASE(UNARY_SIN)
    CASE(UNARY_COS) CASE(UNARY_ERF)
#undef CASE
    default: break;
    }
}

// unary_<dtype>(x, xs, y, n, op): y[0..n) dense, x strided.
// unary_vec_<dtype>(x, y, n, op): x (its first element) and y dense and 16-byte aligned.
#define ENTRY(S, T)                                                                  \
    extern "C" __global__ void unary_##S(const T* x, Strided xs, T* y, i64 n, int op) { \
        unary_body<T>(x, xs, y, n, op);                                              \
    }                                                                                \
    extern "C" __global__ void unary_vec_##S(const T* x, T* y, i64 n, int op) {     \
        unary_vec_body<T>(x, y, n, op);                                              \
    }
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY

// g * op'(v) with the formulas of math.rs::unary_grad, from v: the op's input x or its output y as
// `UnaryOp::saved` says (y for exp, sqrt, rsqrt, recip, relu, sigmoid, tanh).
template <typename A> __device__ __forceinline__ A unary_grad(int op, A v, A g) {
    switch (op) {
    case UNARY_NEG: return -g;
    case UNARY_ABS: return v > A(0) ? g : (v < A(0) ? -g : A(0) * g);
    case UNARY_EXP: return g * v;
    case UNARY_LOG: return g / v;
    case UNARY_SQRT: return g / (A(2) * v);
    case UNARY_RSQRT: return A(-0.5) * g * v * v * v;
    case UNARY_RECIP: return -g * v * v;
    case UNARY_SQUARE: return A(2) * g * v;
    case UNARY_RELU: return v <= A(0) ? A(0) : g;
    case UNARY_GELU: {
        const A cdf = A(0.5) * (A(1) + m_erf(v / A(1.4142135623730951)));
        const A pdf = m_exp(A(-0.5) * v * v) * A(0.3989422804014327);
        return g * (cdf + v * pdf);
    }
    case UNARY_GELU_TANH: {
        const A c = A(0.7978845608028654);
        const A t = m_tanh(c * (v + A(0.044715) * v * v * v));
        const A du = c * (A(1) + A(3 * 0.044715) * v * v);
        return g * (A(0.5) * (A(1) + t) + A(0.5) * v * (A(1) - t * t) * du);
    }
    case UNARY_SIGMOID: return g * v * (A(1) - v);
    case UNARY_SILU: {
        const A s = sigmoid(v);
        return g * (s + v * s * (A(1) - s));
    }
    case UNARY_TANH: return g * (A(1) - v * v);
    case UNARY_SIN: return g * m_cos(v);
    case UNARY_COS: return -g * m_sin(v);
    case UNARY_ERF: return g * A(1.1283791670955126) * m_exp(-v * v);
    default: return m_nan(v);
    }
}

// unary_backward_<dtype>(v, vs, g, gs, y, n, op): y[i] = g[i] * op'(v[i]) in the accumulator,
// rounded once; y[0..n) dense, v and g strided (broadcast dims: stride 0).
template <typename T>
__device__ void unary_backward_body(const T* v, const Strided& vs, const T* g, const Strided& gs,
                                    T* y, i64 n, int op) {
    typedef typename Num<T>::acc A;
    TORSH_GRID_STRIDE(i, n) {
        const A a = Num<T>::load(v[elem_offset(vs, i)]);
        const A b = Num<T>::load(g[elem_offset(gs, i)]);
        y[i] = Num<T>::store(unary_grad<A>(op, a, b));
    }
}

#define ENTRY(S, T)                                                                         \
    extern "C" __global__ void unary_backward_##S(const T* v, Strided vs, const T* g,       \
                                                  Strided gs, T* y, i64 n, int op) {        \
        unary_backward_body<T>(v, vs, g, gs, y, n, op);                                     \
    }
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY
