// Casts between every pair of dtypes (module `cast`): `cast_<src>_<dst>`, and `cast_vec_<src>_<dst>`
// between every pair of float dtypes.
//
// The meaning is the reference backend's (backends/reference/memory.rs): a float source is read as f64
// (exactly), an integer source as i64, then encoded as the destination. Every kernel is a grid-stride loop
// with 64-bit indices; the output is dense (`y[i]`). In `cast_<src>_<dst>` the input is strided
// (`elem_offset`); `cast_vec_<src>_<dst>` is the fast path for a dense input whose first element and the
// output are 16-byte aligned: 16-byte loads and stores, the same per-element conversion. A per-dtype
// variant of this module (`-DTORSH_ONLY_<DTYPE>`) holds the casts from that source dtype.

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

// One element converted from S to D: the conversion of both paths.
template <typename S, typename D> __device__ __forceinline__ D cast_elem(S v) {
    if constexpr (Cvt<S>::is_int) {
        return Cvt<D>::from_i64(Cvt<S>::to_i64(v));
    } else {
        return Cvt<D>::from_f64(Cvt<S>::to_f64(v));
    }
}

// y[i] = x[i] converted from S to D.
template <typename S, typename D>
__device__ void cast_body(const S* x, const Strided& xs, D* y, i64 n) {
    TORSH_GRID_STRIDE(i, n) {
        y[i] = cast_elem<S, D>(x[elem_offset(xs, i)]);
    }
}

// L elements of T moved as one unit; 16-byte aligned and a multiple of 16 bytes, so every access to it
// is one or more 16-byte vector instructions (ld.global.v4 / v2).
template <typename T, int L> struct alignas(16) Pack { T e[L]; };

// Dense x and y, both 16-byte aligned: L = 16 / min(sizeof(S), sizeof(D)) elements per thread and step,
// so the narrower side moves 16 bytes and the wider one a multiple of 16 (f32 -> f16: two 16-byte loads,
// one store); grid-stride over the n / L vectors, then the last n % L elements by the first threads.
template <typename S, typename D> __device__ void cast_vec_body(const S* x, D* y, i64 n) {
    constexpr int L = 16 / (int)(sizeof(S) < sizeof(D) ? sizeof(S) : sizeof(D));
    typedef Pack<S, L> PS;
    typedef Pack<D, L> PD;
    const PS* xv = reinterpret_cast<const PS*>(x);
    PD* yv = reinterpret_cast<PD*>(y);
    const i64 nv = n / L;
    TORSH_GRID_STRIDE(v, nv) {
        const PS p = xv[v];
        PD q;
#pragma unroll
        for (int k = 0; k < L; ++k) {
            q.e[k] = cast_elem<S, D>(p.e[k]);
        }
        yv[v] = q;
    }
    const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n - nv * L) {
        y[nv * L + t] = cast_elem<S, D>(x[nv * L + t]);
    }
}

// X-macro over the destination dtypes for one source (all seven, whatever the variant: a per-dtype
// variant of this module holds the casts *from* its dtype).
#define CAST_TO_EACH(X, S, ST)                                                                \
    X(S, ST, f32, float) X(S, ST, f64, double) X(S, ST, f16, f16_t) X(S, ST, bf16, bf16_t) \
    X(S, ST, i32, i32) X(S, ST, i64, i64) X(S, ST, u8, u8)

// cast_<src>_<dst>(x, xs, y, n): y[0..n) dense, x strided; 49 entry points (7 in a per-dtype variant).
#define CAST_ENTRY(S, ST, D, DT)                                                               \
    extern "C" __global__ void cast_##S##_##D(const ST* x, Strided xs, DT* y, i64 n) {         \
        cast_body<ST, DT>(x, xs, y, n);                                                        \
    }
#define CAST_FROM(S, ST) CAST_TO_EACH(CAST_ENTRY, S, ST)
TORSH_ALL_TYPES(CAST_FROM)
#undef CAST_FROM
#undef CAST_ENTRY
#undef CAST_TO_EACH

// The float destination dtypes for one source: the pairs with a vector fast path.
#define CAST_TO_FLOATS(X, S, ST) \
    X(S, ST, f32, float) X(S, ST, f64, double) X(S, ST, f16, f16_t) X(S, ST, bf16, bf16_t)

// cast_vec_<src>_<dst>(x, y, n): float to float, x (its first element) and y dense and 16-byte aligned;
// 16 entry points (4 in the variant of a float source, none in an integer one).
#define CAST_VEC_ENTRY(S, ST, D, DT)                                                           \
    extern "C" __global__ void cast_vec_##S##_##D(const ST* x, DT* y, i64 n) {                 \
        cast_vec_body<ST, DT>(x, y, n);                                                        \
    }
#define CAST_VEC_FROM(S, ST) CAST_TO_FLOATS(CAST_VEC_ENTRY, S, ST)
TORSH_FLOAT_TYPES(CAST_VEC_FROM)
#undef CAST_VEC_FROM
#undef CAST_VEC_ENTRY
#undef CAST_TO_FLOATS
