// Fill and strided copy by element width (module `copy`): `fill_<width>`, `fill_vec_<width>` and
// `copy_<width>` with width one of u8, u16, u32, u64, for every dtype of that size. These kernels take no dtype, so this module has
// no per-dtype variants: the host always loads the full module.
//
// The meaning is the reference backend's (backends/reference/memory.rs): the host encodes a fill value
// exactly as the reference does, and the kernel writes its bits. Every kernel is a grid-stride loop with
// 64-bit indices; both views of a copy are strided (`elem_offset`). `fill_vec_<width>` is the fast path
// of a fill whose output is 16-byte aligned: 16-byte stores.

// The unsigned integer type of each element width, for the width-generic kernels.
#define TORSH_WIDTHS(X) X(u8, u8) X(u16, u16) X(u32, u32) X(u64, u64)

// y[0..n) = the low bits of `bits` (the host encodes the value as the reference does).
template <typename W> __device__ void fill_body(W* y, i64 n, u64 bits) {
    const W v = (W)bits;
    TORSH_GRID_STRIDE(i, n) {
        y[i] = v;
    }
}

// L elements of W moved as one unit: 16 bytes, 16-byte aligned, so one st.global.v4 stores it.
template <typename W, int L> struct alignas(16) Pack { W e[L]; };

// fill_body with a 16-byte aligned y: 16 bytes per thread and step (L = 16 / sizeof(W) elements),
// grid-stride over the n / L vectors, then the last n % L elements by the first threads of the grid.
template <typename W> __device__ void fill_vec_body(W* y, i64 n, u64 bits) {
    constexpr int L = 16 / (int)sizeof(W);
    typedef Pack<W, L> P;
    const W v = (W)bits;
    P p;
#pragma unroll
    for (int k = 0; k < L; ++k) {
        p.e[k] = v;
    }
    P* yv = reinterpret_cast<P*>(y);
    const i64 nv = n / L;
    TORSH_GRID_STRIDE(i, nv) {
        yv[i] = p;
    }
    const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n - nv * L) {
        y[nv * L + t] = v;
    }
}

// Element by element from one strided view to another of the same shape.
template <typename W>
__device__ void copy_body(const W* x, const Strided& xs, W* y, const Strided& ys, i64 n) {
    TORSH_GRID_STRIDE(i, n) {
        y[elem_offset(ys, i)] = x[elem_offset(xs, i)];
    }
}

// fill_<width>(y, n, bits), fill_vec_<width>(y, n, bits) (y 16-byte aligned) and
// copy_<width>(x, xs, y, ys, n), width one of u8, u16, u32, u64.
#define ENTRY(S, W)                                                                         \
    extern "C" __global__ void fill_##S(W* y, i64 n, u64 bits) { fill_body<W>(y, n, bits); } \
    extern "C" __global__ void fill_vec_##S(W* y, i64 n, u64 bits) {                        \
        fill_vec_body<W>(y, n, bits);                                                       \
    }                                                                                       \
    extern "C" __global__ void copy_##S(const W* x, Strided xs, W* y, Strided ys, i64 n) {  \
        copy_body<W>(x, xs, y, ys, n);                                                      \
    }
TORSH_WIDTHS(ENTRY)
#undef ENTRY
#undef TORSH_WIDTHS
