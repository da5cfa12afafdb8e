// Gathering by an index tensor (module `index`): `gather_<width>_<index>`, width one of u8, u16, u32,
// u64 (every dtype of that size: elements move as bits), index one of i32, i64. These kernels take no
// dtype, so this module has no per-dtype variants: the host always loads the full module.
//
// out[i] = x[i with its coordinate along `dim` replaced by index[i]] (the reference's `gather` in
// backends/reference/index.rs). One thread per output element, grid-stride, 64-bit offsets. An index
// outside 0..size is never followed: the thread leaves its output element as it is and raises the
// error flag (`flag`: [0] how many raised it, [1] the op's code, [2] the first reported index, [3] the
// size), which the host reads at the next synchronize or host read.

// The launch's geometry (`GatherGeometry` in index.rs, same layout).
struct GatherGeometry {
    i64 shape[TORSH_MAX_RANK];      // the output's (= the index's) shape
    i64 in_strides[TORSH_MAX_RANK]; // along `dim`: the step per index
    i64 ix_strides[TORSH_MAX_RANK];
    i64 in_offset;
    i64 ix_offset;
    i64 n;                          // output elements
    i64 size;                       // the input's length along `dim`
    i64 op;                         // the op's code for the flag
    int rank;
    int dim;
};

template <typename W, typename I>
__device__ void gather_body(const W* x, const I* index, W* y, const GatherGeometry& g, u64* flag) {
    TORSH_GRID_STRIDE(i, g.n) {
        i64 rest = i;
        i64 at_ix = g.ix_offset;
        i64 at_in = g.in_offset;
        for (int d = g.rank - 1; d >= 0; --d) {
            const i64 c = rest % g.shape[d];
            rest /= g.shape[d];
            at_ix += c * g.ix_strides[d];
            if (d != g.dim) {
                at_in += c * g.in_strides[d];
            }
        }
        const i64 v = (i64)index[at_ix];
        if (v < 0 || v >= g.size) {
            raise_index_error(flag, v, g.op, g.size);
            continue;
        }
        y[i] = x[at_in + v * g.in_strides[g.dim]];
    }
}

#define TORSH_WIDTHS(X) X(u8, u8) X(u16, u16) X(u32, u32) X(u64, u64)
#define ENTRY(S, W)                                                                              \
    extern "C" __global__ void gather_##S##_i32(const W* x, const i32* index, W* y,              \
                                                GatherGeometry g, u64* flag) {                   \
        gather_body<W, i32>(x, index, y, g, flag);                                               \
    }                                                                                            \
    extern "C" __global__ void gather_##S##_i64(const W* x, const i64* index, W* y,              \
                                                GatherGeometry g, u64* flag) {                   \
        gather_body<W, i64>(x, index, y, g, flag);                                               \
    }
TORSH_WIDTHS(ENTRY)
#undef ENTRY
#undef TORSH_WIDTHS

// ------------------------------------------------------------------------------------------ scatter
//
// `scatter_<width>_<index>` assigns (elements moved as bits) and `scatter_add_<dtype>_<index>` adds
// alpha * src in the dtype's accumulator type (rounded at each addition), with one thread per column
// of the index (the positions sharing every coordinate but `dim`, which land on output elements no
// other column touches), walking `dim` in order: repeated indices resolve as the reference resolves
// them (the last assignment wins, additions sum in order), deterministically.

// The launch's geometry (`ScatterGeometry` in index.rs, same layout).
struct ScatterGeometry {
    i64 shape[TORSH_MAX_RANK];       // the index's (= the source's) shape
    i64 src_strides[TORSH_MAX_RANK];
    i64 ix_strides[TORSH_MAX_RANK];
    i64 out_strides[TORSH_MAX_RANK]; // the dense output's
    i64 src_offset;
    i64 ix_offset;
    i64 columns;
    i64 size;                        // the output's length along `dim`
    i64 op;                          // the op's code for the flag
    double alpha;
    int rank;
    int dim;
};

// Calls `f(out_offset, src_offset)` for each valid position of column `c`, in order along `dim`.
template <typename I, typename F>
__device__ void scatter_column(const I* index, const ScatterGeometry& g, i64 c, u64* flag, F f) {
    i64 at_ix = g.ix_offset;
    i64 at_src = g.src_offset;
    i64 at_out = 0;
    for (int d = g.rank - 1; d >= 0; --d) {
        if (d == g.dim) {
            continue;
        }
        const i64 x = c % g.shape[d];
        c /= g.shape[d];
        at_ix += x * g.ix_strides[d];
        at_src += x * g.src_strides[d];
        at_out += x * g.out_strides[d];
    }
    for (i64 j = 0; j < g.shape[g.dim]; ++j) {
        const i64 v = (i64)index[at_ix];
        if (v < 0 || v >= g.size) {
            raise_index_error(flag, v, g.op, g.size);
        } else {
            f(at_out + v * g.out_strides[g.dim], at_src);
        }
        at_ix += g.ix_strides[g.dim];
        at_src += g.src_strides[g.dim];
    }
}

template <typename W, typename I>
__device__ void scatter_body(const W* src, const I* index, W* y, const ScatterGeometry& g, u64* flag) {
    TORSH_GRID_STRIDE(c, g.columns) {
        scatter_column(index, g, c, flag, [&](i64 t, i64 s) { y[t] = src[s]; });
    }
}

template <typename T, typename I>
__device__ void scatter_add_body(const T* src, const I* index, T* y, const ScatterGeometry& g,
                                 u64* flag) {
    typedef typename Num<T>::acc A;
    const A alpha = (A)g.alpha;
    TORSH_GRID_STRIDE(c, g.columns) {
        scatter_column(index, g, c, flag, [&](i64 t, i64 s) {
            y[t] = Num<T>::store(Num<T>::load(y[t]) + alpha * Num<T>::load(src[s]));
        });
    }
}

#define TORSH_WIDTHS(X) X(u8, u8) X(u16, u16) X(u32, u32) X(u64, u64)
#define ENTRY(S, W)                                                                              \
    extern "C" __global__ void scatter_##S##_i32(const W* src, const i32* index, W* y,           \
                                                 ScatterGeometry g, u64* flag) {                 \
        scatter_body<W, i32>(src, index, y, g, flag);                                            \
    }                                                                                            \
    extern "C" __global__ void scatter_##S##_i64(const W* src, const i64* index, W* y,           \
                                                 ScatterGeometry g, u64* flag) {                 \
        scatter_body<W, i64>(src, index, y, g, flag);                                            \
    }
TORSH_WIDTHS(ENTRY)
#undef ENTRY
#undef TORSH_WIDTHS

#define TORSH_ADD_TYPES(X) X(f32, float) X(f64, double) X(f16, f16_t) X(bf16, bf16_t)
#define ENTRY(S, T)                                                                              \
    extern "C" __global__ void scatter_add_##S##_i32(const T* src, const i32* index, T* y,       \
                                                     ScatterGeometry g, u64* flag) {             \
        scatter_add_body<T, i32>(src, index, y, g, flag);                                        \
    }                                                                                            \
    extern "C" __global__ void scatter_add_##S##_i64(const T* src, const i64* index, T* y,       \
                                                     ScatterGeometry g, u64* flag) {             \
        scatter_add_body<T, i64>(src, index, y, g, flag);                                        \
    }
TORSH_ADD_TYPES(ENTRY)
#undef ENTRY
#undef TORSH_ADD_TYPES
