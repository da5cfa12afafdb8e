// One fused Adam/AdamW step over contiguous params, grads, exp_avg, exp_avg_sq: one thread per element,
// grid-stride, in the accumulator type (float for f32/f16/bf16, double for f64).
//
// Semantics are the reference backend's (backends/reference/adam.rs), in the same order of operations:
//   AdamW: p *= 1 - lr*wd          Adam with wd != 0: g += wd*p
//   m = beta1*m + (1-beta1)*g
//   v = beta2*v + (1-beta2)*g*g
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//   p -= (lr / (1 - beta1^t)) * m / denom
// Every scalar derived from the step (1 - beta^t, its square root, lr / (1 - beta1^t), 1 - lr*wd, 1 - beta)
// is computed by the host in double and passed rounded to the accumulator type.

// Which weight decay applies; the host's DECAY_* constants (optim.rs).
#define ADAM_DECAY_NONE 0
#define ADAM_DECAY_L2 1
#define ADAM_DECAY_DECOUPLED 2

// The step's scalars in the accumulator type A.
template <typename A>
struct AdamScalars {
    A step_size;      // lr / (1 - beta1^t)
    A beta1;
    A one_minus_beta1;
    A beta2;
    A one_minus_beta2;
    A sqrt_bc2;       // sqrt(1 - beta2^t)
    A eps;
    A weight_decay;   // wd, added to the gradient times p (ADAM_DECAY_L2)
    A decay_factor;   // 1 - lr*wd, multiplying p (ADAM_DECAY_DECOUPLED)
    int decay;        // ADAM_DECAY_*
};

__device__ __forceinline__ float adam_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double adam_sqrt(double x) { return sqrt(x); }

// The update of one element, on values already widened to A.
template <typename A>
__device__ __forceinline__ void adam_update(A& p, A g, A& m, A& v, const AdamScalars<A>& s) {
    if (s.decay == ADAM_DECAY_DECOUPLED) {
        p *= s.decay_factor;
    } else if (s.decay == ADAM_DECAY_L2) {
        g += s.weight_decay * p;
    }
    m = s.beta1 * m + s.one_minus_beta1 * g;
    v = s.beta2 * v + s.one_minus_beta2 * g * g;
    const A denom = adam_sqrt(v) / s.sqrt_bc2 + s.eps;
    p -= s.step_size * m / denom;
}

// Element i of the four operands: load, update, store (each stored tensor rounded once).
template <typename T>
__device__ __forceinline__ void adam_element(
    T* __restrict__ params, const T* __restrict__ grads, T* __restrict__ exp_avg,
    T* __restrict__ exp_avg_sq, i64 i, const AdamScalars<typename Num<T>::acc>& s) {
    typedef typename Num<T>::acc A;
    A p = Num<T>::load(params[i]);
    A m = Num<T>::load(exp_avg[i]);
    A v = Num<T>::load(exp_avg_sq[i]);
    adam_update<A>(p, Num<T>::load(grads[i]), m, v, s);
    params[i] = Num<T>::store(p);
    exp_avg[i] = Num<T>::store(m);
    exp_avg_sq[i] = Num<T>::store(v);
}

// The kernels' scalar parameters, gathered.
template <typename A>
__device__ __forceinline__ AdamScalars<A> adam_scalars(
    A step_size, A beta1, A one_minus_beta1, A beta2, A one_minus_beta2, A sqrt_bc2, A eps,
    A weight_decay, A decay_factor, int decay) {
    AdamScalars<A> s;
    s.step_size = step_size;
    s.beta1 = beta1;
    s.one_minus_beta1 = one_minus_beta1;
    s.beta2 = beta2;
    s.one_minus_beta2 = one_minus_beta2;
    s.sqrt_bc2 = sqrt_bc2;
    s.eps = eps;
    s.weight_decay = weight_decay;
    s.decay_factor = decay_factor;
    s.decay = decay;
    return s;
}

// The parameter list every entry point shares; A is the accumulator type.
#define ADAM_PARAMS(T, A)                                                                              \
    T* __restrict__ params, const T* __restrict__ grads, T* __restrict__ exp_avg,                     \
        T* __restrict__ exp_avg_sq, i64 n, A step_size, A beta1, A one_minus_beta1, A beta2,          \
        A one_minus_beta2, A sqrt_bc2, A eps, A weight_decay, A decay_factor, int decay

#define ADAM_SCALARS                                                                                   \
    adam_scalars(step_size, beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_bc2, eps,            \
                 weight_decay, decay_factor, decay)

#define ENTRY(S, T)                                                                                    \
    extern "C" __global__ void adam_##S(ADAM_PARAMS(T, typename Num<T>::acc)) {                     \
        const AdamScalars<typename Num<T>::acc> s = ADAM_SCALARS;                                     \
        TORSH_GRID_STRIDE(i, n) { adam_element<T>(params, grads, exp_avg, exp_avg_sq, i, s); }       \
    }
TORSH_FLOAT_TYPES(ENTRY)
#undef ENTRY

#if TORSH_HAS_F32
// Four f32 values loaded and stored as one 16-byte access.
struct alignas(16) adam_f32x4 {
    float v[4];
};

// f32 with 16-byte vector accesses: the host launches this only when all four base pointers are 16-byte
// aligned. Groups of four elements are grid-strided; the last n % 4 elements go to the first threads.
extern "C" __global__ void adam_vec4_f32(ADAM_PARAMS(float, float)) {
    const AdamScalars<float> s = ADAM_SCALARS;
    const i64 groups = n >> 2;
    adam_f32x4* p4 = reinterpret_cast<adam_f32x4*>(params);
    const adam_f32x4* g4 = reinterpret_cast<const adam_f32x4*>(grads);
    adam_f32x4* m4 = reinterpret_cast<adam_f32x4*>(exp_avg);
    adam_f32x4* v4 = reinterpret_cast<adam_f32x4*>(exp_avg_sq);
    TORSH_GRID_STRIDE(i, groups) {
        adam_f32x4 p = p4[i];
        const adam_f32x4 g = g4[i];
        adam_f32x4 m = m4[i];
        adam_f32x4 v = v4[i];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            adam_update<float>(p.v[k], g.v[k], m.v[k], v.v[k], s);
        }
        p4[i] = p;
        m4[i] = m;
        v4[i] = v;
    }
    const i64 tail = groups * 4 + (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (tail < n) {
        adam_element<float>(params, grads, exp_avg, exp_avg_sq, tail, s);
    }
}
#endif // TORSH_HAS_F32
