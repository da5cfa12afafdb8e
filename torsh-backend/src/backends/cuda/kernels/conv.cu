// 2-D convolution (cross-correlation, as in PyTorch), NCHW, contiguous operands: an implicit GEMM.
//
// Per group g the convolution is the GEMM  out[m, j] = bias[g·Kg + j] + Σ_kidx A[m, kidx] · B[kidx, j]  with
//   m    = (n, p, q) over N·P·Q output pixels (M rows),
//   j    = output channel within the group (Kg = K / groups columns),
//   kidx = (c, r, s) over Cg·R·S taps (Kdim), Cg = C / groups,
//   A[m, kidx] = input[n, g·Cg + c, p·sh − ph + r·dh, q·sw − pw + s·dw] (0 outside the input),
//   B[kidx, j] = weight[g·Kg + j, c, r, s]  (a weight row is contiguous over kidx).
// No im2col buffer: A tiles are gathered from the input on the fly.
//
// Tiling: a 256-thread block computes a CONV_BM × CONV_BN (64 × 64) output tile, stepping through Kdim in
// CONV_BK (16) slices staged in shared memory in the accumulator type. Thread t computes the 4 × 4
// micro-tile of rows tm + 16·i and columns tn + 16·j (tm = t % 16, tn = t / 16), so consecutive threads
// own consecutive pixels (coalesced output stores) and the shared-memory reads are conflict-free.
// Global loads: thread t gathers A elements (row t % 64, slices t / 64 + 4·l) and B elements (slice
// t % 16, columns t / 16 + 16·l), l = 0..3; the next slice is loaded into registers while the current
// one is multiplied.
//
// Exact reference semantics for padding: the reference skips taps outside the input, so a non-finite
// weight never meets a padded position. A 0 · inf there would give NaN, so each staged A element carries
// an "inside the input" flag, and a slice whose B tile holds a non-finite value (detected with the
// barrier's __syncthreads_or, at no extra synchronisation) is multiplied with the flags honoured.
//
// Tiles are visited by block-stride loops in x (pixel tiles), y (channel tiles) and z (groups), so any
// grid is correct; every thread of a block runs the same iterations and reaches every barrier.

#define CONV_BM 64
#define CONV_BN 64
#define CONV_BK 16
#define CONV_THREADS 256
// Row length of the staged B tile: one element of padding against bank conflicts on the stores.
#define CONV_BN_PAD (CONV_BN + 1)

// Shapes and window parameters; `ConvParams` in conv.rs has the same layout.
struct ConvParams {
    i64 m;       // N·P·Q output pixels (GEMM rows).
    i64 pq;      // P·Q.
    i64 q;       // Output width Q.
    i64 c;       // Input channels C.
    i64 h;       // Input height H.
    i64 w;       // Input width W.
    i64 hw;      // H·W.
    i64 k;       // Output channels K.
    i64 kg;      // K / groups (GEMM columns).
    i64 groups;  // Channel groups.
    i64 sh, sw;  // Stride.
    i64 ph, pw;  // Padding.
    i64 dh, dw;  // Dilation.
    int cg;      // C / groups.
    int kdim;    // Cg·R·S (GEMM depth), at most 2^30.
    int rs;      // R·S.
    int s;       // Kernel width S.
    u32 rs_mul;  // Magic multiplier and shift dividing by R·S (see conv_div).
    u32 rs_shift;
    u32 s_mul;   // Magic multiplier and shift dividing by S.
    u32 s_shift;
    int has_bias;
    int pad_;
};

// n / d for 0 <= n < 2^31 by a multiply-high with the host's magic numbers for d (mul = 0 means d = 1):
// mul = ceil(2^(31 + l) / d), shift = l − 1, l = ceil(log2 d).
__device__ __forceinline__ int conv_div(int n, u32 mul, u32 shift) {
    return mul == 0 ? n : (int)(__umulhi((u32)n, mul) >> shift);
}

// Whether v is infinite or NaN.
template <typename Acc>
__device__ __forceinline__ bool conv_nonfinite(Acc v) {
    return isnan(v) || isinf(v);
}

// The input row (output pixel) a thread gathers A elements for, decoded once per pixel tile.
struct ConvRow {
    i64 base;  // Element offset of input[n, g·Cg, 0, 0].
    i64 ih0;   // p·sh − ph.
    i64 iw0;   // q·sw − pw.
    bool ok;   // Whether the pixel exists (m < M).
};

// Decodes pixel m of group g.
__device__ __forceinline__ ConvRow conv_row(const ConvParams& P, i64 m, i64 g) {
    ConvRow row;
    row.ok = m < P.m;
    i64 mm = row.ok ? m : 0;
    i64 n = mm / P.pq;
    i64 pix = mm - n * P.pq;
    i64 p = pix / P.q;
    i64 q = pix - p * P.q;
    row.base = (n * P.c + g * (i64)P.cg) * P.hw;
    row.ih0 = p * P.sh - P.ph;
    row.iw0 = q * P.sw - P.pw;
    return row;
}

// A[m, kidx] for the thread's row, widened; `inside` tells whether the tap lies inside the input.
template <typename T>
__device__ __forceinline__ typename Num<T>::acc conv_load_a(
    const T* __restrict__ x, const ConvParams& P, const ConvRow& row, int kidx, bool& inside) {
    typedef typename Num<T>::acc Acc;
    inside = false;
    if (!row.ok || kidx >= P.kdim) {
        return (Acc)0;
    }
    int c = conv_div(kidx, P.rs_mul, P.rs_shift);
    int rem = kidx - c * P.rs;
    int r = conv_div(rem, P.s_mul, P.s_shift);
    int s = rem - r * P.s;
    i64 ih = row.ih0 + (i64)r * P.dh;
    i64 iw = row.iw0 + (i64)s * P.dw;
    if (ih < 0 || ih >= P.h || iw < 0 || iw >= P.w) {
        return (Acc)0;
    }
    inside = true;
    return Num<T>::load(x[row.base + (i64)c * P.hw + ih * P.w + iw]);
}

// B[kidx, col] = weight[g·Kg + col, kidx], widened; 0 outside the GEMM.
template <typename T>
__device__ __forceinline__ typename Num<T>::acc conv_load_b(
    const T* __restrict__ wt, const ConvParams& P, i64 g, i64 col, int kidx) {
    typedef typename Num<T>::acc Acc;
    if (col >= P.kg || kidx >= P.kdim) {
        return (Acc)0;
    }
    return Num<T>::load(wt[(g * P.kg + col) * (i64)P.kdim + kidx]);
}

// The registers holding one slice's share of the A and B tiles between its load and its staging.
template <typename Acc>
struct ConvSlice {
    Acc a[4];
    bool a_in[4];
    Acc b[4];
};

// Loads this thread's share of the slice starting at depth k0.
template <typename T>
__device__ __forceinline__ void conv_load_slice(
    const T* __restrict__ x, const T* __restrict__ wt, const ConvParams& P, const ConvRow& row,
    i64 g, i64 n0, int k0, ConvSlice<typename Num<T>::acc>& sl) {
    int t = threadIdx.x;
#pragma unroll
    for (int l = 0; l < 4; ++l) {
        sl.a[l] = conv_load_a<T>(x, P, row, k0 + t / CONV_BM + 4 * l, sl.a_in[l]);
        sl.b[l] = conv_load_b<T>(wt, P, g, n0 + t / CONV_BK + 16 * l, k0 + t % CONV_BK);
    }
}

// One output tile: pixels [m0, m0 + 64) × channels [n0, n0 + 64) of group g.
template <typename T>
__device__ __forceinline__ void conv_tile(
    const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias, T* __restrict__ y,
    const ConvParams& P, i64 g, i64 m0, i64 n0,
    typename Num<T>::acc (*as)[CONV_BM], bool (*a_in)[CONV_BM], typename Num<T>::acc (*bs)[CONV_BN_PAD]) {
    typedef typename Num<T>::acc Acc;
    const int t = threadIdx.x;
    const int tm = t % 16;
    const int tn = t / 16;
    Acc acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            acc[i][j] = (Acc)0;
        }
    }
    const ConvRow row = conv_row(P, m0 + t % CONV_BM, g);
    ConvSlice<Acc> sl;
    conv_load_slice<T>(x, wt, P, row, g, n0, 0, sl);
    for (int k0 = 0; k0 < P.kdim; k0 += CONV_BK) {
        bool b_bad = false;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            int ka = t / CONV_BM + 4 * l;
            as[ka][t % CONV_BM] = sl.a[l];
            a_in[ka][t % CONV_BM] = sl.a_in[l];
            bs[t % CONV_BK][t / CONV_BK + 16 * l] = sl.b[l];
            b_bad = b_bad || conv_nonfinite(sl.b[l]);
        }
        const bool masked = __syncthreads_or(b_bad) != 0;
        if (k0 + CONV_BK < P.kdim) {
            conv_load_slice<T>(x, wt, P, row, g, n0, k0 + CONV_BK, sl);
        }
#pragma unroll
        for (int kk = 0; kk < CONV_BK; ++kk) {
            Acc a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                a[i] = as[kk][tm + 16 * i];
                b[i] = bs[kk][tn + 16 * i];
            }
            if (!masked) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        acc[i][j] += a[i] * b[j];
                    }
                }
            } else {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    if (a_in[kk][tm + 16 * i]) {
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            acc[i][j] += a[i] * b[j];
                        }
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        i64 m = m0 + tm + 16 * i;
        if (m >= P.m) {
            continue;
        }
        i64 n = m / P.pq;
        i64 pix = m - n * P.pq;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            i64 col = n0 + tn + 16 * j;
            if (col >= P.kg) {
                continue;
            }
            i64 kc = g * P.kg + col;
            Acc v = acc[i][j];
            if (P.has_bias) {
                v = Num<T>::load(bias[kc]) + v;
            }
            y[(n * P.k + kc) * P.pq + pix] = Num<T>::store(v);
        }
    }
}

// Visits every (group, channel tile, pixel tile) with block-stride loops.
template <typename T>
__device__ __forceinline__ void conv2d_body(
    const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias, T* __restrict__ y,
    const ConvParams& P) {
    typedef typename Num<T>::acc Acc;
    __shared__ Acc as[CONV_BK][CONV_BM];
    __shared__ bool a_in[CONV_BK][CONV_BM];
    __shared__ Acc bs[CONV_BK][CONV_BN_PAD];
    const i64 m_tiles = (P.m + CONV_BM - 1) / CONV_BM;
    const i64 n_tiles = (P.kg + CONV_BN - 1) / CONV_BN;
    for (i64 g = blockIdx.z; g < P.groups; g += gridDim.z) {
        for (i64 tn = blockIdx.y; tn < n_tiles; tn += gridDim.y) {
            for (i64 tm = blockIdx.x; tm < m_tiles; tm += gridDim.x) {
                conv_tile<T>(x, wt, bias, y, P, g, tm * CONV_BM, tn * CONV_BN, as, a_in, bs);
            }
        }
    }
}

// conv2d_<dtype>(input, weight, bias (null when absent), output, params); 256-thread blocks. Asking for
// 2 resident blocks per SM (at most 128 registers) steers ptxas to ~96 registers and no spills; without
// it, it picked 64-80 registers and spilled.
#define ENTRY(S, T)                                                                               \
    extern "C" __global__ void __launch_bounds__(CONV_THREADS, 2) conv2d_##S(                     \
        const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias,            \
        T* __restrict__ y, ConvParams P) {                                                        \
        conv2d_body<T>(x, wt, bias, y, P);                                                        \
    }
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY

// ------------------------------------------------------------------------------------- gradients
//
// The input and weight gradients of conv2d as direct kernels (no atomics: each element is summed
// by one thread or one block in a fixed order, so every run gives the same bits).

// Shapes and window of a convolution whose gradients are computed (`ConvGradParams` in `conv.rs`,
// same layout: nineteen i64).
struct ConvGradParams {
    i64 n, c, h, w, k, cg, r, s, oh, ow, sh, sw, ph, pw, dh, dw, kg;
    i64 total;     // elements written: input elements, or weight elements
    i64 has_bias;  // input gradient only: 1 when `bias` (of C) starts each sum
};

// The window position along an axis whose tap `t` reads input coordinate `i`, or -1.
__device__ __forceinline__ i64 conv_window_of(i64 i, i64 t, i64 pad, i64 dil, i64 stride, i64 n) {
    const i64 d = i + pad - t * dil;
    if (d < 0 || d % stride != 0) {
        return -1;
    }
    const i64 o = d / stride;
    return o < n ? o : -1;
}

// One thread per input element (n, c, y, x): bias[c] (when given) plus the sum over the output
// channels of c's group and the taps whose window position divides exactly and lies in the output.
template <typename T>
__device__ __forceinline__ void conv2d_backward_input_body(
    T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ wt, const T* __restrict__ bias,
    const ConvGradParams& P) {
    typedef typename Num<T>::acc Acc;
    TORSH_GRID_STRIDE(i, P.total) {
        const i64 x = i % P.w;
        const i64 y = (i / P.w) % P.h;
        const i64 ch = (i / (P.h * P.w)) % P.c;
        const i64 img = i / (P.c * P.h * P.w);
        const i64 g = ch / P.cg;
        const i64 cw = ch - g * P.cg;
        Acc sum = P.has_bias ? Num<T>::load(bias[ch]) : (Acc)0;
        for (i64 ko = 0; ko < P.kg; ++ko) {
            const i64 kk = g * P.kg + ko;
            const T* dyp = dy + (img * P.k + kk) * P.oh * P.ow;
            const T* wp = wt + (kk * P.cg + cw) * P.r * P.s;
            for (i64 ri = 0; ri < P.r; ++ri) {
                const i64 oy = conv_window_of(y, ri, P.ph, P.dh, P.sh, P.oh);
                if (oy < 0) {
                    continue;
                }
                for (i64 si = 0; si < P.s; ++si) {
                    const i64 ox = conv_window_of(x, si, P.pw, P.dw, P.sw, P.ow);
                    if (ox < 0) {
                        continue;
                    }
                    sum += Num<T>::load(dyp[oy * P.ow + ox]) * Num<T>::load(wp[ri * P.s + si]);
                }
            }
        }
        dx[i] = Num<T>::store(sum);
    }
}

// One 256-thread block per weight element (k, c, r, s), blocks striding over the elements: the
// block's threads stride over every image's output positions, then the block's tree adds their sums.
template <typename T>
__device__ __forceinline__ void conv2d_backward_weight_body(
    T* __restrict__ dw, const T* __restrict__ x, const T* __restrict__ dy, const ConvGradParams& P) {
    typedef typename Num<T>::acc Acc;
    const i64 positions = P.oh * P.ow;
    const i64 all = P.n * positions;
    for (i64 e = blockIdx.x; e < P.total; e += gridDim.x) {
        const i64 si = e % P.s;
        const i64 ri = (e / P.s) % P.r;
        const i64 cw = (e / (P.r * P.s)) % P.cg;
        const i64 kk = e / (P.cg * P.r * P.s);
        const i64 ch = (kk / P.kg) * P.cg + cw;
        Acc sum = (Acc)0;
        for (i64 j = threadIdx.x; j < all; j += blockDim.x) {
            const i64 img = j / positions;
            const i64 at = j % positions;
            const i64 iy = (at / P.ow) * P.sh - P.ph + ri * P.dh;
            const i64 ix = (at % P.ow) * P.sw - P.pw + si * P.dw;
            if (iy < 0 || iy >= P.h || ix < 0 || ix >= P.w) {
                continue;
            }
            sum += Num<T>::load(dy[(img * P.k + kk) * positions + at]) *
                   Num<T>::load(x[((img * P.c + ch) * P.h + iy) * P.w + ix]);
        }
        sum = torsh_group_reduce<CONV_THREADS, TorshSum<Acc>, Acc>(sum);
        if (threadIdx.x == 0) {
            dw[e] = Num<T>::store(sum);
        }
    }
}

// conv2d_backward_input_<dtype>(grad_input, grad_output, weight, bias (null when absent), params)
// and conv2d_backward_weight_<dtype>(grad_weight, input, grad_output, params); 256-thread blocks.
#define ENTRY(S, T)                                                                                 \
    extern "C" __global__ void conv2d_backward_input_##S(                                           \
        T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ wt,                     \
        const T* __restrict__ bias, ConvGradParams P) {                                             \
        conv2d_backward_input_body<T>(dx, dy, wt, bias, P);                                         \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(CONV_THREADS) conv2d_backward_weight_##S(          \
        T* __restrict__ dw, const T* __restrict__ x, const T* __restrict__ dy, ConvGradParams P) {  \
        conv2d_backward_weight_body<T>(dw, x, dy, P);                                               \
    }
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY
