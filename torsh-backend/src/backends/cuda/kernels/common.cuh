// Shared declarations, prepended to every kernel source. No toolkit headers: 16-bit floats are raw bits.
//
// Conventions every kernel follows:
// - One `extern "C"` entry point per (op, dtype), named `<op>_<dtype>` with dtype one of f32, f64, f16,
//   bf16; the body is a template over the storage type T and its accumulator `typename Num<T>::acc`
//   (double for f64, float otherwise).
// - Element counts and offsets are 64-bit (`i64`); loops are grid-stride so any grid size is correct.
// - Strided operands arrive as a `Strided` by value: shape and strides in elements, row-major order of
//   the logical index, plus an element offset from the base pointer.

typedef unsigned short u16;
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

// Grid-stride loop over [0, n).
#define TORSH_GRID_STRIDE(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// X-macro over the float dtypes: `TORSH_FLOAT_TYPES(ENTRY)` expands `ENTRY(suffix, type)` four times.
// A source defines ENTRY to declare one `extern "C"` entry point per dtype that calls its template body:
//   #define ENTRY(S, T) extern "C" __global__ void neg_##S(const T* x, T* y, i64 n) { neg_body<T>(x, y, n); }
//   TORSH_FLOAT_TYPES(ENTRY)
//   #undef ENTRY
#define TORSH_FLOAT_TYPES(X) X(f32, float) X(f64, double) X(f16, f16_t) X(bf16, bf16_t)
