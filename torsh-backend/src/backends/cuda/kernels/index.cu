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

// Records index `v` in the flag; the first thread to raise it writes the details.
__device__ void raise_index_error(u64* flag, i64 v, const GatherGeometry& g) {
    if (atomicAdd(&flag[0], 1ull) == 0ull) {
        flag[1] = (u64)g.op;
        flag[2] = (u64)v;
        flag[3] = (u64)g.size;
    }
}

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
            raise_index_error(flag, v, g);
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
