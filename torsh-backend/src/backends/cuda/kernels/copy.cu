// Fill and strided copy by element width (module `copy`): `fill_<width>` and `copy_<width>` with width
// one of u8, u16, u32, u64, for every dtype of that size. These kernels take no dtype, so this module has
// no per-dtype variants: the host always loads the full module.
//
// The meaning is the reference backend's (backends/reference/memory.rs): the host encodes a fill value
// exactly as the reference does, and the kernel writes its bits. Every kernel is a grid-stride loop with
// 64-bit indices; both views of a copy are strided (`elem_offset`).

// The unsigned integer type of each element width, for the width-generic kernels.
#define TORSH_WIDTHS(X) X(u8, u8) X(u16, u16) X(u32, u32) X(u64, u64)

// y[0..n) = the low bits of `bits` (the host encodes the value as the reference does).
template <typename W> __device__ void fill_body(W* y, i64 n, u64 bits) {
    const W v = (W)bits;
    TORSH_GRID_STRIDE(i, n) {
        y[i] = v;
    }
}

// Element by element from one strided view to another of the same shape.
template <typename W>
__device__ void copy_body(const W* x, const Strided& xs, W* y, const Strided& ys, i64 n) {
    TORSH_GRID_STRIDE(i, n) {
        y[elem_offset(ys, i)] = x[elem_offset(xs, i)];
    }
}

// fill_<width>(y, n, bits) and copy_<width>(x, xs, y, ys, n), width one of u8, u16, u32, u64.
#define ENTRY(S, W)                                                                         \
    extern "C" __global__ void fill_##S(W* y, i64 n, u64 bits) { fill_body<W>(y, n, bits); } \
    extern "C" __global__ void copy_##S(const W* x, Strided xs, W* y, Strided ys, i64 n) {  \
        copy_body<W>(x, xs, y, ys, n);                                                      \
    }
TORSH_WIDTHS(ENTRY)
#undef ENTRY
#undef TORSH_WIDTHS
