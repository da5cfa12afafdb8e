// Stable sorts along one dim (module `sort`), by ranks: `sort_<dtype>(x, values, indices, g,
// descending)`, the meaning of the reference backend's (backends/reference/sort.rs). One thread per
// element (grid-stride, 64-bit offsets) counts the elements of its line that come before it in the
// sort's total order, or equal it at an earlier position, and writes itself at that rank when the
// rank is below k: its value to `values` and its position along the dim to `indices` (either pointer
// may be null). The ranks of
// a line are a permutation, so every output element is written once. O(len) per element.
//
// The order: NaN after every number, -0 equal to +0 (keys as `Key<T>` in common.cuh: f16 and bf16
// widened to float exactly); `descending` reverses it, equal elements keeping their input order.

// The launch's geometry (`SortGeometry` in sort.rs, same layout).
struct SortGeometry {
    i64 shape[TORSH_MAX_RANK];
    i64 x_strides[TORSH_MAX_RANK];
    i64 x_offset;
    i64 n;          // elements
    i64 inner;      // the product of the dims after `dim`
    i64 k;          // ranks written: the outputs have x's shape with `dim` cut to k
    int rank;
    int dim;
};

// True when `a` comes strictly before `b` in ascending order: numbers before NaN, IEEE otherwise.
template <typename K> __device__ __forceinline__ bool sort_before(K a, K b) {
    const bool a_nan = a != a;
    const bool b_nan = b != b;
    if (a_nan || b_nan) {
        return !a_nan && b_nan;
    }
    return a < b;
}

template <typename T>
__device__ void sort_body(const T* x, T* values, i64* indices, const SortGeometry& g, int descending) {
    typedef typename Key<T>::K K;
    TORSH_GRID_STRIDE(e, g.n) {
        i64 rest = e;
        i64 at = g.x_offset;
        i64 pos = 0;
        for (int d = g.rank - 1; d >= 0; --d) {
            const i64 c = rest % g.shape[d];
            rest /= g.shape[d];
            at += c * g.x_strides[d];
            if (d == g.dim) {
                pos = c;
            }
        }
        const i64 stride = g.x_strides[g.dim];
        const i64 base = at - pos * stride;
        const i64 len = g.shape[g.dim];
        const K mine = Key<T>::of(x[at]);
        i64 rank = 0;
        for (i64 i = 0; i < len; ++i) {
            const K other = Key<T>::of(x[base + i * stride]);
            const bool before = descending ? sort_before(mine, other) : sort_before(other, mine);
            const bool tie = !sort_before(other, mine) && !sort_before(mine, other) && i < pos;
            if (before || tie) {
                ++rank;
            }
        }
        if (rank >= g.k) {
            continue;
        }
        const i64 out = (e / (len * g.inner) * g.k + rank) * g.inner + e % g.inner;
        if (values) {
            values[out] = x[at];
        }
        if (indices) {
            indices[out] = pos;
        }
    }
}

// sort_<dtype>(x, values, indices, g, descending): values (null: not written) and indices (i64;
// null: not written) dense with x's shape cut to k along `dim`.
#define ENTRY(S, T)                                                                               \
    extern "C" __global__ void sort_##S(const T* x, T* values, i64* indices, SortGeometry g,      \
                                        int descending) {                                         \
        sort_body<T>(x, values, indices, g, descending);                                          \
    }
TORSH_ALL_TYPES(ENTRY)
#undef ENTRY
