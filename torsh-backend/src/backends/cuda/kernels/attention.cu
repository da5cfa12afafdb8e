// Scaled dot-product attention, FlashAttention-2 style: O = softmax(scale · Q·Kᵀ [causal]) · V over dense
// [batch·heads, seq, head_dim] operands, without materialising the score matrix.
//
// Work split:
// - One block (ATT_WARPS warps) handles one tile of ATT_BQ query rows of one (batch, head) and one group of
//   W = 32·CPL output columns (W ∈ {64, 128, 256}; head_dim > 256 takes several column groups, each of
//   which recomputes the scores). Blocks walk the tiles grid-stride, heaviest query tiles first.
// - Each warp owns ATT_ROWS query rows. Key/value tiles of ATT_BK = 32 rows are walked in order; lane `j`
//   of a warp computes the score of key `k0 + j` against each of its rows (Q and K staged in shared
//   memory in head_dim chunks of ATT_DC columns, so any head_dim fits), the warp reduces the tile max and
//   sum with shuffles, and the online softmax rescales the running state (m, l, acc) by exp(m_old − m_new).
// - For P·V, lane `c` owns output columns c and c + 32 of every ATT_DC chunk of its column group; the
//   probabilities are broadcast from the lane that computed them.
// - Causal (top-left: query i sees keys j ≤ i, as the reference): key tiles past the tile's last query
//   row are skipped, and keys above the diagonal inside a tile are excluded from max, sum and P·V.
//
// Numerics follow the reference: the max ignores NaN scores (f64::max), a NaN score or a +inf max makes
// the row NaN, and a row whose scores are all −inf is NaN (0/0). Accumulation is in Num<T>::acc.

#define ATT_WARPS 4
#define ATT_ROWS 4
#define ATT_THREADS (ATT_WARPS * 32)
#define ATT_BQ (ATT_WARPS * ATT_ROWS)
#define ATT_BK 32
#define ATT_DC 64
// Row pitch of the K/V tile in shared memory: the +1 keeps lane-per-row reads of K conflict-free.
#define ATT_KV_LD (ATT_DC + 1)

#define ATT_FULL_MASK 0xffffffffu

__device__ __forceinline__ float att_neg_inf(float) { return __int_as_float(0xff800000); }
__device__ __forceinline__ double att_neg_inf(double) { return __longlong_as_double(0xfff0000000000000LL); }

__device__ __forceinline__ float att_exp(float x) { return expf(x); }
__device__ __forceinline__ double att_exp(double x) { return exp(x); }

// Max that ignores a NaN operand, like Rust's f64::max.
__device__ __forceinline__ float att_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double att_max(double a, double b) { return fmax(a, b); }

// Max over the warp; every lane gets the same value.
template <typename A>
__device__ __forceinline__ A att_warp_max(A x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        x = att_max(x, __shfl_xor_sync(ATT_FULL_MASK, x, o));
    }
    return x;
}

// Sum over the warp (butterfly tree); every lane gets the same bits.
template <typename A>
__device__ __forceinline__ A att_warp_sum(A x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        x += __shfl_xor_sync(ATT_FULL_MASK, x, o);
    }
    return x;
}

// Copies rows [row0, row0 + rows) × columns [col0, col0 + width) of the [seq, dim] matrix `src` into
// `dst` (pitch `ld`), widened to the accumulator type; rows at or past `seq` become zeros. Called by the
// whole block between barriers.
template <typename T, typename A>
__device__ __forceinline__ void att_stage(A* dst, int ld, const T* src, i64 row0, i64 seq, i64 dim,
                                          i64 col0, int width, int rows) {
    for (int idx = threadIdx.x; idx < rows * width; idx += blockDim.x) {
        int r = idx / width;
        int c = idx - r * width;
        i64 row = row0 + r;
        A x = (A)0;
        if (row < seq) {
            x = Num<T>::load(src[row * dim + col0 + c]);
        }
        dst[r * ld + c] = x;
    }
}

// One (head, query tile, column group). `q`, `k`, `v`, `o` point at the head's first row.
template <typename T, int CPL>
__device__ void attention_tile(const T* q, const T* k, const T* v, T* o, i64 sq, i64 skv, i64 dim,
                               i64 q0, i64 col_base, typename Num<T>::acc scale, bool causal) {
    typedef typename Num<T>::acc A;
    __shared__ A qs[ATT_BQ * ATT_DC];
    __shared__ A kvs[ATT_BK * ATT_KV_LD];

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const A neg_inf = att_neg_inf((A)0);

    i64 row[ATT_ROWS];
    A m[ATT_ROWS];
    A l[ATT_ROWS];
    A acc[ATT_ROWS][CPL];
#pragma unroll
    for (int r = 0; r < ATT_ROWS; ++r) {
        row[r] = q0 + warp * ATT_ROWS + r;
        m[r] = neg_inf;
        l[r] = (A)0;
#pragma unroll
        for (int t = 0; t < CPL; ++t) {
            acc[r][t] = (A)0;
        }
    }

    // Keys any row of this tile can see; causal tiles stop at the last row's diagonal.
    const i64 q_end = min(sq, q0 + ATT_BQ);
    const i64 kv_end = causal ? min(skv, q_end) : skv;

    for (i64 k0 = 0; k0 < kv_end; k0 += ATT_BK) {
        // Scores: lane j holds scale · Q[row r] · K[k0 + j] for each of the warp's rows.
        A s[ATT_ROWS];
#pragma unroll
        for (int r = 0; r < ATT_ROWS; ++r) {
            s[r] = (A)0;
        }
        for (i64 d0 = 0; d0 < dim; d0 += ATT_DC) {
            const int width = (int)min((i64)ATT_DC, dim - d0);
            __syncthreads();
            if (k0 == 0 || dim > ATT_DC) {  // with a single chunk, Q stays from the first key tile
                att_stage<T, A>(qs, ATT_DC, q, q0, sq, dim, d0, width, ATT_BQ);
            }
            att_stage<T, A>(kvs, ATT_KV_LD, k, k0, skv, dim, d0, width, ATT_BK);
            __syncthreads();
            const A* krow = kvs + lane * ATT_KV_LD;
            const A* qrows = qs + warp * ATT_ROWS * ATT_DC;
            for (int c = 0; c < width; ++c) {
                const A kc = krow[c];
#pragma unroll
                for (int r = 0; r < ATT_ROWS; ++r) {
                    s[r] += qrows[r * ATT_DC + c] * kc;
                }
            }
        }

        // Online softmax update.
        const i64 key = k0 + lane;
        A p[ATT_ROWS];
#pragma unroll
        for (int r = 0; r < ATT_ROWS; ++r) {
            const bool visible = key < skv && row[r] < sq && (!causal || key <= row[r]);
            const A score = scale * s[r];
            const A m_new = att_max(m[r], att_warp_max(visible ? score : neg_inf));
            // Exponents are taken relative to m_new, or to 0 while every score so far is -inf (so a later
            // finite score still works, and an all -inf row ends as 0/0 = NaN like the reference).
            const A base = (m_new == neg_inf) ? (A)0 : m_new;
            const A alpha = att_exp(m[r] - base);
            p[r] = visible ? att_exp(score - base) : (A)0;
            l[r] = l[r] * alpha + att_warp_sum(p[r]);
            m[r] = m_new;
#pragma unroll
            for (int t = 0; t < CPL; ++t) {
                acc[r][t] *= alpha;
            }
        }

        // P·V over this block's columns, ATT_DC at a time; lane owns chunk columns lane and lane + 32.
        const int nk = (int)min((i64)ATT_BK, skv - k0);
#pragma unroll
        for (int ch = 0; ch < CPL / 2; ++ch) {
            const i64 c0 = col_base + ch * ATT_DC;
            if (c0 < dim) {  // uniform over the block
                const int width = (int)min((i64)ATT_DC, dim - c0);
                __syncthreads();
                att_stage<T, A>(kvs, ATT_KV_LD, v, k0, skv, dim, c0, width, ATT_BK);
                __syncthreads();
                for (int jj = 0; jj < nk; ++jj) {
                    const A* vrow = kvs + jj * ATT_KV_LD;
                    const A v0 = lane < width ? vrow[lane] : (A)0;
                    const A v1 = lane + 32 < width ? vrow[lane + 32] : (A)0;
                    const i64 key_j = k0 + jj;
#pragma unroll
                    for (int r = 0; r < ATT_ROWS; ++r) {
                        const A pj = __shfl_sync(ATT_FULL_MASK, p[r], jj);
                        if (!causal || key_j <= row[r]) {
                            acc[r][2 * ch] += pj * v0;
                            acc[r][2 * ch + 1] += pj * v1;
                        }
                    }
                }
            }
        }
    }

    // O = acc / l, rounded once to T.
#pragma unroll
    for (int r = 0; r < ATT_ROWS; ++r) {
        if (row[r] < sq) {
            T* orow = o + row[r] * dim;
#pragma unroll
            for (int t = 0; t < CPL; ++t) {
                const i64 c = col_base + (t >> 1) * ATT_DC + (t & 1) * 32 + lane;
                if (c < dim) {
                    orow[c] = Num<T>::store(acc[r][t] / l[r]);
                }
            }
        }
    }
}

// Grid-stride walk over (head, query tile, column group) work items. Launch with ATT_THREADS threads.
// Items are ordered query tile slowest, last tile first, so the heaviest causal tiles start first.
template <typename T, int CPL>
__device__ void attention_body(const T* q, const T* k, const T* v, T* o, i64 bh, i64 sq, i64 skv,
                               i64 dim, double scale, int causal) {
    const i64 width = 32 * CPL;
    const i64 n_qt = (sq + ATT_BQ - 1) / ATT_BQ;
    const i64 n_cg = (dim + width - 1) / width;
    const i64 total = bh * n_qt * n_cg;
    const typename Num<T>::acc sc = (typename Num<T>::acc)scale;
    for (i64 item = blockIdx.x; item < total; item += gridDim.x) {
        const i64 head = item % bh;
        const i64 rest = item / bh;
        const i64 cg = rest % n_cg;
        const i64 qt = n_qt - 1 - rest / n_cg;
        attention_tile<T, CPL>(q + head * sq * dim, k + head * skv * dim, v + head * skv * dim,
                               o + head * sq * dim, sq, skv, dim, qt * ATT_BQ, cg * width, sc,
                               causal != 0);
    }
}

// attention_w{64,128,256}_<dtype>(q, k, v, o, batch·heads, seq_q, seq_kv, head_dim, scale, causal):
// the suffix is the column-group width; the host picks the smallest width ≥ head_dim (256 above that).
#define ENTRY_W(W, CPL, S, T)                                                                       \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                      \
        attention_w##W##_##S(const T* q, const T* k, const T* v, T* o, i64 bh, i64 sq, i64 skv,     \
                             i64 dim, double scale, int causal) {                                   \
        attention_body<T, CPL>(q, k, v, o, bh, sq, skv, dim, scale, causal);                        \
    }
#define ENTRY(S, T) ENTRY_W(64, 2, S, T) ENTRY_W(128, 4, S, T) ENTRY_W(256, 8, S, T)
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY
#undef ENTRY_W
