// Reductions along one axis of a strided input (module `reduce`).
//
// The input is seen as [n_out, len]: output element j (row-major over the input's dims other than the
// axis, i.e. the contiguous output's index) starts at `strided_offset(rest, j)`, where `rest` is the
// input view without the axis, and its lane runs `len` elements with step `axis_stride`.
//
// A "group" of G threads reduces one lane (G = 1, 32 or 256 = the whole block; blockDim.x is always
// REDUCE_BLOCK). Each thread of the group accumulates every G-th element of the lane in order, then the
// group combines its partials with a tree (warp shuffles, then shared memory across the warps of the
// block). The loop over output elements is uniform across a group, so every thread of a block reaches
// every __syncthreads() (which only the G = 256 form uses, where the group is the whole block).
//
// Semantics (the reference backend's, `backends/reference/reduce.rs`):
// - sum: sums start at -0, the exact identity of + (as Rust's f64 sum), so the sum over an empty axis
//   is -0; mean: sum / len (NaN over an empty axis);
// - var: two passes relative to the lane's first value, mean then sum((x - mean)^2) /
//   max(len - correction, 0);
// - max/min/argmax/argmin: the first extreme element; the first NaN wins outright. Ties compare with
//   ==, so -0 and +0 tie and the earlier one wins. max/min store that element's value, the arg forms
//   its index as i64.

#define REDUCE_BLOCK 256

#define RED_SUM 0
#define RED_MEAN 1
#define RED_MAX 2
#define RED_MIN 3
#define RED_VAR 4
#define RED_ARGMAX 5
#define RED_ARGMIN 6

// A quiet NaN of the accumulator type.
template <typename A> __device__ __forceinline__ A red_nan();
template <> __device__ __forceinline__ float red_nan<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double red_nan<double>() {
    return __longlong_as_double(0x7ff8000000000000LL);
}

// Sum of `v` over the G threads of a group (`torsh_group_reduce` in common.cuh); every thread of the
// group receives the total.
template <int G, typename A>
__device__ __forceinline__ A red_group_sum(A v) {
    static_assert(G == 1 || G == 32 || G == REDUCE_BLOCK, "a group is one thread, one warp or the whole block");
    return torsh_group_reduce<G, TorshSum<A>>(v);
}

// Folds candidate (ov, oi) into the running extreme (v, i). Index < 0 means "no element". The result is
// the candidate with the smaller index among NaNs if either is NaN, else the larger (smaller for
// !is_max) value, ties going to the smaller index: associative and commutative, so any tree order gives
// the reference's sequential answer.
template <typename A>
__device__ __forceinline__ void red_ext_fold(A& v, i64& i, A ov, i64 oi, bool is_max) {
    if (oi < 0) {
        return;
    }
    bool take;
    if (i < 0) {
        take = true;
    } else {
        const bool n = v != v;
        const bool on = ov != ov;
        if (n || on) {
            take = on && (!n || oi < i);
        } else if (ov == v) {
            take = oi < i;
        } else {
            take = is_max ? (ov > v) : (ov < v);
        }
    }
    if (take) {
        v = ov;
        i = oi;
    }
}

// Extreme of (v, i) over the G threads of a group; the result is valid in the group's first thread.
template <int G, typename A>
__device__ __forceinline__ void red_group_ext(A& v, i64& i, bool is_max) {
    if constexpr (G > 1) {
        for (int off = 16; off > 0; off >>= 1) {
            const A ov = __shfl_down_sync(TORSH_FULL_MASK, v, off);
            const i64 oi = __shfl_down_sync(TORSH_FULL_MASK, i, off);
            red_ext_fold(v, i, ov, oi, is_max);
        }
        if constexpr (G == REDUCE_BLOCK) {
            __shared__ A sv[REDUCE_BLOCK / 32];
            __shared__ i64 si[REDUCE_BLOCK / 32];
            const int warp = threadIdx.x >> 5;
            const int lane = threadIdx.x & 31;
            if (lane == 0) {
                sv[warp] = v;
                si[warp] = i;
            }
            __syncthreads();
            if (warp == 0) {
                v = lane < REDUCE_BLOCK / 32 ? sv[lane] : (A)0;
                i = lane < REDUCE_BLOCK / 32 ? si[lane] : (i64)-1;
                for (int off = 16; off > 0; off >>= 1) {
                    const A ov = __shfl_down_sync(TORSH_FULL_MASK, v, off);
                    const i64 oi = __shfl_down_sync(TORSH_FULL_MASK, i, off);
                    red_ext_fold(v, i, ov, oi, is_max);
                }
            }
            // The slots are rewritten by the next output element's reduction.
            __syncthreads();
        }
    }
}

// Sum, mean or variance of one lane; the result is valid in every thread of the group.
template <int G, typename T>
__device__ __forceinline__ typename Num<T>::acc red_moment(const T* p, i64 axis_stride, i64 len, int op,
                                                           i64 correction, int lane) {
    typedef typename Num<T>::acc A;
    if (op != RED_VAR) {
        A s = (A)-0.0;  // The exact identity of +, as Rust's f64 sum starts (the sum of no elements is -0).
        for (i64 a = lane; a < len; a += G) {
            s += Num<T>::load(p[a * axis_stride]);
        }
        s = red_group_sum<G, A>(s);
        return op == RED_SUM ? s : s / (A)len;
    }
    // The variance's moments relative to the lane's first value: a constant lane has deviations of
    // exactly 0 (a mean rounded to the accumulation type would not).
    const A pivot = len > 0 ? Num<T>::load(p[0]) : (A)0;
    A shifted = (A)-0.0;
    for (i64 a = lane; a < len; a += G) {
        shifted += Num<T>::load(p[a * axis_stride]) - pivot;
    }
    const A mean = red_group_sum<G, A>(shifted) / (A)len;
    A q = (A)-0.0;
    for (i64 a = lane; a < len; a += G) {
        const A d = (Num<T>::load(p[a * axis_stride]) - pivot) - mean;
        q += d * d;
    }
    q = red_group_sum<G, A>(q);
    const A den = len > correction ? (A)(len - correction) : (A)0;
    return q / den;
}

// max/min of one lane without indices, for lanes free of NaN whose extreme is not zero: each thread
// folds its elements with a NaN-ignoring fmax (of -x for min, so one combine serves both) and counts
// its NaNs; the group combines both. Returns false, having written nothing, when the lane holds a NaN,
// is empty, or its extreme is ±0 (whose sign the first-wins rule of the exact fold decides); the
// caller then runs the exact fold. Uniform across the group (every thread sees the combined values),
// so every thread of a block reaches the same barriers. About twice the speed of the indexed fold,
// whose per-element branches and 64-bit indices kept too few loads in flight.
template <int G, typename T>
__device__ __forceinline__ bool red_value_extreme(const T* p, i64 axis_stride, i64 len, bool is_max,
                                                  int lane, T* out) {
    typedef typename Num<T>::acc A;
    A m = torsh_neg_inf<A>();
    A nans = (A)0;
#pragma unroll 4
    for (i64 a = lane; a < len; a += G) {
        const A x = Num<T>::load(p[a * axis_stride]);
        m = torsh_fmax(m, is_max ? x : -x);
        nans += x != x ? (A)1 : (A)0;
    }
    m = torsh_group_reduce<G, TorshFmax<A>>(m);
    nans = red_group_sum<G, A>(nans);
    if (len == 0 || nans != (A)0 || m == (A)0) {
        return false;
    }
    if (lane == 0) {
        *out = Num<T>::store(is_max ? m : -m);
    }
    return true;
}

template <int G, typename T>
__device__ void reduce_body(const T* x, void* out, Strided rest, i64 axis_stride, i64 len, i64 n_out,
                            int op, i64 correction) {
    typedef typename Num<T>::acc A;
    const int groups = REDUCE_BLOCK / G;
    const int lane = (int)(threadIdx.x % G);
    const i64 group = (i64)(threadIdx.x / G);
    const bool extreme = op == RED_MAX || op == RED_MIN || op == RED_ARGMAX || op == RED_ARGMIN;
    const bool is_max = op == RED_MAX || op == RED_ARGMAX;
    for (i64 j = (i64)blockIdx.x * groups + group; j < n_out; j += (i64)gridDim.x * groups) {
        const T* p = x + strided_offset(rest, j);
        if ((op == RED_MAX || op == RED_MIN) && red_value_extreme<G, T>(p, axis_stride, len, is_max, lane,
                                                                          (T*)out + j)) {
            continue;
        }
        if (extreme) {
            A v = 0;
            i64 i = -1;
            for (i64 a = lane; a < len; a += G) {
                red_ext_fold(v, i, Num<T>::load(p[a * axis_stride]), a, is_max);
                if (v != v) {
                    break;  // Later elements of this thread cannot beat its first NaN.
                }
            }
            red_group_ext<G, A>(v, i, is_max);
            if (lane == 0) {
                if (op == RED_MAX || op == RED_MIN) {
                    ((T*)out)[j] = Num<T>::store(i < 0 ? red_nan<A>() : v);
                } else {
                    ((i64*)out)[j] = i < 0 ? 0 : i;
                }
            }
        } else {
            const A r = red_moment<G, T>(p, axis_stride, len, op, correction, lane);
            if (lane == 0) {
                ((T*)out)[j] = Num<T>::store(r);
            }
        }
    }
}

// Entry points reduce_g<G>_<dtype>(x, out, rest, axis_stride, len, n_out, op, correction).
#define ENTRY_G(S, T, G)                                                                              \
    extern "C" __global__ void __launch_bounds__(REDUCE_BLOCK) reduce_g##G##_##S(                        \
        const T* x, void* out, Strided rest, i64 axis_stride, i64 len, i64 n_out, int op,           \
        i64 correction) {                                                                             \
        reduce_body<G, T>(x, out, rest, axis_stride, len, n_out, op, correction);                     \
    }
#define ENTRY(S, T) ENTRY_G(S, T, 1) ENTRY_G(S, T, 32) ENTRY_G(S, T, 256)
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY
#undef ENTRY_G
