//! The raw [`ComputeBackend`] trait with bad arguments: freed, foreign, null, huge, short,
//! misaligned and overlapping pointers, and sizes that overflow.
//!
//! A case builds a small valid op over freshly allocated operands and checks that it runs, then
//! replaces one operand's pointer (or the op's sizes) with a bad one and checks the answer: a typed
//! error of the kinds that mistake allows, nothing written to the other operands (validation comes
//! before any work), and every allocation returned afterwards. These run in child processes (see
//! `main.rs`), so a crash or hang is caught and reported with its case.

use torsh_backend::compute::{
    AdamDesc, AttentionBackwardDesc, AttentionDesc, BatchNormBackwardDesc, BatchedGemmDesc,
    BinaryDesc, BinaryOp, CastDesc, CompareDesc, CompareOp, Conv2dBackwardInputDesc,
    Conv2dBackwardWeightDesc, Conv2dDesc, CopyDesc, CrossEntropyDesc, Distribution, DropoutDesc,
    FillDesc, GatherDesc, GemmDesc, GemvDesc, LayerNormBackwardDesc, LayerNormDesc,
    Pool2dBackwardDesc, Pool2dDesc, PoolKind, RandomDesc, ReduceDesc, ReduceOp, ScanDesc, ScanOp,
    ScatterDesc, ScatterReduce, SoftmaxBackwardDesc, SoftmaxDesc, SortDesc, StridedBuf,
    UnaryBackwardDesc, UnaryDesc, UnaryOp, UnscaleDesc, Value, WhereDesc,
};
use torsh_backend::prelude::*;
use torsh_backend::{ComputeBackend, DevicePtr, Transpose};

use crate::gen::Rng;
use crate::report::{error_kind, Outcome};

/// One operand of a raw op: its size and whether the op writes it.
#[derive(Clone, Copy, Debug)]
struct Operand {
    bytes: usize,
    writes: bool,
}

/// The call of a raw op on a backend, given one pointer per operand.
type Call = Box<dyn Fn(&dyn ComputeBackend, &[DevicePtr]) -> Result<()> + Send + Sync>;

/// A small valid raw op.
struct RawOp {
    name: String,
    operands: Vec<Operand>,
    /// The op runs in place when an output's pointer is exactly its input's.
    in_place: bool,
    /// Operands filled with zero bytes rather than ones (index tensors: index 0 is valid).
    zeroed: Vec<usize>,
    call: Call,
}

/// What is done to the op.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mutation {
    Freed,
    Foreign,
    Null,
    Huge,
    Short,
    PastEnd,
    Misaligned,
    /// An output pointer onto another operand, `offset` bytes in.
    Overlap(usize, usize),
}

fn op(
    name: impl Into<String>,
    operands: &[(usize, bool)],
    in_place: bool,
    call: impl Fn(&dyn ComputeBackend, &[DevicePtr]) -> Result<()> + Send + Sync + 'static,
) -> RawOp {
    RawOp {
        name: name.into(),
        operands: operands
            .iter()
            .map(|&(bytes, writes)| Operand { bytes, writes })
            .collect(),
        in_place,
        zeroed: Vec::new(),
        call: Box::new(call),
    }
}

const F32: DType = DType::F32;

fn gemm_desc(p: &[DevicePtr], (m, n, k): (usize, usize, usize), beta: f64) -> GemmDesc {
    GemmDesc {
        dtype: F32,
        trans_a: Transpose::No,
        trans_b: Transpose::No,
        m,
        n,
        k,
        alpha: 1.0,
        a: p[0],
        lda: m.max(1),
        b: p[1],
        ldb: k.max(1),
        beta,
        c: p[2],
        ldc: m.max(1),
    }
}

/// A random small valid raw op over f32 operands.
fn generate_op(rng: &mut Rng) -> RawOp {
    let n = rng.range(1, 300);
    let bytes = 4 * n;
    match rng.range(0, 31) {
        0 => op("fill", &[(bytes, true)], false, move |c, p| {
            c.fill(&FillDesc {
                dtype: F32,
                ptr: p[0],
                len: n,
                value: 1.5,
            })
        }),
        1 => op(
            "copy_dtod",
            &[(bytes, false), (bytes, true)],
            false,
            move |c, p| c.copy_dtod(p[1], p[0], bytes),
        ),
        2 => op("copy_htod", &[(bytes, true)], false, move |c, p| {
            c.copy_htod(p[0], &vec![0x3F; bytes])
        }),
        3 => op("copy_dtoh", &[(bytes, false)], false, move |c, p| {
            c.copy_dtoh(&mut vec![0; bytes], p[0])
        }),
        4 => {
            let u = rng.pick(UnaryOp::ALL);
            op(
                format!("unary {}", u.name()),
                &[(bytes, false), (bytes, true)],
                true,
                move |c, p| {
                    c.unary(&UnaryDesc {
                        op: u,
                        dtype: F32,
                        input: StridedBuf::contiguous(p[0], &[n]),
                        output: p[1],
                    })
                },
            )
        }
        5 => {
            let b = rng.pick(BinaryOp::ALL);
            // Half the time the right operand is a scalar in the descriptor.
            let scalar = rng.chance(0.5);
            let operands: &[(usize, bool)] = if scalar {
                &[(bytes, false), (bytes, true)]
            } else {
                &[(bytes, false), (bytes, false), (bytes, true)]
            };
            let name = format!("binary {}{}", b.name(), if scalar { " scalar" } else { "" });
            op(name, operands, true, move |c, p| {
                let rhs = match scalar {
                    true => Value::Scalar(-1.25),
                    false => Value::Tensor(StridedBuf::contiguous(p[1], &[n])),
                };
                c.binary(&BinaryDesc {
                    op: b,
                    dtype: F32,
                    lhs: StridedBuf::contiguous(p[0], &[n]),
                    rhs,
                    output: p[p.len() - 1],
                })
            })
        }
        6 => {
            let (m, k, nn) = (rng.range(1, 9), rng.range(1, 9), rng.range(1, 9));
            let beta = rng.pick(&[0.0, 1.0]);
            op(
                format!("gemm {m}×{k}×{nn} beta {beta}"),
                &[(4 * m * k, false), (4 * k * nn, false), (4 * m * nn, true)],
                false,
                move |c, p| c.gemm(&gemm_desc(p, (m, nn, k), beta)),
            )
        }
        7 => {
            let (m, nn) = (rng.range(1, 9), rng.range(1, 9));
            op(
                format!("gemv {m}×{nn}"),
                &[(4 * m * nn, false), (4 * nn, false), (4 * m, true)],
                false,
                move |c, p| {
                    c.gemv(&GemvDesc {
                        dtype: F32,
                        trans: Transpose::No,
                        m,
                        n: nn,
                        alpha: 1.0,
                        a: p[0],
                        lda: m,
                        x: p[1],
                        incx: 1,
                        beta: 0.0,
                        y: p[2],
                        incy: 1,
                    })
                },
            )
        }
        8 => {
            let (m, k, nn, batch) = (
                rng.range(1, 5),
                rng.range(1, 5),
                rng.range(1, 5),
                rng.range(1, 4),
            );
            op(
                format!("batched_gemm {batch} × {m}×{k}×{nn}"),
                &[
                    (4 * m * k * batch, false),
                    (4 * k * nn * batch, false),
                    (4 * m * nn * batch, true),
                ],
                false,
                move |c, p| {
                    c.batched_gemm(&BatchedGemmDesc {
                        gemm: gemm_desc(p, (m, nn, k), 0.0),
                        stride_a: m * k,
                        stride_b: k * nn,
                        stride_c: m * nn,
                        batch_count: batch,
                    })
                },
            )
        }
        9 => {
            let (rows, cols) = (rng.range(1, 9), rng.range(1, 40));
            let r = rng.pick(&[
                ReduceOp::Sum,
                ReduceOp::Max,
                ReduceOp::Var { correction: 1 },
            ]);
            op(
                format!("reduce {} of {rows}×{cols}", r.name()),
                &[(4 * rows * cols, false), (4 * rows, true)],
                false,
                move |c, p| {
                    c.reduce(&ReduceDesc {
                        op: r,
                        dtype: F32,
                        input: StridedBuf::contiguous(p[0], &[rows, cols]),
                        axis: 1,
                        output: p[1],
                    })
                },
            )
        }
        10 => {
            let (outer, len, inner) = (rng.range(1, 5), rng.range(1, 40), rng.range(1, 3));
            let b = 4 * outer * len * inner;
            op(
                format!("softmax {outer}×{len}×{inner}"),
                &[(b, false), (b, true)],
                false,
                move |c, p| {
                    c.softmax(&SoftmaxDesc {
                        dtype: F32,
                        input: p[0],
                        output: p[1],
                        outer,
                        axis_len: len,
                        inner,
                        log: false,
                    })
                },
            )
        }
        11 => {
            let (rows, cols) = (rng.range(1, 6), rng.range(1, 40));
            let b = 4 * rows * cols;
            op(
                format!("layer_norm {rows}×{cols}"),
                &[
                    (b, false),
                    (b, true),
                    (4 * cols, false),
                    (4 * cols, false),
                    (4 * rows, true),
                    (4 * rows, true),
                ],
                false,
                move |c, p| {
                    c.layer_norm(&LayerNormDesc {
                        dtype: F32,
                        input: p[0],
                        weight: Some(p[2]),
                        bias: Some(p[3]),
                        output: p[1],
                        rows,
                        cols,
                        eps: 1e-5,
                        saved_mean: Some(p[4]),
                        saved_invstd: Some(p[5]),
                    })
                },
            )
        }
        12 => op(
            "cast f32 to f16",
            &[(bytes, false), (2 * n, true)],
            false,
            move |c, p| {
                c.cast(&CastDesc {
                    src_dtype: F32,
                    dst_dtype: DType::F16,
                    input: StridedBuf::contiguous(p[0], &[n]),
                    output: p[1],
                })
            },
        ),
        13 => op(
            "copy_strided",
            &[(bytes, false), (bytes, true)],
            true,
            move |c, p| {
                c.copy_strided(&CopyDesc {
                    dtype: F32,
                    src: StridedBuf::contiguous(p[0], &[n]),
                    dst: StridedBuf::contiguous(p[1], &[n]),
                })
            },
        ),
        14 => op(
            "adam",
            &[(bytes, true), (bytes, false), (bytes, true), (bytes, true)],
            false,
            move |c, p| {
                c.adam_step(&AdamDesc {
                    dtype: F32,
                    params: p[0],
                    grads: p[1],
                    exp_avg: p[2],
                    exp_avg_sq: p[3],
                    len: n,
                    lr: 1e-3,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    weight_decay: 0.0,
                    decoupled_weight_decay: false,
                    step: 1,
                })
            },
        ),
        15 => op(
            "unscale_and_check",
            &[(bytes, false), (bytes, true), (4, true)],
            true,
            move |c, p| {
                c.unscale_and_check(&UnscaleDesc {
                    dtype: F32,
                    input: p[0],
                    output: p[1],
                    len: n,
                    inv_scale: 0.5,
                    found_inf: p[2],
                })
            },
        ),
        18 => RawOp {
            zeroed: vec![1],
            ..op(
                "gather",
                &[(bytes, false), (8 * n, false), (bytes, true)],
                false,
                move |c, p| {
                    c.gather(&GatherDesc {
                        dtype: F32,
                        index_dtype: DType::I64,
                        input: StridedBuf::contiguous(p[0], &[n]),
                        dim: 0,
                        index: StridedBuf::contiguous(p[1], &[n]),
                        output: p[2],
                    })
                },
            )
        },
        19 => RawOp {
            zeroed: vec![0],
            ..op(
                "scatter_add",
                &[(4 * n, false), (bytes, false), (bytes, true)],
                false,
                move |c, p| {
                    c.scatter(&ScatterDesc {
                        dtype: F32,
                        index_dtype: DType::I32,
                        reduce: ScatterReduce::Add,
                        output: p[2],
                        output_shape: vec![n],
                        dim: 0,
                        index: StridedBuf::contiguous(p[0], &[n]),
                        src: StridedBuf::contiguous(p[1], &[n]),
                        alpha: 1.0,
                    })
                },
            )
        },
        20 => op(
            "compare",
            &[(bytes, false), (n, true)],
            false,
            move |c, p| {
                c.compare(&CompareDesc {
                    op: CompareOp::Lt,
                    dtype: F32,
                    lhs: StridedBuf::contiguous(p[0], &[n]),
                    rhs: Value::Scalar(0.5),
                    output: p[1],
                })
            },
        ),
        21 => op(
            "where",
            &[(n, false), (bytes, false), (bytes, true)],
            false,
            move |c, p| {
                c.where_(&WhereDesc {
                    dtype: F32,
                    cond_dtype: DType::U8,
                    cond: StridedBuf::contiguous(p[0], &[n]),
                    on_true: Value::Tensor(StridedBuf::contiguous(p[1], &[n])),
                    on_false: Value::Scalar(-1.0),
                    output: p[2],
                })
            },
        ),
        22 => {
            // A cumulative sum or product along either dim of a small matrix.
            let (rows, dim) = (rng.range(1, 4), rng.range(0, 1));
            let scan = rng.pick(&[ScanOp::Sum, ScanOp::Prod]);
            op(
                format!("{} {rows}×{n} dim {dim}", scan.name()),
                &[(rows * bytes, false), (rows * bytes, true)],
                false,
                move |c, p| {
                    c.scan(&ScanDesc {
                        op: scan,
                        dtype: F32,
                        input: StridedBuf::contiguous(p[0], &[rows, n]),
                        dim,
                        output: p[1],
                    })
                },
            )
        }
        23 => {
            // The first k of each line, values and positions, or a whole sort.
            let k = rng.range(1, n);
            let descending = rng.chance(0.5);
            op(
                format!("sort k {k} of {n}, descending {descending}"),
                &[(bytes, false), (4 * k, true), (8 * k, true)],
                false,
                move |c, p| {
                    c.sort(&SortDesc {
                        dtype: F32,
                        input: StridedBuf::contiguous(p[0], &[n]),
                        dim: 0,
                        descending,
                        k,
                        values: Some(p[1]),
                        indices: Some(p[2]),
                    })
                },
            )
        }
        24 => {
            let u = rng.pick(UnaryOp::ALL);
            op(
                format!("unary_backward {}", u.name()),
                &[(bytes, false), (bytes, false), (bytes, true)],
                true,
                move |c, p| {
                    c.unary_backward(&UnaryBackwardDesc {
                        op: u,
                        dtype: F32,
                        saved: StridedBuf::contiguous(p[0], &[n]),
                        grad: StridedBuf::contiguous(p[1], &[n]),
                        output: p[2],
                    })
                },
            )
        }
        25 => op(
            "dropout",
            &[(bytes, false), (bytes, true)],
            true,
            move |c, p| {
                c.dropout(&DropoutDesc {
                    dtype: F32,
                    input: p[0],
                    output: p[1],
                    len: n,
                    p: 0.25,
                    seed: 3,
                })
            },
        ),
        26 => {
            let (planes, h, w) = (rng.range(1, 5), rng.range(2, 9), rng.range(2, 9));
            let (k, stride) = (rng.range(2, 3).min(h).min(w), rng.range(1, 3));
            let pad = rng.range(0, k / 2);
            let include = rng.chance(0.5);
            let out_h = (h + 2 * pad - k) / stride + 1;
            let out_w = (w + 2 * pad - k) / stride + 1;
            op(
                format!("avg pool backward {planes}×{h}×{w} k{k} s{stride} p{pad}"),
                &[
                    (4 * planes * out_h * out_w, false),
                    (4 * planes * h * w, true),
                ],
                false,
                move |c, p| {
                    c.pool2d_backward(&Pool2dBackwardDesc {
                        kind: PoolKind::Avg {
                            count_include_pad: include,
                        },
                        dtype: F32,
                        grad: p[0],
                        grad_shape: [planes, 1, out_h, out_w],
                        indices: None,
                        output: p[1],
                        input_shape: [planes, 1, h, w],
                        kernel: [k, k],
                        stride: [stride, stride],
                        padding: [pad, pad],
                    })
                },
            )
        }
        28 => {
            // A layer norm or batch norm gradient from statistics, every gradient asked for.
            let (rows, cols) = (rng.range(1, 6), rng.range(1, 40));
            let (data, row, stat) = (4 * rows * cols, 4 * cols, 4 * rows);
            if rng.chance(0.5) {
                op(
                    format!("layer_norm_backward {rows}×{cols}"),
                    &[
                        (data, false),
                        (data, false),
                        (row, false),
                        (stat, false),
                        (stat, false),
                        (data, true),
                        (row, true),
                        (row, true),
                    ],
                    false,
                    move |c, p| {
                        c.layer_norm_backward(&LayerNormBackwardDesc {
                            dtype: F32,
                            grad_output: p[0],
                            input: p[1],
                            weight: Some(p[2]),
                            mean: p[3],
                            invstd: p[4],
                            grad_input: Some(p[5]),
                            grad_weight: Some(p[6]),
                            grad_bias: Some(p[7]),
                            rows,
                            cols,
                        })
                    },
                )
            } else {
                // `rows` images of `cols` positions, one channel.
                op(
                    format!("batch_norm_backward {rows}×1×{cols}"),
                    &[
                        (data, false),
                        (data, false),
                        (4, false),
                        (4, false),
                        (4, false),
                        (data, true),
                        (4, true),
                        (4, true),
                    ],
                    false,
                    move |c, p| {
                        c.batch_norm_backward(&BatchNormBackwardDesc {
                            dtype: F32,
                            grad_output: p[0],
                            input: p[1],
                            weight: Some(p[2]),
                            mean: p[3],
                            invstd: p[4],
                            grad_input: Some(p[5]),
                            grad_weight: Some(p[6]),
                            grad_bias: Some(p[7]),
                            batch: rows,
                            channels: 1,
                            spatial: cols,
                            training: true,
                        })
                    },
                )
            }
        }
        27 => {
            // A strided, padded convolution's input or weight gradient.
            let (batch, ch, h, w) = (
                rng.range(1, 2),
                rng.range(1, 3),
                rng.range(3, 9),
                rng.range(3, 9),
            );
            let (k, out, stride) = (rng.range(1, 3), rng.range(1, 3), rng.range(1, 2));
            let pad = rng.range(0, k / 2);
            let (oh, ow) = (
                (h + 2 * pad - k) / stride + 1,
                (w + 2 * pad - k) / stride + 1,
            );
            let (x, wt, y) = ([batch, ch, h, w], [out, ch, k, k], [batch, out, oh, ow]);
            let bytes = |s: [usize; 4]| 4 * s.iter().product::<usize>();
            let window = ([stride, stride], [pad, pad], [1, 1], 1);
            if rng.chance(0.5) {
                op(
                    format!("conv2d_backward_input {batch}×{ch}×{h}×{w} k{k} s{stride} p{pad}"),
                    &[(bytes(y), false), (bytes(wt), false), (bytes(x), true)],
                    false,
                    move |c, p| {
                        c.conv2d_backward_input(&Conv2dBackwardInputDesc {
                            dtype: F32,
                            grad_output: p[0],
                            grad_output_shape: y,
                            weight: p[1],
                            weight_shape: wt,
                            bias: None,
                            grad_input: p[2],
                            grad_input_shape: x,
                            stride: window.0,
                            padding: window.1,
                            dilation: window.2,
                            groups: window.3,
                        })
                    },
                )
            } else {
                op(
                    format!("conv2d_backward_weight {batch}×{ch}×{h}×{w} k{k} s{stride} p{pad}"),
                    &[(bytes(x), false), (bytes(y), false), (bytes(wt), true)],
                    false,
                    move |c, p| {
                        c.conv2d_backward_weight(&Conv2dBackwardWeightDesc {
                            dtype: F32,
                            input: p[0],
                            input_shape: x,
                            grad_output: p[1],
                            grad_output_shape: y,
                            grad_weight: p[2],
                            weight_shape: wt,
                            stride: window.0,
                            padding: window.1,
                            dilation: window.2,
                            groups: window.3,
                        })
                    },
                )
            }
        }
        29 => {
            let (outer, len, inner) = (rng.range(1, 5), rng.range(1, 40), rng.range(1, 3));
            let b = 4 * outer * len * inner;
            let log = rng.chance(0.5);
            op(
                format!("softmax_backward {outer}×{len}×{inner} log {log}"),
                &[(b, false), (b, false), (b, true)],
                false,
                move |c, p| {
                    c.softmax_backward(&SoftmaxBackwardDesc {
                        dtype: F32,
                        grad_output: p[0],
                        output: p[1],
                        grad_input: p[2],
                        outer,
                        axis_len: len,
                        inner,
                        log,
                    })
                },
            )
        }
        30 => {
            // Zeroed I64 targets: class 0 of every row.
            let (rows, classes) = (rng.range(1, 6), rng.range(1, 40));
            let backward = rng.chance(0.5);
            let logits = 4 * rows * classes;
            let mut operands = vec![(logits, false), (8 * rows, false)];
            if backward {
                operands.push((4 * rows, false));
            }
            operands.push((if backward { logits } else { 4 * rows }, true));
            RawOp {
                zeroed: vec![1],
                ..op(
                    format!("cross_entropy {rows}×{classes} backward {backward}"),
                    &operands,
                    false,
                    move |c, p| {
                        c.cross_entropy(&CrossEntropyDesc {
                            dtype: F32,
                            index_dtype: DType::I64,
                            logits: p[0],
                            target: p[1],
                            grad: backward.then(|| p[2]),
                            output: p[p.len() - 1],
                            rows,
                            classes,
                            ignore_index: Some(-100),
                            label_smoothing: 0.1,
                        })
                    },
                )
            }
        }
        16 => op("random", &[(bytes, true)], false, move |c, p| {
            c.random(&RandomDesc {
                dtype: F32,
                ptr: p[0],
                len: n,
                distribution: Distribution::Uniform {
                    low: 0.0,
                    high: 1.0,
                },
                seed: 7,
            })
        }),
        17 => {
            let (batch, ch, h, w) = (
                rng.range(1, 2),
                rng.range(1, 3),
                rng.range(3, 9),
                rng.range(3, 9),
            );
            let (k, out) = (rng.range(1, 3), rng.range(1, 3));
            let (oh, ow) = (h - k + 1, w - k + 1);
            if rng.chance(0.5) {
                op(
                    format!("conv2d {batch}×{ch}×{h}×{w} k{k}"),
                    &[
                        (4 * batch * ch * h * w, false),
                        (4 * out * ch * k * k, false),
                        (4 * batch * out * oh * ow, true),
                    ],
                    false,
                    move |c, p| {
                        c.conv2d_forward(&Conv2dDesc {
                            dtype: F32,
                            input: p[0],
                            input_shape: [batch, ch, h, w],
                            weight: p[1],
                            weight_shape: [out, ch, k, k],
                            bias: None,
                            output: p[2],
                            output_shape: [batch, out, oh, ow],
                            stride: [1, 1],
                            padding: [0, 0],
                            dilation: [1, 1],
                            groups: 1,
                        })
                    },
                )
            } else {
                let with_indices = rng.chance(0.5);
                let mut operands = vec![
                    (4 * batch * ch * h * w, false),
                    (4 * batch * ch * oh * ow, true),
                ];
                if with_indices {
                    operands.push((8 * batch * ch * oh * ow, true));
                }
                op(
                    format!("max pool {batch}×{ch}×{h}×{w} k{k} indices {with_indices}"),
                    &operands,
                    false,
                    move |c, p| {
                        c.pool2d(&Pool2dDesc {
                            kind: PoolKind::Max,
                            dtype: F32,
                            input: p[0],
                            input_shape: [batch, ch, h, w],
                            output: p[1],
                            output_shape: [batch, ch, oh, ow],
                            kernel: [k, k],
                            stride: [1, 1],
                            padding: [0, 0],
                            indices: with_indices.then(|| p[2]),
                        })
                    },
                )
            }
        }
        _ => {
            let (s, d) = (rng.range(1, 9), rng.range(1, 17));
            let b = 4 * s * d;
            let causal = rng.chance(0.5);
            if rng.chance(0.5) {
                // The forward, saving its log-sum-exps half the time.
                let with_lse = rng.chance(0.5);
                let mut operands = vec![(b, false), (b, false), (b, false), (b, true)];
                if with_lse {
                    operands.push((4 * s, true));
                }
                return op(
                    format!("attention {s}×{d} lse {with_lse}"),
                    &operands,
                    false,
                    move |c, p| {
                        c.attention(&AttentionDesc {
                            dtype: F32,
                            q: p[0],
                            k: p[1],
                            v: p[2],
                            o: p[3],
                            batch: 1,
                            heads: 1,
                            seq_q: s,
                            seq_kv: s,
                            head_dim: d,
                            scale: 0.5,
                            causal,
                            lse: with_lse.then(|| p[4]),
                        })
                    },
                );
            }
            let mut operands = vec![(b, false); 5];
            operands.push((4 * s, false));
            operands.extend([(b, true); 3]);
            op(
                format!("attention_backward {s}×{d}"),
                &operands,
                false,
                move |c, p| {
                    c.attention_backward(&AttentionBackwardDesc {
                        dtype: F32,
                        grad_output: p[0],
                        q: p[1],
                        k: p[2],
                        v: p[3],
                        o: p[4],
                        lse: p[5],
                        grad_q: p[6],
                        grad_k: p[7],
                        grad_v: p[8],
                        batch: 1,
                        heads: 1,
                        seq_q: s,
                        seq_kv: s,
                        head_dim: d,
                        scale: 0.5,
                        causal,
                    })
                },
            )
        }
    }
}

/// Ops whose sizes overflow or exceed any memory, on valid small pointers: each must answer
/// `SizeOverflow`, `OutOfBounds`, `OutOfMemory` or `InvalidArgument`, never run.
fn huge(rng: &mut Rng) -> RawOp {
    let len = rng.pick(&[
        usize::MAX,
        usize::MAX / 2,
        usize::MAX / 4 + 1,
        1 << 62,
        1 << 40,
    ]);
    match rng.range(0, 4) {
        0 => op(
            format!("fill of {len}"),
            &[(64, true)],
            false,
            move |c, p| {
                c.fill(&FillDesc {
                    dtype: F32,
                    ptr: p[0],
                    len,
                    value: 0.0,
                })
            },
        ),
        1 => op(
            format!("unary over [{len}, {len}]"),
            &[(64, false), (64, true)],
            false,
            move |c, p| {
                c.unary(&UnaryDesc {
                    op: UnaryOp::Exp,
                    dtype: F32,
                    input: StridedBuf {
                        ptr: p[0],
                        layout: torsh_backend::Layout::new(vec![len, len], vec![0, 0], 0)?,
                    },
                    output: p[1],
                })
            },
        ),
        2 => op(
            format!("gemm {len}×2×2"),
            &[(64, false), (64, false), (64, true)],
            false,
            move |c, p| c.gemm(&gemm_desc(p, (len, 2, 2), 0.0)),
        ),
        3 => op(
            format!("softmax of {len} rows"),
            &[(64, false), (64, true)],
            false,
            move |c, p| {
                c.softmax(&SoftmaxDesc {
                    dtype: F32,
                    input: p[0],
                    output: p[1],
                    outer: len,
                    axis_len: 4,
                    inner: 1,
                    log: false,
                })
            },
        ),
        _ => op(
            format!("copy_dtod of {len} bytes"),
            &[(64, false), (64, true)],
            false,
            move |c, p| c.copy_dtod(p[1], p[0], len),
        ),
    }
}

/// The case `rng` draws, as a description and its check on `b` (with `other`, another instance of
/// the same kind, as the owner of foreign pointers).
pub fn run(rng: &mut Rng, b: &Backend, other: &Backend) -> (String, Outcome) {
    let c = b.compute();
    let baseline = c.allocated_bytes();
    if rng.chance(0.1) {
        let op = huge(rng);
        let desc = format!("{} (sizes past memory)", op.name);
        let outcome = with_operands(c, &op, |ptrs| {
            judge_error(
                (op.call)(c, ptrs),
                &[
                    "SizeOverflow",
                    "OutOfBounds",
                    "OutOfMemory",
                    "InvalidArgument",
                ],
            )
        });
        return (desc, leak_check(c, baseline, outcome));
    }
    let op = generate_op(rng);
    let target = rng.range(0, op.operands.len() - 1);
    let mutation = pick_mutation(rng, &op, target);
    let desc = format!("{}: operand {target} {mutation:?}", op.name);
    let outcome = with_operands(c, &op, |ptrs| {
        if let Err(e) = (op.call)(c, ptrs) {
            return Outcome::Error(format!("the valid op failed: {e}"));
        }
        mutated(c, other.compute(), &op, ptrs, target, mutation)
    });
    (desc, leak_check(c, baseline, outcome))
}

fn pick_mutation(rng: &mut Rng, op: &RawOp, target: usize) -> Mutation {
    let writes = op.operands[target].writes;
    let others: Vec<usize> = (0..op.operands.len()).filter(|&i| i != target).collect();
    match rng.range(0, 7) {
        0 => Mutation::Freed,
        1 => Mutation::Foreign,
        2 => Mutation::Null,
        3 => Mutation::Huge,
        4 => Mutation::Short,
        5 => Mutation::PastEnd,
        6 if writes && !others.is_empty() => {
            let onto = rng.pick(&others);
            let offset = rng
                .pick(&[0, 4])
                .min(op.operands[onto].bytes.saturating_sub(4));
            Mutation::Overlap(onto, offset)
        }
        _ => Mutation::Misaligned,
    }
}

/// Allocates `op`'s operands (filled with ones, its `zeroed` ones with zeros), runs `f` on their
/// pointers, frees them.
fn with_operands(
    c: &dyn ComputeBackend,
    op: &RawOp,
    f: impl FnOnce(&[DevicePtr]) -> Outcome,
) -> Outcome {
    let mut ptrs = Vec::new();
    for (k, o) in op.operands.iter().enumerate() {
        match c.alloc(o.bytes) {
            Ok(p) => ptrs.push(p),
            Err(e) => {
                free_all(c, &ptrs);
                return Outcome::Error(format!("alloc of {} bytes: {e}", o.bytes));
            }
        }
        let fill = if op.zeroed.contains(&k) { 0.0f32 } else { 1.0 };
        let ones: Vec<u8> = std::iter::repeat_n(fill.to_le_bytes(), o.bytes / 4)
            .flatten()
            .collect();
        if let Err(e) = c.copy_htod(*ptrs.last().unwrap(), &ones) {
            free_all(c, &ptrs);
            return Outcome::Error(format!("upload: {e}"));
        }
    }
    let outcome = f(&ptrs);
    free_all(c, &ptrs);
    outcome
}

fn free_all(c: &dyn ComputeBackend, ptrs: &[DevicePtr]) {
    for &p in ptrs {
        let _ = c.free(p);
    }
}

/// A failure when allocations outlive the case.
fn leak_check(c: &dyn ComputeBackend, baseline: Option<usize>, outcome: Outcome) -> Outcome {
    match (baseline, c.allocated_bytes()) {
        (Some(before), Some(after)) if after != before && !outcome.failed() => Outcome::Error(
            format!("{} bytes allocated before the case, {after} after", before),
        ),
        _ => outcome,
    }
}

/// Runs `op` with operand `target` replaced as `mutation` says, and judges the answer.
fn mutated(
    c: &dyn ComputeBackend,
    foreign: &dyn ComputeBackend,
    op: &RawOp,
    ptrs: &[DevicePtr],
    target: usize,
    mutation: Mutation,
) -> Outcome {
    let bytes = op.operands[target].bytes;
    let mut bad = ptrs.to_vec();
    let mut scratch = None;
    let mut foreign_scratch = None;
    let pointer_errors: &[&str] = &["InvalidPointer", "OutOfBounds"];
    let expect: &[&str] = match mutation {
        Mutation::Freed => {
            match c.alloc(bytes).and_then(|p| c.free(p).map(|()| p)) {
                Ok(p) => bad[target] = p,
                Err(e) => return Outcome::Error(format!("alloc/free: {e}")),
            }
            if c.backend_type() == BackendType::Cuda {
                // CUDA's allocator may hand a freed address out again (as cudaFree does).
                &["InvalidPointer", "OutOfBounds", "Ok"]
            } else {
                pointer_errors
            }
        }
        Mutation::Foreign => {
            match foreign.alloc(bytes) {
                Ok(p) => {
                    bad[target] = p;
                    foreign_scratch = Some(p);
                }
                Err(e) => return Outcome::Error(format!("foreign alloc: {e}")),
            }
            pointer_errors
        }
        Mutation::Null => {
            bad[target] = DevicePtr(0);
            pointer_errors
        }
        Mutation::Huge => {
            bad[target] = DevicePtr(u64::MAX - 3);
            &["InvalidPointer", "OutOfBounds", "SizeOverflow"]
        }
        Mutation::Short => {
            if bytes < 2 {
                return Outcome::Pass;
            }
            match c.alloc(bytes - 2) {
                Ok(p) => {
                    bad[target] = p;
                    scratch = Some(p);
                }
                Err(e) => return Outcome::Error(format!("alloc: {e}")),
            }
            pointer_errors
        }
        Mutation::PastEnd => {
            bad[target] = DevicePtr(ptrs[target].0 + 4);
            pointer_errors
        }
        Mutation::Misaligned => {
            match c.alloc(bytes + 4) {
                Ok(p) => {
                    bad[target] = DevicePtr(p.0 + 1);
                    scratch = Some(p);
                    // An index operand keeps valid contents (zeros) at its new address.
                    if op.zeroed.contains(&target) {
                        let _ = c.copy_htod(p, &vec![0; bytes + 4]);
                    }
                }
                Err(e) => return Outcome::Error(format!("alloc: {e}")),
            }
            // Any byte address is allowed; a backend that cannot take one says so.
            &[
                "Ok",
                "InvalidArgument",
                "FeatureUnavailable",
                "Unsupported",
                "InvalidPointer",
            ]
        }
        Mutation::Overlap(onto, offset) => {
            bad[target] = DevicePtr(ptrs[onto].0 + offset as u64);
            let exact = offset == 0 && op.operands[onto].bytes == bytes;
            if exact && op.in_place && !op.operands[onto].writes {
                &["Ok", "Aliasing"]
            } else {
                &["Aliasing", "OutOfBounds"]
            }
        }
    };
    // Outputs other than the mutated one are set to a known pattern, which a failing op must leave.
    let watched: Vec<usize> = (0..ptrs.len())
        .filter(|&i| {
            op.operands[i].writes
                && bad[i] == ptrs[i]
                && !overlaps_target(&bad, ptrs, i, target, op)
        })
        .collect();
    for &i in &watched {
        let _ = c.copy_htod(ptrs[i], &vec![0x5A; op.operands[i].bytes]);
    }
    let result = (op.call)(c, &bad);
    let mut outcome = judge_error(result.as_ref().map(|_| ()).map_err(clone_kind), expect);
    if result.is_err() && !outcome.failed() {
        for &i in &watched {
            let mut now = vec![0; op.operands[i].bytes];
            if c.copy_dtoh(&mut now, ptrs[i]).is_ok() && now.iter().any(|&b| b != 0x5A) {
                outcome = Outcome::WrongError(format!(
                    "failed with {:?} after writing operand {i}",
                    result.as_ref().err().map(error_kind)
                ));
            }
        }
    }
    if let Some(p) = scratch {
        let _ = c.free(p);
    }
    if let Some(p) = foreign_scratch {
        let _ = foreign.free(p);
    }
    outcome
}

/// Whether operand `i`'s buffer is the one the mutation points the target at.
fn overlaps_target(
    bad: &[DevicePtr],
    ptrs: &[DevicePtr],
    i: usize,
    target: usize,
    op: &RawOp,
) -> bool {
    let (t0, t1) = (
        bad[target].0,
        bad[target]
            .0
            .saturating_add(op.operands[target].bytes as u64),
    );
    let (i0, i1) = (ptrs[i].0, ptrs[i].0 + op.operands[i].bytes as u64);
    t0 < i1 && i0 < t1
}

/// The error kept by kind only (errors are not `Clone`).
fn clone_kind(e: &BackendError) -> (String, &'static str) {
    (e.to_string(), error_kind(e))
}

/// `Pass` when `result` is one of `expect` ("Ok" for success), with a non-empty message.
fn judge_error<E: ErrorLike>(result: std::result::Result<(), E>, expect: &[&str]) -> Outcome {
    match result {
        Ok(()) if expect.contains(&"Ok") => Outcome::Pass,
        Ok(()) => Outcome::WrongError(format!("Ok, expected {expect:?}")),
        Err(e) if expect.contains(&e.kind()) && !e.message().trim().is_empty() => Outcome::Pass,
        Err(e) => Outcome::WrongError(format!(
            "{} ({}), expected {expect:?}",
            e.message(),
            e.kind()
        )),
    }
}

/// An error judged by kind and message.
trait ErrorLike {
    fn kind(&self) -> &'static str;
    fn message(&self) -> String;
}

impl ErrorLike for BackendError {
    fn kind(&self) -> &'static str {
        error_kind(self)
    }
    fn message(&self) -> String {
        self.to_string()
    }
}

impl ErrorLike for (String, &'static str) {
    fn kind(&self) -> &'static str {
        self.1
    }
    fn message(&self) -> String {
        self.0.clone()
    }
}
