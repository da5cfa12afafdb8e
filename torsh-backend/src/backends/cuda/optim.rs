//! Host side of the fused Adam/AdamW kernels (`kernels/adam.cu`): the step's scalars are derived in f64
//! here, exactly as the reference backend derives them, rounded once to the kernel's accumulator type,
//! and passed to one launch of `adam_<dtype>` (or `adam_vec4_f32` when every f32 operand is 16-byte
//! aligned).

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::launch::{check_aligned, suffix, to_i64};
use super::Gpu;
use crate::backends::cuda::CudaBackend;
use crate::compute::op::OpImpl;
use crate::compute::AdamDesc;
use crate::compute::UnscaleDesc;
use crate::dtype::DType;
use crate::error::Result;

/// The op's name in errors.
const OP: &str = "adam_step";

/// No weight decay (`ADAM_DECAY_NONE` in `adam.cu`).
const DECAY_NONE: i32 = 0;
/// Adam's L2 penalty added to the gradient (`ADAM_DECAY_L2`).
const DECAY_L2: i32 = 1;
/// AdamW's decoupled decay of the parameters (`ADAM_DECAY_DECOUPLED`).
const DECAY_DECOUPLED: i32 = 2;

/// The scalars of one step, in the kernel's accumulator type `A` (the order of the kernel's
/// parameters after `n`).
#[derive(Clone, Copy, Debug, PartialEq)]
struct AdamScalars<A> {
    /// `lr / (1 − β₁ᵗ)`.
    step_size: A,
    /// β₁.
    beta1: A,
    /// `1 − β₁`.
    one_minus_beta1: A,
    /// β₂.
    beta2: A,
    /// `1 − β₂`.
    one_minus_beta2: A,
    /// `√(1 − β₂ᵗ)`.
    sqrt_bias_correction2: A,
    /// ε.
    eps: A,
    /// The L2 coefficient added to the gradient (Adam).
    weight_decay: A,
    /// `1 − lr·wd`, the factor on the parameters (AdamW).
    decay_factor: A,
    /// One of the `DECAY_*` constants.
    decay: i32,
}

impl AdamScalars<f64> {
    /// The scalars of `d` in f64, with the reference's expressions (`backends/reference/optim.rs`).
    fn of(d: &AdamDesc) -> AdamScalars<f64> {
        let t = d.step as f64;
        let bias_correction1 = 1.0 - d.beta1.powf(t);
        let bias_correction2 = 1.0 - d.beta2.powf(t);
        AdamScalars {
            step_size: d.lr / bias_correction1,
            beta1: d.beta1,
            one_minus_beta1: 1.0 - d.beta1,
            beta2: d.beta2,
            one_minus_beta2: 1.0 - d.beta2,
            sqrt_bias_correction2: bias_correction2.sqrt(),
            eps: d.eps,
            weight_decay: d.weight_decay,
            decay_factor: 1.0 - d.lr * d.weight_decay,
            decay: decay_mode(d),
        }
    }

    /// Every scalar rounded (to nearest) to f32, the accumulator of f32, f16 and bf16.
    fn to_f32(self) -> AdamScalars<f32> {
        AdamScalars {
            step_size: self.step_size as f32,
            beta1: self.beta1 as f32,
            one_minus_beta1: self.one_minus_beta1 as f32,
            beta2: self.beta2 as f32,
            one_minus_beta2: self.one_minus_beta2 as f32,
            sqrt_bias_correction2: self.sqrt_bias_correction2 as f32,
            eps: self.eps as f32,
            weight_decay: self.weight_decay as f32,
            decay_factor: self.decay_factor as f32,
            decay: self.decay,
        }
    }
}

/// Which decay `d` applies: the reference multiplies the parameters whenever the step is decoupled, and
/// adds `wd·p` to the gradient only when `wd ≠ 0` (so an infinite parameter does not turn it into NaN).
fn decay_mode(d: &AdamDesc) -> i32 {
    if d.decoupled_weight_decay {
        DECAY_DECOUPLED
    } else if d.weight_decay != 0.0 {
        DECAY_L2
    } else {
        DECAY_NONE
    }
}

/// Whether the 16-byte vector kernel applies: f32 with every base address a multiple of 16.
fn use_vec4(d: &AdamDesc) -> bool {
    d.dtype == DType::F32
        && [d.params, d.grads, d.exp_avg, d.exp_avg_sq]
            .iter()
            .all(|p| p.0 % 16 == 0)
}

/// Enqueues one step of `d` (validated by the caller) on the backend's stream; nothing when empty.
pub(crate) fn adam_step(gpu: &Gpu, d: &AdamDesc) -> Result<()> {
    if d.len == 0 {
        return Ok(());
    }
    check_aligned(OP, d.dtype, &[d.params, d.grads, d.exp_avg, d.exp_avg_sq])?;
    let scalars = AdamScalars::of(d);
    if use_vec4(d) {
        launch(
            gpu,
            d,
            "adam_vec4_f32",
            gpu.grid(d.len.div_ceil(4)),
            &scalars.to_f32(),
        )
    } else {
        let name = format!("adam_{}", suffix(d.dtype));
        let config = gpu.grid(d.len);
        match d.dtype {
            DType::F64 => launch(gpu, d, &name, config, &scalars),
            _ => launch(gpu, d, &name, config, &scalars.to_f32()),
        }
    }
}

/// Launches kernel `name` of module `adam` over `d`'s operands with scalars `s` in the kernel's
/// accumulator type `A` (f64 for `adam_f64`, f32 for the others).
fn launch<A: DeviceRepr>(
    gpu: &Gpu,
    d: &AdamDesc,
    name: &str,
    config: LaunchConfig,
    s: &AdamScalars<A>,
) -> Result<()> {
    let f = gpu.function_for("adam", d.dtype, name)?;
    let n = to_i64(OP, d.len)?;
    let (params, grads, exp_avg, exp_avg_sq) = (d.params.0, d.grads.0, d.exp_avg.0, d.exp_avg_sq.0);
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&params)
        .arg(&grads)
        .arg(&exp_avg)
        .arg(&exp_avg_sq)
        .arg(&n);
    b.arg(&s.step_size)
        .arg(&s.beta1)
        .arg(&s.one_minus_beta1)
        .arg(&s.beta2)
        .arg(&s.one_minus_beta2)
        .arg(&s.sqrt_bias_correction2)
        .arg(&s.eps)
        .arg(&s.weight_decay)
        .arg(&s.decay_factor)
        .arg(&s.decay);
    // SAFETY: the caller checked the four regions against live allocations and for aliasing; the
    // arguments match `ADAM_PARAMS(T, A)` in `adam.cu`, with `A` the entry point's accumulator type.
    unsafe { b.launch(config) }.map_err(|e| super::driver_error(OP, e))?;
    Ok(())
}

impl OpImpl<AdamDesc> for CudaBackend {
    fn op(&self, desc: &AdamDesc) -> Result<()> {
        let acc = desc.accesses()?;
        Self::float_only("adam_step", desc.dtype)?;
        self.run(acc, |gpu| adam_step(gpu, desc))
    }
}

impl OpImpl<UnscaleDesc> for CudaBackend {
    /// Composed from `fill`, `binary`, `unary` and `reduce`, reading one value back per call.
    fn op(&self, desc: &UnscaleDesc) -> Result<()> {
        crate::compute::unscale_by_parts(self, desc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::DevicePtr;

    fn desc() -> AdamDesc {
        AdamDesc {
            dtype: DType::F32,
            params: DevicePtr(0x1000),
            grads: DevicePtr(0x2000),
            exp_avg: DevicePtr(0x3000),
            exp_avg_sq: DevicePtr(0x4000),
            len: 10,
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            decoupled_weight_decay: false,
            step: 1,
        }
    }

    #[test]
    fn scalars_are_the_references_bias_corrections() {
        let d = AdamDesc { step: 3, ..desc() };
        let s = AdamScalars::of(&d);
        let bc1 = 1.0 - 0.9f64.powf(3.0);
        let bc2 = 1.0 - 0.999f64.powf(3.0);
        assert_eq!(s.step_size, 1e-3 / bc1);
        assert_eq!(s.sqrt_bias_correction2, bc2.sqrt());
        assert_eq!((s.beta1, s.one_minus_beta1), (0.9, 1.0 - 0.9));
        assert_eq!((s.beta2, s.one_minus_beta2), (0.999, 1.0 - 0.999));
        assert_eq!((s.eps, s.weight_decay), (1e-8, 0.01));
        assert_eq!(s.decay_factor, 1.0 - 1e-3 * 0.01);
        let f = s.to_f32();
        assert_eq!(f.step_size, (1e-3 / bc1) as f32);
        assert_eq!(f.sqrt_bias_correction2, bc2.sqrt() as f32);
        assert_eq!(f.decay, s.decay);
    }

    #[test]
    fn first_step_bias_correction_keeps_its_precision_in_f32() {
        // 1 − β₂ computed in f32 would lose most digits; done in f64 then rounded it is exact to 1 ulp.
        let d = AdamDesc {
            beta2: 0.999_999,
            ..desc()
        };
        let f = AdamScalars::of(&d).to_f32();
        let exact = (1.0f64 - 0.999_999).sqrt();
        assert!(((f.sqrt_bias_correction2 as f64) - exact).abs() <= exact * 1e-7);
        assert!(((f.one_minus_beta2 as f64) - 1e-6).abs() <= 1e-6 * 1e-7);
    }

    #[test]
    fn decay_modes_follow_the_reference_branches() {
        assert_eq!(decay_mode(&desc()), DECAY_L2);
        let no_decay = AdamDesc {
            weight_decay: 0.0,
            ..desc()
        };
        assert_eq!(decay_mode(&no_decay), DECAY_NONE);
        let adamw = AdamDesc {
            decoupled_weight_decay: true,
            ..desc()
        };
        assert_eq!(decay_mode(&adamw), DECAY_DECOUPLED);
        // AdamW multiplies by 1 − lr·0 = 1 even without decay, as the reference does.
        let adamw_no_decay = AdamDesc {
            weight_decay: 0.0,
            ..adamw
        };
        assert_eq!(decay_mode(&adamw_no_decay), DECAY_DECOUPLED);
        assert_eq!(AdamScalars::of(&adamw_no_decay).decay_factor, 1.0);
    }

    #[test]
    fn decay_codes_and_entry_points_match_the_kernel_source() {
        let src = include_str!("kernels/adam.cu");
        for (name, code) in [
            ("ADAM_DECAY_NONE", DECAY_NONE),
            ("ADAM_DECAY_L2", DECAY_L2),
            ("ADAM_DECAY_DECOUPLED", DECAY_DECOUPLED),
        ] {
            let line = format!("#define {name} {code}\n");
            assert!(src.contains(&line), "adam.cu lacks `{}`", line.trim());
        }
        assert!(src.contains("void adam_##S(ADAM_PARAMS(T, typename Num<T>::acc))"));
        assert!(src.contains("void adam_vec4_f32(ADAM_PARAMS(float, float))"));
        assert!(src.contains("TORSH_FLOAT_TYPES(ENTRY)"));
    }

    #[test]
    fn vector_kernel_needs_f32_and_every_pointer_aligned() {
        assert!(use_vec4(&desc()));
        let misaligned = AdamDesc {
            exp_avg_sq: DevicePtr(0x4008),
            ..desc()
        };
        assert!(!use_vec4(&misaligned));
        let misaligned_grads = AdamDesc {
            grads: DevicePtr(0x2004),
            ..desc()
        };
        assert!(!use_vec4(&misaligned_grads));
        for dtype in [DType::F64, DType::F16, DType::BF16] {
            assert!(!use_vec4(&AdamDesc { dtype, ..desc() }));
        }
    }
}
