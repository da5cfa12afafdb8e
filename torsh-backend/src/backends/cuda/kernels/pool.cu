// 2-D max and average pooling over contiguous NCHW operands: one thread per output element, grid-stride;
// the max pool that also writes its positions; and the input gradients, one thread per input element.
//
// Semantics are the reference backend's (backends/reference/pool.rs): the window of output (oy, ox)
// covers input rows oy*sh + r - ph (r < kh) and columns ox*sw + s - pw (s < kw); taps outside the
// input are skipped. Max: -inf when no tap is inside, NaN as soon as one tap is NaN. Average: the sum
// of the taps inside divided by kh*kw (count_include_pad) or by the number of taps inside (0/0 = NaN
// when there are none). Taps are visited row by row, as the reference sums them.

// How a window is combined; the host's MODE_* constants (pool.rs).
#define POOL_MAX 0
#define POOL_AVG_INCLUDE_PAD 1
#define POOL_AVG_EXCLUDE_PAD 2

// The launch's geometry; the same layout as `PoolGeometry` in pool.rs. All sizes are in elements.
struct PoolGeometry {
    i64 total;      // N*C*OH*OW output elements
    i64 height;     // H
    i64 width;      // W
    i64 out_height; // OH
    i64 out_width;  // OW
    i64 kernel_h;
    i64 kernel_w;
    i64 stride_h;
    i64 stride_w;
    i64 pad_h;
    i64 pad_w;
    double area;    // kh*kw, the divisor when padding counts
    int mode;       // POOL_*
    int pad_;
};

__device__ __forceinline__ i64 pool_max_i64(i64 a, i64 b) { return a > b ? a : b; }
__device__ __forceinline__ i64 pool_min_i64(i64 a, i64 b) { return a < b ? a : b; }

// -infinity in the accumulator type.
template <typename A> __device__ __forceinline__ A pool_neg_inf();
template <> __device__ __forceinline__ float pool_neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double pool_neg_inf<double>() {
    return __longlong_as_double(0xfff0000000000000LL);
}

// The taps of one window that lie inside the input: rows [r0, r1) and columns [s0, s1) of the kernel,
// with (y0, x0) the input coordinate of tap (0, 0). Empty ranges have r1 <= r0 or s1 <= s0.
struct PoolWindow {
    i64 y0, x0, r0, r1, s0, s1;
};

// The window of output (oy, ox). The host guarantees H + 2*ph and W + 2*pw fit in i64, so no step here
// overflows.
__device__ __forceinline__ PoolWindow pool_window(const PoolGeometry& g, i64 oy, i64 ox) {
    PoolWindow w;
    w.y0 = oy * g.stride_h - g.pad_h;
    w.x0 = ox * g.stride_w - g.pad_w;
    w.r0 = pool_max_i64(0, -w.y0);
    w.r1 = pool_min_i64(g.kernel_h, g.height - w.y0);
    w.s0 = pool_max_i64(0, -w.x0);
    w.s1 = pool_min_i64(g.kernel_w, g.width - w.x0);
    return w;
}

// Number of taps of `w` inside the input.
__device__ __forceinline__ i64 pool_count(const PoolWindow& w) {
    return (w.r1 > w.r0 && w.s1 > w.s0) ? (w.r1 - w.r0) * (w.s1 - w.s0) : 0;
}

// Maximum over the taps inside the input of one plane `xp`; a NaN tap makes (and keeps) it NaN.
template <typename T>
__device__ __forceinline__ typename Num<T>::acc pool_window_max(
    const T* __restrict__ xp, const PoolGeometry& g, const PoolWindow& w) {
    typedef typename Num<T>::acc A;
    A m = pool_neg_inf<A>();
    for (i64 r = w.r0; r < w.r1; ++r) {
        const T* row = xp + (w.y0 + r) * g.width + w.x0;
        for (i64 s = w.s0; s < w.s1; ++s) {
            A v = Num<T>::load(row[s]);
            // v > m is false once m is NaN, so NaN sticks; a NaN v is taken.
            m = (v > m || v != v) ? v : m;
        }
    }
    return m;
}

// Sum over the taps inside the input of one plane `xp`, row by row.
template <typename T>
__device__ __forceinline__ typename Num<T>::acc pool_window_sum(
    const T* __restrict__ xp, const PoolGeometry& g, const PoolWindow& w) {
    typedef typename Num<T>::acc A;
    A sum = (A)0;
    for (i64 r = w.r0; r < w.r1; ++r) {
        const T* row = xp + (w.y0 + r) * g.width + w.x0;
        for (i64 s = w.s0; s < w.s1; ++s) {
            sum += Num<T>::load(row[s]);
        }
    }
    return sum;
}

// y[n, c, oy, ox] for every output element; `g.total` > 0.
template <typename T>
__device__ __forceinline__ void pool2d_body(T* __restrict__ y, const T* __restrict__ x, const PoolGeometry& g) {
    typedef typename Num<T>::acc A;
    const i64 plane_size = g.height * g.width;
    TORSH_GRID_STRIDE(i, g.total) {
        const i64 ox = i % g.out_width;
        const i64 rest = i / g.out_width;
        const i64 oy = rest % g.out_height;
        const i64 plane = rest / g.out_height;
        const T* xp = x + plane * plane_size;
        const PoolWindow w = pool_window(g, oy, ox);
        A out;
        if (g.mode == POOL_MAX) {
            out = pool_window_max<T>(xp, g, w);
        } else if (g.mode == POOL_AVG_INCLUDE_PAD) {
            out = pool_window_sum<T>(xp, g, w) / (A)g.area;
        } else {
            out = pool_window_sum<T>(xp, g, w) / (A)pool_count(w);
        }
        y[i] = Num<T>::store(out);
    }
}

#define ENTRY(S, T)                                                                                   \
    extern "C" __global__ void pool2d_##S(T* __restrict__ y, const T* __restrict__ x, const PoolGeometry g) { \
        pool2d_body<T>(y, x, g);                                                                      \
    }
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY

// The max pool that also writes, as i64, each window's position `iy * W + ix` in its plane: the first
// tap holding the largest value in row-major window order, or the last NaN tap. The value written is
// the input there. `g.total` is the number of outputs.
template <typename T>
__device__ __forceinline__ void max_pool2d_indices_body(
    T* __restrict__ y, i64* __restrict__ idx, const T* __restrict__ x, const PoolGeometry& g) {
    typedef typename Num<T>::acc A;
    const i64 plane_size = g.height * g.width;
    TORSH_GRID_STRIDE(i, g.total) {
        const i64 ox = i % g.out_width;
        const i64 rest = i / g.out_width;
        const i64 oy = rest % g.out_height;
        const i64 plane = rest / g.out_height;
        const T* xp = x + plane * plane_size;
        const PoolWindow w = pool_window(g, oy, ox);
        A best = pool_neg_inf<A>();
        i64 at = -1;
        for (i64 r = w.r0; r < w.r1; ++r) {
            for (i64 s = w.s0; s < w.s1; ++s) {
                const i64 k = (w.y0 + r) * g.width + w.x0 + s;
                A v = Num<T>::load(xp[k]);
                if (at < 0 || v > best || v != v) {
                    best = v;
                    at = k;
                }
            }
        }
        // Every window holds a real tap (padding is at most half the window).
        at = at < 0 ? 0 : at;
        y[i] = xp[at];
        idx[i] = at;
    }
}

// The windows along an axis holding input position `i`: `o` in [*lo, *hi) with
// `o * stride <= i + pad < o * stride + k` and `o < n`.
__device__ __forceinline__ void pool_windows_over(i64 i, i64 n, i64 k, i64 stride, i64 pad, i64* lo, i64* hi) {
    const i64 q = i + pad;
    *lo = q + 1 > k ? (q + 1 - k + stride - 1) / stride : 0;
    *hi = pool_min_i64(q / stride + 1, n);
    *hi = pool_max_i64(*hi, *lo);
}

// The input gradient: each thread sums, over the windows holding its element in row-major window
// order (the reference's order), the window's gradient (max: when the window's position is this
// element; average: divided by the window's divisor). No atomics. A position that is not an element
// inside its own window is never followed: the thread of the window's first real tap raises the error
// flag with op code `op`. `g.total` is the number of input elements; `idx` is unused by averages.
template <typename T>
__device__ __forceinline__ void pool2d_backward_body(
    T* __restrict__ dx, const T* __restrict__ dy, const i64* __restrict__ idx, const PoolGeometry& g,
    u64* flag, i64 op) {
    typedef typename Num<T>::acc A;
    const i64 plane_size = g.height * g.width;
    const i64 out_plane = g.out_height * g.out_width;
    TORSH_GRID_STRIDE(i, g.total) {
        const i64 plane = i / plane_size;
        const i64 at = i % plane_size;
        const i64 iy = at / g.width;
        const i64 ix = at % g.width;
        i64 oy0, oy1, ox0, ox1;
        pool_windows_over(iy, g.out_height, g.kernel_h, g.stride_h, g.pad_h, &oy0, &oy1);
        pool_windows_over(ix, g.out_width, g.kernel_w, g.stride_w, g.pad_w, &ox0, &ox1);
        const T* gp = dy + plane * out_plane;
        A sum = (A)0;
        for (i64 oy = oy0; oy < oy1; ++oy) {
            for (i64 ox = ox0; ox < ox1; ++ox) {
                const i64 o = oy * g.out_width + ox;
                const A grad = Num<T>::load(gp[o]);
                const PoolWindow w = pool_window(g, oy, ox);
                if (g.mode == POOL_MAX) {
                    const i64 v = idx[plane * out_plane + o];
                    if (v == at) {
                        sum += grad;
                    }
                    if (iy == w.y0 + w.r0 && ix == w.x0 + w.s0) {
                        const bool inside = v >= 0 && v < plane_size && v / g.width >= w.y0 + w.r0 &&
                                            v / g.width < w.y0 + w.r1 && v % g.width >= w.x0 + w.s0 &&
                                            v % g.width < w.x0 + w.s1;
                        if (!inside) {
                            raise_index_error(flag, v, op, plane_size);
                        }
                    }
                } else if (g.mode == POOL_AVG_INCLUDE_PAD) {
                    sum += grad / (A)g.area;
                } else {
                    sum += grad / (A)pool_count(w);
                }
            }
        }
        dx[i] = Num<T>::store(sum);
    }
}

#define ENTRY(S, T)                                                                                   \
    extern "C" __global__ void max_pool2d_indices_##S(T* __restrict__ y, i64* __restrict__ idx,       \
                                                       const T* __restrict__ x, const PoolGeometry g) { \
        max_pool2d_indices_body<T>(y, idx, x, g);                                                     \
    }                                                                                                 \
    extern "C" __global__ void pool2d_backward_##S(T* __restrict__ dx, const T* __restrict__ dy,      \
                                                    const i64* __restrict__ idx, const PoolGeometry g, \
                                                    u64* flag, i64 op) {                              \
        pool2d_backward_body<T>(dx, dy, idx, g, flag, op);                                            \
    }
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY
