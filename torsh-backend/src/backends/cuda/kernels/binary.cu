// Binary math (module `binary`): `binary_<dtype>` and `binary_vec_<dtype>`, one entry point each per
// float dtype with the op as a code.
//
// The meaning of every op is the reference backend's (backends/reference/elementwise.rs, math.rs). Math
// runs in `Num<T>::acc` (f64 for f64, f32 otherwise). Every kernel is a grid-stride loop with 64-bit
// indices; the output is dense (`y[i]`). In `binary_<dtype>` the inputs are strided (broadcast dims have
// stride 0): the host merges dims that are contiguous in every operand, so contiguous views arrive as
// rank 1 and `elem_offset` skips the index divisions. `binary_vec_<dtype>` is the fast path for dense,
// unbroadcast inputs whose first elements and the output are 16-byte aligned: 16-byte loads and stores,
// the same per-element computation. `binary_scalar_<dtype>` and `binary_scalar_vec_<dtype>` take the
// right operand as one value (a scalar in the op's descriptor) instead of memory.

__device__ __forceinline__ float m_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double m_pow(double a, double b) { return pow(a, b); }

// A quiet NaN of the argument's type.
__device__ __forceinline__ float m_nan(float) { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ double m_nan(double) { return __longlong_as_double(0x7ff8000000000000LL); }

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

// OP(a, b) for one element, in the accumulator, rounded once: the computation of both paths.
template <typename T, int OP> __device__ __forceinline__ T binary_elem(T a, T b) {
    typedef typename Num<T>::acc A;
    return Num<T>::store(binary_op<A>(OP, Num<T>::load(a), Num<T>::load(b)));
}

// L elements of T moved as one unit; 16-byte aligned and a multiple of 16 bytes, so every access to it
// is one or more 16-byte vector instructions (ld.global.v4 / v2).
template <typename T, int L> struct alignas(16) Pack { T e[L]; };

// The right operand of the loops: a strided view (`at`), a dense view (`at`, and `pack` for the
// vector loop), or one value for every element.
template <typename T> struct ViewRhs {
    const T* b;
    Strided bs;
    __device__ __forceinline__ T at(i64 i) const { return b[elem_offset(bs, i)]; }
};
template <typename T> struct DenseRhs {
    const T* b;
    __device__ __forceinline__ T at(i64 i) const { return b[i]; }
    template <int L> __device__ __forceinline__ Pack<T, L> pack(i64 v) const {
        return reinterpret_cast<const Pack<T, L>*>(b)[v];
    }
};
template <typename T> struct ScalarRhs {
    T s;
    __device__ __forceinline__ T at(i64) const { return s; }
    template <int L> __device__ __forceinline__ Pack<T, L> pack(i64) const {
        Pack<T, L> p;
#pragma unroll
        for (int k = 0; k < L; ++k) {
            p.e[k] = s;
        }
        return p;
    }
};

// y[i] = OP(a[i], b[i]) for one op fixed at compile time.
template <typename T, int OP, typename B>
__device__ __forceinline__ void binary_loop(const T* a, const Strided& as, const B& b, T* y, i64 n) {
    TORSH_GRID_STRIDE(i, n) {
        y[i] = binary_elem<T, OP>(a[elem_offset(as, i)], b.at(i));
    }
}

// Dense a, b and y, all 16-byte aligned: 16 bytes of each per thread and step (L = 16 / sizeof(T)
// elements), grid-stride over the n / L vectors, then the last n % L elements by the first threads.
template <typename T, int OP, typename B>
__device__ __forceinline__ void binary_vec_loop(const T* a, const B& b, T* y, i64 n) {
    constexpr int L = 16 / (int)sizeof(T);
    typedef Pack<T, L> P;
    const P* av = reinterpret_cast<const P*>(a);
    P* yv = reinterpret_cast<P*>(y);
    const i64 nv = n / L;
    TORSH_GRID_STRIDE(v, nv) {
        P pa = av[v];
        const P pb = b.template pack<L>(v);
#pragma unroll
        for (int k = 0; k < L; ++k) {
            pa.e[k] = binary_elem<T, OP>(pa.e[k], pb.e[k]);
        }
        yv[v] = pa;
    }
    const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n - nv * L) {
        const i64 i = nv * L + t;
        y[i] = binary_elem<T, OP>(a[i], b.at(i));
    }
}

// Dispatches the run-time op code to its loop. An unknown code writes nothing.
template <typename T, typename B>
__device__ void binary_body(const T* a, const Strided& as, const B& b, T* y, i64 n, int op) {
    switch (op) {
#define CASE(K) case K: binary_loop<T, K>(a, as, b, y, n); break;
    CASE(BINARY_ADD) CASE(BINARY_SUB) CASE(BINARY_MUL) CASE(BINARY_DIV) CASE(BINARY_MAXIMUM)
    CASE(BINARY_MINIMUM) CASE(BINARY_POW)
#undef CASE
    default: break;
    }
}

// The vector path's dispatch of the run-time op code. An unknown code writes nothing.
template <typename T, typename B>
__device__ void binary_vec_body(const T* a, const B& b, T* y, i64 n, int op) {
    switch (op) {
#define CASE(K) case K: binary_vec_loop<T, K>(a, b, y, n); break;
    CASE(BINARY_ADD) CASE(BINARY_SUB) CASE(BINARY_MUL) CASE(BINARY_DIV) CASE(BINARY_MAXIMUM)
    CASE(BINARY_MINIMUM) CASE(BINARY_POW)
#undef CASE
    default: break;
    }
}

// binary_<dtype>(a, as, b, bs, y, n, op): y[0..n) dense; a and b strided (broadcast dims: stride 0).
// binary_vec_<dtype>(a, b, y, n, op): a, b (their first elements) and y dense and 16-byte aligned.
// binary_scalar_<dtype>(a, as, y, n, op, b_bits) and binary_scalar_vec_<dtype>(a, y, n, op, b_bits):
// the same with one right operand for every element, its element bits in the low bytes of b_bits.
#define ENTRY(S, T)                                                                              \
    extern "C" __global__ void binary_##S(const T* a, Strided as, const T* b, Strided bs, T* y,  \
                                          i64 n, int op) {                                       \
        binary_body<T>(a, as, ViewRhs<T>{b, bs}, y, n, op);                                      \
    }                                                                                            \
    extern "C" __global__ void binary_vec_##S(const T* a, const T* b, T* y, i64 n, int op) {     \
        binary_vec_body<T>(a, DenseRhs<T>{b}, y, n, op);                                         \
    }                                                                                            \
    extern "C" __global__ void binary_scalar_##S(const T* a, Strided as, T* y, i64 n, int op,    \
                                                 u64 b_bits) {                                   \
        binary_body<T>(a, as, ScalarRhs<T>{from_bits<T>(b_bits)}, y, n, op);                     \
    }                                                                                            \
    extern "C" __global__ void binary_scalar_vec_##S(const T* a, T* y, i64 n, int op,            \
                                                     u64 b_bits) {                               \
        binary_vec_body<T>(a, ScalarRhs<T>{from_bits<T>(b_bits)}, y, n, op);                     \
    }
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY
