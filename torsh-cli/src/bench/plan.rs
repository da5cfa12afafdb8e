//! Which cases `bench` runs on each class of backend, and the selection by `--op`.

use torsh_backend::{BackendType, DType};

use super::cases::{Case, MemOp, Op, Target, Work};

/// How large a backend's cases are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// `--quick`: tiny, for tests and smoke runs.
    Quick,
    /// The reference backend: scalar kernels, so a full run takes seconds only at small sizes.
    Host,
    /// The CPU backend: the shapes of the CPU issue (GEMM up to 2048, 64 MiB memory-bound ops,
    /// ResNet convolutions at batch 1 and 8, attention up to S=2048, Adam over 10 M parameters).
    Cpu,
    /// GPUs: sizes that fill the device.
    Gpu,
}

impl Scale {
    /// The scale of a backend of `kind` (always [`Scale::Quick`] under `--quick`).
    /// `software` marks a GPU API served on the CPU (WebGPU on lavapipe), measured at host sizes.
    pub fn for_backend(kind: BackendType, quick: bool, software: bool) -> Scale {
        match kind {
            _ if quick => Scale::Quick,
            BackendType::Cpu => Scale::Cpu,
            BackendType::Reference => Scale::Host,
            _ if software => Scale::Host,
            _ => Scale::Gpu,
        }
    }
}

/// GEMM sizes `(m, n, k)`.
type Mnk = (usize, usize, usize);

/// Every memory-bound op, the memcpy ceiling first.
const MEMORY_OPS: [MemOp; 36] = [
    MemOp::Memcpy,
    MemOp::Copy,
    MemOp::CopyTransposed,
    MemOp::Add,
    MemOp::Mul,
    MemOp::Exp,
    MemOp::Gelu,
    MemOp::Erf,
    MemOp::Tanh,
    MemOp::Sigmoid,
    MemOp::Softmax,
    MemOp::LayerNorm,
    MemOp::BatchNormTraining,
    MemOp::BatchNormInference,
    MemOp::Sum,
    MemOp::SumColumns,
    MemOp::Max,
    MemOp::CastBf16,
    MemOp::Fill,
    MemOp::Gather,
    MemOp::IndexSelect,
    MemOp::IndexAdd,
    MemOp::Where,
    MemOp::Cumsum,
    MemOp::Topk,
    MemOp::Cat,
    MemOp::GeluBackward,
    MemOp::SoftmaxBackward,
    MemOp::Dropout,
    MemOp::MaxPool,
    MemOp::MaxPoolBackward,
    MemOp::AvgPoolBackward,
    MemOp::CrossEntropy,
    MemOp::CrossEntropyBackward,
    MemOp::LayerNormBackward,
    MemOp::BatchNormBackward,
];

/// A convolution with "same" padding (`r / 2`).
fn conv(n: usize, c: usize, hw: usize, k: usize, r: usize, stride: usize, bias: bool) -> Op {
    Op::Conv2d {
        n,
        c,
        hw,
        k,
        r,
        stride,
        pad: r / 2,
        groups: 1,
        bias,
        backward: false,
    }
}

/// A depthwise 3x3 convolution of `c` channels.
fn depthwise(n: usize, c: usize, hw: usize) -> Op {
    Op::Conv2d {
        n,
        c,
        hw,
        k: c,
        r: 3,
        stride: 1,
        pad: 1,
        groups: c,
        bias: true,
        backward: false,
    }
}

/// The GEMM cases: square sizes and transformer shapes per dtype.
fn gemm_cases(cuda: bool, scale: Scale) -> Vec<Case> {
    use DType::{BF16, F16, F32, F64};
    let mut cases = Vec::new();
    let square = |s: usize, dtype| Case::new(Op::Matmul { m: s, n: s, k: s }, dtype);
    let (squares, transformer): (&[usize], &[Mnk]) = match scale {
        Scale::Quick => (&[16, 32], &[(32, 96, 48)]),
        // m = tokens, n = out features, k = in features: BERT-base's projection and MLP on a few
        // tokens, small because the reference kernels are scalar (about 1 GFLOP/s).
        Scale::Host => (&[64, 128, 256, 512], &[(64, 768, 768), (16, 3072, 768)]),
        // 4096 tokens of a 1024-wide model (projection), and an MLP down-projection on 512 tokens.
        Scale::Cpu => (
            &[64, 128, 256, 512, 1024, 2048],
            &[(4096, 1024, 1024), (512, 4096, 1024)],
        ),
        // 8192 tokens of a 4096-wide model: QKV/out projection, MLP up and down (Llama-like).
        Scale::Gpu => (
            &[1024, 2048, 4096, 8192],
            &[(8192, 4096, 4096), (8192, 14336, 4096), (8192, 4096, 14336)],
        ),
    };
    // The 16-bit dtypes: every square size, except on the CPU where one size shows the kernel.
    let half_squares: &[usize] = if scale == Scale::Cpu {
        &[1024]
    } else {
        squares
    };
    let transformer_dtypes: &[DType] = match scale {
        Scale::Gpu => &[BF16, F16],
        Scale::Cpu => &[F32, F64],
        _ => &[F32],
    };
    for dtype in [F32, F64] {
        cases.extend(squares.iter().map(|&s| square(s, dtype)));
        if scale == Scale::Cpu && transformer_dtypes.contains(&dtype) {
            cases.extend(
                transformer
                    .iter()
                    .map(|&(m, n, k)| Case::new(Op::Matmul { m, n, k }, dtype)),
            );
        }
    }
    for dtype in [F16, BF16] {
        cases.extend(half_squares.iter().map(|&s| square(s, dtype)));
    }
    if cuda {
        for &s in squares {
            cases.push(Case {
                target: Target::Tf32,
                ..square(s, F32)
            });
        }
    }
    if scale != Scale::Cpu {
        for &dtype in transformer_dtypes {
            for &(m, n, k) in transformer {
                cases.push(Case::new(Op::Matmul { m, n, k }, dtype));
            }
        }
    }
    cases
}

/// Memory-bound ops on tensors larger than the caches (64 MiB f32 on the CPU; 4 MiB on the reference,
/// whose scalar kernels take long on larger ones).
fn memory_cases(scale: Scale) -> Vec<Case> {
    let (rows, cols) = match scale {
        Scale::Quick => (128, 256),
        Scale::Host => (1024, 1024),
        Scale::Cpu => (4096, 4096),
        Scale::Gpu => (16384, 4096),
    };
    let memory = |op| Op::Memory { op, rows, cols };
    let mut cases: Vec<Case> = MEMORY_OPS
        .iter()
        .map(|&op| Case::new(memory(op), DType::F32))
        .collect();
    // The same tensor as four long rows: how the row kernels fare when rows are few, and, with
    // WebGPU's `--binding-mib` at a quarter of the tensor, the paths of a row past a binding.
    for op in [MemOp::Softmax, MemOp::LayerNorm, MemOp::Sum] {
        let long = Op::Memory {
            op,
            rows: 4,
            cols: rows * cols / 4,
        };
        cases.push(Case::new(long, DType::F32));
    }
    // A transformer's embedding lookup: 8192 tokens into a 4096 x 512 table.
    let (vocab, width) = match scale {
        Scale::Quick => (64, 32),
        Scale::Host => (1024, 256),
        Scale::Cpu | Scale::Gpu => (4096, 512),
    };
    let embedding = Op::Memory {
        op: MemOp::Embedding,
        rows: vocab,
        cols: width,
    };
    cases.push(Case::new(embedding, DType::F32));
    if scale == Scale::Gpu {
        // The transformer's own dtype, where a 16-bit kernel's efficiency shows.
        for op in [MemOp::Memcpy, MemOp::Add, MemOp::Softmax, MemOp::LayerNorm] {
            cases.push(Case::new(memory(op), DType::BF16));
        }
    }
    cases
}

/// Attention, each shape without and with the causal mask, each followed by its backward.
fn attention_cases(scale: Scale) -> Vec<Case> {
    use DType::{BF16, F16, F32};
    let shapes: &[(DType, [usize; 4])] = match scale {
        Scale::Quick => &[(F32, [1, 2, 32, 16])],
        Scale::Host => &[(F32, [1, 4, 256, 64])],
        Scale::Cpu => &[(F32, [1, 8, 512, 64]), (F32, [1, 8, 2048, 64])],
        Scale::Gpu => &[
            (BF16, [4, 16, 4096, 128]),
            (F16, [4, 16, 4096, 128]),
            (F32, [4, 16, 2048, 128]),
        ],
    };
    let mut cases = Vec::new();
    for &(dtype, [b, h, s, d]) in shapes {
        for causal in [false, true] {
            for backward in [false, true] {
                let op = Op::Attention {
                    b,
                    h,
                    s,
                    d,
                    causal,
                    backward,
                };
                cases.push(Case::new(op, dtype));
            }
        }
    }
    cases
}

/// Convolutions: ResNet layers (stem 7x7/2, a 1x1 bottleneck, 3x3 of the stages) and a depthwise 3x3.
fn conv_cases(scale: Scale) -> Vec<Case> {
    use DType::{BF16, F32};
    let (convs, dtypes): (Vec<Op>, &[DType]) = match scale {
        Scale::Quick => (
            vec![conv(1, 4, 8, 8, 3, 1, false), depthwise(1, 4, 8)],
            &[F32],
        ),
        // The ResNet-50 layers at batch 1 and a quarter of the resolution (56x56 input), and a
        // wide 3x3 layer whose image (1.1 MiB in f32) is past a 1 MiB binding, so that WebGPU's
        // `--binding-mib 1` measures its cut of one image by channels.
        Scale::Host => (
            vec![
                conv(1, 3, 56, 64, 7, 2, false),
                conv(1, 64, 14, 64, 3, 1, false),
                conv(1, 256, 14, 64, 1, 1, false),
                conv(1, 128, 7, 128, 3, 1, false),
                conv(1, 32, 96, 32, 3, 1, false),
            ],
            &[F32],
        ),
        // Full resolution at batch 1 and 8, with bias (as the ONNX Runtime peer runs them).
        Scale::Cpu => (
            [1, 8]
                .into_iter()
                .flat_map(|n| {
                    [
                        conv(n, 64, 56, 64, 3, 1, true),
                        conv(n, 256, 14, 256, 3, 1, true),
                        conv(n, 3, 224, 64, 7, 2, true),
                        conv(n, 256, 56, 64, 1, 1, true),
                        depthwise(n, 128, 56),
                    ]
                })
                .collect(),
            &[F32],
        ),
        Scale::Gpu => (
            vec![
                conv(32, 3, 224, 64, 7, 2, false),
                conv(32, 64, 56, 64, 3, 1, false),
                conv(32, 256, 56, 64, 1, 1, false),
                conv(32, 128, 28, 128, 3, 1, false),
                conv(32, 256, 14, 256, 3, 1, false),
                conv(32, 512, 7, 512, 3, 1, false),
            ],
            &[F32, BF16],
        ),
    };
    // Each convolution, then (but for depthwise ones) its backward.
    let with_backward = convs.into_iter().flat_map(|op| {
        let mut backward = op;
        let has_backward = match &mut backward {
            Op::Conv2d {
                c,
                groups,
                backward,
                ..
            } if *groups == 1 || groups != c => {
                *backward = true;
                true
            }
            _ => false,
        };
        let backward = has_backward.then_some(backward);
        std::iter::once(op).chain(backward)
    });
    let ops: Vec<Op> = with_backward.collect();
    dtypes
        .iter()
        .flat_map(|&dtype| ops.iter().map(move |&op| Case::new(op, dtype)))
        .collect()
}

/// Every case for a backend of `kind`, section by section; the memcpy ceiling comes first among the
/// memory-bound ops. TF32 GEMM cases only on CUDA.
/// WebGPU has no f64 math (WGSL has no f64), so its cases leave f64 out; it adds f16 beside the f32
/// memory-bound cases, which run natively where the adapter has `shader-f16` (bf16 measures the
/// staging through f32 copies).
pub fn plan(kind: BackendType, scale: Scale) -> Vec<Case> {
    let mut cases = all_cases(kind, scale);
    if kind == BackendType::WebGpu {
        cases.retain(|c| c.dtype != DType::F64);
        let halves: Vec<Case> = cases
            .iter()
            .filter(|c| matches!(c.op, Op::Memory { .. }) && c.dtype == DType::F32)
            .filter(|c| !cases.iter().any(|h| h.op == c.op && h.dtype == DType::F16))
            .map(|c| Case::new(c.op, DType::F16))
            .collect();
        cases.extend(halves);
    }
    cases
}

/// Every case for a backend of `kind`, before any filtering by kind.
fn all_cases(kind: BackendType, scale: Scale) -> Vec<Case> {
    let mut cases = gemm_cases(kind == BackendType::Cuda, scale);
    cases.extend(memory_cases(scale));
    cases.extend(attention_cases(scale));
    cases.extend(conv_cases(scale));
    // Fused Adam over a model's worth of parameters (10 M in 100 tensors on the CPU).
    let (tensors, len) = match scale {
        Scale::Quick => (4, 1024),
        Scale::Host => (4, 1 << 18),
        Scale::Cpu => (100, 100_000),
        Scale::Gpu => (16, 1 << 22),
    };
    cases.push(Case::new(Op::Adam { tensors, len }, DType::F32));
    cases
}

/// The cases whose op is in `ops` (all when empty; names outside `OP_NAMES` match nothing), keeping
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
    use super::super::cases::OP_NAMES;
    use super::*;

    #[test]
    fn every_scale_covers_every_op_and_selection_keeps_the_ceiling() {
        for scale in [Scale::Quick, Scale::Host, Scale::Cpu, Scale::Gpu] {
            let cases = plan(BackendType::Cuda, scale);
            for name in OP_NAMES {
                assert!(cases.iter().any(|c| c.name() == name), "{name} {scale:?}");
            }
            // Host and CPU sizes serve the host backends only.
            if !matches!(scale, Scale::Host | Scale::Cpu) {
                assert!(cases.iter().any(|c| c.target == Target::Tf32));
            }
        }
        assert!(plan(BackendType::Cpu, Scale::Cpu)
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

    #[test]
    fn the_cpu_plan_has_the_shapes_of_the_issue() {
        let cases = plan(BackendType::Cpu, Scale::Cpu);
        let has = |op: Op, dtype: DType| cases.iter().any(|c| c.op == op && c.dtype == dtype);
        for dtype in [DType::F32, DType::F64] {
            for s in [64, 128, 256, 512, 1024, 2048] {
                assert!(has(Op::Matmul { m: s, n: s, k: s }, dtype), "{s} {dtype}");
            }
            for (m, n, k) in [(4096, 1024, 1024), (512, 4096, 1024)] {
                assert!(has(Op::Matmul { m, n, k }, dtype));
            }
        }
        let square = Op::Matmul {
            m: 1024,
            n: 1024,
            k: 1024,
        };
        assert!(has(square, DType::BF16) && has(square, DType::F16));
        for s in [512, 2048] {
            for causal in [false, true] {
                for backward in [false, true] {
                    let op = Op::Attention {
                        b: 1,
                        h: 8,
                        s,
                        d: 64,
                        causal,
                        backward,
                    };
                    assert!(has(op, DType::F32));
                }
            }
        }
        assert!(has(conv(8, 3, 224, 64, 7, 2, true), DType::F32));
        assert!(has(depthwise(1, 128, 56), DType::F32));
        // Memory-bound tensors of at least 64 MiB, but for the embedding lookup, whose table is a
        // transformer's (4096 x 512, looked up by 8192 tokens).
        for c in cases.iter().filter(|c| matches!(c.op, Op::Memory { .. })) {
            let Op::Memory { op, rows, cols } = c.op else {
                unreachable!()
            };
            if op != MemOp::Embedding {
                assert!(rows * cols * 4 >= 64 << 20, "{c:?}");
            }
        }
        let embedding = Op::Memory {
            op: MemOp::Embedding,
            rows: 4096,
            cols: 512,
        };
        assert!(has(embedding, DType::F32));
        assert!(has(
            Op::Adam {
                tensors: 100,
                len: 100_000
            },
            DType::F32
        ));
    }

    #[test]
    fn webgpu_plans_f16_beside_each_f32_memory_case_and_no_f64() {
        for scale in [Scale::Quick, Scale::Host, Scale::Gpu] {
            let cases = plan(BackendType::WebGpu, scale);
            assert!(cases.iter().all(|c| c.dtype != DType::F64));
            let memory: Vec<&Case> = cases
                .iter()
                .filter(|c| matches!(c.op, Op::Memory { .. }))
                .collect();
            for c in memory.iter().filter(|c| c.dtype == DType::F32) {
                let halves = memory
                    .iter()
                    .filter(|h| h.op == c.op && h.dtype == DType::F16)
                    .count();
                assert_eq!(halves, 1, "{c:?}");
            }
        }
    }
}
