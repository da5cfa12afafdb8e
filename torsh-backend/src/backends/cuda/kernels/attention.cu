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
//
// With a non-null `lse` (Num<T>::acc per query row), each row's log-sum-exp of its scaled scores,
// base + log(l) (base: the running max, or 0 while it is −inf), is written too, for the backward.

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
__device__ void attention_tile(const T* q, const T* k, const T* v, T* o,
                               typename Num<T>::acc* lse, i64 sq, i64 skv, i64 dim, i64 q0,
                               i64 col_base, typename Num<T>::acc scale, bool causal) {
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

    // O = acc / l, rounded once to T; the log-sum-exp from the first column group's lane 0.
#pragma unroll
    for (int r = 0; r < ATT_ROWS; ++r) {
        if (row[r] < sq) {
            if (lse != nullptr && col_base == 0 && lane == 0) {
                lse[row[r]] = (m[r] == neg_inf ? (A)0 : m[r]) + log(l[r]);
            }
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
__device__ void attention_body(const T* q, const T* k, const T* v, T* o, typename Num<T>::acc* lse,
                               i64 bh, i64 sq, i64 skv, i64 dim, double scale, int causal) {
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
                               o + head * sq * dim, lse == nullptr ? nullptr : lse + head * sq, sq,
                               skv, dim, qt * ATT_BQ, cg * width, sc, causal != 0);
    }
}

// attention_w{64,128,256}_<dtype>(q, k, v, o, lse, batch·heads, seq_q, seq_kv, head_dim, scale,
// causal): the suffix is the column-group width; the host picks the smallest width ≥ head_dim (256
// above that). `lse` may be null.
#define ENTRY_W(W, CPL, S, T)                                                                       \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                      \
        attention_w##W##_##S(const T* q, const T* k, const T* v, T* o, typename Num<T>::acc* lse,   \
                             i64 bh, i64 sq, i64 skv, i64 dim, double scale, int causal) {          \
        attention_body<T, CPL>(q, k, v, o, lse, bh, sq, skv, dim, scale, causal);                   \
    }
#define ENTRY(S, T) ENTRY_W(64, 2, S, T) ENTRY_W(128, 4, S, T) ENTRY_W(256, 8, S, T)
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY
#undef ENTRY_W

// ----------------------------------------------------------------------------------------- gradients
//
// attention_backward_{dq,dkv}_w{64,128,256}_<dtype>: the gradients from the forward's output O and
// log-sum-exp (Num<T>::acc per query row), P = exp(scale · q·k − lse), dS = P · (dO·v − D) with
// D = dO·O, rebuilt per (query, key) pair and never stored. Deterministic: every output row is summed
// by one warp in a fixed order, no atomics.
// - dq: a warp owns ATT_GRAD_ROWS query rows (grid-stride over them). It takes their D and walks the
//   keys they see 32 at a time, lane j computing the rows' dS with key j; then, with the dS broadcast
//   by shuffles, lane c adds dS · k into the rows' columns c, c + 32, ... of one column group of
//   W = 32·CPL columns (head_dim > 256: several groups, each recomputing dS). dQ = scale · the sums.
// - dkv: a warp owns ATT_GRAD_ROWS key rows and walks the queries that see them 32 at a time, lane i
//   computing query i's D, P and dS with each key; lane c then adds dS · q into dK's columns and
//   P · dO into dV's. dK = scale · its sums.
// Causal: query i sees keys j ≤ i, as the forward.

#define ATT_GRAD_ROWS 4

// dq for the warp's rows `rows[r]` (of one head; `q`, `dout`, `o`, `lse` at the head's first row).
template <typename T, int CPL>
__device__ void attention_dq_rows(const T* dout, const T* q, const T* k, const T* v, const T* o,
                                  const typename Num<T>::acc* lse, T* dq, i64 row0, i64 sq,
                                  i64 skv, i64 dim, typename Num<T>::acc scale, bool causal) {
    typedef typename Num<T>::acc A;
    const int lane = threadIdx.x & 31;
    A delta[ATT_GRAD_ROWS];
    A lse_r[ATT_GRAD_ROWS];
    i64 last = -1;
#pragma unroll
    for (int r = 0; r < ATT_GRAD_ROWS; ++r) {
        const i64 i = row0 + r;
        A part = (A)0;
        if (i < sq) {
            for (i64 c = lane; c < dim; c += 32) {
                part += Num<T>::load(dout[i * dim + c]) * Num<T>::load(o[i * dim + c]);
            }
            last = i;
        }
        delta[r] = att_warp_sum(part);
        lse_r[r] = i < sq ? lse[i] : (A)0;
    }
    const i64 key_end = causal ? min(skv, last + 1) : skv;
    const i64 width = 32 * CPL;
    for (i64 col_base = 0; col_base < dim; col_base += width) {
        A acc[ATT_GRAD_ROWS][CPL];
#pragma unroll
        for (int r = 0; r < ATT_GRAD_ROWS; ++r) {
#pragma unroll
            for (int t = 0; t < CPL; ++t) {
                acc[r][t] = (A)0;
            }
        }
        for (i64 k0 = 0; k0 < key_end; k0 += 32) {
            const i64 j = k0 + lane;
            A ds[ATT_GRAD_ROWS];
#pragma unroll
            for (int r = 0; r < ATT_GRAD_ROWS; ++r) {
                ds[r] = (A)0;
            }
            if (j < key_end) {
#pragma unroll
                for (int r = 0; r < ATT_GRAD_ROWS; ++r) {
                    const i64 i = row0 + r;
                    if (i < sq && (!causal || j <= i)) {
                        A s = (A)0;
                        A dp = (A)0;
                        for (i64 c = 0; c < dim; ++c) {
                            s += Num<T>::load(q[i * dim + c]) * Num<T>::load(k[j * dim + c]);
                            dp += Num<T>::load(dout[i * dim + c]) * Num<T>::load(v[j * dim + c]);
                        }
                        ds[r] = att_exp(scale * s - lse_r[r]) * (dp - delta[r]);
                    }
                }
            }
            const int nk = (int)min((i64)32, key_end - k0);
            for (int jj = 0; jj < nk; ++jj) {
                const T* krow = k + (k0 + jj) * dim;
#pragma unroll
                for (int r = 0; r < ATT_GRAD_ROWS; ++r) {
                    const A d = __shfl_sync(ATT_FULL_MASK, ds[r], jj);
#pragma unroll
                    for (int t = 0; t < CPL; ++t) {
                        const i64 c = col_base + 32 * t + lane;
                        if (c < dim) {
                            acc[r][t] += d * Num<T>::load(krow[c]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ATT_GRAD_ROWS; ++r) {
            const i64 i = row0 + r;
            if (i < sq) {
#pragma unroll
                for (int t = 0; t < CPL; ++t) {
                    const i64 c = col_base + 32 * t + lane;
                    if (c < dim) {
                        dq[i * dim + c] = Num<T>::store(scale * acc[r][t]);
                    }
                }
            }
        }
    }
}

// dk and dv for the warp's key rows from `col0` (of one head).
template <typename T, int CPL>
__device__ void attention_dkv_rows(const T* dout, const T* q, const T* k, const T* v, const T* o,
                                   const typename Num<T>::acc* lse, T* dk, T* dv, i64 col0, i64 sq,
                                   i64 skv, i64 dim, typename Num<T>::acc scale, bool causal) {
    typedef typename Num<T>::acc A;
    const int lane = threadIdx.x & 31;
    // Queries that see any of the warp's keys: all, or (causal) from its first key on.
    const i64 q_start = causal ? col0 : 0;
    const i64 width = 32 * CPL;
    for (i64 col_base = 0; col_base < dim; col_base += width) {
        A acc_k[ATT_GRAD_ROWS][CPL];
        A acc_v[ATT_GRAD_ROWS][CPL];
#pragma unroll
        for (int r = 0; r < ATT_GRAD_ROWS; ++r) {
#pragma unroll
            for (int t = 0; t < CPL; ++t) {
                acc_k[r][t] = (A)0;
                acc_v[r][t] = (A)0;
            }
        }
        for (i64 i0 = q_start; i0 < sq; i0 += 32) {
            const i64 i = i0 + lane;
            A p[ATT_GRAD_ROWS];
            A ds[ATT_GRAD_ROWS];
#pragma unroll
            for (int r = 0; r < ATT_GRAD_ROWS; ++r) {
                p[r] = (A)0;
                ds[r] = (A)0;
            }
            if (i < sq) {
                A delta = (A)0;
                for (i64 c = 0; c < dim; ++c) {
                    delta += Num<T>::load(dout[i * dim + c]) * Num<T>::load(o[i * dim + c]);
                }
#pragma unroll
                for (int r = 0; r < ATT_GRAD_ROWS; ++r) {
                    const i64 j = col0 + r;
                    if (j < skv && (!causal || j <= i)) {
                        A s = (A)0;
                        A dp = (A)0;
                        for (i64 c = 0; c < dim; ++c) {
                            s += Num<T>::load(q[i * dim + c]) * Num<T>::load(k[j * dim + c]);
                            dp += Num<T>::load(dout[i * dim + c]) * Num<T>::load(v[j * dim + c]);
                        }
                        p[r] = att_exp(scale * s - lse[i]);
                        ds[r] = p[r] * (dp - delta);
                    }
                }
            }
            const int nq = (int)min((i64)32, sq - i0);
            for (int ii = 0; ii < nq; ++ii) {
                const T* qrow = q + (i0 + ii) * dim;
                const T* drow = dout + (i0 + ii) * dim;
#pragma unroll
                for (int r = 0; r < ATT_GRAD_ROWS; ++r) {
                    const A pr = __shfl_sync(ATT_FULL_MASK, p[r], ii);
                    const A dsr = __shfl_sync(ATT_FULL_MASK, ds[r], ii);
#pragma unroll
                    for (int t = 0; t < CPL; ++t) {
                        const i64 c = col_base + 32 * t + lane;
                        if (c < dim) {
                            acc_k[r][t] += dsr * Num<T>::load(qrow[c]);
                            acc_v[r][t] += pr * Num<T>::load(drow[c]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ATT_GRAD_ROWS; ++r) {
            const i64 j = col0 + r;
            if (j < skv) {
#pragma unroll
                for (int t = 0; t < CPL; ++t) {
                    const i64 c = col_base + 32 * t + lane;
                    if (c < dim) {
                        dk[j * dim + c] = Num<T>::store(scale * acc_k[r][t]);
                        dv[j * dim + c] = Num<T>::store(acc_v[r][t]);
                    }
                }
            }
        }
    }
}

// Grid-stride walk of warps over (head, tile of ATT_GRAD_ROWS rows) items; `dkv` picks the kernel.
template <typename T, int CPL>
__device__ void attention_backward_body(const T* dout, const T* q, const T* k, const T* v,
                                        const T* o, const typename Num<T>::acc* lse, T* dq, T* dk,
                                        T* dv, i64 bh, i64 sq, i64 skv, i64 dim, double scale,
                                        int causal, bool dkv) {
    const i64 len = dkv ? skv : sq;
    const i64 tiles = (len + ATT_GRAD_ROWS - 1) / ATT_GRAD_ROWS;
    const i64 total = bh * tiles;
    const i64 warps = (i64)gridDim.x * (blockDim.x >> 5);
    const typename Num<T>::acc sc = (typename Num<T>::acc)scale;
    for (i64 item = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); item < total;
         item += warps) {
        const i64 head = item % bh;
        const i64 row0 = (item / bh) * ATT_GRAD_ROWS;
        const i64 qh = head * sq * dim;
        const i64 kh = head * skv * dim;
        if (dkv) {
            attention_dkv_rows<T, CPL>(dout + qh, q + qh, k + kh, v + kh, o + qh, lse + head * sq,
                                       dk + kh, dv + kh, row0, sq, skv, dim, sc, causal != 0);
        } else {
            attention_dq_rows<T, CPL>(dout + qh, q + qh, k + kh, v + kh, o + qh, lse + head * sq,
                                      dq + qh, row0, sq, skv, dim, sc, causal != 0);
        }
    }
}

// attention_backward_w{64,128,256}_<dtype>(dout, q, k, v, o, lse, dq, dk, dv, batch·heads, seq_q,
// seq_kv, head_dim, scale, causal, which): `which` 0 writes dq, 1 dk and dv. Launch with ATT_THREADS
// threads; the suffix is the column-group width, as the forward's.
#define GRAD_ENTRY_W(W, CPL, S, T)                                                                  \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_backward_w##W##_##S(        \
        const T* dout, const T* q, const T* k, const T* v, const T* o,                              \
        const typename Num<T>::acc* lse, T* dq, T* dk, T* dv, i64 bh, i64 sq, i64 skv, i64 dim,     \
        double scale, int causal, int which) {                                                      \
        attention_backward_body<T, CPL>(dout, q, k, v, o, lse, dq, dk, dv, bh, sq, skv, dim, scale, \
                                        causal, which != 0);                                        \
    }
#define GRAD_ENTRY(S, T) GRAD_ENTRY_W(64, 2, S, T) GRAD_ENTRY_W(128, 4, S, T) GRAD_ENTRY_W(256, 8, S, T)
TORSH_FLOAT_TYPES(GRAD_ENTRY)
#undef GRAD_ENTRY
#undef GRAD_ENTRY_W

// ------------------------------------------------------------------------- tensor-core path (sm_80+)
//
// attention_mma_d{64,128}_{f16,bf16}: the same operation for f16/bf16 with head_dim fixed at 64 or 128,
// on tensor cores (mma.sync.aligned.m16n8k16, f16/bf16 inputs, f32 accumulation), FlashAttention-2
// structure:
// - A block of MMA_WARPS = 4 warps owns MMA_BQ = 64 query rows of one head; warp w owns rows
//   16w .. 16w + 15, the M dimension of its mmas. Its Q fragments (the A operands of S = Q·Kᵀ, D/16
//   k-steps) are loaded once, through shared memory, and stay in registers.
// - Key tiles of MMA_BK = 64 rows: K and V are staged in shared memory with 16-byte loads (rows at or
//   past seq_kv zero-filled), row pitch D + 8 halves so that the fragment loads are bank-conflict free.
// - Per tile each warp computes S (16 × 64) as 8 m16n8 accumulators; entries whose key is at or past
//   seq_kv, or (causal) past the row, become −inf; the row max is reduced over the four lanes that share
//   a row (__shfl_xor 1, 2) and the online softmax rescales (m, l, O) as the SIMT kernel does (same
//   NaN/−inf rules: exponents relative to 0 while the max is −inf).
// - P = exp(S − m) is rounded to T and repacked into A fragments (the C layout of n-tiles 2kk, 2kk + 1
//   is the A layout of k-step kk), and O += P·V with V's B fragments built from 16-bit shared loads.
//   l is summed per lane from the unrounded p and reduced over the quad at the end.
// - Causal: key tiles past the block's last row are not visited; n-tiles and k-steps past the warp's
//   last row are skipped (their p are 0). In the one 16-key block on a warp's diagonal, a masked p of 0
//   times a non-finite V would give NaN where the reference skips the key: if that block of V holds an
//   inf or NaN, its P·V is done on CUDA cores with the mask applied per row instead.
// - Rows at or past seq_q are computed on zeros and not stored.
//
// Fragments of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"),
// g = lane >> 2, t = lane & 3, the lower-indexed element of a pair in bits 0..15 of its register:
//   A (16×16, row-major), 4 regs: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16×8, col), 2 regs:        b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//   C/D (16×8, f32), 4 regs:      c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1)

#if __CUDA_ARCH__ >= 800 && (TORSH_HAS_F16 || TORSH_HAS_BF16)

#define MMA_WARPS 4
#define MMA_THREADS (MMA_WARPS * 32)
#define MMA_BQ (MMA_WARPS * 16)
#define MMA_BK 64
// Extra halves per shared row: a pitch of D + 8 halves puts the 8 rows of a fragment load in 8
// different 4-bank groups.
#define MMA_PAD 8

// Per-dtype pieces of the tensor-core path.
template <typename T> struct Mma;

template <> struct Mma<f16_t> {
    // Two floats as f16x2 rounded to nearest even, `lo` in bits 0..15 (cvt's first source goes high).
    static __device__ __forceinline__ u32 pack(float lo, float hi) {
        u32 d;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
        return d;
    }
    static __device__ __forceinline__ float to_float(u16 x) { return f16_to_float(x); }
    // Whether either half of a pair is an infinity or a NaN.
    static __device__ __forceinline__ bool nonfinite2(u32 x) {
        return (x & 0x7c00u) == 0x7c00u || (x & 0x7c000000u) == 0x7c000000u;
    }
    // d += a · b on one m16n8k16 tile.
    static __device__ __forceinline__ void mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <> struct Mma<bf16_t> {
    // Two floats as bf16x2 rounded to nearest even, `lo` in bits 0..15 (cvt's first source goes high).
    static __device__ __forceinline__ u32 pack(float lo, float hi) {
        u32 d;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
        return d;
    }
    static __device__ __forceinline__ float to_float(u16 x) { return bf16_to_float(x); }
    // Whether either half of a pair is an infinity or a NaN.
    static __device__ __forceinline__ bool nonfinite2(u32 x) {
        return (x & 0x7f80u) == 0x7f80u || (x & 0x7f800000u) == 0x7f800000u;
    }
    // d += a · b on one m16n8k16 tile.
    static __device__ __forceinline__ void mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// The 32 bits at `p` (4-byte aligned): two halves, the one at `p` in bits 0..15.
__device__ __forceinline__ u32 mma_ld32(const u16* p) { return *reinterpret_cast<const u32*>(p); }

// Copies rows [row0, row0 + 64) of the [seq, D] matrix `src` (16-byte aligned) into `dst` (pitch
// D + MMA_PAD halves), 16 bytes per thread and step; rows at or past `seq` become zeros. Called by the
// whole block between barriers.
template <int D>
__device__ __forceinline__ void mma_stage(u16* dst, const u16* src, i64 row0, i64 seq) {
    constexpr int CHUNKS = D / 8;
    static_assert(MMA_BK * CHUNKS % MMA_THREADS == 0, "whole steps");
#pragma unroll
    for (int step = 0; step < MMA_BK * CHUNKS / MMA_THREADS; ++step) {
        const int idx = step * MMA_THREADS + (int)threadIdx.x;
        const int r = idx / CHUNKS;
        const int c = (idx % CHUNKS) * 8;
        const i64 row = row0 + r;
        uint4 x = make_uint4(0u, 0u, 0u, 0u);
        if (row < seq) {
            x = *reinterpret_cast<const uint4*>(src + row * D + c);
        }
        *reinterpret_cast<uint4*>(dst + r * (D + MMA_PAD) + c) = x;
    }
}

// Whether the 16 staged rows of V at `vt` hold an infinity or a NaN; the same answer in every lane.
template <typename T, int D>
__device__ __forceinline__ bool mma_nonfinite16(const u16* vt, int lane) {
    constexpr int PAIRS = D / 2;
    bool bad = false;
#pragma unroll
    for (int step = 0; step < 16 * PAIRS / 32; ++step) {
        const int idx = step * 32 + lane;
        bad |= Mma<T>::nonfinite2(mma_ld32(vt + (idx / PAIRS) * (D + MMA_PAD) + (idx % PAIRS) * 2));
    }
    return __any_sync(ATT_FULL_MASK, bad);
}

// O += P·V for the 16 keys kb .. kb + 15 (staged at `vt`) on CUDA cores, each row adding only the keys
// it sees (key ≤ row): the causal diagonal block when its V is not finite. `p[jj][i]` is this lane's
// unrounded p of n-tile jj of the block in the C layout; every lane of the warp must call it.
template <typename T, int D>
__device__ __forceinline__ void mma_pv_masked(float (&acc)[D / 8][4], const float (&p)[2][4],
                                              const u16* vt, i64 kb, const i64 (&row)[2], int lane) {
    const int t = lane & 3;
#pragma unroll 1
    for (int c = 0; c < 16; ++c) {
        // Key kb + c sits in n-tile c >> 3, element (c & 7) of the row: lane t' = (c & 7) >> 1 of the
        // quad, register c & 1 (row g) or (c & 1) + 2 (row g + 8). (Selects, not a dynamic index, keep
        // `p` in registers; the loop stays rolled, as this path is rare.)
        const int src = (lane & ~3) | ((c & 7) >> 1);
        const bool hi_tile = c >= 8;
        const bool odd = (c & 1) != 0;
        const float mine0 = hi_tile ? (odd ? p[1][1] : p[1][0]) : (odd ? p[0][1] : p[0][0]);
        const float mine1 = hi_tile ? (odd ? p[1][3] : p[1][2]) : (odd ? p[0][3] : p[0][2]);
        const float p0 = __shfl_sync(ATT_FULL_MASK, mine0, src);
        const float p1 = __shfl_sync(ATT_FULL_MASK, mine1, src);
        const bool see0 = kb + c <= row[0];
        const bool see1 = kb + c <= row[1];
        const u16* vr = vt + c * (D + MMA_PAD) + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const float v0 = Mma<T>::to_float(vr[8 * n]);
            const float v1 = Mma<T>::to_float(vr[8 * n + 1]);
            if (see0) {
                acc[n][0] += p0 * v0;
                acc[n][1] += p0 * v1;
            }
            if (see1) {
                acc[n][2] += p1 * v0;
                acc[n][3] += p1 * v1;
            }
        }
    }
}

// One (head, 64-row query tile) on tensor cores. `q`, `k`, `v`, `o` point at the head's first row, as
// raw 16-bit elements.
template <typename T, int D>
__device__ void mma_tile(const u16* q, const u16* k, const u16* v, u16* o, float* lse, i64 sq,
                         i64 skv, i64 q0, float scale, bool causal) {
    constexpr int LD = D + MMA_PAD;
    constexpr int KS = D / 16;  // k-steps of Q·Kᵀ
    constexpr int NT = D / 8;   // n-tiles of O
    alignas(16) __shared__ u16 ks[MMA_BK * LD];
    alignas(16) __shared__ u16 vs[MMA_BK * LD];

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;
    const float neg_inf = __int_as_float(0xff800000);

    // Q fragments, staged through `ks`.
    __syncthreads();
    mma_stage<D>(ks, q, q0, sq);
    __syncthreads();
    u32 qa[KS][4];
    {
        const u16* qw = ks + (warp * 16 + g) * LD + 2 * t;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
            qa[kk][0] = mma_ld32(qw + 16 * kk);
            qa[kk][1] = mma_ld32(qw + 8 * LD + 16 * kk);
            qa[kk][2] = mma_ld32(qw + 16 * kk + 8);
            qa[kk][3] = mma_ld32(qw + 8 * LD + 16 * kk + 8);
        }
    }

    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            acc[n][i] = 0.f;
        }
    }
    float m[2] = {neg_inf, neg_inf};
    float l[2] = {0.f, 0.f};
    const i64 r_first = q0 + warp * 16;
    const i64 row[2] = {r_first + g, r_first + g + 8};
    // Keys any row of the block sees (causal tiles stop at the last row's diagonal), and keys any row
    // of this warp sees.
    const i64 q_end = min(sq, q0 + MMA_BQ);
    const i64 kv_end = causal ? min(skv, q_end) : skv;
    const i64 key_lim = causal ? min(skv, r_first + 16) : skv;

    for (i64 k0 = 0; k0 < kv_end; k0 += MMA_BK) {
        __syncthreads();
        mma_stage<D>(ks, k, k0, skv);
        mma_stage<D>(vs, v, k0, skv);
        __syncthreads();

        // S = Q·Kᵀ: n-tile j holds keys k0 + 8j .. k0 + 8j + 7.
        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                s[j][i] = 0.f;
            }
            if (k0 + 8 * j < key_lim) {  // uniform over the warp
                const u16* kr = ks + (8 * j + g) * LD + 2 * t;
#pragma unroll
                for (int kk = 0; kk < KS; ++kk) {
                    Mma<T>::mma(s[j], qa[kk], mma_ld32(kr + 16 * kk), mma_ld32(kr + 16 * kk + 8));
                }
            }
        }

        // Mask and scale; the tile's max per row over the quad.
        float mx[2] = {neg_inf, neg_inf};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const i64 key = k0 + 8 * j + 2 * t + (i & 1);
                const bool visible = key < skv && (!causal || key <= row[i >> 1]);
                s[j][i] = visible ? scale * s[j][i] : neg_inf;
                mx[i >> 1] = fmaxf(mx[i >> 1], s[j][i]);
            }
        }
        // Online softmax: exponents relative to the new max, or to 0 while every score so far is −inf.
        float base[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(ATT_FULL_MASK, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(ATT_FULL_MASK, mx[h], 2));
            const float m_new = fmaxf(m[h], mx[h]);
            base[h] = (m_new == neg_inf) ? 0.f : m_new;
            const float alpha = expf(m[h] - base[h]);
            m[h] = m_new;
            l[h] *= alpha;
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                acc[n][2 * h] *= alpha;
                acc[n][2 * h + 1] *= alpha;
            }
        }

        // P and O += P·V, 16 keys (n-tiles 2kk, 2kk + 1) per k-step.
        float ls[2] = {0.f, 0.f};
#pragma unroll
        for (int kk = 0; kk < MMA_BK / 16; ++kk) {
            float p[2][4];
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    p[jj][i] = expf(s[2 * kk + jj][i] - base[i >> 1]);
                    ls[i >> 1] += p[jj][i];
                }
            }
            const i64 kb = k0 + 16 * kk;
            if (kb < key_lim) {  // uniform over the warp
                const u16* vt = vs + 16 * kk * LD;
                if (causal && kb == r_first && mma_nonfinite16<T, D>(vt, lane)) {
                    mma_pv_masked<T, D>(acc, p, vt, kb, row, lane);
                } else {
                    const u32 pa[4] = {Mma<T>::pack(p[0][0], p[0][1]), Mma<T>::pack(p[0][2], p[0][3]),
                                       Mma<T>::pack(p[1][0], p[1][1]), Mma<T>::pack(p[1][2], p[1][3])};
                    const u16* vc = vt + 2 * t * LD + g;
#pragma unroll
                    for (int n = 0; n < NT; ++n) {
                        const u16* vn = vc + 8 * n;
                        const u32 b0 = (u32)vn[0] | ((u32)vn[LD] << 16);
                        const u32 b1 = (u32)vn[8 * LD] | ((u32)vn[9 * LD] << 16);
                        Mma<T>::mma(acc[n], pa, b0, b1);
                    }
                }
            }
        }
        l[0] += ls[0];
        l[1] += ls[1];
    }

    // O = acc / l (l summed over the quad), rounded once to T; rows past seq_q are not stored.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l[h] += __shfl_xor_sync(ATT_FULL_MASK, l[h], 1);
        l[h] += __shfl_xor_sync(ATT_FULL_MASK, l[h], 2);
        if (lse != nullptr && t == 0 && row[h] < sq) {
            lse[row[h]] = (m[h] == neg_inf ? 0.f : m[h]) + logf(l[h]);
        }
        if (row[h] < sq) {
            u32* orow = reinterpret_cast<u32*>(o + row[h] * D + 2 * t);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                orow[4 * n] = Mma<T>::pack(acc[n][2 * h] / l[h], acc[n][2 * h + 1] / l[h]);
            }
        }
    }
}

// Grid-stride walk over (head, query tile) items, last query tile first (the heaviest when causal).
// Launch with MMA_THREADS threads.
template <typename T, int D>
__device__ void mma_body(const T* q, const T* k, const T* v, T* o, float* lse, i64 bh, i64 sq,
                         i64 skv, double scale, int causal) {
    const i64 n_qt = (sq + MMA_BQ - 1) / MMA_BQ;
    const i64 total = bh * n_qt;
    for (i64 item = blockIdx.x; item < total; item += gridDim.x) {
        const i64 head = item % bh;
        const i64 qt = n_qt - 1 - item / bh;
        mma_tile<T, D>(reinterpret_cast<const u16*>(q + head * sq * D),
                       reinterpret_cast<const u16*>(k + head * skv * D),
                       reinterpret_cast<const u16*>(v + head * skv * D),
                       reinterpret_cast<u16*>(o + head * sq * D),
                       lse == nullptr ? nullptr : lse + head * sq, sq, skv, qt * MMA_BQ,
                       (float)scale, causal != 0);
    }
}

// attention_mma_d{64,128}_{f16,bf16}(q, k, v, o, lse, batch·heads, seq_q, seq_kv, head_dim, scale,
// causal):
// the SIMT entry points' parameters; head_dim must equal the suffix's D, and q, k, v, o must be 16-byte
// aligned.
#define MMA_ENTRY_D(D, S, T)                                                                        \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS)                                      \
        attention_mma_d##D##_##S(const T* q, const T* k, const T* v, T* o, float* lse, i64 bh,      \
                                 i64 sq, i64 skv, i64 dim, double scale, int causal) {              \
        (void)dim;                                                                                  \
        mma_body<T, D>(q, k, v, o, lse, bh, sq, skv, scale, causal);                                \
    }
#define MMA_ENTRY(S, T) MMA_ENTRY_D(64, S, T) MMA_ENTRY_D(128, S, T)
#if TORSH_HAS_F16
MMA_ENTRY(f16, f16_t)
#endif
#if TORSH_HAS_BF16
MMA_ENTRY(bf16, bf16_t)
#endif
#undef MMA_ENTRY
#undef MMA_ENTRY_D

#endif  // __CUDA_ARCH__ >= 800 && (TORSH_HAS_F16 || TORSH_HAS_BF16)
