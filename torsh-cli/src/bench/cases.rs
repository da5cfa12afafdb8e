//! What `bench` measures: the cases of each section, their sizes per backend class, the work each does
//! (flops or bytes) and how each is run through the public `Backend`/`Tensor` API.

use serde_json::{json, Value};
use torsh_backend::{AdamState, Backend, BackendError, BackendType, ConvConfig, DType};

/// One call of the measured op; errors as text (ours and the peers' alike).
pub type Runner<'a> = Box<dyn FnMut() -> Result<(), String> + 'a>;

/// The table a case belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    Gemm,
    Memory,
    Attention,
    Conv,
    Optimizer,
}

impl Section {
    pub const ALL: [Section; 5] = [
        Section::Gemm,
        Section::Memory,
        Section::Attention,
        Section::Conv,
        Section::Optimizer,
    ];

    pub fn key(self) -> &'static str {
        match self {
            Section::Gemm => "gemm",
            Section::Memory => "memory",
            Section::Attention => "attention",
            Section::Conv => "conv2d",
            Section::Optimizer => "optimizer",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Section::Gemm => {
                "GEMM: matmul of row-major [M,K]·[K,N], shape M x N x K, 2·M·N·K flops"
            }
            Section::Memory => {
                "Memory-bound: bytes read + written; ceiling = dense device-to-device copy (memcpy)"
            }
            Section::Attention => {
                "Attention: softmax(Q·Kᵀ/√D)·V over [B,H,S,D], 4·B·H·S²·D flops (half when causal)"
            }
            Section::Conv => "Conv2d (NCHW, ResNet-like layers): 2·N·K·OH·OW·C·R·S flops",
            Section::Optimizer => {
                "Fused Adam: one step over a list of parameters; 4 reads + 3 writes per element"
            }
        }
    }
}

/// Which backend instance runs a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The backend the user chose.
    Main,
    /// A second CUDA backend built with `enable_tensor_cores(true)` (TF32 f32 GEMM).
    Tf32,
}

/// A memory-bound op over a `[rows, cols]` tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemOp {
    /// The ceiling: `ComputeBackend::copy_dtod` of a dense buffer (the device's own memcpy).
    Memcpy,
    /// `Tensor::copy` of a dense tensor.
    Copy,
    /// `x.t().contiguous()`: a strided read, dense write.
    CopyTransposed,
    Add,
    Mul,
    Exp,
    Gelu,
    /// Softmax over each row.
    Softmax,
    /// Layer norm over each row, no affine parameters.
    LayerNorm,
    /// Sum over each row.
    Sum,
    /// Cast to bf16.
    CastBf16,
}

impl MemOp {
    fn name(self) -> &'static str {
        match self {
            MemOp::Memcpy => "memcpy",
            MemOp::Copy | MemOp::CopyTransposed => "copy",
            MemOp::Add => "add",
            MemOp::Mul => "mul",
            MemOp::Exp => "exp",
            MemOp::Gelu => "gelu",
            MemOp::Softmax => "softmax",
            MemOp::LayerNorm => "layer_norm",
            MemOp::Sum => "sum",
            MemOp::CastBf16 => "cast",
        }
    }
}

/// The op of a case with its sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Matmul {
        m: usize,
        n: usize,
        k: usize,
    },
    Memory {
        op: MemOp,
        rows: usize,
        cols: usize,
    },
    Attention {
        b: usize,
        h: usize,
        s: usize,
        d: usize,
        causal: bool,
    },
    /// Square images and kernels: input `[n, c, hw, hw]`, weight `[k, c, r, r]`.
    Conv2d {
        n: usize,
        c: usize,
        hw: usize,
        k: usize,
        r: usize,
        stride: usize,
        pad: usize,
    },
    /// `tensors` parameters of `len` elements each.
    Adam {
        tensors: usize,
        len: usize,
    },
}

/// Every op name `--op` accepts.
pub const OP_NAMES: [&str; 14] = [
    "matmul",
    "memcpy",
    "copy",
    "add",
    "mul",
    "exp",
    "gelu",
    "softmax",
    "layer_norm",
    "sum",
    "cast",
    "attention",
    "conv2d",
    "adam",
];

/// The work of one call: what throughput is computed from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Work {
    Flops(f64),
    Bytes(f64),
}

/// One measured case.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Case {
    pub op: Op,
    pub dtype: DType,
    pub target: Target,
}

impl Case {
    fn new(op: Op, dtype: DType) -> Case {
        Case {
            op,
            dtype,
            target: Target::Main,
        }
    }

    pub fn section(&self) -> Section {
        match self.op {
            Op::Matmul { .. } => Section::Gemm,
            Op::Memory { .. } => Section::Memory,
            Op::Attention { .. } => Section::Attention,
            Op::Conv2d { .. } => Section::Conv,
            Op::Adam { .. } => Section::Optimizer,
        }
    }

    pub fn name(&self) -> &'static str {
        match self.op {
            Op::Matmul { .. } => "matmul",
            Op::Memory { op, .. } => op.name(),
            Op::Attention { .. } => "attention",
            Op::Conv2d { .. } => "conv2d",
            Op::Adam { .. } => "adam",
        }
    }

    /// The dtype as the table shows it (`tf32` for f32 GEMM on tensor cores).
    pub fn dtype_label(&self) -> &'static str {
        match self.target {
            Target::Tf32 => "tf32",
            Target::Main => self.dtype.name(),
        }
    }

    /// A variant worth naming in the JSON (`tf32`, `causal`, `transposed`, `to bf16`).
    pub fn variant(&self) -> Option<&'static str> {
        match self.op {
            _ if self.target == Target::Tf32 => Some("tf32"),
            Op::Attention { causal: true, .. } => Some("causal"),
            Op::Memory {
                op: MemOp::CopyTransposed,
                ..
            } => Some("transposed"),
            Op::Memory {
                op: MemOp::CastBf16,
                ..
            } => Some("to bf16"),
            _ => None,
        }
    }

    /// The shape column of the table.
    pub fn shape_label(&self) -> String {
        match self.op {
            Op::Matmul { m, n, k } => format!("{m}x{n}x{k}"),
            Op::Memory { op, rows, cols } => match op {
                MemOp::Memcpy => format!("{rows}x{cols} dense"),
                MemOp::CopyTransposed => format!("{rows}x{cols} .t()"),
                MemOp::CastBf16 => format!("{rows}x{cols} -> bf16"),
                MemOp::Softmax | MemOp::LayerNorm | MemOp::Sum => format!("{rows}x{cols} rows"),
                _ => format!("{rows}x{cols}"),
            },
            Op::Attention { b, h, s, d, causal } => {
                format!("B{b} H{h} S{s} D{d}{}", if causal { " causal" } else { "" })
            }
            Op::Conv2d {
                n,
                c,
                hw,
                k,
                r,
                stride,
                ..
            } => format!("N{n} C{c} {hw}x{hw} K{k} {r}x{r}/{stride}"),
            Op::Adam { tensors, len } => format!("{tensors} x {len}"),
        }
    }

    /// The sizes as a JSON object.
    pub fn dims_json(&self) -> Value {
        match self.op {
            Op::Matmul { m, n, k } => json!({"m": m, "n": n, "k": k}),
            Op::Memory { rows, cols, .. } => json!({"rows": rows, "cols": cols}),
            Op::Attention { b, h, s, d, causal } => {
                json!({"batch": b, "heads": h, "seq_q": s, "seq_kv": s, "head_dim": d, "causal": causal})
            }
            Op::Conv2d {
                n,
                c,
                hw,
                k,
                r,
                stride,
                pad,
            } => json!({
                "n": n, "c": c, "h": hw, "w": hw, "k": k, "r": r, "s": r,
                "stride": stride, "padding": pad, "out_hw": conv_out(hw, r, stride, pad),
            }),
            Op::Adam { tensors, len } => json!({"tensors": tensors, "len": len}),
        }
    }

    /// Flops or bytes of one call.
    pub fn work(&self) -> Work {
        let size = self.dtype.size_in_bytes() as f64;
        match self.op {
            Op::Matmul { m, n, k } => Work::Flops(2.0 * (m * n) as f64 * k as f64),
            Op::Memory { op, rows, cols } => {
                let n = (rows * cols) as f64;
                Work::Bytes(match op {
                    MemOp::Add | MemOp::Mul => 3.0 * n * size,
                    MemOp::Sum => n * size + rows as f64 * size,
                    MemOp::CastBf16 => n * (size + DType::BF16.size_in_bytes() as f64),
                    _ => 2.0 * n * size,
                })
            }
            Op::Attention { b, h, s, d, causal } => {
                let full = 4.0 * (b * h) as f64 * (s * s) as f64 * d as f64;
                Work::Flops(if causal { full / 2.0 } else { full })
            }
            Op::Conv2d {
                n,
                c,
                hw,
                k,
                r,
                stride,
                pad,
            } => {
                let o = conv_out(hw, r, stride, pad) as f64;
                Work::Flops(2.0 * (n * k) as f64 * o * o * (c * r * r) as f64)
            }
            Op::Adam { tensors, len } => Work::Bytes(7.0 * (tensors * len) as f64 * size),
        }
    }

    /// Allocates the inputs (random, never zeros) on `backend` and returns one call of the op. Each call
    /// allocates its output, as the API does, and drops it.
    pub fn prepare(&self, backend: &Backend) -> torsh_backend::Result<Runner<'static>> {
        let dt = self.dtype;
        let text = |e: BackendError| e.to_string();
        Ok(match self.op {
            Op::Matmul { m, n, k } => {
                let a = backend.randn(&[m, k], dt)?;
                let b = backend.randn(&[k, n], dt)?;
                Box::new(move || a.matmul(&b).map(drop).map_err(text))
            }
            Op::Memory { op, rows, cols } => {
                let x = backend.randn(&[rows, cols], dt)?;
                match op {
                    MemOp::Memcpy => {
                        let dst = backend.empty(&[rows, cols], dt)?;
                        let bytes = rows * cols * dt.size_in_bytes();
                        Box::new(move || {
                            x.backend()
                                .compute()
                                .copy_dtod(dst.data_ptr(), x.data_ptr(), bytes)
                                .map_err(text)
                        })
                    }
                    MemOp::Copy => Box::new(move || x.copy().map(drop).map_err(text)),
                    MemOp::CopyTransposed => {
                        let xt = x.t()?;
                        Box::new(move || xt.contiguous().map(drop).map_err(text))
                    }
                    MemOp::Add | MemOp::Mul => {
                        let y = backend.randn(&[rows, cols], dt)?;
                        if op == MemOp::Add {
                            Box::new(move || x.add(&y).map(drop).map_err(text))
                        } else {
                            Box::new(move || x.mul(&y).map(drop).map_err(text))
                        }
                    }
                    MemOp::Exp => Box::new(move || x.exp().map(drop).map_err(text)),
                    MemOp::Gelu => Box::new(move || x.gelu().map(drop).map_err(text)),
                    MemOp::Softmax => Box::new(move || x.softmax(-1).map(drop).map_err(text)),
                    MemOp::LayerNorm => Box::new(move || {
                        x.layer_norm(&[cols], None, None, 1e-5)
                            .map(drop)
                            .map_err(text)
                    }),
                    MemOp::Sum => Box::new(move || x.sum(-1, false).map(drop).map_err(text)),
                    MemOp::CastBf16 => {
                        Box::new(move || x.cast(DType::BF16).map(drop).map_err(text))
                    }
                }
            }
            Op::Attention { b, h, s, d, causal } => {
                let q = backend.randn(&[b, h, s, d], dt)?;
                let k = backend.randn(&[b, h, s, d], dt)?;
                let v = backend.randn(&[b, h, s, d], dt)?;
                Box::new(move || q.attention(&k, &v, causal).map(drop).map_err(text))
            }
            Op::Conv2d {
                n,
                c,
                hw,
                k,
                r,
                stride,
                pad,
            } => {
                let input = backend.randn(&[n, c, hw, hw], dt)?;
                let weight = backend.randn(&[k, c, r, r], dt)?;
                let config = ConvConfig {
                    stride: [stride, stride],
                    padding: [pad, pad],
                    dilation: [1, 1],
                    groups: 1,
                };
                Box::new(move || input.conv2d(&weight, config).map(drop).map_err(text))
            }
            Op::Adam { tensors, len } => {
                let mut params = Vec::with_capacity(tensors);
                let mut grads = Vec::with_capacity(tensors);
                for _ in 0..tensors {
                    params.push(backend.randn(&[len], dt)?);
                    grads.push(backend.randn(&[len], dt)?);
                }
                let mut state = AdamState::adam();
                let backend = backend.clone();
                Box::new(move || {
                    backend
                        .fused_adam_step(&mut params, &grads, &mut state, 1e-3, (0.9, 0.999))
                        .map_err(text)
                })
            }
        })
    }
}

/// Output height (or width) of a square convolution.
fn conv_out(hw: usize, r: usize, stride: usize, pad: usize) -> usize {
    (hw + 2 * pad).saturating_sub(r) / stride + 1
}

/// How large a backend's cases are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// `--quick`: tiny, for tests and smoke runs.
    Quick,
    /// The reference and the CPU: a full run takes seconds.
    Host,
    /// GPUs: sizes that fill the device.
    Gpu,
}

impl Scale {
    pub fn for_backend(kind: BackendType, quick: bool) -> Scale {
        match kind {
            _ if quick => Scale::Quick,
            BackendType::Cpu | BackendType::Reference => Scale::Host,
            _ => Scale::Gpu,
        }
    }
}

/// GEMM sizes `(m, n, k)`.
type Mnk = (usize, usize, usize);

/// Every case for a backend of `kind`, section by section; the memcpy ceiling comes first among the
/// memory-bound ops. TF32 GEMM cases only on CUDA.
pub fn plan(kind: BackendType, scale: Scale) -> Vec<Case> {
    use DType::{BF16, F16, F32, F64};
    let mut cases = Vec::new();
    let cuda = kind == BackendType::Cuda;

    // GEMM: square sizes in every float dtype, then transformer-like shapes (tokens x hidden).
    let (squares, transformer): (&[usize], &[Mnk]) = match scale {
        Scale::Quick => (&[16, 32], &[(32, 96, 48)]),
        // m = tokens, n = out features, k = in features: BERT-base's projection and MLP on a few
        // tokens. Small, because the CPU is served by the scalar reference kernels for now
        // (about 1 GFLOP/s); grow them with the CPU backend's own kernels.
        Scale::Host => (&[64, 128, 256], &[(64, 768, 768), (16, 3072, 768)]),
        // 8192 tokens of a 4096-wide model: QKV/out projection, MLP up and down (Llama-like).
        Scale::Gpu => (
            &[1024, 2048, 4096, 8192],
            &[(8192, 4096, 4096), (8192, 14336, 4096), (8192, 4096, 14336)],
        ),
    };
    for dtype in [F32, F64, F16, BF16] {
        for &s in squares {
            cases.push(Case::new(Op::Matmul { m: s, n: s, k: s }, dtype));
        }
    }
    if cuda {
        for &s in squares {
            cases.push(Case {
                target: Target::Tf32,
                ..Case::new(Op::Matmul { m: s, n: s, k: s }, F32)
            });
        }
    }
    let transformer_dtypes: &[DType] = match scale {
        Scale::Gpu => &[BF16, F16],
        _ => &[F32],
    };
    for &dtype in transformer_dtypes {
        for &(m, n, k) in transformer {
            cases.push(Case::new(Op::Matmul { m, n, k }, dtype));
        }
    }

    // Memory-bound ops on tensors larger than the caches on GPUs (4 MiB f32 on the host: larger ones
    // take seconds per call on the reference kernels).
    let (rows, cols) = match scale {
        Scale::Quick => (128, 256),
        Scale::Host => (1024, 1024),
        Scale::Gpu => (16384, 4096),
    };
    let memory = |op| Op::Memory { op, rows, cols };
    use MemOp::*;
    for op in [
        Memcpy,
        Copy,
        CopyTransposed,
        Add,
        Mul,
        Exp,
        Gelu,
        Softmax,
        LayerNorm,
        Sum,
        CastBf16,
    ] {
        cases.push(Case::new(memory(op), F32));
    }
    if scale == Scale::Gpu {
        // The transformer's own dtype, where a 16-bit kernel's efficiency shows.
        for op in [Memcpy, Add, Softmax, LayerNorm] {
            cases.push(Case::new(memory(op), BF16));
        }
    }

    // Attention.
    let attention: &[(DType, [usize; 4])] = match scale {
        Scale::Quick => &[(F32, [1, 2, 32, 16])],
        Scale::Host => &[(F32, [1, 4, 256, 64])],
        Scale::Gpu => &[
            (BF16, [4, 16, 4096, 128]),
            (F16, [4, 16, 4096, 128]),
            (F32, [4, 16, 2048, 128]),
        ],
    };
    for &(dtype, [b, h, s, d]) in attention {
        for causal in [false, true] {
            cases.push(Case::new(Op::Attention { b, h, s, d, causal }, dtype));
        }
    }

    // Convolution: ResNet-50 layers (stem 7x7/2, a 1x1 bottleneck, 3x3 of each stage).
    let conv = |n, c, hw, k, r, stride| Op::Conv2d {
        n,
        c,
        hw,
        k,
        r,
        stride,
        pad: r / 2,
    };
    let (convs, conv_dtypes): (Vec<Op>, &[DType]) = match scale {
        Scale::Quick => (vec![conv(1, 4, 8, 8, 3, 1)], &[F32]),
        // The same layers at batch 1 and a quarter of the resolution (56x56 input).
        Scale::Host => (
            vec![
                conv(1, 3, 56, 64, 7, 2),
                conv(1, 64, 14, 64, 3, 1),
                conv(1, 256, 14, 64, 1, 1),
                conv(1, 128, 7, 128, 3, 1),
            ],
            &[F32],
        ),
        Scale::Gpu => (
            vec![
                conv(32, 3, 224, 64, 7, 2),
                conv(32, 64, 56, 64, 3, 1),
                conv(32, 256, 56, 64, 1, 1),
                conv(32, 128, 28, 128, 3, 1),
                conv(32, 256, 14, 256, 3, 1),
                conv(32, 512, 7, 512, 3, 1),
            ],
            &[F32, BF16],
        ),
    };
    for &dtype in conv_dtypes {
        for &op in &convs {
            cases.push(Case::new(op, dtype));
        }
    }

    // Fused Adam over a model's worth of parameters.
    let (tensors, len) = match scale {
        Scale::Quick => (4, 1024),
        Scale::Host => (4, 1 << 18),
        Scale::Gpu => (16, 1 << 22),
    };
    cases.push(Case::new(Op::Adam { tensors, len }, F32));
    cases
}

/// The cases whose op is in `ops` (all when empty; names outside [`OP_NAMES`] match nothing), keeping
/// the memcpy ceiling whenever a memory-bound op (one measured in bytes, Adam included) is selected.
pub fn select(cases: Vec<Case>, ops: &[String]) -> Vec<Case> {
    if ops.is_empty() {
        return cases;
    }
    let wanted = |c: &Case| ops.iter().any(|o| o == c.name());
    let memory_wanted = cases
        .iter()
        .any(|c| wanted(c) && matches!(c.work(), Work::Bytes(_)));
    cases
        .into_iter()
        .filter(|c| {
            wanted(c)
                || (memory_wanted
                    && matches!(
                        c.op,
                        Op::Memory {
                            op: MemOp::Memcpy,
                            ..
                        }
                    ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_counts_follow_the_conventions() {
        let mm = Case::new(Op::Matmul { m: 2, n: 3, k: 4 }, DType::F32);
        assert_eq!(mm.work(), Work::Flops(48.0));
        let add = Case::new(
            Op::Memory {
                op: MemOp::Add,
                rows: 2,
                cols: 5,
            },
            DType::F32,
        );
        assert_eq!(add.work(), Work::Bytes(120.0));
        let att = |causal| {
            Case::new(
                Op::Attention {
                    b: 1,
                    h: 2,
                    s: 3,
                    d: 4,
                    causal,
                },
                DType::BF16,
            )
            .work()
        };
        assert_eq!(att(false), Work::Flops(288.0));
        assert_eq!(att(true), Work::Flops(144.0));
        // 3x3, pad 1, stride 1 keeps 8x8: 2·1·8·64·4·9.
        let conv = Case::new(
            Op::Conv2d {
                n: 1,
                c: 4,
                hw: 8,
                k: 8,
                r: 3,
                stride: 1,
                pad: 1,
            },
            DType::F32,
        );
        assert_eq!(conv.work(), Work::Flops(36864.0));
    }

    #[test]
    fn every_scale_covers_every_op_and_selection_keeps_the_ceiling() {
        for scale in [Scale::Quick, Scale::Host, Scale::Gpu] {
            let cases = plan(BackendType::Cuda, scale);
            for name in OP_NAMES {
                assert!(cases.iter().any(|c| c.name() == name), "{name} {scale:?}");
            }
            // Host sizes serve the CPU and the reference only.
            if scale != Scale::Host {
                assert!(cases.iter().any(|c| c.target == Target::Tf32));
            }
        }
        assert!(plan(BackendType::Cpu, Scale::Host)
            .iter()
            .all(|c| c.target == Target::Main));
        let add = select(plan(BackendType::Cpu, Scale::Quick), &["add".into()]);
        assert_eq!(add[0].name(), "memcpy");
        assert!(add[1..].iter().all(|c| c.name() == "add"));
        let adam = select(plan(BackendType::Cpu, Scale::Quick), &["adam".into()]);
        assert_eq!(
            adam.iter().map(Case::name).collect::<Vec<_>>(),
            ["memcpy", "adam"]
        );
        let mm = select(plan(BackendType::Cpu, Scale::Quick), &["matmul".into()]);
        assert!(mm.iter().all(|c| c.name() == "matmul"));
        assert!(select(plan(BackendType::Cpu, Scale::Quick), &["nope".into()]).is_empty());
    }
}
