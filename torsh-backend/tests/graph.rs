//! Graph capture and replay (`runtime/graph/`) on every available backend: a replay on new inputs is
//! bitwise equal to running the same ops eagerly on them, in-place updates reach the tensors passed,
//! bad inputs and calls a graph cannot repeat are refused with typed errors, and a graph's memory goes
//! back when it is dropped.

use torsh_backend::prelude::*;
use torsh_backend::Graph;

mod common;
use common::backends;

/// The raw bytes of each tensor, for bitwise comparison.
fn bytes(ts: &[Tensor]) -> Vec<Vec<u8>> {
    ts.iter().map(|t| t.to_bytes().unwrap()).collect()
}

/// Fresh random tensors of these shapes, drawn outside any capture.
fn randoms(b: &Backend, shapes: &[&[usize]]) -> Vec<Tensor> {
    shapes
        .iter()
        .map(|s| b.randn(s, DType::F32).unwrap())
        .collect()
}

#[test]
fn seed_graph_snippet() -> Result<()> {
    let backend = Backend::new(BackendType::Auto)?;
    let a = backend.randn(&[16, 32], DType::F32)?;
    let b = backend.randn(&[32, 8], DType::F32)?;
    let c = backend.randn(&[8, 4], DType::F32)?;
    let graph = backend.capture_graph(|| {
        let x = backend.matmul(&a, &b)?;
        let y = backend.relu(&x)?;
        backend.matmul(&y, &c)
    })?;
    let inputs = vec![
        backend.randn(&[16, 32], DType::F32)?,
        backend.randn(&[32, 8], DType::F32)?,
        backend.randn(&[8, 4], DType::F32)?,
    ];
    let result = backend.launch_graph(&graph, &inputs)?;
    let eager = inputs[0].matmul(&inputs[1])?.relu()?.matmul(&inputs[2])?;
    assert_eq!(bytes(&result), bytes(&[eager]));
    Ok(())
}

/// Inputs for [`many_ops`], in the order its ops first use them: `[7, 13]`, a `[13, 5]` column-major
/// view (a transposed `[5, 13]`), `[5]` (a broadcast bias), `[2, 3, 9, 9]`, `[4, 3, 3, 3]`, `[3]`
/// (batch-norm statistics) and `[1, 2, 11, 8]` (q, k and v).
fn many_inputs(b: &Backend) -> Vec<Tensor> {
    let shapes: [&[usize]; 7] = [
        &[7, 13],
        &[5, 13],
        &[5],
        &[2, 3, 9, 9],
        &[4, 3, 3, 3],
        &[3],
        &[1, 2, 11, 8],
    ];
    let mut x = randoms(b, &shapes);
    x[1] = x[1].t().unwrap();
    x
}

/// A closure touching every op family, with strided, broadcast and odd-sized operands.
fn many_ops(b: &Backend, x: &[Tensor]) -> Result<Vec<Tensor>> {
    let h = b.matmul(&x[0], &x[1])?.add(&x[2])?.mul_scalar(0.5)?;
    let h = b.layer_norm(&h, &[5], None, None, 1e-5)?.gelu()?;
    let s = b.softmax(&h, -1)?;
    let r = b.sum(&s.exp()?, 0, false)?;
    let conv = b.conv2d(
        &x[3],
        &x[4],
        ConvConfig {
            padding: [1, 1],
            stride: [2, 1],
            ..ConvConfig::default()
        },
    )?;
    let pooled = b.max_pool2d(&conv.relu()?, Pool2dConfig::new([2, 2]))?;
    let bn = b.batch_norm_with(
        &x[3],
        BatchNormConfig {
            weight: None,
            bias: None,
            running_mean: Some(&x[5]),
            running_var: Some(&x[5].abs()?.add_scalar(1.0)?),
            training: false,
            momentum: None,
            eps: None,
        },
    )?;
    let att = b.attention(&x[6], &x[6].mul_scalar(0.3)?, &x[6].neg()?, true)?;
    let v = b.gemv(
        &x[0],
        &x[1].narrow(1, 0, 1)?.squeeze(1)?.tanh()?,
        1.5,
        &b.zeros(&[7], DType::F32)?,
        0.0,
    )?;
    Ok(vec![r, pooled, bn.mean_all()?, att, v, h.transpose(0, 1)?])
}

#[test]
fn replay_is_bitwise_equal_to_eager_for_every_op_family() {
    for b in backends() {
        let kind = b.backend_type();
        eprintln!("backend: {kind}");
        let captured = many_inputs(&b);
        let graph = b.capture_graph(|| many_ops(&b, &captured)).unwrap();
        let specs: Vec<_> = captured
            .iter()
            .map(|t| (t.shape().to_vec(), t.dtype()))
            .collect();
        assert_eq!(
            graph.input_specs(),
            specs,
            "{kind}: inputs in order of first use"
        );
        assert!(graph.updated_inputs().is_empty(), "{kind}");
        for launch in 0..2 {
            let inputs = many_inputs(&b);
            let replayed = b.launch_graph(&graph, &inputs).unwrap();
            let eager = many_ops(&b, &inputs).unwrap();
            assert_eq!(replayed.len(), eager.len());
            for (i, (r, e)) in replayed.iter().zip(&eager).enumerate() {
                assert_eq!(r.shape(), e.shape(), "{kind}: output {i}");
                assert_eq!(
                    r.to_vec::<f32>().unwrap(),
                    e.to_vec::<f32>().unwrap(),
                    "{kind}: launch {launch}, output {i} differs from eager"
                );
                assert_eq!(
                    bytes(std::slice::from_ref(r)),
                    bytes(&[e.contiguous().unwrap()]),
                    "{kind}: output {i} bits"
                );
            }
        }
    }
}

#[test]
fn replay_takes_inputs_of_other_layouts() {
    for b in backends() {
        let kind = b.backend_type();
        let a = b.randn(&[6, 4], DType::F32).unwrap();
        let graph = b.capture_graph(|| a.sigmoid()?.add(&a)).unwrap();
        // A transposed view of the right shape: copied into the graph's input element by element.
        let other = b.randn(&[4, 6], DType::F32).unwrap().t().unwrap();
        let out = b
            .launch_graph(&graph, std::slice::from_ref(&other))
            .unwrap();
        let eager = other.sigmoid().unwrap().add(&other).unwrap();
        assert_eq!(
            out[0].to_vec::<f32>().unwrap(),
            eager.to_vec::<f32>().unwrap(),
            "{kind}"
        );
    }
}

#[test]
fn in_place_updates_reach_the_tensors_passed() {
    for b in backends() {
        let kind = b.backend_type();
        eprintln!("backend: {kind}");
        // One warm-up step so the moments exist before the capture; the captured step is step 2.
        let setup = |seed: u64| {
            b.manual_seed(seed);
            let mut p = vec![b.randn(&[37], DType::F32).unwrap()];
            let g = vec![b.randn(&[37], DType::F32).unwrap()];
            let mut state = AdamState::adamw(0.01);
            b.fused_adam_step(&mut p, &g, &mut state, 1e-2, (0.9, 0.999))
                .unwrap();
            (p, g, state)
        };
        let (mut p, g, mut state) = setup(1);
        let graph = b
            .capture_graph(|| b.fused_adam_step(&mut p, &g, &mut state, 1e-2, (0.9, 0.999)))
            .unwrap();
        assert_eq!(
            graph.input_specs().len(),
            4,
            "{kind}: params, grads and two moments"
        );
        assert_eq!(graph.updated_inputs(), vec![0, 2, 3], "{kind}");

        // Replay on another parameter set with the same history, against the eager step 2.
        let (p2, g2, s2) = setup(2);
        let inputs = [
            p2[0].clone(),
            g2[0].clone(),
            s2.exp_avg()[0].clone(),
            s2.exp_avg_sq()[0].clone(),
        ];
        let before = bytes(&inputs);
        let (mut pe, ge, mut se) = setup(2);
        b.fused_adam_step(&mut pe, &ge, &mut se, 1e-2, (0.9, 0.999))
            .unwrap();
        let outputs = b.launch_graph(&graph, &inputs).unwrap();
        assert!(outputs.is_empty());
        assert_ne!(bytes(&inputs), before, "{kind}: the parameters moved");
        let eager = [
            pe[0].clone(),
            ge[0].clone(),
            se.exp_avg()[0].clone(),
            se.exp_avg_sq()[0].clone(),
        ];
        assert_eq!(
            bytes(&inputs),
            bytes(&eager),
            "{kind}: replayed step equals the eager one"
        );
    }
}

#[test]
fn an_input_returned_as_output_is_replaced_by_the_new_input() {
    for b in backends() {
        let kind = b.backend_type();
        let a = b.randn(&[3, 5], DType::F32).unwrap();
        let graph = b.capture_graph(|| Ok((a.clone(), a.exp()?))).unwrap();
        let x = b.randn(&[3, 5], DType::F32).unwrap();
        let out = b.launch_graph(&graph, std::slice::from_ref(&x)).unwrap();
        assert_eq!(bytes(&out[..1]), bytes(std::slice::from_ref(&x)), "{kind}");
        assert_eq!(bytes(&out[1..]), bytes(&[x.exp().unwrap()]), "{kind}");
    }
}

#[test]
fn bad_inputs_are_rejected() {
    for b in backends() {
        let kind = b.backend_type();
        let (x, y) = (
            b.randn(&[4, 3], DType::F32).unwrap(),
            b.randn(&[3], DType::F32).unwrap(),
        );
        let graph = b.capture_graph(|| x.add(&y)).unwrap();
        assert_eq!(
            graph.input_specs(),
            vec![(vec![4, 3], DType::F32), (vec![3], DType::F32)]
        );
        let err = |inputs: &[Tensor]| b.launch_graph(&graph, inputs).unwrap_err();
        assert!(
            matches!(
                err(std::slice::from_ref(&x)),
                BackendError::InvalidArgument { .. }
            ),
            "{kind}"
        );
        assert!(
            matches!(
                err(&[x.clone(), b.randn(&[4], DType::F32).unwrap()]),
                BackendError::ShapeMismatch { .. }
            ),
            "{kind}"
        );
        let e = err(&[x.clone(), b.zeros(&[3], DType::F64).unwrap()]);
        assert!(
            matches!(e, BackendError::DTypeMismatch { .. }),
            "{kind}: {e}"
        );
        let elsewhere = Backend::reference().unwrap();
        let foreign = elsewhere.randn(&[3], DType::F32).unwrap();
        assert!(
            matches!(
                err(&[x.clone(), foreign]),
                BackendError::DeviceMismatch { .. }
            ),
            "{kind}"
        );
        let other = Backend::new(kind).unwrap();
        let (ox, oy) = (
            other.randn(&[4, 3], DType::F32).unwrap(),
            other.randn(&[3], DType::F32).unwrap(),
        );
        assert!(
            matches!(
                other.launch_graph(&graph, &[ox, oy]),
                Err(BackendError::GraphCapture { .. })
            ),
            "{kind}: a graph of another backend instance"
        );
        // The good call still works after the refusals.
        assert_eq!(
            b.launch_graph(&graph, &[x.clone(), y.clone()])
                .unwrap()
                .len(),
            1
        );
    }
}

fn refused(b: &Backend, ops: impl FnOnce() -> Result<Tensor>) -> BackendError {
    b.capture_graph(ops)
        .expect_err("the capture must be refused")
}

#[test]
fn calls_a_replay_cannot_repeat_are_refused() {
    for b in backends() {
        let kind = b.backend_type();
        let x = b.randn(&[8], DType::F32).unwrap();
        // Reading on the host, even when the closure swallows the error.
        let e = refused(&b, || {
            let y = x.exp()?;
            let _ = y.to_vec::<f32>();
            Ok(y)
        });
        assert!(
            matches!(
                e,
                BackendError::GraphCapture {
                    op: "copy_dtoh",
                    ..
                }
            ),
            "{kind}: {e}"
        );
        let e = refused(&b, || b.randn(&[8], DType::F32));
        assert!(
            matches!(e, BackendError::GraphCapture { op: "random", .. }),
            "{kind}: {e}"
        );
        // Nested captures and launches during a capture.
        let inner = b.capture_graph(|| x.exp()).unwrap();
        let e = refused(&b, || {
            b.capture_graph(|| x.exp())?;
            x.exp()
        });
        assert!(
            matches!(
                e,
                BackendError::GraphCapture {
                    op: "capture_graph",
                    ..
                }
            ),
            "{kind}: {e}"
        );
        let e = refused(&b, || {
            Ok(b.launch_graph(&inner, std::slice::from_ref(&x))?.remove(0))
        });
        assert!(
            matches!(
                e,
                BackendError::GraphCapture {
                    op: "launch_graph",
                    ..
                }
            ),
            "{kind}: {e}"
        );
        // A second view reaching outside the first one.
        let wide = b.randn(&[4, 4], DType::F32).unwrap();
        let e = refused(&b, || {
            let top = wide.narrow(0, 0, 2)?.exp()?;
            let all = wide.exp()?;
            top.add(&all.narrow(0, 0, 2)?)
        });
        assert!(
            matches!(e, BackendError::GraphCapture { .. }),
            "{kind}: {e}"
        );
        // Raw device memory.
        let raw = b.compute().alloc(32).unwrap();
        let e = refused(&b, || {
            let y = x.exp()?;
            b.compute().copy_dtod(raw, y.data_ptr(), 32)?;
            Ok(y)
        });
        assert!(
            matches!(e, BackendError::GraphCapture { .. }),
            "{kind}: {e}"
        );
        b.compute().free(raw).unwrap();
        // The closure's own error comes back as it is.
        let e = refused(&b, || x.add(&b.zeros(&[3], DType::F32)?));
        assert!(
            matches!(e, BackendError::ShapeMismatch { .. }),
            "{kind}: {e}"
        );
        // The backend is unharmed: eager ops and a new capture work.
        let g = b.capture_graph(|| x.exp()).unwrap();
        let out = b.launch_graph(&g, std::slice::from_ref(&x)).unwrap();
        assert_eq!(bytes(&out), bytes(&[x.exp().unwrap()]), "{kind}");
    }
}

#[test]
fn other_threads_are_not_recorded() {
    for b in backends() {
        let kind = b.backend_type();
        let x = b.randn(&[64], DType::F32).unwrap();
        let graph: Graph = b
            .capture_graph(|| {
                let other = std::thread::scope(|s| {
                    s.spawn(|| {
                        let y = b.randn(&[64], DType::F32)?; // refused if it were recorded
                        y.to_vec::<f32>()
                    })
                    .join()
                    .unwrap()
                })?;
                assert_eq!(other.len(), 64);
                x.exp()
            })
            .unwrap();
        assert_eq!(graph.input_specs().len(), 1, "{kind}");
        assert_eq!(graph.num_ops(), 1, "{kind}: only the exp was recorded");
    }
}

#[test]
fn a_dropped_graph_gives_its_memory_back() {
    for b in backends() {
        let kind = b.backend_type();
        let Some(base) = b.allocated_bytes() else {
            continue;
        };
        let x = b.randn(&[1000], DType::F32).unwrap();
        let with_x = b.allocated_bytes().unwrap();
        let graph = b.capture_graph(|| x.exp()?.sqrt()?.add(&x)).unwrap();
        assert!(
            b.allocated_bytes().unwrap() > with_x,
            "{kind}: the graph holds memory"
        );
        let out = b.launch_graph(&graph, std::slice::from_ref(&x)).unwrap();
        drop((graph, out));
        assert_eq!(b.allocated_bytes().unwrap(), with_x, "{kind}");
        drop(x);
        assert_eq!(b.allocated_bytes().unwrap(), base, "{kind}");
    }
}

#[cfg(feature = "webgpu")]
#[test]
fn a_webgpu_launch_is_one_queue_submission() {
    use torsh_backend::webgpu::WebGpuBackend;
    let Ok(b) = Backend::new(BackendType::WebGpu) else {
        eprintln!("no WebGPU adapter here");
        return;
    };
    let submissions = || {
        b.compute()
            .as_any()
            .and_then(|a| a.downcast_ref::<WebGpuBackend>())
            .expect("the WebGPU backend")
            .queue_submissions()
            .unwrap()
    };
    let x = b.randn(&[257], DType::F32).unwrap();
    let graph = b
        .capture_graph(|| {
            let mut y = x.clone();
            for _ in 0..50 {
                y = y.mul_scalar(0.99)?.tanh()?;
            }
            Ok(y)
        })
        .unwrap();
    let inputs = [b.randn(&[257], DType::F32).unwrap()];
    b.synchronize().unwrap();
    let before = submissions();
    let out = b.launch_graph(&graph, &inputs).unwrap();
    assert_eq!(
        submissions() - before,
        1,
        "{} ops in one submission",
        graph.num_ops()
    );
    let mut eager = inputs[0].clone();
    for _ in 0..50 {
        eager = eager.mul_scalar(0.99).unwrap().tanh().unwrap();
    }
    assert_eq!(bytes(&out), bytes(&[eager]));
}

#[test]
fn uploads_inside_a_capture_replay_in_order() {
    for b in backends() {
        let kind = b.backend_type();
        let x = b.randn(&[3, 5], DType::F32).unwrap();
        let ops = |x: &Tensor| -> Result<Tensor> {
            // A kernel, then a host upload into fresh memory, then kernels reading both: on WebGPU
            // the upload is a queue write, which must not overtake the kernel issued before it.
            let y = x.exp()?;
            let c = b.from_slice(&[0.5f32, -1.0, 2.0, 0.25, 3.0], &[5])?;
            // A buffer written by a kernel, then overwritten from the host, then read.
            let t = x.sqrt()?;
            let host: Vec<u8> = (0..15u32)
                .flat_map(|i| (i as f32 * 0.125).to_le_bytes())
                .collect();
            b.compute().copy_htod(t.data_ptr(), &host)?;
            y.mul(&c)?.add(&t)
        };
        let graph = b.capture_graph(|| ops(&x)).unwrap();
        for _ in 0..3 {
            let input = b.randn(&[3, 5], DType::F32).unwrap();
            let out = b
                .launch_graph(&graph, std::slice::from_ref(&input))
                .unwrap();
            assert_eq!(bytes(&out), bytes(&[ops(&input).unwrap()]), "{kind}");
        }
    }
}
