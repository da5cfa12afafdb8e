// Comparison and selection (module `select`): `compare_<dtype>` writes a U8 mask of 0 and 1,
// `where_<width>` picks each element from one of two operands by a U8 mask, moving elements as bits
// (width one of u8, u16, u32, u64: every dtype of that size). The meaning of both is the reference
// backend's (backends/reference/select.rs).
//
// Comparisons read each element as its key type (f16 and bf16 widened to float exactly, the others
// as they are), so C++'s comparisons are IEEE's: NaN compares unequal to everything, -0 == +0. The
// module is compiled without flushing subnormals, so none compares as zero. The logical ops take any
// value but a zero as true (NaN included).
//
// Operands are strided over the output's shape (broadcast dims: stride 0); `b` (compare) and either
// branch (where) may instead be a scalar, passed as its element bits in the low bytes of a u64 with
// a flag set. One thread per output element, grid-stride, 64-bit offsets; the output is dense.

// Comparison op codes: the numbers of `CompareOp` (compute/desc/mod.rs).
#define CMP_EQ 0
#define CMP_NE 1
#define CMP_LT 2
#define CMP_LE 3
#define CMP_GT 4
#define CMP_GE 5
#define CMP_LOGICAL_AND 6
#define CMP_LOGICAL_OR 7
#define CMP_LOGICAL_XOR 8

template <typename K> __device__ __forceinline__ bool compare_keys(int op, K a, K b) {
    const K zero = K(0);
    switch (op) {
    case CMP_EQ: return a == b;
    case CMP_NE: return a != b;
    case CMP_LT: return a < b;
    case CMP_LE: return a <= b;
    case CMP_GT: return a > b;
    case CMP_GE: return a >= b;
    case CMP_LOGICAL_AND: return a != zero && b != zero;
    case CMP_LOGICAL_OR: return a != zero || b != zero;
    case CMP_LOGICAL_XOR: return (a != zero) != (b != zero);
    default: return false;
    }
}

template <typename T>
__device__ void compare_body(const T* a, const Strided& as, const T* b, const Strided& bs, u64 b_bits,
                             int b_scalar, u8* y, i64 n, int op) {
    typedef Key<T> Kt;
    const T scalar = from_bits<T>(b_bits);
    TORSH_GRID_STRIDE(i, n) {
        const T x = a[elem_offset(as, i)];
        const T z = b_scalar ? scalar : b[elem_offset(bs, i)];
        y[i] = compare_keys<typename Kt::K>(op, Kt::of(x), Kt::of(z)) ? 1 : 0;
    }
}

// compare_<dtype>(a, as, b, bs, b_bits, b_scalar, y, n, op): y[0..n) dense U8; b ignored when
// b_scalar (its value is b_bits).
#define ENTRY(S, T)                                                                               \
    extern "C" __global__ void compare_##S(const T* a, Strided as, const T* b, Strided bs,        \
                                           u64 b_bits, int b_scalar, u8* y, i64 n, int op) {      \
        compare_body<T>(a, as, b, bs, b_bits, b_scalar, y, n, op);                                \
    }
TORSH_ALL_TYPES(ENTRY)
#undef ENTRY

template <typename W>
__device__ void where_body(const u8* c, const Strided& cs, const W* t, const Strided& ts, u64 t_bits,
                           int t_scalar, const W* f, const Strided& fs, u64 f_bits, int f_scalar, W* y,
                           i64 n) {
    const W t_value = from_bits<W>(t_bits);
    const W f_value = from_bits<W>(f_bits);
    TORSH_GRID_STRIDE(i, n) {
        if (c[elem_offset(cs, i)] != 0) {
            y[i] = t_scalar ? t_value : t[elem_offset(ts, i)];
        } else {
            y[i] = f_scalar ? f_value : f[elem_offset(fs, i)];
        }
    }
}

// where_<width>(c, cs, t, ts, t_bits, t_scalar, f, fs, f_bits, f_scalar, y, n): y[0..n) dense; a
// branch flagged scalar is its bits, its pointer ignored. These take no dtype: every variant of the
// module declares them.
#define ENTRY(S, W)                                                                               \
    extern "C" __global__ void where_##S(const u8* c, Strided cs, const W* t, Strided ts,         \
                                         u64 t_bits, int t_scalar, const W* f, Strided fs,         \
                                         u64 f_bits, int f_scalar, W* y, i64 n) {                  \
        where_body<W>(c, cs, t, ts, t_bits, t_scalar, f, fs, f_bits, f_scalar, y, n);             \
    }
ENTRY(u8, u8) ENTRY(u16, u16) ENTRY(u32, u32) ENTRY(u64, u64)
#undef ENTRY
