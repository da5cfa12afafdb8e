// Softmax, layer norm and batch norm (module `norm`).
//
// Every kernel gives one "row" (a softmax lane, a layer-norm row, a batch-norm channel) to a group of G
// threads (G = 1, 32 or 256 = the whole block; blockDim.x is always NORM_BLOCK). Each thread accumulates
// every G-th element of the row in order, then the group combines its partials with a tree (warp
// shuffles, then shared memory across the warps of the block). The loop over rows is uniform across a
// group, so every thread of a block reaches every __syncthreads() (which only the G = 256 form uses,
// where the group is the whole block).
//
// Semantics (the reference backend's, `backends/reference/norm.rs`):
// - softmax: m = max of the lane ignoring NaN (fmax; -inf when every element is NaN), s = sum(exp(x - m)),
//   y = exp(x - m) / s, or for log-softmax y = (x - m) - log(s);
// - softmax's gradient from dy and the forward's y: dx = y * (dy - sum(dy * y)), or for log-softmax
//   dx = dy - exp(y) * sum(dy), a group per lane;
// - cross-entropy of [rows, classes] logits against a target class per row (a group per row), with
//   label smoothing eps: lse = m + log(s), the loss lse - (1 - eps) * x_t - eps * mean(x) (terms with a
//   factor of 0 skipped, computed in double), or with per-row gradients w the logits' gradient
//   w * (exp(x - lse) - eps / classes - (1 - eps) * [c == t]); a row whose target is the ignore index
//   gives 0, any other target outside [0, classes) raises the error flag and leaves its row unwritten;
// - layer norm and batch norm: two passes, mean then biased variance sum((x - mean)^2) / n,
//   y = (x - mean) * (1 / sqrt(var + eps)) * weight + bias (weight 1 and bias 0 when absent); the
//   moments are taken relative to a pivot, the row's or channel's first value, so that a constant
//   row has deviations of exactly 0 and normalises to exactly 0 (its bias);
// - batch norm in training normalises with the batch statistics and, when running statistics are given,
//   updates them to (1 - momentum) * old + momentum * new, with the unbiased variance var * n / (n - 1);
//   in inference it normalises with the running statistics.
// Sums start at -0, the exact identity of + (as Rust's f64 sum does).
// The forwards write the mean and 1 / sqrt(var + eps) they normalised with (in the accumulator type,
// the statistics' dtype: float for half, bfloat16 and float, double for double) where `save_mean` and
// `save_invstd` are not null.
//
// Gradients, from such statistics (xhat = (x - mean) * invstd, g = dy * weight):
// - layer norm: dx = invstd * (g - mean(g) - xhat * mean(g * xhat)) per row, a group per row;
//   dweight = sum over rows of dy * xhat, dbias = sum of dy, a thread per column;
// - batch norm: per channel (a group each) sum_dy = sum dy, sum_dyx = sum dy * xhat; dweight =
//   sum_dyx, dbias = sum_dy; dx = weight * invstd * (dy - sum_dy / M - xhat * sum_dyx / M) in training,
//   weight * invstd * dy otherwise. Null outputs are not written.

#define NORM_BLOCK 256

__device__ __forceinline__ float norm_exp(float a) { return expf(a); }
__device__ __forceinline__ double norm_exp(double a) { return exp(a); }
__device__ __forceinline__ float norm_log(float a) { return logf(a); }
__device__ __forceinline__ double norm_log(double a) { return log(a); }
__device__ __forceinline__ float norm_sqrt(float a) { return sqrtf(a); }
__device__ __forceinline__ double norm_sqrt(double a) { return sqrt(a); }

// Sum and NaN-ignoring max of `v` over the G threads of a group (`torsh_group_reduce` in common.cuh);
// every thread of the group receives the result.
template <int G, typename A>
__device__ __forceinline__ A norm_group_sum(A v) {
    static_assert(G == 1 || G == 32 || G == NORM_BLOCK, "a group is one thread, one warp or the whole block");
    return torsh_group_reduce<G, TorshSum<A>>(v);
}

template <int G, typename A>
__device__ __forceinline__ A norm_group_max(A v) {
    static_assert(G == 1 || G == 32 || G == NORM_BLOCK, "a group is one thread, one warp or the whole block");
    return torsh_group_reduce<G, TorshFmax<A>>(v);
}

// ---------------------------------------------------------------------------------------------------
// Softmax of a contiguous [outer, len, inner] tensor along the middle dim: row r = (o, i) has its
// elements at (o * len + a) * inner + i.

template <int G, typename T>
__device__ void softmax_body(const T* x, T* y, i64 outer, i64 len, i64 inner, int log_softmax) {
    typedef typename Num<T>::acc A;
    const int groups = NORM_BLOCK / G;
    const int lane = (int)(threadIdx.x % G);
    const i64 group = (i64)(threadIdx.x / G);
    const i64 rows = outer * inner;
    for (i64 r = (i64)blockIdx.x * groups + group; r < rows; r += (i64)gridDim.x * groups) {
        const i64 o = r / inner;
        const i64 base = o * len * inner + (r - o * inner);
        const T* xr = x + base;
        T* yr = y + base;
        A m = torsh_neg_inf<A>();
        for (i64 a = lane; a < len; a += G) {
            m = torsh_fmax(m, Num<T>::load(xr[a * inner]));
        }
        m = norm_group_max<G, A>(m);
        A s = (A)-0.0;
        for (i64 a = lane; a < len; a += G) {
            s += norm_exp(Num<T>::load(xr[a * inner]) - m);
        }
        s = norm_group_sum<G, A>(s);
        const A log_s = norm_log(s);
        for (i64 a = lane; a < len; a += G) {
            const A d = Num<T>::load(xr[a * inner]) - m;
            yr[a * inner] = Num<T>::store(log_softmax ? d - log_s : norm_exp(d) / s);
        }
    }
}

// The input gradient of softmax (or log-softmax) over the same layout, from the output's gradient `dy`
// and the forward's output `y`.
template <int G, typename T>
__device__ void softmax_backward_body(const T* dy, const T* y, T* dx, i64 outer, i64 len, i64 inner,
                                      int log_softmax) {
    typedef typename Num<T>::acc A;
    const int groups = NORM_BLOCK / G;
    const int lane = (int)(threadIdx.x % G);
    const i64 group = (i64)(threadIdx.x / G);
    const i64 rows = outer * inner;
    for (i64 r = (i64)blockIdx.x * groups + group; r < rows; r += (i64)gridDim.x * groups) {
        const i64 o = r / inner;
        const i64 base = o * len * inner + (r - o * inner);
        const T* gr = dy + base;
        const T* yr = y + base;
        T* dr = dx + base;
        A s = (A)-0.0;
        for (i64 a = lane; a < len; a += G) {
            const A g = Num<T>::load(gr[a * inner]);
            s += log_softmax ? g : g * Num<T>::load(yr[a * inner]);
        }
        s = norm_group_sum<G, A>(s);
        for (i64 a = lane; a < len; a += G) {
            const A g = Num<T>::load(gr[a * inner]);
            const A v = Num<T>::load(yr[a * inner]);
            dr[a * inner] = Num<T>::store(log_softmax ? g - norm_exp(v) * s : v * (g - s));
        }
    }
}

// Cross-entropy of contiguous [rows, classes] logits `x` against `target`: the losses into `out` ([rows])
// when `w` is null, else the logits' gradient ([rows, classes]) scaled by w[row].
template <int G, typename T, typename I>
__device__ void cross_entropy_body(const T* x, const I* target, const T* w, T* out, i64 rows, i64 classes,
                                   int has_ignore, i64 ignore, double eps, u64* flag, i64 op) {
    typedef typename Num<T>::acc A;
    const int groups = NORM_BLOCK / G;
    const int lane = (int)(threadIdx.x % G);
    const i64 group = (i64)(threadIdx.x / G);
    for (i64 r = (i64)blockIdx.x * groups + group; r < rows; r += (i64)gridDim.x * groups) {
        // Every lane of the group reads the same target, so the branches below are uniform.
        const i64 t = (i64)target[r];
        const T* xr = x + r * classes;
        if (has_ignore && t == ignore) {
            if (w) {
                for (i64 a = lane; a < classes; a += G) {
                    out[r * classes + a] = Num<T>::store((A)0);
                }
            } else if (lane == 0) {
                out[r] = Num<T>::store((A)0);
            }
            continue;
        }
        if (t < 0 || t >= classes) {
            if (lane == 0) {
                raise_index_error(flag, t, op, classes);
            }
            continue;
        }
        A m = torsh_neg_inf<A>();
        for (i64 a = lane; a < classes; a += G) {
            m = torsh_fmax(m, Num<T>::load(xr[a]));
        }
        m = norm_group_max<G, A>(m);
        A s = (A)-0.0;
        A sx = (A)-0.0;
        for (i64 a = lane; a < classes; a += G) {
            const A v = Num<T>::load(xr[a]);
            s += norm_exp(v - m);
            sx += v;
        }
        s = norm_group_sum<G, A>(s);
        sx = norm_group_sum<G, A>(sx);
        const A lse = m + norm_log(s);
        if (!w) {
            if (lane == 0) {
                double loss = (double)lse;
                if (eps < 1.0) {
                    loss -= (1.0 - eps) * (double)Num<T>::load(xr[t]);
                }
                if (eps > 0.0) {
                    loss -= eps * (double)sx / (double)classes;
                }
                out[r] = Num<T>::store((A)loss);
            }
            continue;
        }
        const A k = Num<T>::load(w[r]);
        const A spread = (A)(eps / (double)classes);
        const A hot = (A)(1.0 - eps);
        for (i64 a = lane; a < classes; a += G) {
            A g = norm_exp(Num<T>::load(xr[a]) - lse) - spread;
            if (a == t) {
                g -= hot;
            }
            out[r * classes + a] = Num<T>::store(k * g);
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Layer norm of a contiguous [rows, cols] tensor over each row. `w` and `b` may be null.

template <int G, typename T>
__device__ void layer_norm_body(const T* x, const T* w, const T* b, T* y, i64 rows, i64 cols,
                                double eps, typename Num<T>::acc* save_mean,
                                typename Num<T>::acc* save_invstd) {
    typedef typename Num<T>::acc A;
    const int groups = NORM_BLOCK / G;
    const int lane = (int)(threadIdx.x % G);
    const i64 group = (i64)(threadIdx.x / G);
    for (i64 r = (i64)blockIdx.x * groups + group; r < rows; r += (i64)gridDim.x * groups) {
        const T* xr = x + r * cols;
        T* yr = y + r * cols;
        const A pivot = cols > 0 ? Num<T>::load(xr[0]) : (A)0;
        A s = (A)-0.0;
        for (i64 c = lane; c < cols; c += G) {
            s += Num<T>::load(xr[c]) - pivot;
        }
        const A mean = norm_group_sum<G, A>(s) / (A)cols;
        A q = (A)-0.0;
        for (i64 c = lane; c < cols; c += G) {
            const A d = (Num<T>::load(xr[c]) - pivot) - mean;
            q += d * d;
        }
        const A var = norm_group_sum<G, A>(q) / (A)cols;
        const A inv = (A)1 / norm_sqrt(var + (A)eps);
        if (save_mean && lane == 0) {
            save_mean[r] = pivot + mean;
            save_invstd[r] = inv;
        }
        for (i64 c = lane; c < cols; c += G) {
            const A scale = w ? Num<T>::load(w[c]) : (A)1;
            const A shift = b ? Num<T>::load(b[c]) : (A)0;
            yr[c] = Num<T>::store(((Num<T>::load(xr[c]) - pivot) - mean) * inv * scale + shift);
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Batch norm of a contiguous [batch, channels, spatial] tensor per channel: channel c's k-th value
// (k = n * spatial + s) is at (n * channels + c) * spatial + s. `w`, `b`, `rm`, `rv` may be null (rm and
// rv together).

// Walks the k = lane, lane + G, ... values of one channel without a division per step.
struct NormChannelCursor {
    i64 n;
    i64 s;
    i64 dn;
    i64 ds;
    i64 spatial;

    __device__ __forceinline__ NormChannelCursor(i64 start, i64 step, i64 spatial_)
        : n(start / spatial_), s(start % spatial_), dn(step / spatial_), ds(step % spatial_),
          spatial(spatial_) {}

    __device__ __forceinline__ i64 offset(i64 channels, i64 c) const { return (n * channels + c) * spatial + s; }

    __device__ __forceinline__ void advance() {
        n += dn;
        s += ds;
        if (s >= spatial) {
            s -= spatial;
            n += 1;
        }
    }
};

template <int G, typename T>
__device__ void batch_norm_body(const T* x, T* y, const T* w, const T* b, T* rm, T* rv, i64 batch,
                                i64 channels, i64 spatial, int training, double momentum, double eps,
                                typename Num<T>::acc* save_mean, typename Num<T>::acc* save_invstd) {
    typedef typename Num<T>::acc A;
    const int groups = NORM_BLOCK / G;
    const int lane = (int)(threadIdx.x % G);
    const i64 group = (i64)(threadIdx.x / G);
    const i64 count = batch * spatial;
    for (i64 c = (i64)blockIdx.x * groups + group; c < channels; c += (i64)gridDim.x * groups) {
        A pivot = 0;
        A mean = 0;
        A var = 1;
        if (training) {
            pivot = count > 0 ? Num<T>::load(x[c * spatial]) : (A)0;
            A s = (A)-0.0;
            NormChannelCursor k(lane, G, spatial);
            for (i64 i = lane; i < count; i += G, k.advance()) {
                s += Num<T>::load(x[k.offset(channels, c)]) - pivot;
            }
            mean = norm_group_sum<G, A>(s) / (A)count;
            A q = (A)-0.0;
            NormChannelCursor k2(lane, G, spatial);
            for (i64 i = lane; i < count; i += G, k2.advance()) {
                const A d = (Num<T>::load(x[k2.offset(channels, c)]) - pivot) - mean;
                q += d * d;
            }
            var = norm_group_sum<G, A>(q) / (A)count;
            if (rm && rv && lane == 0) {
                const A mom = (A)momentum;
                const A unbiased = var * (A)count / ((A)count - (A)1);
                rm[c] = Num<T>::store(((A)1 - mom) * Num<T>::load(rm[c]) + mom * (pivot + mean));
                rv[c] = Num<T>::store(((A)1 - mom) * Num<T>::load(rv[c]) + mom * unbiased);
            }
        } else if (rm && rv) {
            mean = Num<T>::load(rm[c]);
            var = Num<T>::load(rv[c]);
        }
        const A inv = (A)1 / norm_sqrt(var + (A)eps);
        if (save_mean && lane == 0) {
            save_mean[c] = pivot + mean;
            save_invstd[c] = inv;
        }
        const A scale = w ? Num<T>::load(w[c]) : (A)1;
        const A shift = b ? Num<T>::load(b[c]) : (A)0;
        NormChannelCursor k(lane, G, spatial);
        for (i64 i = lane; i < count; i += G, k.advance()) {
            const i64 off = k.offset(channels, c);
            y[off] = Num<T>::store(((Num<T>::load(x[off]) - pivot) - mean) * inv * scale + shift);
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Gradients.

template <int G, typename T>
__device__ void layer_norm_backward_input_body(const T* dy, const T* x, const T* w,
                                               const typename Num<T>::acc* mean,
                                               const typename Num<T>::acc* invstd, T* dx, i64 rows,
                                               i64 cols) {
    typedef typename Num<T>::acc A;
    const int groups = NORM_BLOCK / G;
    const int lane = (int)(threadIdx.x % G);
    const i64 group = (i64)(threadIdx.x / G);
    for (i64 r = (i64)blockIdx.x * groups + group; r < rows; r += (i64)gridDim.x * groups) {
        const T* dyr = dy + r * cols;
        const T* xr = x + r * cols;
        const A m = mean[r];
        const A inv = invstd[r];
        A sg = (A)-0.0;
        A sgx = (A)-0.0;
        for (i64 c = lane; c < cols; c += G) {
            const A g = Num<T>::load(dyr[c]) * (w ? Num<T>::load(w[c]) : (A)1);
            sg += g;
            sgx += g * ((Num<T>::load(xr[c]) - m) * inv);
        }
        const A mean_g = norm_group_sum<G, A>(sg) / (A)cols;
        const A mean_gx = norm_group_sum<G, A>(sgx) / (A)cols;
        for (i64 c = lane; c < cols; c += G) {
            const A g = Num<T>::load(dyr[c]) * (w ? Num<T>::load(w[c]) : (A)1);
            const A h = (Num<T>::load(xr[c]) - m) * inv;
            dx[r * cols + c] = Num<T>::store(inv * ((g - mean_g) - h * mean_gx));
        }
    }
}

// A thread per column (grid-stride), walking every row.
template <typename T>
__device__ void layer_norm_backward_params_body(const T* dy, const T* x,
                                                const typename Num<T>::acc* mean,
                                                const typename Num<T>::acc* invstd, T* dw, T* db,
                                                i64 rows, i64 cols) {
    typedef typename Num<T>::acc A;
    for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < cols;
         c += (i64)gridDim.x * blockDim.x) {
        A sw = (A)-0.0;
        A sb = (A)-0.0;
        for (i64 r = 0; r < rows; r++) {
            const A g = Num<T>::load(dy[r * cols + c]);
            sw += g * ((Num<T>::load(x[r * cols + c]) - mean[r]) * invstd[r]);
            sb += g;
        }
        if (dw) {
            dw[c] = Num<T>::store(sw);
        }
        if (db) {
            db[c] = Num<T>::store(sb);
        }
    }
}

template <int G, typename T>
__device__ void batch_norm_backward_body(const T* dy, const T* x, const T* w,
                                         const typename Num<T>::acc* mean,
                                         const typename Num<T>::acc* invstd, T* dx, T* dw, T* db,
                                         i64 batch, i64 channels, i64 spatial, int training) {
    typedef typename Num<T>::acc A;
    const int groups = NORM_BLOCK / G;
    const int lane = (int)(threadIdx.x % G);
    const i64 group = (i64)(threadIdx.x / G);
    const i64 count = batch * spatial;
    for (i64 c = (i64)blockIdx.x * groups + group; c < channels; c += (i64)gridDim.x * groups) {
        const A m = mean[c];
        const A inv = invstd[c];
        A sd = (A)-0.0;
        A sdx = (A)-0.0;
        NormChannelCursor k(lane, G, spatial);
        for (i64 i = lane; i < count; i += G, k.advance()) {
            const i64 off = k.offset(channels, c);
            const A g = Num<T>::load(dy[off]);
            sd += g;
            sdx += g * (Num<T>::load(x[off]) - m);
        }
        sd = norm_group_sum<G, A>(sd);
        const A sdh = norm_group_sum<G, A>(sdx) * inv;
        if (lane == 0) {
            if (dw) {
                dw[c] = Num<T>::store(sdh);
            }
            if (db) {
                db[c] = Num<T>::store(sd);
            }
        }
        if (!dx) {
            continue;
        }
        // dx = a * ((dy - k0) - (x - mean) * bx): the mean gradient subtracted before the scale.
        const A a = (w ? Num<T>::load(w[c]) : (A)1) * inv;
        const A bx = training ? inv * sdh / (A)count : (A)0;
        const A k0 = training ? sd / (A)count : (A)0;
        NormChannelCursor k2(lane, G, spatial);
        for (i64 i = lane; i < count; i += G, k2.advance()) {
            const i64 off = k2.offset(channels, c);
            const A v = a * ((Num<T>::load(dy[off]) - k0) - (Num<T>::load(x[off]) - m) * bx);
            dx[off] = Num<T>::store(v);
        }
    }
}

// Entry points, for G in {1, 32, 256} (A is the accumulator type, Num<T>::acc):
//   softmax_g<G>_<dtype>(x, y, outer, len, inner, log_softmax)
//   layer_norm_g<G>_<dtype>(x, w, b, y, rows, cols, eps, save_mean, save_invstd)
//   softmax_backward_g<G>_<dtype>(dy, y, dx, outer, len, inner, log_softmax)
//   cross_entropy_g<G>_<dtype>_<i32|i64>(x, target, w, out, rows, classes, has_ignore, ignore, eps,
//                                        flag, op)
//   batch_norm_g<G>_<dtype>(x, y, w, b, rm, rv, batch, channels, spatial, training, momentum, eps,
//                           save_mean, save_invstd)
//   layer_norm_backward_input_g<G>_<dtype>(dy, x, w, mean, invstd, dx, rows, cols)
//   batch_norm_backward_g<G>_<dtype>(dy, x, w, mean, invstd, dx, dw, db, batch, channels, spatial,
//                                    training)
// and, once per dtype, layer_norm_backward_params_<dtype>(dy, x, mean, invstd, dw, db, rows, cols).
#define ENTRY_G(S, T, G)                                                                              \
    extern "C" __global__ void __launch_bounds__(NORM_BLOCK) softmax_g##G##_##S(                      \
        const T* x, T* y, i64 outer, i64 len, i64 inner, int log_softmax) {                           \
        softmax_body<G, T>(x, y, outer, len, inner, log_softmax);                                     \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(NORM_BLOCK) softmax_backward_g##G##_##S(             \
        const T* dy, const T* y, T* dx, i64 outer, i64 len, i64 inner, int log_softmax) {             \
        softmax_backward_body<G, T>(dy, y, dx, outer, len, inner, log_softmax);                       \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(NORM_BLOCK) cross_entropy_g##G##_##S##_i32(          \
        const T* x, const i32* target, const T* w, T* out, i64 rows, i64 classes, int has_ignore,     \
        i64 ignore, double eps, u64* flag, i64 op) {                                                  \
        cross_entropy_body<G, T, i32>(x, target, w, out, rows, classes, has_ignore, ignore, eps,      \
                                      flag, op);                                                      \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(NORM_BLOCK) cross_entropy_g##G##_##S##_i64(          \
        const T* x, const i64* target, const T* w, T* out, i64 rows, i64 classes, int has_ignore,     \
        i64 ignore, double eps, u64* flag, i64 op) {                                                  \
        cross_entropy_body<G, T, i64>(x, target, w, out, rows, classes, has_ignore, ignore, eps,      \
                                      flag, op);                                                      \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(NORM_BLOCK) layer_norm_g##G##_##S(                   \
        const T* x, const T* w, const T* b, T* y, i64 rows, i64 cols, double eps,                     \
        Num<T>::acc* save_mean, Num<T>::acc* save_invstd) {                                           \
        layer_norm_body<G, T>(x, w, b, y, rows, cols, eps, save_mean, save_invstd);                   \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(NORM_BLOCK) batch_norm_g##G##_##S(                   \
        const T* x, T* y, const T* w, const T* b, T* rm, T* rv, i64 batch, i64 channels,             \
        i64 spatial, int training, double momentum, double eps, Num<T>::acc* save_mean,              \
        Num<T>::acc* save_invstd) {                                                                   \
        batch_norm_body<G, T>(x, y, w, b, rm, rv, batch, channels, spatial, training, momentum, eps,  \
                              save_mean, save_invstd);                                                \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(NORM_BLOCK) layer_norm_backward_input_g##G##_##S(   \
        const T* dy, const T* x, const T* w, const Num<T>::acc* mean, const Num<T>::acc* invstd,      \
        T* dx, i64 rows, i64 cols) {                                                                  \
        layer_norm_backward_input_body<G, T>(dy, x, w, mean, invstd, dx, rows, cols);                 \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(NORM_BLOCK) batch_norm_backward_g##G##_##S(          \
        const T* dy, const T* x, const T* w, const Num<T>::acc* mean, const Num<T>::acc* invstd,      \
        T* dx, T* dw, T* db, i64 batch, i64 channels, i64 spatial, int training) {                    \
        batch_norm_backward_body<G, T>(dy, x, w, mean, invstd, dx, dw, db, batch, channels, spatial,  \
                                       training);                                                     \
    }
#define ENTRY(S, T)                                                                                   \
    ENTRY_G(S, T, 1) ENTRY_G(S, T, 32) ENTRY_G(S, T, 256)                                             \
    extern "C" __global__ void layer_norm_backward_params_##S(                                        \
        const T* dy, const T* x, const Num<T>::acc* mean, const Num<T>::acc* invstd, T* dw, T* db,    \
        i64 rows, i64 cols) {                                                                         \
        layer_norm_backward_params_body<T>(dy, x, mean, invstd, dw, db, rows, cols);                  \
    }
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY
#undef ENTRY_G
