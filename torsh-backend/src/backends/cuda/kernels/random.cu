// The crate's counter-based random fill (module `random`): `random_<dtype>` per float dtype, and
// dropout by the same streams (`dropout_<dtype>`).
//
// The meaning is the reference backend's (backends/reference/rng.rs, crate::rng): every value is computed
// in f64 exactly as the reference does and rounded once to the dtype. The kernel is a grid-stride loop
// with 64-bit indices over a dense output.

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

// dropout_<dtype>(x, y, n, seed, threshold, scale): y[i] = x[i] * scale where the top 53 bits of
// bits(seed, i) are at least `threshold`, else 0 (DropoutDesc): the product in f64, rounded once.
// x and y dense; y may be x.
template <typename T>
__device__ void dropout_body(const T* x, T* y, i64 n, u64 seed, u64 threshold, double scale) {
    TORSH_GRID_STRIDE(i, n) {
        const bool kept = (rng_bits(seed, (u64)i) >> 11) >= threshold;
        const double v = kept ? __dmul_rn((double)Num<T>::load(x[i]), scale) : 0.0;
        y[i] = Num<T>::from_double(v);
    }
}

#define ENTRY(S, T)                                                                     \
    extern "C" __global__ void dropout_##S(const T* x, T* y, i64 n, u64 seed,          \
                                           u64 threshold, double scale) {              \
        dropout_body<T>(x, y, n, seed, threshold, scale);                              \
    }
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY
