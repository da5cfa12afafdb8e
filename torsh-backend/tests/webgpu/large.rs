//! Tensors larger than one storage binding: ops in pieces, views through windows, two-pass
//! reductions, cut GEMMs and convolutions, composed normalisations.

use super::*;

/// A backend, host values and an f32 tensor of them past one binding, or `None` (after saying why)
/// when the adapter's limits leave no room for one. With `lowered`, the backend binds at most that
/// many bytes (`max_binding_size`) and the tensor is 96 KiB past it; without, the adapter's own
/// binding (128 MiB on lavapipe) and 12 MiB past it.
fn larger_than_a_binding(
    lowered: Option<u64>,
) -> Option<(Backend, Vec<f32>, torsh_backend::Tensor)> {
    let probe = raw()?;
    let device = webgpu::block_on(webgpu::WebGpuDevice::from_best_adapter(0)).unwrap();
    let limits = device.limits();
    let own = limits.max_storage_buffer_binding_size;
    let binding = lowered.map_or(own, |l| l.min(own));
    let bytes = binding
        + if lowered.is_some() {
            96 << 10
        } else {
            12 << 20
        };
    if limits.max_buffer_size < bytes || binding > 1 << 30 {
        eprintln!("webgpu: the adapter's binding limit ({binding} bytes) leaves no room to test");
        return None;
    }
    drop(probe);
    let b = match lowered {
        Some(l) => with_binding(l)?,
        None => backend()?,
    };
    let n = (bytes / 4) as usize;
    let host: Vec<f32> = (0..n)
        .map(|i| ((i as f32) * 0.618_034).sin() * 2.0)
        .collect();
    let big = b.from_slice(&host, &[n]).unwrap();
    Some((b, host, big))
}

/// The values of a tensor, as f64.
pub(super) fn values(t: &torsh_backend::Tensor) -> Vec<f64> {
    t.cast(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// An f32 tensor's values in a tensor of the same shape on `reference`.
fn on_reference(reference: &Backend, t: &torsh_backend::Tensor) -> torsh_backend::Tensor {
    reference
        .from_slice(&t.to_vec::<f32>().unwrap(), t.shape())
        .unwrap()
}

/// Asserts `got` is within 1e-5 of `want` in relative error.
fn check_close(name: &str, got: &torsh_backend::Tensor, want: &torsh_backend::Tensor) {
    let e = rel_error(&values(got), &values(want));
    assert!(e <= 1e-5, "{name}: relative error {e}");
}

#[test]
fn tensors_larger_than_one_binding_run_elementwise_ops_in_pieces_and_views_through_windows() {
    let Some((b, host, big)) = larger_than_a_binding(None) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    let n = host.len();
    // Views of the host data on the reference backend, to compare with.
    let on_ref = |start: usize, shape: &[usize]| {
        let len = shape.iter().product::<usize>();
        reference
            .from_slice(&host[start..start + len], shape)
            .unwrap()
    };
    let check = check_close;
    // Dense elementwise ops over the whole tensor run in pieces that each fit a binding; fresh
    // outputs are poisoned, so a piece left unwritten shows.
    let exp = b
        .unary(UnaryOp::Exp, &big)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let want: Vec<f64> = host.iter().map(|&x| f64::from(x).exp()).collect();
    let got: Vec<f64> = exp.iter().map(|&x| f64::from(x)).collect();
    assert!(rel_error(&got, &want) <= 1e-6);
    let twice = b.binary(torsh_backend::BinaryOp::Add, &big, &big).unwrap();
    let twice = twice.to_vec::<f32>().unwrap();
    assert!(twice.iter().zip(&host).all(|(t, x)| *t == x + x));
    let halved = b
        .binary_scalar(torsh_backend::BinaryOp::Mul, &big, 0.5)
        .unwrap();
    let halved = halved.to_vec::<f32>().unwrap();
    assert!(halved.iter().zip(&host).all(|(h, x)| *h == x * 0.5));
    let halves = big.cast(DType::F16).unwrap().to_vec::<half::f16>().unwrap();
    assert!(halves
        .iter()
        .zip(&host)
        .all(|(h, x)| *h == half::f16::from_f32(*x)));
    let zeros = b.zeros(&[n], DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert!(zeros.iter().all(|&z| z == 0.0));
    drop((exp, twice, halved, halves, zeros));
    // Random fills in pieces continue the stream: element i is the reference's element i (values
    // formed in f32 here, in f64 there), across the piece boundaries.
    b.manual_seed(41);
    reference.manual_seed(41);
    check_close(
        "randn",
        &b.randn(&[n], DType::F32).unwrap(),
        &reference.randn(&[n], DType::F32).unwrap(),
    );

    // Views past the first binding's reach, at an odd element (not on a binding-offset boundary).
    let (rows, cols) = (37, 61);
    let start = n - rows * cols - 5;
    let view = big.narrow(0, start, rows * cols).unwrap();
    let matrix = view.reshape(&[rows, cols]).unwrap();
    let want_matrix = on_ref(start, &[rows, cols]);
    check(
        "exp",
        &b.unary(UnaryOp::Exp, &matrix).unwrap(),
        &reference.unary(UnaryOp::Exp, &want_matrix).unwrap(),
    );
    let other = b.randn(&[rows, cols], DType::F32).unwrap();
    let other_ref = on_reference(&reference, &other);
    check(
        "mul",
        &b.binary(torsh_backend::BinaryOp::Mul, &matrix, &other)
            .unwrap(),
        &reference
            .binary(torsh_backend::BinaryOp::Mul, &want_matrix, &other_ref)
            .unwrap(),
    );
    check(
        "matmul",
        &matrix.matmul(&other.t().unwrap()).unwrap(),
        &want_matrix.matmul(&other_ref.t().unwrap()).unwrap(),
    );
    check(
        "sum",
        &matrix.sum(0, false).unwrap(),
        &want_matrix.sum(0, false).unwrap(),
    );
    check(
        "softmax",
        &matrix.softmax(1).unwrap(),
        &want_matrix.softmax(1).unwrap(),
    );
    check(
        "layer_norm",
        &matrix.layer_norm(&[cols], None, None, 1e-5).unwrap(),
        &want_matrix.layer_norm(&[cols], None, None, 1e-5).unwrap(),
    );
    // A transposed copy and a cast (the strided copy and cast kernels).
    check(
        "contiguous",
        &matrix.t().unwrap().contiguous().unwrap(),
        &want_matrix.t().unwrap().contiguous().unwrap(),
    );
    check(
        "cast",
        &matrix.cast(DType::F16).unwrap(),
        &want_matrix.cast(DType::F16).unwrap(),
    );
    // A view at the very start and one at the very end of the buffer in one op: more than a
    // binding apart, so each is bound through a window of its own.
    let head = big.narrow(0, 0, 7).unwrap();
    let tail = big.narrow(0, n - 7, 7).unwrap();
    let far = b
        .binary(torsh_backend::BinaryOp::Add, &head, &tail)
        .unwrap();
    let want: Vec<f32> = (0..7).map(|i| host[i] + host[n - 7 + i]).collect();
    assert_eq!(far.to_vec::<f32>().unwrap(), want);

    // Writes into the large buffer through a window land where they should and nowhere else.
    let raw = b.compute();
    let len = 1000;
    let at = n - len - 3;
    let src = b.from_slice(&host[..len], &[len]).unwrap();
    let dst = big.data_ptr().offset(at * 4).unwrap();
    raw.unary(&UnaryDesc {
        op: UnaryOp::Neg,
        dtype: DType::F32,
        input: StridedBuf::contiguous(src.data_ptr(), &[len]),
        output: dst,
    })
    .unwrap();
    let after = big
        .narrow(0, at - 5, len + 8)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let mut want = host[at - 5..at + len + 3].to_vec();
    for (w, x) in want[5..5 + len].iter_mut().zip(&host[..len]) {
        *w = -x;
    }
    assert_eq!(after, want);
}

#[test]
fn ops_over_all_of_a_tensor_larger_than_one_binding_split_into_pieces_that_fit() {
    // On a binding lowered to 1 MiB: the same code paths as at the adapter's own limit (the
    // elementwise test above runs there), at a size the reference checks in full.
    let Some((b, host, big)) = larger_than_a_binding(Some(1 << 20)) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    let n = host.len();
    let check = check_close;
    // Ops made of independent rows split along them: softmax and its gradient, layer norm and a sum
    // by rows, a GEMM
    // by blocks, Adam by elements; against the reference on all of the tensor.
    let (rows_all, cols_all) = (n / 1024, 1024);
    assert_eq!(rows_all * cols_all, n);
    let all = big.reshape(&[rows_all, cols_all]).unwrap();
    let all_ref = reference.from_slice(&host, &[rows_all, cols_all]).unwrap();
    check(
        "softmax of all",
        &all.softmax(1).unwrap(),
        &all_ref.softmax(1).unwrap(),
    );
    let y_all = all.softmax(1).unwrap();
    let y_all_ref = all_ref.softmax(1).unwrap();
    check(
        "softmax_backward of all",
        &b.softmax_backward(&all, &y_all, 1).unwrap(),
        &reference.softmax_backward(&all_ref, &y_all_ref, 1).unwrap(),
    );
    drop((y_all, y_all_ref));
    let classes: Vec<i64> = (0..rows_all).map(|r| (r * 37 % cols_all) as i64).collect();
    let target = b.from_slice(&classes, &[rows_all]).unwrap();
    let target_ref = reference.from_slice(&classes, &[rows_all]).unwrap();
    let config = torsh_backend::CrossEntropyConfig::default();
    check(
        "cross_entropy of all",
        &all.cross_entropy(&target, config).unwrap(),
        &all_ref.cross_entropy(&target_ref, config).unwrap(),
    );
    let one = b.full(&[], 1.0, DType::F32).unwrap();
    let one_ref = reference.full(&[], 1.0, DType::F32).unwrap();
    check(
        "cross_entropy_backward of all",
        &b.cross_entropy_backward(&one, &all, &target, config)
            .unwrap(),
        &reference
            .cross_entropy_backward(&one_ref, &all_ref, &target_ref, config)
            .unwrap(),
    );
    check(
        "layer_norm of all",
        &all.layer_norm(&[cols_all], None, None, 1e-5).unwrap(),
        &all_ref.layer_norm(&[cols_all], None, None, 1e-5).unwrap(),
    );
    check(
        "sum of all rows",
        &all.sum(1, false).unwrap(),
        &all_ref.sum(1, false).unwrap(),
    );
    let w = b.randn(&[cols_all, 3], DType::F32).unwrap();
    let w_ref = on_reference(&reference, &w);
    check(
        "matmul of all",
        &all.matmul(&w).unwrap(),
        &all_ref.matmul(&w_ref).unwrap(),
    );
    // A column sum reads the whole tensor for every output: two passes over blocks of rows.
    check(
        "sum of all columns",
        &all.sum(0, false).unwrap(),
        &all_ref.sum(0, false).unwrap(),
    );
    // Adam updates its parameters in place: on a fresh copy, so `big` keeps the host's values.
    let step = |be: &Backend| {
        let mut params = vec![be.from_slice(&host, &[n]).unwrap()];
        let grads = [be
            .binary_scalar(torsh_backend::BinaryOp::Mul, &params[0], 0.01)
            .unwrap()];
        let mut state = torsh_backend::AdamState::adamw(0.1);
        be.fused_adam_step(&mut params, &grads, &mut state, 1e-3, (0.9, 0.999))
            .unwrap();
        params.pop().unwrap()
    };
    check("adam over all", &step(&b), &step(&reference));

    // Batched and per-image ops split by batch, image, head or channel: a GEMV, a batched GEMM,
    // conv2d, max pooling and causal attention, against the reference on all of it.
    let v = b.randn(&[cols_all], DType::F32).unwrap();
    let v_ref = on_reference(&reference, &v);
    let y = b.randn(&[rows_all], DType::F32).unwrap();
    let y_ref = on_reference(&reference, &y);
    check(
        "gemv of all",
        &all.gemv(&v, 1.0, &y, 0.5).unwrap(),
        &all_ref.gemv(&v_ref, 1.0, &y_ref, 0.5).unwrap(),
    );
    let (batch, side) = (rows_all, 32);
    let cube = big.reshape(&[batch, side, side]).unwrap();
    let cube_ref = reference.from_slice(&host, &[batch, side, side]).unwrap();
    let right = b.randn(&[batch, side, 2], DType::F32).unwrap();
    let right_ref = on_reference(&reference, &right);
    check(
        "batched matmul of all",
        &cube.matmul(&right).unwrap(),
        &cube_ref.matmul(&right_ref).unwrap(),
    );
    let images = big.reshape(&[batch, 1, side, side]).unwrap();
    let images_ref = reference
        .from_slice(&host, &[batch, 1, side, side])
        .unwrap();
    let kernel = b.randn(&[2, 1, 3, 3], DType::F32).unwrap();
    let kernel_ref = on_reference(&reference, &kernel);
    let conv = torsh_backend::ConvConfig::default();
    check(
        "conv2d of all",
        &b.conv2d(&images, &kernel, conv).unwrap(),
        &reference.conv2d(&images_ref, &kernel_ref, conv).unwrap(),
    );
    let pool = torsh_backend::Pool2dConfig {
        kernel: [2, 2],
        stride: [2, 2],
        padding: [0, 0],
        count_include_pad: true,
    };
    check(
        "max_pool2d of all",
        &b.max_pool2d(&images, pool).unwrap(),
        &reference.max_pool2d(&images_ref, pool).unwrap(),
    );
    let (pooled, indices) = images.max_pool2d_with_indices(pool).unwrap();
    let (pooled_ref, indices_ref) = images_ref.max_pool2d_with_indices(pool).unwrap();
    check("max_pool2d_with_indices of all", &pooled, &pooled_ref);
    assert_eq!(
        indices.to_vec::<i64>().unwrap(),
        indices_ref.to_vec::<i64>().unwrap()
    );
    let shape = images.shape().to_vec();
    check(
        "max_pool2d_backward of all",
        &b.max_pool2d_backward(&pooled, &indices, &shape, pool)
            .unwrap(),
        &reference
            .max_pool2d_backward(&pooled_ref, &indices_ref, &shape, pool)
            .unwrap(),
    );
    check(
        "avg_pool2d_backward of all",
        &b.avg_pool2d_backward(&pooled, &shape, pool).unwrap(),
        &reference
            .avg_pool2d_backward(&pooled_ref, &shape, pool)
            .unwrap(),
    );
    let heads = big.reshape(&[batch / 2, 2, 16, 64]).unwrap();
    let heads_ref = reference
        .from_slice(&host, &[batch / 2, 2, 16, 64])
        .unwrap();
    check(
        "attention of all",
        &b.attention(&heads, &heads, &heads, true).unwrap(),
        &reference
            .attention(&heads_ref, &heads_ref, &heads_ref, true)
            .unwrap(),
    );
}

/// A tensor-level backend whose kernels bind at most `bytes` (`max_binding_size`), so that small
/// tensors take the paths of tensors larger than a binding (windows, pieces, two passes); `None`
/// when there is no adapter.
fn with_binding(bytes: u64) -> Option<Backend> {
    raw()?;
    let config = WebGpuBackendConfig {
        max_binding_size: bytes,
        ..Default::default()
    };
    Some(Backend::from_compute(Box::new(WebGpuBackend::new(config))).unwrap())
}

/// `host` as an f32 tensor of `shape` on `be`, cast to `dtype`.
pub(super) fn dtype_tensor(
    be: &Backend,
    host: &[f32],
    shape: &[usize],
    dtype: DType,
) -> torsh_backend::Tensor {
    be.from_slice(host, shape).unwrap().cast(dtype).unwrap()
}

/// Asserts `got` matches `want` within `dtype`'s parity bound, NaN for NaN.
pub(super) fn check_dtype(
    name: &str,
    dtype: DType,
    got: &torsh_backend::Tensor,
    want: &torsh_backend::Tensor,
) {
    let cmp = validation::compare(&values(got), &values(want));
    let bound = validation::tolerance(if got.dtype() == DType::I64 {
        DType::I64
    } else {
        dtype
    });
    assert!(cmp.within(bound), "{name} ({dtype:?}): {cmp}");
}

#[test]
fn max_binding_size_below_the_smallest_supported_is_an_invalid_argument() {
    if raw().is_none() {
        return;
    }
    let mut b = WebGpuBackend::new(WebGpuBackendConfig {
        max_binding_size: webgpu::MIN_BINDING_SIZE - 4,
        ..Default::default()
    });
    let err = b.init().unwrap_err();
    assert!(
        matches!(err, BackendError::InvalidArgument { .. }),
        "{err:?}"
    );
}

#[test]
fn leading_dim_reductions_larger_than_a_binding_combine_partials_of_blocks() {
    let binding = 256 << 10;
    let Some(b) = with_binding(binding) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    // 131 × 1031: 270 KB even in f16, past the 256 KiB binding. Column 5 holds a NaN late (it must
    // win max, min and both arg-reductions), column 7 a tied maximum and minimum in two blocks (the
    // first must win).
    let (rows, cols) = (131, 1031);
    let mut host: Vec<f32> = (0..rows * cols)
        .map(|i| ((i as f32) * 0.754_877_7).sin() * 3.0 + 0.25)
        .collect();
    host[100 * cols + 5] = f32::NAN;
    for r in [3, 90] {
        host[r * cols + 7] = 9.0;
    }
    for r in [11, 120] {
        host[r * cols + 7] = -9.0;
    }
    type Reduction = fn(&torsh_backend::Tensor) -> torsh_backend::Result<torsh_backend::Tensor>;
    let reductions: [(&str, Reduction); 7] = [
        ("sum", |t| t.sum(0, false)),
        ("mean", |t| t.mean(0, false)),
        ("max", |t| t.max(0, false)),
        ("min", |t| t.min(0, false)),
        ("var", |t| t.var(0, 1, false)),
        ("argmax", |t| t.argmax(0, false)),
        ("argmin", |t| t.argmin(0, false)),
    ];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let x = dtype_tensor(&b, &host, &[rows, cols], dtype);
        let x_ref = dtype_tensor(&reference, &host, &[rows, cols], dtype);
        // The whole matrix, a view with strided rows, and a 3-D view reduced along its leading dim.
        let views = |t: &torsh_backend::Tensor| {
            [
                t.clone(),
                t.narrow(1, 3, cols - 4).unwrap(),
                t.narrow(1, 0, 1030)
                    .unwrap()
                    .reshape(&[rows, 10, 103])
                    .unwrap(),
            ]
        };
        for (view, (v, v_ref)) in views(&x).iter().zip(views(&x_ref)).enumerate() {
            for (name, reduce) in reductions {
                let name = format!("{name} of view {view}");
                check_dtype(&name, dtype, &reduce(v).unwrap(), &reduce(&v_ref).unwrap());
            }
        }
        // All of a 1-D tensor: its one output from every block.
        let flat = x.reshape(&[rows * cols]).unwrap();
        let flat_ref = x_ref.reshape(&[rows * cols]).unwrap();
        let no_nan = |t: &torsh_backend::Tensor| t.narrow(0, 101 * cols, 30 * cols).unwrap();
        check_dtype(
            "sum of all",
            dtype,
            &no_nan(&flat).sum(0, false).unwrap(),
            &no_nan(&flat_ref).sum(0, false).unwrap(),
        );
    }
    // A captured graph of two-pass reductions replays on new inputs as eager execution does, bit
    // for bit (its host combine runs inside the replay).
    let x = b.from_slice(&host, &[rows, cols]).unwrap();
    let graph = b
        .capture_graph(|| {
            Ok(vec![
                x.sum(0, false)?,
                x.var(0, 1, false)?,
                x.argmax(0, false)?,
            ])
        })
        .unwrap();
    let shifted: Vec<f32> = host.iter().map(|v| v * 0.5 - 1.0).collect();
    let fresh = b.from_slice(&shifted, &[rows, cols]).unwrap();
    let replayed = b
        .launch_graph(&graph, std::slice::from_ref(&fresh))
        .unwrap();
    let eager = [
        fresh.sum(0, false).unwrap(),
        fresh.var(0, 1, false).unwrap(),
        fresh.argmax(0, false).unwrap(),
    ];
    for (r, e) in replayed.iter().zip(&eager) {
        assert_eq!(r.to_bytes().unwrap(), e.to_bytes().unwrap());
    }
}

#[test]
fn reductions_whose_leading_indices_each_exceed_a_binding_cut_the_other_dims() {
    // On a 64 KiB binding, every index of the leading dim below is larger than the binding: along
    // the leading dim the outputs are cut into blocks of dim 1 (or, for [2, 2, 20 011], where even
    // one index of dim 1 is too large, into reductions of a rank less), along other dims each
    // leading index is a reduction of its own (in two passes where that is along its leading dim).
    let Some(b) = with_binding(64 << 10) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    type Reduction =
        fn(&torsh_backend::Tensor, isize) -> torsh_backend::Result<torsh_backend::Tensor>;
    let reductions: [(&str, Reduction); 7] = [
        ("sum", |t, d| t.sum(d, false)),
        ("mean", |t, d| t.mean(d, false)),
        ("max", |t, d| t.max(d, false)),
        ("min", |t, d| t.min(d, false)),
        ("var", |t, d| t.var(d, 1, false)),
        ("argmax", |t, d| t.argmax(d, false)),
        ("argmin", |t, d| t.argmin(d, false)),
    ];
    let shapes: [&[usize]; 3] = [&[3, 5, 4099], &[2, 20_011], &[2, 2, 20_011]];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for shape in shapes {
            let len = shape.iter().product();
            let host = wave(len, 0.6);
            let x = dtype_tensor(&b, &host, shape, dtype);
            let x_ref = dtype_tensor(&reference, &host, shape, dtype);
            for axis in 0..shape.len() {
                for (name, reduce) in reductions {
                    let name = format!("{name} of {shape:?} along {axis}");
                    let axis = axis as isize;
                    let got = reduce(&x, axis).unwrap();
                    check_dtype(&name, dtype, &got, &reduce(&x_ref, axis).unwrap());
                }
            }
        }
    }
}

#[test]
fn batch_norm_larger_than_a_binding_normalises_with_statistics_of_every_image() {
    // 37 images of 3 channels of 11 × 97 on a 256 KiB binding: 474 KB in f32, 237 KB in f16 (past
    // the binding once staged or cast to f32). And 3 rows of 12 000 channels on a 64 KiB binding:
    // blocks of one row, each channel's block a single value whose variance is 0 (its unbiased
    // variance 0 / 0), so the batch's variance is all between blocks. Channel means far from zero,
    // and images whose means differ, test the combination of moments.
    for (binding, shape) in [
        (256 << 10, vec![37, 3, 11, 97]),
        (64 << 10, vec![3, 12_000]),
    ] {
        let Some(b) = with_binding(binding) else {
            return;
        };
        let (n, c) = (shape[0], shape[1]);
        let image: usize = shape[1..].iter().product();
        let spatial = image / c;
        let host: Vec<f32> = (0..n * image)
            .map(|i| {
                let (im, ch) = (i / image, (i / spatial) % c);
                let offset = 4.0 * (ch % 3) as f32 - 2.0 + 0.5 * (im % 5) as f32;
                ((i as f32) * 0.381_966).sin() * (1.0 + (ch % 3) as f32) + offset
            })
            .collect();
        // Weight, bias, running mean and running variance (positive), per channel.
        let param = |k: usize| -> Vec<f32> {
            (0..c)
                .map(|ch| {
                    let v = ((ch * 7 + k * 13) as f32 * 0.618_034).sin();
                    if k == 3 {
                        0.5 + v.abs()
                    } else {
                        v * 1.5
                    }
                })
                .collect()
        };
        let params = [param(0), param(1), param(2), param(3)];
        let params = [&params[0][..], &params[1], &params[2], &params[3]];
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for training in [true, false] {
                let data = (&host[..], &shape[..], dtype);
                check_batch_norm(&b, "in blocks", data, params, training, 0.3);
            }
        }
    }
}

#[test]
fn native_f16_ops_are_budgeted_without_f32_copies_so_a_tensor_that_fits_runs_whole() {
    if !has_shader_f16() {
        return;
    }
    let binding = 256 << 10;
    let Some(b) = with_binding(binding) else {
        return;
    };
    let exec = webgpu::WebGpuKernelExecutor::new(&b).unwrap();
    let launches = || exec.pipeline_stats().kernel_launches;
    // 0.75 of a binding in f16: whole with shader-f16, where f32 copies would take 1.5 bindings.
    let elements = (binding as usize * 3 / 4) / 2;
    let x = b.randn(&[elements / 1024, 1024], DType::F16).unwrap();
    let before = launches();
    let y = x.softmax(1).unwrap();
    let e = x.exp().unwrap();
    assert_eq!(launches() - before, 2, "softmax and exp, one launch each");
    let reference = Backend::reference().unwrap();
    let x_ref = reference
        .from_slice(&x.to_vec::<half::f16>().unwrap(), x.shape())
        .unwrap();
    check_dtype("softmax", DType::F16, &y, &x_ref.softmax(1).unwrap());
    check_dtype("exp", DType::F16, &e, &x_ref.exp().unwrap());
}

#[test]
fn views_far_apart_in_one_allocation_are_bound_through_windows_of_their_own() {
    let Some(b) = with_binding(256 << 10) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    // One flat allocation of 1.2 MB, over four bindings of 256 KiB, as a framework keeps all its
    // parameters; each op below takes views from its far ends and its middle.
    let n = 300_000;
    let host: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.457_1).cos() * 1.5).collect();
    let run = |be: &Backend| {
        let flat = be.from_slice(&host, &[n]).unwrap();
        let a = flat
            .narrow(0, 5, 64 * 48)
            .unwrap()
            .reshape(&[64, 48])
            .unwrap();
        let w = flat
            .narrow(0, n - 48 * 32 - 9, 48 * 32)
            .unwrap()
            .reshape(&[48, 32])
            .unwrap();
        let (gamma, beta) = (
            flat.narrow(0, n / 2, 48).unwrap(),
            flat.narrow(0, n - 48, 48).unwrap(),
        );
        let product = a.matmul(&w).unwrap();
        let normed = a
            .layer_norm(&[48], Some(&gamma), Some(&beta), 1e-5)
            .unwrap();
        let row = flat
            .narrow(0, n - 2 * 48, 48)
            .unwrap()
            .reshape(&[1, 48])
            .unwrap();
        let sum = be.binary(torsh_backend::BinaryOp::Add, &a, &row).unwrap();
        // Adam on parameters at the front of the allocation with gradients at its back, in place.
        let mut params = vec![flat.narrow(0, 11, 5000).unwrap()];
        let grads = [flat.narrow(0, n - 5003, 5000).unwrap()];
        let mut state = torsh_backend::AdamState::adamw(0.01);
        be.fused_adam_step(&mut params, &grads, &mut state, 1e-3, (0.9, 0.999))
            .unwrap();
        [product, normed, sum, flat.narrow(0, 0, 5100).unwrap()]
    };
    let (got, want) = (run(&b), run(&reference));
    for (name, (g, w)) in ["matmul", "layer_norm", "add", "adam"]
        .iter()
        .zip(got.iter().zip(&want))
    {
        check_close(name, g, w);
    }
}

/// `len` values of a fixed pseudo-random sequence in about [-2, 2], none zero in practice.
pub(super) fn wave(len: usize, phase: f32) -> Vec<f32> {
    (0..len)
        .map(|i| ((i as f32) * 0.734_271 + phase).sin() * 2.0 + 0.01)
        .collect()
}

#[test]
fn gemms_whose_operands_each_exceed_a_binding_cut_rows_columns_and_the_inner_dim() {
    // On a 64 KiB binding, A (131 × 257 stored, plus 3 rows of gap) and B (257 × 199, plus 2) are
    // each larger than a binding even in f16, so whichever way they are transposed no block of C
    // alone narrows both: A untransposed and B transposed only narrow along the inner dim. C is a
    // strided block (ldc = m + 5) with beta 0.5, so the 16-bit path's cast of C into f32 and its
    // rounding back through a dense scratch both run.
    let Some(b) = with_binding(64 << 10) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    let (m, n, k) = (131, 199, 257);
    let transposes = [Transpose::No, Transpose::Yes];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (trans_a, trans_b) in transposes
            .iter()
            .flat_map(|&a| transposes.iter().map(move |&b| (a, b)))
        {
            let stored = |t: Transpose, rows: usize, cols: usize| match t {
                Transpose::No => (rows, cols),
                Transpose::Yes => (cols, rows),
            };
            let ((ar, ac), (br, bc)) = (stored(trans_a, m, k), stored(trans_b, k, n));
            let (lda, ldb, ldc) = (ar + 3, br + 2, m + 5);
            let run = |be: &Backend| {
                let a = dtype_tensor(be, &wave(lda * ac, 0.1), &[lda * ac], dtype);
                let bm = dtype_tensor(be, &wave(ldb * bc, 0.7), &[ldb * bc], dtype);
                let c = dtype_tensor(be, &wave(ldc * n, 1.3), &[ldc * n], dtype);
                be.compute()
                    .gemm(&GemmDesc {
                        dtype,
                        trans_a,
                        trans_b,
                        m,
                        n,
                        k,
                        alpha: 1.25,
                        a: a.data_ptr(),
                        lda,
                        b: bm.data_ptr(),
                        ldb,
                        beta: 0.5,
                        c: c.data_ptr(),
                        ldc,
                    })
                    .unwrap();
                c
            };
            let name = format!("gemm {trans_a:?} {trans_b:?}");
            check_dtype(&name, dtype, &run(&b), &run(&reference));
        }
    }
}

#[test]
fn a_16_bit_gemm_cut_along_its_inner_dim_rounds_once_from_f32() {
    // A (8 × 4096, ones) and op(B) (4096 × 8) are each 64 KiB in bf16, past a 64 KiB binding once
    // widened to f32, and only cuts of the inner dim narrow them. Each column of op(B) holds 256,
    // then 4095 values of 1.5 · 2⁻¹²: the exact sum, 257.4996, rounds to 258 in bf16 (its spacing at
    // 256 is 2), while any cut that rounded C after each inner range would add less than 1 to 256 each
    // time and stay at 256.
    let Some(b) = with_binding(64 << 10) else {
        return;
    };
    let (m, n, k) = (8, 8, 4096);
    let ones = vec![1.0f32; m * k];
    let mut column = vec![1.5 * 2f32.powi(-12); k];
    column[0] = 256.0;
    let b_host: Vec<f32> = (0..n).flat_map(|_| column.clone()).collect();
    let a = dtype_tensor(&b, &ones, &[m * k], DType::BF16);
    // B stored n × k column-major (ldb = n): element (j, p) at j + p·n, op(B) = Bᵀ.
    let b_stored: Vec<f32> = (0..k)
        .flat_map(|p| (0..n).map(move |j| (p, j)))
        .map(|(p, j)| b_host[j * k + p])
        .collect();
    let bm = dtype_tensor(&b, &b_stored, &[n * k], DType::BF16);
    let c = b.zeros(&[m * n], DType::BF16).unwrap();
    b.compute()
        .gemm(&GemmDesc {
            dtype: DType::BF16,
            trans_a: Transpose::No,
            trans_b: Transpose::Yes,
            m,
            n,
            k,
            alpha: 1.0,
            a: a.data_ptr(),
            lda: m,
            b: bm.data_ptr(),
            ldb: n,
            beta: 0.0,
            c: c.data_ptr(),
            ldc: m,
        })
        .unwrap();
    let got = c.cast(DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert!(got.iter().all(|&v| v == 258.0), "{got:?}");
}

#[test]
fn gemvs_and_batched_gemms_past_a_binding_in_any_direction_run_as_cut_gemms() {
    // On a 64 KiB binding: GEMVs over rows of 20 011 values (80 KB each, so no block of rows fits)
    // and over an untransposed view (rows do not narrow it), and a batched GEMM whose every product
    // is larger than a binding; against the reference, in every float dtype the kernels take.
    let Some(b) = with_binding(64 << 10) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let tensor = |be: &Backend, shape: &[usize], phase: f32| {
            let len = shape.iter().product();
            dtype_tensor(be, &wave(len, phase), shape, dtype)
        };
        let run = |be: &Backend| {
            let long_rows = tensor(be, &[3, 20_011], 0.2);
            let x = tensor(be, &[20_011], 0.9);
            let y = tensor(be, &[3], 1.7);
            let tall = tensor(be, &[173, 211], 0.4).t().unwrap();
            let (x2, y2) = (tensor(be, &[173], 2.1), tensor(be, &[211], 2.9));
            let left = tensor(be, &[2, 131, 257], 0.5);
            let right = tensor(be, &[2, 257, 199], 1.1);
            [
                long_rows.gemv(&x, 1.5, &y, 0.5).unwrap(),
                tall.gemv(&x2, -0.75, &y2, 2.0).unwrap(),
                left.matmul(&right).unwrap(),
            ]
        };
        let names = ["gemv of long rows", "gemv of a transposed view", "batched"];
        for ((name, got), want) in names.iter().zip(run(&b)).zip(run(&reference)) {
            check_dtype(name, dtype, &got, &want);
        }
    }
}

#[test]
fn convolutions_of_images_larger_than_a_binding_cut_groups_and_channels() {
    // On a 64 KiB binding every image below is larger than a binding (even in f16), so the cut by
    // image cannot fit and each image is cut by channels: a dense convolution by blocks of output
    // and input channels (its partial sums accumulated in f32, the bias added once), a grouped one
    // by blocks of whole groups, a depthwise one likewise; with stride, padding and dilation.
    let Some(b) = with_binding(64 << 10) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    let dense = torsh_backend::ConvConfig {
        stride: [2, 1],
        padding: [1, 2],
        dilation: [1, 2],
        groups: 1,
    };
    let grouped = torsh_backend::ConvConfig {
        padding: [1, 1],
        groups: 3,
        ..Default::default()
    };
    let depthwise = torsh_backend::ConvConfig {
        padding: [1, 1],
        groups: 16,
        ..Default::default()
    };
    let cases: [(&str, [usize; 4], [usize; 4], _); 3] = [
        ("dense", [2, 13, 53, 61], [11, 13, 3, 3], dense),
        ("grouped", [1, 12, 53, 61], [6, 4, 3, 3], grouped),
        ("depthwise", [1, 16, 53, 61], [16, 1, 3, 3], depthwise),
    ];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (name, input, weight, config) in cases {
            let run = |be: &Backend| {
                let x = dtype_tensor(be, &wave(input.iter().product(), 0.3), &input, dtype);
                let w = dtype_tensor(be, &wave(weight.iter().product(), 1.9), &weight, dtype);
                let bias = dtype_tensor(be, &wave(weight[0], 2.6), &[weight[0]], dtype);
                be.conv2d_with_bias(&x, &w, Some(&bias), config).unwrap()
            };
            check_dtype(name, dtype, &run(&b), &run(&reference));
        }
    }
    // One channel of one image larger than a binding (200 × 100 f32): no cut fits, the typed error.
    let plane = b.randn(&[1, 1, 200, 100], DType::F32).unwrap();
    let w = b.randn(&[1, 1, 3, 3], DType::F32).unwrap();
    let err = b
        .conv2d(&plane, &w, torsh_backend::ConvConfig::default())
        .unwrap_err();
    assert!(
        matches!(err, BackendError::FeatureUnavailable { .. }),
        "{err:?}"
    );
}

#[test]
fn elementwise_ops_copies_and_casts_whose_leading_indices_each_exceed_a_binding() {
    // On a 64 KiB binding: a unary op, a copy and casts of transposed views whose every row spans
    // 160 KB or more (the copy cut into tiles of both views' widest dims, the others run on such a
    // dense copy), and broadcasting binary ops whose output rows are 80 KB each, each leading index
    // of which runs as an op of one rank less; so no block of leading indices fits any of them.
    let Some(b) = with_binding(64 << 10) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    use torsh_backend::BinaryOp;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let run = |be: &Backend| {
            let tall = dtype_tensor(be, &wave(2 * 20_011, 0.8), &[20_011, 2], dtype);
            let wide = dtype_tensor(be, &wave(3 * 20_011, 1.4), &[3, 20_011], dtype);
            let row = dtype_tensor(be, &wave(20_011, 2.2), &[1, 20_011], dtype);
            let column = dtype_tensor(be, &wave(3, 3.1), &[3, 1], dtype);
            [
                be.unary(UnaryOp::Exp, &tall.t().unwrap()).unwrap(),
                be.binary(BinaryOp::Add, &wide, &row).unwrap(),
                be.binary(BinaryOp::Mul, &column, &wide).unwrap(),
                be.binary(
                    BinaryOp::Sub,
                    &tall.t().unwrap(),
                    &column.narrow(0, 0, 2).unwrap(),
                )
                .unwrap(),
                be.binary_scalar(BinaryOp::Div, &tall.t().unwrap(), -0.3)
                    .unwrap(),
                tall.t().unwrap().contiguous().unwrap(),
                tall.t().unwrap().cast(DType::F32).unwrap(),
                wide.t().unwrap().cast(DType::BF16).unwrap(),
            ]
        };
        let names = [
            "exp of a transposed view",
            "add a row",
            "mul by a column",
            "sub",
            "div by a scalar",
            "copy of a transposed view",
            "cast of a transposed view",
            "cast of another",
        ];
        for ((name, got), want) in names.iter().zip(run(&b)).zip(run(&reference)) {
            check_dtype(name, dtype, &got, &want);
        }
    }
}

#[test]
fn normalisations_whose_single_slice_exceeds_a_binding_are_composed_or_cut_by_channels() {
    // On a 64 KiB binding: softmax and log-softmax and their gradients of rows of 20 011 values
    // (80 KB each) and over the 7 channels of [2, 7, 3 001] (84 KB per outer slice), layer norm of such rows with weight
    // and bias, each composed of reductions and elementwise ops in f32; batch norm of images of
    // 82 KB (by blocks of channels, copied out of every image in training) and of one channel of
    // 80 KB in inference (by ranges of positions); against the reference in f32, f16 and bf16.
    let Some(b) = with_binding(64 << 10) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let run = |be: &Backend| {
            let rows = dtype_tensor(be, &wave(2 * 20_011, 0.35), &[2, 20_011], dtype);
            // Logits masked with -inf, as attention masks do: their probabilities are 0.
            let mut masked_host = wave(2 * 20_011, 0.35);
            for i in [5, 9_000, 20_011 + 7] {
                masked_host[i] = f32::NEG_INFINITY;
            }
            let masked = dtype_tensor(be, &masked_host, &[2, 20_011], dtype);
            let channels = dtype_tensor(be, &wave(2 * 7 * 3001, 1.05), &[2, 7, 3001], dtype);
            let weight = dtype_tensor(be, &wave(20_011, 2.45), &[20_011], dtype);
            let bias = dtype_tensor(be, &wave(20_011, 0.15), &[20_011], dtype);
            let grad_rows = dtype_tensor(be, &wave(2 * 20_011, 1.3), &[2, 20_011], dtype);
            let grad_channels = dtype_tensor(be, &wave(2 * 7 * 3001, 0.6), &[2, 7, 3001], dtype);
            let (y, log_y) = (masked.softmax(1).unwrap(), masked.log_softmax(1).unwrap());
            let y_channels = channels.softmax(1).unwrap();
            let log_y_channels = channels.log_softmax(1).unwrap();
            [
                be.softmax_backward(&grad_rows, &y, 1).unwrap(),
                be.log_softmax_backward(&grad_rows, &log_y, 1).unwrap(),
                be.softmax_backward(&grad_channels, &y_channels, 1).unwrap(),
                be.log_softmax_backward(&grad_channels, &log_y_channels, 1)
                    .unwrap(),
                y,
                log_y,
                y_channels,
                log_y_channels,
                rows.layer_norm(&[20_011], Some(&weight), Some(&bias), 1e-5)
                    .unwrap(),
            ]
        };
        let names = [
            "softmax_backward of masked rows",
            "log_softmax_backward of masked rows",
            "softmax_backward over channels",
            "log_softmax_backward over channels",
            "softmax of masked rows",
            "log_softmax of masked rows",
            "softmax over channels",
            "log_softmax over channels",
            "layer_norm of rows",
        ];
        for ((name, got), want) in names.iter().zip(run(&b)).zip(run(&reference)) {
            check_dtype(name, dtype, &got, &want);
        }
        for (shape, trainings) in [
            (vec![2, 5, 4099], &[true, false][..]),
            (vec![2, 1, 20_011], &[false][..]),
        ] {
            let (c, len) = (shape[1], shape.iter().product());
            let host: Vec<f32> = wave(len, 0.45)
                .iter()
                .enumerate()
                .map(|(i, v)| v + (i / (len / shape[0])) as f32)
                .collect();
            let param = |k: usize| -> Vec<f32> {
                wave(c, k as f32)
                    .iter()
                    .map(|v| if k == 3 { 0.5 + v.abs() } else { *v })
                    .collect()
            };
            let params = [param(0), param(1), param(2), param(3)];
            let params = [&params[0][..], &params[1], &params[2], &params[3]];
            for &training in trainings {
                let data = (&host[..], &shape[..], dtype);
                check_batch_norm(&b, "of large images", data, params, training, 0.3);
            }
        }
    }
    // Training without running statistics, in two passes over blocks of images ([6, 3, 4099]:
    // each image fits) and by blocks of channels ([2, 5, 4099]); and, with one channel of one
    // image larger than a binding, the typed error.
    let no_stats = torsh_backend::BatchNormConfig {
        weight: None,
        bias: None,
        running_mean: None,
        running_var: None,
        training: true,
        momentum: None,
        eps: None,
    };
    for shape in [[6, 3, 4099], [2, 5, 4099]] {
        let host = wave(shape.iter().product(), 0.85);
        let x = b.from_slice(&host, &shape).unwrap();
        let x_ref = reference.from_slice(&host, &shape).unwrap();
        check_close(
            "batch_norm without running statistics",
            &x.batch_norm(no_stats).unwrap(),
            &x_ref.batch_norm(no_stats).unwrap(),
        );
    }
    let x = b.randn(&[2, 1, 20_011], DType::F32).unwrap();
    let err = x.batch_norm(no_stats).unwrap_err();
    assert!(
        matches!(err, BackendError::FeatureUnavailable { .. }),
        "{err:?}"
    );
}

#[test]
fn norm_gradients_past_a_binding_run_by_rows_or_images_and_statistics_are_written() {
    // Bindings of 64 KiB: a [64, 512] f32 tensor (128 KiB) is past one. The forwards cut it and
    // save every row's and channel's statistics; layer norm's gradients run by pieces of rows,
    // batch norm's by pieces of images.
    let Some(b) = with_binding(webgpu::MIN_BINDING_SIZE) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    let host = wave(64 * 512, 0.3);
    let x = b.from_slice(&host, &[64, 512]).unwrap();
    let saved = x.layer_norm_with_stats(&[512], None, None, 1e-5).unwrap();
    let want = on_reference(&reference, &x)
        .layer_norm_with_stats(&[512], None, None, 1e-5)
        .unwrap();
    check_close("layer_norm mean", &saved.mean, &want.mean);
    check_close("layer_norm invstd", &saved.invstd, &want.invstd);
    let images = x.reshape(&[64, 4, 128]).unwrap();
    let bn = images
        .batch_norm_with_stats(torsh_backend::BatchNormConfig {
            training: true,
            ..Default::default()
        })
        .unwrap();
    let want = on_reference(&reference, &images)
        .batch_norm_with_stats(torsh_backend::BatchNormConfig {
            training: true,
            ..Default::default()
        })
        .unwrap();
    check_close("batch_norm mean", &bn.mean, &want.mean);
    check_close("batch_norm invstd", &bn.invstd, &want.invstd);
    // Layer norm's gradients by pieces of rows, the weight and bias gradients of every piece
    // added up.
    let grad = b.from_slice(&wave(64 * 512, 1.7), &[64, 512]).unwrap();
    let weight = b.from_slice(&wave(512, 0.9), &[512]).unwrap();
    let got = b
        .layer_norm_backward(&grad, &x, &[512], Some(&weight), &saved.mean, &saved.invstd)
        .unwrap();
    let x_ref = on_reference(&reference, &x);
    let stats = x_ref
        .layer_norm_with_stats(&[512], None, None, 1e-5)
        .unwrap();
    let want = reference
        .layer_norm_backward(
            &on_reference(&reference, &grad),
            &x_ref,
            &[512],
            Some(&on_reference(&reference, &weight)),
            &stats.mean,
            &stats.invstd,
        )
        .unwrap();
    check_close("layer_norm_backward input", &got.input, &want.input);
    check_close("layer_norm_backward weight", &got.weight, &want.weight);
    check_close("layer_norm_backward bias", &got.bias, &want.bias);
    // Batch norm's by pieces of images: each piece's per-channel sums added into the batch's
    // totals, then each piece's input gradient from them; training (the batch's statistics) and
    // fixed statistics, with and without a weight, in f32, native f16 and staged bf16.
    let dy_host = wave(64 * 512, 1.3);
    let w_host = wave(4, 0.4);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (training, with_weight) in [(true, true), (true, false), (false, true)] {
            let run = |be: &Backend| {
                let x = dtype_tensor(be, &host, &[64, 4, 128], dtype);
                let dy = dtype_tensor(be, &dy_host, &[64, 4, 128], dtype);
                let w = with_weight.then(|| dtype_tensor(be, &w_host, &[4], dtype));
                let stats = x
                    .batch_norm_with_stats(torsh_backend::BatchNormConfig {
                        training: true,
                        ..Default::default()
                    })
                    .unwrap();
                let g = be
                    .batch_norm_backward(&dy, &x, w.as_ref(), &stats.mean, &stats.invstd, training)
                    .unwrap();
                [g.input, g.weight, g.bias]
            };
            let (got, want) = (run(&b), run(&reference));
            for (what, (g, w)) in ["input", "weight", "bias"]
                .iter()
                .zip(got.iter().zip(&want))
            {
                let name = format!("batch_norm_backward {what}, training {training}");
                check_dtype(&name, dtype, g, w);
            }
        }
    }
    // One image past a binding has no cut: the typed error.
    let big = b.from_slice(&wave(20_000, 0.2), &[1, 1, 20_000]).unwrap();
    let mean = b.from_slice(&[0.1f32], &[1]).unwrap();
    let err = b
        .batch_norm_backward(&big, &big, None, &mean, &mean, true)
        .unwrap_err();
    assert!(
        matches!(err, BackendError::FeatureUnavailable { .. }),
        "{err:?}"
    );
}

#[test]
fn attention_past_a_binding_saves_every_log_sum_exp_and_runs_its_gradients_by_heads() {
    // Bindings of 64 KiB: Q, K and V of [4, 2, 64, 64] f32 (128 KiB each) are past one. The
    // forward runs (batch, head) pieces, each writing its rows' log-sum-exps; the gradients run by
    // (batch, head) pieces too, causal with seq_q ≠ seq_kv. One head past a binding has no cut: the
    // typed error.
    let Some(b) = with_binding(webgpu::MIN_BINDING_SIZE) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    for (seq_q, seq_kv) in [(64, 64), (48, 80)] {
        let tensor = |be: &Backend, seq: usize, phase: f32| {
            let host: Vec<f32> = wave(4 * 2 * seq * 64, phase)
                .iter()
                .map(|x| x * 0.3)
                .collect();
            be.from_slice(&host, &[4, 2, seq, 64]).unwrap()
        };
        let run = |be: &Backend| {
            let (q, k, v) = (
                tensor(be, seq_q, 0.1),
                tensor(be, seq_kv, 0.2),
                tensor(be, seq_kv, 0.3),
            );
            let g = tensor(be, seq_q, 0.7);
            let fwd = be.attention_with_lse(&q, &k, &v, true, 0.125).unwrap();
            let grads = be
                .attention_backward(&g, &q, &k, &v, &fwd.output, &fwd.lse, true, 0.125)
                .unwrap();
            [fwd.output, fwd.lse, grads.q, grads.k, grads.v]
        };
        let (got, want) = (run(&b), run(&reference));
        for (what, (g, w)) in ["output", "lse", "dq", "dk", "dv"]
            .iter()
            .zip(got.iter().zip(&want))
        {
            check_close(&format!("attention {what} ({seq_q}, {seq_kv})"), g, w);
        }
    }
    let head = |seq: usize| b.randn(&[1, 1, seq, 64], DType::F32).unwrap();
    let (q, k) = (head(300), head(300));
    let fwd = b.attention_with_lse(&q, &k, &k, false, 0.125);
    let err = match fwd {
        Ok(f) => b
            .attention_backward(&q, &q, &k, &k, &f.output, &f.lse, false, 0.125)
            .unwrap_err(),
        Err(e) => e,
    };
    assert!(
        matches!(err, BackendError::FeatureUnavailable { .. }),
        "{err:?}"
    );
}

#[test]
fn conv_gradients_past_a_binding_run_by_images_and_sum_the_weight_gradient() {
    // On a 64 KiB binding each batch below (its input and output gradient) is past a binding while
    // each image fits: the input gradient and the transposed convolution run by pieces of images,
    // the weight gradient sums its pieces' gradients; dense with stride, padding and dilation, and
    // grouped. An image larger than a binding has no cut: the typed error.
    let Some(b) = with_binding(64 << 10) else {
        return;
    };
    let reference = Backend::reference().unwrap();
    let dense = torsh_backend::ConvConfig {
        stride: [2, 1],
        padding: [1, 2],
        dilation: [1, 2],
        groups: 1,
    };
    let grouped = torsh_backend::ConvConfig {
        padding: [1, 1],
        groups: 2,
        ..Default::default()
    };
    let cases: [(&str, [usize; 4], [usize; 4], _); 2] = [
        ("dense", [7, 5, 31, 37], [6, 5, 3, 3], dense),
        ("grouped", [5, 4, 41, 43], [6, 2, 3, 3], grouped),
    ];
    for dtype in [DType::F32, DType::F16] {
        for (name, input, weight, config) in cases {
            let out: [usize; 4] = {
                let x = reference.zeros(&input, DType::F32).unwrap();
                let w = reference.zeros(&weight, DType::F32).unwrap();
                reference
                    .conv2d(&x, &w, config)
                    .unwrap()
                    .shape()
                    .try_into()
                    .unwrap()
            };
            let bytes = |s: [usize; 4]| s.iter().product::<usize>() * 4;
            assert!(bytes(input) > 64 << 10 && bytes(out) > 64 << 10, "{name}");
            let transpose = torsh_backend::ConvTransposeConfig {
                stride: config.stride,
                padding: config.padding,
                output_padding: [0, 0],
                dilation: config.dilation,
                groups: config.groups,
            };
            let run = |be: &Backend| {
                let x = dtype_tensor(be, &wave(input.iter().product(), 0.3), &input, dtype);
                let w = dtype_tensor(be, &wave(weight.iter().product(), 1.9), &weight, dtype);
                let g = dtype_tensor(be, &wave(out.iter().product(), 0.7), &out, dtype);
                let bias = dtype_tensor(be, &wave(input[1], 2.6), &[input[1]], dtype);
                [
                    be.conv2d_backward_input(&g, &w, &input, config).unwrap(),
                    be.conv2d_backward_weight(&g, &x, &weight, config).unwrap(),
                    be.conv_transpose2d(&g, &w, Some(&bias), transpose).unwrap(),
                ]
            };
            let (got, want) = (run(&b), run(&reference));
            for (what, (g, w)) in ["input", "weight", "transpose"]
                .iter()
                .zip(got.iter().zip(&want))
            {
                check_dtype(&format!("{name} {what}"), dtype, g, w);
            }
        }
    }
    let plane = b.randn(&[1, 1, 200, 100], DType::F32).unwrap();
    let w = b.randn(&[1, 1, 3, 3], DType::F32).unwrap();
    let config = torsh_backend::ConvConfig::default();
    let g = b.randn(&[1, 1, 198, 98], DType::F32).unwrap();
    for err in [
        b.conv2d_backward_input(&g, &w, &[1, 1, 200, 100], config)
            .unwrap_err(),
        b.conv2d_backward_weight(&g, &plane, &[1, 1, 3, 3], config)
            .unwrap_err(),
    ] {
        assert!(
            matches!(err, BackendError::FeatureUnavailable { .. }),
            "{err:?}"
        );
    }
}
