// Binary math (module `binary`): `binary_<dtype>`, one entry point per float dtype with the op as a code.
//
// The meaning of every op is the reference backend's (backends/reference/elementwise.rs, math.rs). Math
// runs in `Num<T>::acc` (f64 for f64, f32 otherwise). Every kernel is a grid-stride loop with 64-bit
// indices; the output is dense (`y[i]`), the inputs strided (broadcast dims have stride 0). The host
// merges dims that are contiguous in every operand, so contiguous views arrive as rank 1 and
// `elem_offset` skips the index divisions.

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
