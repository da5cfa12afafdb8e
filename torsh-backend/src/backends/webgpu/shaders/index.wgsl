// Gathering by an index tensor (`GatherDesc`): out[i] = input[i with its coordinate along DIM
// replaced by index[i]], for elements of any width, moved as bits.
//
// Buffers are arrays of 32-bit words. The input and output are located by byte address and their
// elements are aligned to their width (1, 2, 4 or 8 bytes); the index by element offset, I32 (one
// word) or I64 (two words, low first). One invocation writes one output element; writes go through
// atomics, as an element narrower than a word shares it with elements other invocations write.
//
// An index outside 0..size is never followed: the invocation leaves its output element as it is and
// raises the error flag (`flag`: [0] how many raised it, [1] the op's code, [2], [3] the first
// reported index as (low, high) words, [4] the size), which the host reads at the next synchronize
// or host read.
//
// Parameter words (`p`): [0] n, [1] rank (at most 8), [2..10) the output's shape, [10] input byte
// address, [11..19) input strides (elements; the one along DIM is the step per index), [19] index
// element offset, [20..28) index strides, [28] output byte address, [29] the size of the input along
// DIM, [30] the op's code for the flag.

override WIDTH: u32 = 4u;
override INDEX64: bool = false;
override DIM: u32 = 0u;

@group(0) @binding(0) var<storage, read_write> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> idx: array<u32>;
@group(0) @binding(3) var<storage, read_write> flag: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

const WG: u32 = 256u;
const SHAPE: u32 = 2u;
const IN_VIEW: u32 = 10u;
const IX_VIEW: u32 = 19u;
const OUT_AT: u32 = 28u;
const SIZE: u32 = 29u;
const OP: u32 = 30u;

// Writes the `mask` bits of output word `w` to those of `bits`.
fn store_bits(w: u32, bits: u32, mask: u32) {
    if (mask == 0xffffffffu) {
        atomicStore(&dst[w], bits);
        return;
    }
    atomicAnd(&dst[w], ~mask);
    atomicOr(&dst[w], bits & mask);
}

// Raises the error flag for index (lo, hi); the first invocation to raise it records the index.
fn raise(lo: u32, hi: u32) {
    if (atomicAdd(&flag[0], 1u) == 0u) {
        atomicStore(&flag[1], p[OP]);
        atomicStore(&flag[2], lo);
        atomicStore(&flag[3], hi);
        atomicStore(&flag[4], p[SIZE]);
    }
}

@compute @workgroup_size(256)
fn gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * groups.x) * WG + lid;
    if (i >= p[0]) {
        return;
    }
    // The output coordinate, split over the shape, dotted with the index's and input's strides.
    var rest = i;
    var at_ix = p[IX_VIEW];
    var at_in = 0u;
    for (var d = p[1]; d > 0u; d--) {
        let extent = p[SHAPE + d - 1u];
        let c = rest % extent;
        rest /= extent;
        at_ix += c * p[IX_VIEW + d];
        if (d - 1u != DIM) {
            at_in += c * p[IN_VIEW + d];
        }
    }
    var lo: u32;
    var hi = 0u;
    if (INDEX64) {
        lo = idx[2u * at_ix];
        hi = idx[2u * at_ix + 1u];
    } else {
        lo = idx[at_ix];
        hi = select(0u, 0xffffffffu, (lo & 0x80000000u) != 0u);
    }
    if (hi != 0u || lo >= p[SIZE]) {
        raise(lo, hi);
        return;
    }
    at_in += lo * p[IN_VIEW + 1u + DIM];
    let src_at = p[IN_VIEW] + at_in * WIDTH;
    let dst_at = p[OUT_AT] + i * WIDTH;
    if (WIDTH == 8u) {
        store_bits(dst_at >> 2u, src[src_at >> 2u], 0xffffffffu);
        store_bits((dst_at >> 2u) + 1u, src[(src_at >> 2u) + 1u], 0xffffffffu);
    } else if (WIDTH == 4u) {
        store_bits(dst_at >> 2u, src[src_at >> 2u], 0xffffffffu);
    } else {
        let mask = select(0xffu, 0xffffu, WIDTH == 2u);
        let bits = (src[src_at >> 2u] >> ((src_at & 3u) * 8u)) & mask;
        let shift = (dst_at & 3u) * 8u;
        store_bits(dst_at >> 2u, bits << shift, mask << shift);
    }
}
