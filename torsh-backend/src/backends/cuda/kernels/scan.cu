// Inclusive scans along one dim (module `scan`): `scan_<dtype>(x, xs, y, g, op)`, the meaning of the
// reference backend's (backends/reference/scan.rs): y[.., i, ..] = x[.., 0, ..] op ... op x[.., i, ..].
// One thread per line (the positions sharing every coordinate but `dim`), walking the dim in order,
// grid-stride over lines with 64-bit offsets. Floats accumulate in `Num<T>::acc` (double for f64,
// float otherwise) and round once per output; integers wrap (computed in unsigned arithmetic, so no
// signed overflow is undefined).

#define SCAN_SUM 0
#define SCAN_PROD 1

// The launch's geometry (`ScanGeometry` in scan.rs, same layout).
struct ScanGeometry {
    i64 shape[TORSH_MAX_RANK];
    i64 x_strides[TORSH_MAX_RANK];
    i64 x_offset;
    i64 lines;
    int rank;
    int dim;
};

// Accumulation of T: the float accumulator, or wrapping integer arithmetic.
template <typename T> struct ScanAcc {
    typedef typename Num<T>::acc A;
    static __device__ __forceinline__ A load(T x) { return Num<T>::load(x); }
    static __device__ __forceinline__ T store(A a) { return Num<T>::store(a); }
    static __device__ __forceinline__ A combine(int op, A a, A b) { return op == SCAN_PROD ? a * b : a + b; }
};

#define TORSH_INT_SCAN(T, U)                                                                      \
    template <> struct ScanAcc<T> {                                                               \
        typedef T A;                                                                              \
        static __device__ __forceinline__ T load(T x) { return x; }                               \
        static __device__ __forceinline__ T store(T a) { return a; }                              \
        static __device__ __forceinline__ T combine(int op, T a, T b) {                           \
            return (T)(op == SCAN_PROD ? (U)a * (U)b : (U)a + (U)b);                              \
        }                                                                                         \
    };
TORSH_INT_SCAN(i32, u32)
TORSH_INT_SCAN(i64, u64)
TORSH_INT_SCAN(u8, u32)
#undef TORSH_INT_SCAN

template <typename T>
__device__ void scan_body(const T* x, T* y, const ScanGeometry& g, int op) {
    typedef ScanAcc<T> S;
    const i64 len = g.shape[g.dim];
    i64 y_stride = 1;
    for (int d = g.rank - 1; d > g.dim; --d) {
        y_stride *= g.shape[d];
    }
    TORSH_GRID_STRIDE(line, g.lines) {
        // The line's coordinates over every dim but `dim`, dotted with the input's strides; the
        // output is dense, so its offset is the line's position with `dim` spliced in.
        i64 rest = line;
        i64 at_x = g.x_offset;
        i64 at_y = 0;
        i64 step = 1;
        for (int d = g.rank - 1; d >= 0; --d) {
            if (d == g.dim) {
                step *= len;
                continue;
            }
            const i64 c = rest % g.shape[d];
            rest /= g.shape[d];
            at_x += c * g.x_strides[d];
            at_y += c * step;
            step *= g.shape[d];
        }
        const i64 sx = g.x_strides[g.dim];
        typename S::A acc = S::load(x[at_x]);
        y[at_y] = S::store(acc);
        for (i64 i = 1; i < len; ++i) {
            acc = S::combine(op, acc, S::load(x[at_x + i * sx]));
            y[at_y + i * y_stride] = S::store(acc);
        }
    }
}

// scan_<dtype>(x, y, g, op): y dense with x's shape; op SCAN_SUM or SCAN_PROD.
#define ENTRY(S, T)                                                                               \
    extern "C" __global__ void scan_##S(const T* x, T* y, ScanGeometry g, int op) {               \
        scan_body<T>(x, y, g, op);                                                                \
    }
TORSH_ALL_TYPES(ENTRY)
#undef ENTRY
