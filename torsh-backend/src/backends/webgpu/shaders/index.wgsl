// Gathering and scattering by an index tensor. `gather` (`GatherDesc`): out[i] = input[i with its
// coordinate along DIM replaced by index[i]], for elements of any width, moved as bits. `scatter`
// (`ScatterDesc`): out[i with its coordinate along DIM replaced by index[i]] = src[i] (moved as bits)
// or += alpha * src[i] (ADD, f32), one invocation per column of the index (the positions sharing
// every coordinate but DIM, which land on output elements no other column touches), walking DIM in
// order, so repeated indices resolve as the reference resolves them: the last assignment wins and
// additions sum in order.
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
// Parameter words (`p`): [0] n (gather: output elements; scatter: columns), [1] rank (at most 8),
// [2..10) the index's shape, [10] input (gather) or src (scatter) byte address, [11..19) its strides
// (elements), [19] index element offset, [20..28) index strides, [28] output byte address, [29] the
// size along DIM of the input (gather) or output (scatter), [30] the op's code for the flag; scatter
// only: [31..39) the output's strides, [39] alpha as f32 bits.

override WIDTH: u32 = 4u;
override INDEX64: bool = false;
override DIM: u32 = 0u;
// scatter: add alpha * src (f32) instead of assigning.
override ADD: bool = false;

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
const OUT_STRIDES: u32 = 31u;
const ALPHA: u32 = 39u;

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
    let v = index_at(at_ix);
    let lo = v.x;
    let hi = v.y;
    if (hi != 0u || lo >= p[SIZE]) {
        raise(lo, hi);
        return;
    }
    at_in += lo * p[IN_VIEW + 1u + DIM];
    move_element(p[IN_VIEW] + at_in * WIDTH, p[OUT_AT] + i * WIDTH);
}

// The index at element `at` of the index buffer as (low, high) words.
fn index_at(at: u32) -> vec2<u32> {
    if (INDEX64) {
        return vec2<u32>(idx[2u * at], idx[2u * at + 1u]);
    }
    let lo = idx[at];
    return vec2<u32>(lo, select(0u, 0xffffffffu, (lo & 0x80000000u) != 0u));
}

// Copies the WIDTH-byte element at byte address `src_at` of `src` to byte address `dst_at` of `dst`.
fn move_element(src_at: u32, dst_at: u32) {
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

@compute @workgroup_size(256)
fn scatter(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let c = (wid.x + wid.y * groups.x) * WG + lid;
    if (c >= p[0]) {
        return;
    }
    // The column's coordinate over every dim but DIM, dotted with each operand's strides.
    var rest = c;
    var at_ix = p[IX_VIEW];
    var at_src = 0u;
    var at_out = 0u;
    for (var d = p[1]; d > 0u; d--) {
        let k = d - 1u;
        if (k == DIM) {
            continue;
        }
        let extent = p[SHAPE + k];
        let x = rest % extent;
        rest /= extent;
        at_ix += x * p[IX_VIEW + d];
        at_src += x * p[IN_VIEW + d];
        at_out += x * p[OUT_STRIDES + k];
    }
    let len = p[SHAPE + DIM];
    let alpha = bitcast<f32>(p[ALPHA]);
    for (var j = 0u; j < len; j++) {
        let v = index_at(at_ix);
        if (v.y != 0u || v.x >= p[SIZE]) {
            raise(v.x, v.y);
        } else {
            let t = at_out + v.x * p[OUT_STRIDES + DIM];
            if (ADD) {
                let w = (p[OUT_AT] >> 2u) + t;
                let sum = bitcast<f32>(atomicLoad(&dst[w]))
                    + alpha * bitcast<f32>(src[(p[IN_VIEW] >> 2u) + at_src]);
                atomicStore(&dst[w], bitcast<u32>(sum));
            } else {
                move_element(p[IN_VIEW] + at_src * WIDTH, p[OUT_AT] + t * WIDTH);
            }
        }
        at_ix += p[IX_VIEW + 1u + DIM];
        at_src += p[IN_VIEW + 1u + DIM];
    }
}
