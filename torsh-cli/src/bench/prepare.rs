//! How ours runs each case: inputs allocated once on the backend, then one call per run.
//!
//! GEMM, attention and convolution go through the public `Tensor` API, which allocates its output on
//! each call as a user's code does. The memory-bound ops write into an output allocated once, through
//! the backend's `ComputeBackend` descriptors (the same calls the `Tensor` API makes), so that they
//! measure the kernel's traffic and not the allocator or the page faults of a fresh 64 MiB buffer.

use torsh_backend::compute::{
    BatchNormBackwardDesc, BatchNormDesc, BinaryDesc, CastDesc, DropoutDesc, FillDesc, GatherDesc,
    LayerNormBackwardDesc, LayerNormDesc, Pool2dBackwardDesc, Pool2dDesc, PoolKind, ReduceDesc,
    ScanDesc, ScanOp, ScatterDesc, ScatterReduce, SoftmaxBackwardDesc, SoftmaxDesc, StridedBuf,
    UnaryBackwardDesc, UnaryDesc, Value, WhereDesc,
};
use torsh_backend::{
    AdamState, Backend, BackendError, BatchNormConfig, BinaryOp, ConvConfig, CrossEntropyConfig,
    DType, ReduceOp, Tensor, UnaryOp,
};

use super::cases::{pool_image, Case, MemOp, Op, Runner, BATCH_NORM_CHANNELS, TOPK};

/// An error of ours as text.
fn text(e: BackendError) -> String {
    e.to_string()
}

impl Case {
    /// Allocates the inputs (random, never zeros) on `backend` and returns one call of the op.
    pub fn prepare(&self, backend: &Backend) -> torsh_backend::Result<Runner<'static>> {
        let dt = self.dtype;
        Ok(match self.op {
            Op::Matmul { m, n, k } => {
                let a = backend.randn(&[m, k], dt)?;
                let b = backend.randn(&[k, n], dt)?;
                Box::new(move || a.matmul(&b).map(drop).map_err(text))
            }
            Op::Memory { op, rows, cols } => memory(backend, op, rows, cols, dt)?,
            Op::Attention {
                b,
                h,
                s,
                d,
                causal,
                backward,
            } => {
                let q = backend.randn(&[b, h, s, d], dt)?;
                let k = backend.randn(&[b, h, s, d], dt)?;
                let v = backend.randn(&[b, h, s, d], dt)?;
                if backward {
                    let scale = 1.0 / (d as f64).sqrt();
                    let fwd = backend.attention_with_lse(&q, &k, &v, causal, scale)?;
                    let grad = backend.randn(&[b, h, s, d], dt)?;
                    let backend = backend.clone();
                    return Ok(Box::new(move || {
                        let (o, lse) = (&fwd.output, &fwd.lse);
                        backend
                            .attention_backward(&grad, &q, &k, &v, o, lse, causal, scale)
                            .map(drop)
                            .map_err(text)
                    }));
                }
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
                groups,
                bias,
                backward,
            } => {
                let input = backend.randn(&[n, c, hw, hw], dt)?;
                let weight = backend.randn(&[k, c / groups.max(1), r, r], dt)?;
                let bias = if bias {
                    Some(backend.randn(&[k], dt)?)
                } else {
                    None
                };
                let config = ConvConfig {
                    stride: [stride, stride],
                    padding: [pad, pad],
                    dilation: [1, 1],
                    groups,
                };
                let backend = backend.clone();
                if backward {
                    let out = backend.conv2d(&input, &weight, config)?;
                    let grad = backend.randn(out.shape(), dt)?;
                    return Ok(Box::new(move || {
                        let shape = input.shape();
                        backend
                            .conv2d_backward_input(&grad, &weight, shape, config)
                            .map_err(text)?;
                        backend
                            .conv2d_backward_weight(&grad, &input, weight.shape(), config)
                            .map_err(text)?;
                        if bias.is_some() {
                            backend.conv2d_backward_bias(&grad).map_err(text)?;
                        }
                        Ok(())
                    }));
                }
                Box::new(move || {
                    backend
                        .conv2d_with_bias(&input, &weight, bias.as_ref(), config)
                        .map(drop)
                        .map_err(text)
                })
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

/// A memory-bound op on a random `[rows, cols]` input, into an output allocated here once.
fn memory(
    backend: &Backend,
    op: MemOp,
    rows: usize,
    cols: usize,
    dt: DType,
) -> torsh_backend::Result<Runner<'static>> {
    let x = backend.randn(&[rows, cols], dt)?;
    let dense_out = || backend.empty(&[rows, cols], dt);
    let dense = |t: &Tensor| StridedBuf::contiguous(t.data_ptr(), &[rows, cols]);
    let b = backend.clone();
    Ok(match op {
        MemOp::Memcpy => {
            let out = dense_out()?;
            let bytes = rows * cols * dt.size_in_bytes();
            Box::new(move || {
                b.compute()
                    .copy_dtod(out.data_ptr(), x.data_ptr(), bytes)
                    .map_err(text)
            })
        }
        MemOp::Copy => {
            let out = dense_out()?;
            Box::new(move || out.copy_from(&x).map_err(text))
        }
        MemOp::CopyTransposed => {
            let xt = x.t()?;
            let out = backend.empty(&[cols, rows], dt)?;
            Box::new(move || out.copy_from(&xt).map_err(text))
        }
        MemOp::Add | MemOp::Mul => {
            let out = dense_out()?;
            let y = backend.randn(&[rows, cols], dt)?;
            let desc = BinaryDesc {
                op: if op == MemOp::Add {
                    BinaryOp::Add
                } else {
                    BinaryOp::Mul
                },
                dtype: dt,
                lhs: dense(&x),
                rhs: Value::Tensor(dense(&y)),
                output: out.data_ptr(),
            };
            Box::new(move || {
                let _keep = (&x, &y, &out);
                b.compute().binary(&desc).map_err(text)
            })
        }
        MemOp::Exp | MemOp::Gelu | MemOp::Erf | MemOp::Tanh | MemOp::Sigmoid => {
            let out = dense_out()?;
            let desc = UnaryDesc {
                op: match op {
                    MemOp::Exp => UnaryOp::Exp,
                    MemOp::Gelu => UnaryOp::Gelu,
                    MemOp::Erf => UnaryOp::Erf,
                    MemOp::Tanh => UnaryOp::Tanh,
                    _ => UnaryOp::Sigmoid,
                },
                dtype: dt,
                input: dense(&x),
                output: out.data_ptr(),
            };
            Box::new(move || {
                let _keep = (&x, &out);
                b.compute().unary(&desc).map_err(text)
            })
        }
        MemOp::GeluBackward => {
            let (grad, out) = (backend.randn(&[rows, cols], dt)?, dense_out()?);
            let desc = UnaryBackwardDesc {
                op: UnaryOp::Gelu,
                dtype: dt,
                saved: dense(&x),
                grad: dense(&grad),
                output: out.data_ptr(),
            };
            Box::new(move || {
                let _keep = (&x, &grad, &out);
                b.compute().unary_backward(&desc).map_err(text)
            })
        }
        MemOp::SoftmaxBackward => {
            let (y, grad, out) = (
                x.softmax(1)?,
                backend.randn(&[rows, cols], dt)?,
                dense_out()?,
            );
            let desc = SoftmaxBackwardDesc {
                dtype: dt,
                grad_output: grad.data_ptr(),
                output: y.data_ptr(),
                grad_input: out.data_ptr(),
                outer: rows,
                axis_len: cols,
                inner: 1,
                log: false,
            };
            Box::new(move || {
                let _keep = (&y, &grad, &out);
                b.compute().softmax_backward(&desc).map_err(text)
            })
        }
        MemOp::Dropout => {
            let out = dense_out()?;
            let desc = DropoutDesc {
                dtype: dt,
                input: x.data_ptr(),
                output: out.data_ptr(),
                len: rows * cols,
                p: 0.5,
                seed: 7,
            };
            Box::new(move || {
                let _keep = (&x, &out);
                b.compute().dropout(&desc).map_err(text)
            })
        }
        MemOp::MaxPool | MemOp::MaxPoolBackward | MemOp::AvgPoolBackward => {
            let image = pool_image(rows, cols);
            let [n, c, h, w] = image;
            let pooled = [n, c, h / 2, w / 2];
            let window = ([2, 2], [2, 2], [0, 0]);
            let positions = backend.empty(&pooled, DType::I64)?;
            let y = backend.empty(&pooled, dt)?;
            let forward = Pool2dDesc {
                kind: PoolKind::Max,
                dtype: dt,
                input: x.data_ptr(),
                input_shape: image,
                output: y.data_ptr(),
                output_shape: pooled,
                kernel: window.0,
                stride: window.1,
                padding: window.2,
                indices: None,
            };
            if op == MemOp::MaxPool {
                return Ok(Box::new(move || {
                    let _keep = (&x, &y, &positions);
                    b.compute().pool2d(&forward).map_err(text)
                }));
            }
            b.compute().pool2d(&Pool2dDesc {
                indices: Some(positions.data_ptr()),
                ..forward
            })?;
            let out = dense_out()?;
            let kind = if op == MemOp::MaxPoolBackward {
                PoolKind::Max
            } else {
                PoolKind::Avg {
                    count_include_pad: true,
                }
            };
            let desc = Pool2dBackwardDesc {
                kind,
                dtype: dt,
                grad: y.data_ptr(),
                grad_shape: pooled,
                indices: (kind == PoolKind::Max).then(|| positions.data_ptr()),
                output: out.data_ptr(),
                input_shape: image,
                kernel: window.0,
                stride: window.1,
                padding: window.2,
            };
            Box::new(move || {
                let _keep = (&x, &y, &positions, &out);
                b.compute().pool2d_backward(&desc).map_err(text)
            })
        }
        MemOp::CrossEntropy | MemOp::CrossEntropyBackward => {
            let classes: Vec<i64> = (0..rows).map(|r| ((r * 7919) % cols) as i64).collect();
            let target = backend.from_slice(&classes, &[rows])?;
            let config = CrossEntropyConfig::default();
            if op == MemOp::CrossEntropy {
                Box::new(move || x.cross_entropy(&target, config).map(drop).map_err(text))
            } else {
                let one = backend.full(&[], 1.0, dt)?;
                Box::new(move || {
                    b.cross_entropy_backward(&one, &x, &target, config)
                        .map(drop)
                        .map_err(text)
                })
            }
        }
        MemOp::Softmax => {
            let out = dense_out()?;
            let desc = SoftmaxDesc {
                dtype: dt,
                input: x.data_ptr(),
                output: out.data_ptr(),
                outer: rows,
                axis_len: cols,
                inner: 1,
                log: false,
            };
            Box::new(move || {
                let _keep = (&x, &out);
                b.compute().softmax(&desc).map_err(text)
            })
        }
        MemOp::LayerNorm => {
            let out = dense_out()?;
            let desc = LayerNormDesc {
                dtype: dt,
                input: x.data_ptr(),
                weight: None,
                bias: None,
                output: out.data_ptr(),
                rows,
                cols,
                eps: 1e-5,
                saved_mean: None,
                saved_invstd: None,
            };
            Box::new(move || {
                let _keep = (&x, &out);
                b.compute().layer_norm(&desc).map_err(text)
            })
        }
        MemOp::BatchNormTraining | MemOp::BatchNormInference => {
            let out = dense_out()?;
            let c = BATCH_NORM_CHANNELS;
            let per_channel = || backend.randn(&[c], dt);
            let (weight, bias, mean) = (per_channel()?, per_channel()?, per_channel()?);
            let var = per_channel()?.exp()?;
            let desc = BatchNormDesc {
                dtype: dt,
                input: x.data_ptr(),
                output: out.data_ptr(),
                batch: rows,
                channels: c,
                spatial: cols / c,
                weight: Some(weight.data_ptr()),
                bias: Some(bias.data_ptr()),
                running_mean: Some(mean.data_ptr()),
                running_var: Some(var.data_ptr()),
                training: op == MemOp::BatchNormTraining,
                momentum: 0.1,
                eps: 1e-5,
                saved_mean: None,
                saved_invstd: None,
            };
            Box::new(move || {
                let _keep = (&x, &out, &weight, &bias, &mean, &var);
                b.compute().batch_norm(&desc).map_err(text)
            })
        }
        MemOp::LayerNormBackward => {
            let w = backend.randn(&[cols], dt)?;
            let saved = x.layer_norm_with_stats(&[cols], Some(&w), None, 1e-5)?;
            let grad = backend.randn(&[rows, cols], dt)?;
            let out = dense_out()?;
            let params = || backend.empty(&[cols], dt);
            let (dw, db) = (params()?, params()?);
            let desc = LayerNormBackwardDesc {
                dtype: dt,
                grad_output: grad.data_ptr(),
                input: x.data_ptr(),
                weight: Some(w.data_ptr()),
                mean: saved.mean.data_ptr(),
                invstd: saved.invstd.data_ptr(),
                grad_input: Some(out.data_ptr()),
                grad_weight: Some(dw.data_ptr()),
                grad_bias: Some(db.data_ptr()),
                rows,
                cols,
            };
            Box::new(move || {
                let _keep = (&x, &w, &saved, &grad, &out, &dw, &db);
                b.compute().layer_norm_backward(&desc).map_err(text)
            })
        }
        MemOp::BatchNormBackward => {
            let c = BATCH_NORM_CHANNELS;
            let image = x.reshape(&[rows, c, cols / c])?;
            let w = backend.randn(&[c], dt)?;
            let saved = image.batch_norm_with_stats(BatchNormConfig {
                weight: Some(&w),
                training: true,
                ..Default::default()
            })?;
            let grad = backend.randn(&[rows, cols], dt)?;
            let out = dense_out()?;
            let (dw, db) = (backend.empty(&[c], dt)?, backend.empty(&[c], dt)?);
            let desc = BatchNormBackwardDesc {
                dtype: dt,
                grad_output: grad.data_ptr(),
                input: x.data_ptr(),
                weight: Some(w.data_ptr()),
                mean: saved.mean.data_ptr(),
                invstd: saved.invstd.data_ptr(),
                grad_input: Some(out.data_ptr()),
                grad_weight: Some(dw.data_ptr()),
                grad_bias: Some(db.data_ptr()),
                batch: rows,
                channels: c,
                spatial: cols / c,
                training: true,
            };
            Box::new(move || {
                let _keep = (&x, &w, &saved, &grad, &out, &dw, &db);
                b.compute().batch_norm_backward(&desc).map_err(text)
            })
        }
        MemOp::Sum | MemOp::Max => {
            let reduced = backend.empty(&[rows], dt)?;
            let desc = ReduceDesc {
                op: if op == MemOp::Sum {
                    ReduceOp::Sum
                } else {
                    ReduceOp::Max
                },
                dtype: dt,
                input: dense(&x),
                axis: 1,
                output: reduced.data_ptr(),
            };
            Box::new(move || {
                let _keep = (&x, &reduced);
                b.compute().reduce(&desc).map_err(text)
            })
        }
        MemOp::SumColumns => {
            let reduced = backend.empty(&[cols], dt)?;
            let desc = ReduceDesc {
                op: ReduceOp::Sum,
                dtype: dt,
                input: dense(&x),
                axis: 0,
                output: reduced.data_ptr(),
            };
            Box::new(move || {
                let _keep = (&x, &reduced);
                b.compute().reduce(&desc).map_err(text)
            })
        }
        MemOp::CastBf16 => {
            let cast = backend.empty(&[rows, cols], DType::BF16)?;
            let desc = CastDesc {
                src_dtype: dt,
                dst_dtype: DType::BF16,
                input: dense(&x),
                output: cast.data_ptr(),
            };
            Box::new(move || {
                let _keep = (&x, &cast);
                b.compute().cast(&desc).map_err(text)
            })
        }
        MemOp::Gather | MemOp::IndexSelect | MemOp::Embedding => {
            // Random indices from a fixed host stream, so every backend gathers the same elements.
            let (count, high) = match op {
                MemOp::Gather => (rows * cols, cols),
                MemOp::Embedding => (2 * rows, rows),
                _ => (rows, rows),
            };
            let mut rng = torsh_backend::rng::HostRng::new(0x1d5);
            let picks: Vec<i64> = (0..count)
                .map(|_| (rng.next_u64() % high as u64) as i64)
                .collect();
            // Gather writes the input's shape; the row lookups one row per index.
            let out_rows = if op == MemOp::Gather { rows } else { count };
            let out = backend.empty(&[out_rows, cols], dt)?;
            let desc = if op == MemOp::Gather {
                let index = backend.from_slice(&picks, &[rows, cols])?;
                (
                    index.clone(),
                    GatherDesc {
                        dtype: dt,
                        index_dtype: DType::I64,
                        input: dense(&x),
                        dim: 1,
                        index: index.strided_buf(),
                        output: out.data_ptr(),
                    },
                )
            } else {
                let index = backend.from_slice(&picks, &[count])?;
                let spread = torsh_backend::Layout::new(vec![count, cols], vec![1, 0], 0)?;
                (
                    index.clone(),
                    GatherDesc {
                        dtype: dt,
                        index_dtype: DType::I64,
                        input: dense(&x),
                        dim: 0,
                        index: StridedBuf {
                            ptr: index.data_ptr(),
                            layout: spread,
                        },
                        output: out.data_ptr(),
                    },
                )
            };
            let (index, desc) = desc;
            Box::new(move || {
                let _keep = (&x, &out, &index);
                b.compute().gather(&desc).map_err(text)
            })
        }
        MemOp::IndexAdd => {
            let mut rng = torsh_backend::rng::HostRng::new(0x1d6);
            let picks: Vec<i64> = (0..rows)
                .map(|_| (rng.next_u64() % rows as u64) as i64)
                .collect();
            let index = backend.from_slice(&picks, &[rows])?;
            let out = backend.zeros(&[rows, cols], dt)?;
            let desc = ScatterDesc {
                dtype: dt,
                index_dtype: DType::I64,
                reduce: ScatterReduce::Add,
                output: out.data_ptr(),
                output_shape: vec![rows, cols],
                dim: 0,
                index: StridedBuf {
                    ptr: index.data_ptr(),
                    layout: torsh_backend::Layout::new(vec![rows, cols], vec![1, 0], 0)?,
                },
                src: dense(&x),
                alpha: 1.0,
            };
            Box::new(move || {
                let _keep = (&x, &out, &index);
                b.compute().scatter(&desc).map_err(text)
            })
        }
        MemOp::Where => {
            // A random mask from a fixed host stream, so every backend picks the same elements.
            let mut rng = torsh_backend::rng::HostRng::new(0x1d7);
            let bits: Vec<u8> = (0..rows * cols)
                .map(|_| (rng.next_u64() & 1) as u8)
                .collect();
            let mask = backend.from_slice(&bits, &[rows, cols])?;
            let other = backend.randn(&[rows, cols], dt)?;
            let out = dense_out()?;
            let desc = WhereDesc {
                dtype: dt,
                cond_dtype: DType::U8,
                cond: mask.strided_buf(),
                on_true: Value::Tensor(dense(&x)),
                on_false: Value::Tensor(dense(&other)),
                output: out.data_ptr(),
            };
            Box::new(move || {
                let _keep = (&x, &other, &mask, &out);
                b.compute().where_(&desc).map_err(text)
            })
        }
        MemOp::Cumsum => {
            let out = dense_out()?;
            let desc = ScanDesc {
                op: ScanOp::Sum,
                dtype: dt,
                input: dense(&x),
                dim: 1,
                output: out.data_ptr(),
            };
            Box::new(move || {
                let _keep = (&x, &out);
                b.compute().scan(&desc).map_err(text)
            })
        }
        MemOp::Topk => {
            // Through the tensor API (a full stable sort, then the first k kept), which allocates
            // its outputs each call.
            Box::new(move || x.topk(TOPK.min(cols), 1, true).map(drop).map_err(text))
        }
        MemOp::Cat => {
            let half = cols / 2;
            let left = backend.randn(&[rows, half], dt)?;
            let right = backend.randn(&[rows, cols - half], dt)?;
            Box::new(move || b.cat(&[&left, &right], 1).map(drop).map_err(text))
        }
        MemOp::Fill => {
            let out = dense_out()?;
            let desc = FillDesc {
                dtype: dt,
                ptr: out.data_ptr(),
                len: rows * cols,
                value: 0.5,
            };
            Box::new(move || {
                let _keep = &out;
                b.compute().fill(&desc).map_err(text)
            })
        }
    })
}
