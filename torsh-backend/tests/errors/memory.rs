//! Memory: invalid and foreign pointers, extents past an allocation, and aliasing between operands.

use super::*;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use common::through_op;
use torsh_backend::compute::{Accesses, OpDesc};
use torsh_backend::validation::{case_seed, cases, parity_targets, run_case, Outcome};

// ---------------------------------------------------------------------------------------------------
// Pointers
// ---------------------------------------------------------------------------------------------------

#[test]
fn invalid_pointers() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        let good = upload(c, &[1.0, 2.0, 3.0, 4.0]);
        let eye = upload(c, &[1.0, 0.0, 0.0, 1.0]);
        let out = c.alloc(16).expect("alloc");

        // null
        let null = DevicePtr(0);
        let err = assert_err!(c.copy_htod(null, &[0u8; 4]), InvalidPointer);
        assert_mentions(&err, &["0x0", "null"]);
        assert_err!(c.copy_dtoh(&mut [0u8; 4], null), InvalidPointer);
        assert_err!(c.free(null), InvalidPointer);
        assert_err!(c.gemm(&gemm_desc(null, eye, out, 2, 2, 2)), InvalidPointer);
        assert_err!(
            c.unary(&unary_desc(
                UnaryOp::Exp,
                StridedBuf::contiguous(good, &[4]),
                null
            )),
            InvalidPointer
        );
        assert_err!(
            c.fill(&FillDesc {
                dtype: DType::F32,
                ptr: null,
                len: 0,
                value: 0.0,
            }),
            InvalidPointer
        );

        // made-up addresses
        for made_up in [
            DevicePtr(0x1234),
            DevicePtr(0xdead_beef_0000),
            DevicePtr(u64::MAX - 16),
        ] {
            let err = assert_err!(c.copy_htod(made_up, &[0u8; 4]), InvalidPointer);
            assert_mentions(&err, &[&format!("{:#x}", made_up.0)]);
            assert_err!(c.copy_dtoh(&mut [0u8; 4], made_up), InvalidPointer);
            assert_err!(c.free(made_up), InvalidPointer);
            assert_err!(c.copy_dtod(out, made_up, 4), InvalidPointer);
            assert_err!(c.copy_dtod(made_up, good, 4), InvalidPointer);
            assert_err!(
                c.gemm(&gemm_desc(good, made_up, out, 2, 2, 2)),
                InvalidPointer
            );
            assert_err!(
                c.fill(&FillDesc {
                    dtype: DType::F32,
                    ptr: made_up,
                    len: 1,
                    value: 0.0,
                }),
                InvalidPointer
            );
        }

        // a pointer from another backend instance (which has allocated nothing)
        let other = Backend::reference().expect("reference");
        let oc = other.compute();
        let err = assert_err!(oc.copy_dtoh(&mut [0u8; 16], good), InvalidPointer);
        assert_mentions(&err, &["backend"]);
        assert_err!(oc.copy_htod(good, &[0u8; 16]), InvalidPointer);
        assert_err!(oc.free(good), InvalidPointer);
        assert_err!(
            oc.unary(&unary_desc(
                UnaryOp::Neg,
                StridedBuf::contiguous(good, &[4]),
                out
            )),
            InvalidPointer
        );
        assert_eq!(download(c, good, 4), vec![1.0, 2.0, 3.0, 4.0]);

        // freed pointers, double free
        let tmp = upload(c, &[5.0; 4]);
        assert_ok!(c.free(tmp));
        let err = assert_err!(c.copy_htod(tmp, &[0u8; 4]), InvalidPointer);
        assert_mentions(&err, &["freed"]);
        assert_err!(c.copy_dtoh(&mut [0u8; 4], tmp), InvalidPointer);
        assert_err!(c.gemm(&gemm_desc(good, tmp, out, 2, 2, 2)), InvalidPointer);
        assert_err!(
            c.unary(&unary_desc(
                UnaryOp::Neg,
                StridedBuf::contiguous(tmp, &[4]),
                out
            )),
            InvalidPointer
        );
        assert_err!(c.free(tmp), InvalidPointer);
        let fresh = c.alloc(16).expect("alloc");
        if b.backend_type() == BackendType::Cuda {
            // CUDA pointers are driver addresses and its caching allocator hands a freed block out
            // again (as `cudaFree` + `cudaMalloc` may): the old pointer then names the new
            // allocation, and only the new allocation's lifetime decides its validity.
            if fresh == tmp {
                assert_ok!(c.copy_htod(tmp, &[0u8; 4]));
            }
        } else {
            assert_ne!(fresh, tmp, "a freed address was handed out again");
            assert_err!(c.copy_htod(tmp, &[0u8; 4]), InvalidPointer);
            assert_err!(c.free(tmp), InvalidPointer);
        }

        // interior pointer passed to free; the allocation survives
        let err = assert_err!(c.free(off(good, 4)), InvalidPointer);
        assert_mentions(&err, &["interior"]);
        assert_eq!(download(c, good, 4), vec![1.0, 2.0, 3.0, 4.0]);
        // a pointer into the gap after an allocation
        assert_err!(c.copy_htod(off(good, 80), &[0u8; 4]), InvalidPointer);

        for p in [good, eye, out, fresh] {
            assert_ok!(c.free(p));
        }
        assert_backend_works(&b);
        assert_backend_works(&other);
    }
}

#[test]
fn foreign_pointer_is_rejected_even_when_the_other_backend_has_allocations() {
    // Two backend instances that have each allocated memory: a pointer of one must not be accepted by
    // the other (InvalidPointer lists "allocated by another backend instance" as a case), and above all
    // must not read, overwrite or free the other's memory. Every consequence is collected, then reported.
    let a = Backend::reference().expect("reference");
    let b = Backend::reference().expect("reference");
    let (ac, bc) = (a.compute(), b.compute());
    let pa = upload(ac, &[1.0, 2.0, 3.0, 4.0]);
    let pb = upload(bc, &[5.0, 6.0, 7.0, 8.0]);
    eprintln!("pointer on a: {pa:?}, pointer on b: {pb:?}");
    let mut failures = Vec::new();
    let mut host = [0u8; 16];
    let r = no_panic!(bc.copy_dtoh(&mut host, pa));
    if !matches!(r, Err(BackendError::InvalidPointer { .. })) {
        failures.push(format!(
            "b.copy_dtoh(a's pointer) gave {r:?} and read {:?}",
            f32s_of(&host)
        ));
    }
    let r = no_panic!(bc.copy_htod(pa, &bytes_of(&[0.0; 4])));
    if !matches!(r, Err(BackendError::InvalidPointer { .. })) {
        failures.push(format!("b.copy_htod(a's pointer) gave {r:?}"));
    }
    let r = no_panic!(bc.free(pa));
    if !matches!(r, Err(BackendError::InvalidPointer { .. })) {
        failures.push(format!("b.free(a's pointer) gave {r:?}"));
    }
    let mut back = [0u8; 16];
    match bc.copy_dtoh(&mut back, pb) {
        Ok(()) if f32s_of(&back) == [5.0, 6.0, 7.0, 8.0] => {}
        Ok(()) => failures.push(format!(
            "b's own buffer was overwritten: {:?}",
            f32s_of(&back)
        )),
        Err(e) => failures.push(format!("b's own buffer is gone: {e:?}")),
    }
    assert_eq!(download(ac, pa, 4), vec![1.0, 2.0, 3.0, 4.0]);
    assert!(
        failures.is_empty(),
        "a foreign pointer was accepted:\n{}",
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------------
// Out-of-bounds extents
// ---------------------------------------------------------------------------------------------------

#[test]
fn out_of_bounds_extents() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        let p = upload(c, &[1.0, 2.0, 3.0, 4.0]); // 16 bytes

        let err = assert_err!(c.copy_htod(p, &[0u8; 17]), OutOfBounds);
        match &err {
            BackendError::OutOfBounds {
                ptr,
                bytes,
                allocation_base,
                allocation_size,
            } => {
                assert_eq!(
                    (*ptr, *bytes, *allocation_base, *allocation_size),
                    (p.0, 17, p.0, 16)
                );
            }
            other => unreachable!("{other:?}"),
        }
        assert_mentions(&err, &["17", "16"]);
        assert_eq!(download(c, p, 4), vec![1.0, 2.0, 3.0, 4.0], "partial write");
        assert_err!(c.copy_dtoh(&mut [0u8; 32], p), OutOfBounds);
        // offset pointers whose extent crosses the end
        let mid = off(p, 8);
        assert_err!(c.copy_htod(mid, &[0u8; 12]), OutOfBounds);
        assert_err!(c.copy_dtoh(&mut [0u8; 9], mid), OutOfBounds);
        let end = off(p, 16);
        assert_err!(c.copy_htod(end, &[0u8; 1]), OutOfBounds);
        assert_ok!(c.copy_htod(end, &[]));
        assert_eq!(download(c, p, 4), vec![1.0, 2.0, 3.0, 4.0], "partial write");
        assert_ok!(c.copy_htod(mid, &bytes_of(&[7.0, 8.0])));
        assert_eq!(download(c, p, 4), vec![1.0, 2.0, 7.0, 8.0]);

        // GEMM extents
        let a = upload(c, &[1.0, 2.0, 3.0, 4.0]);
        let eye = upload(c, &[1.0, 0.0, 0.0, 1.0]);
        let cbuf = c.alloc(16).expect("alloc");
        assert_ok!(c.gemm(&gemm_desc(a, eye, cbuf, 2, 2, 2)));
        let err = assert_err!(
            c.gemm(&GemmDesc {
                ldc: 3,
                ..gemm_desc(a, eye, cbuf, 2, 2, 2)
            }),
            OutOfBounds
        );
        assert_mentions(&err, &["20 bytes", "16 bytes"]);
        assert_err!(
            c.gemm(&GemmDesc {
                lda: 3,
                ..gemm_desc(a, eye, cbuf, 2, 2, 2)
            }),
            OutOfBounds
        );
        assert_err!(
            c.gemm(&gemm_desc(a, eye, off(cbuf, 4), 2, 2, 2)),
            OutOfBounds
        );
        assert_err!(c.gemm(&gemm_desc(a, eye, cbuf, 3, 2, 2)), OutOfBounds);
        assert_err!(
            c.batched_gemm(&BatchedGemmDesc {
                gemm: gemm_desc(a, eye, cbuf, 2, 2, 2),
                stride_a: 0,
                stride_b: 0,
                stride_c: 4,
                batch_count: 2,
            }),
            OutOfBounds
        );
        assert_err!(
            c.gemv(&GemvDesc {
                incy: 4,
                ..gemv_desc(a, eye, cbuf, 2, 2)
            }),
            OutOfBounds
        );
        assert_err!(
            c.unary(&unary_desc(
                UnaryOp::Neg,
                StridedBuf::contiguous(a, &[4]),
                off(cbuf, 8)
            )),
            OutOfBounds
        );
        let strided = StridedBuf {
            ptr: a,
            layout: assert_ok!(Layout::new(vec![4], vec![2], 0)),
        };
        assert_err!(
            c.unary(&unary_desc(UnaryOp::Neg, strided, cbuf)),
            OutOfBounds
        );
        assert_err!(
            c.fill(&FillDesc {
                dtype: DType::F32,
                ptr: cbuf,
                len: 5,
                value: 0.0,
            }),
            OutOfBounds
        );
        assert_err!(c.copy_dtod(cbuf, a, 32), OutOfBounds);
        assert_err!(
            c.conv2d_forward(&Conv2dDesc {
                input_shape: [1, 1, 2, 2],
                output_shape: [1, 1, 1, 1],
                ..conv_desc(a, off(eye, 4), cbuf)
            }),
            OutOfBounds
        );
        assert_eq!(
            download(c, cbuf, 4),
            vec![1.0, 2.0, 3.0, 4.0],
            "a failed op wrote its output"
        );

        for q in [p, a, eye, cbuf] {
            assert_ok!(c.free(q));
        }
        assert_backend_works(&b);
    }
}

// ---------------------------------------------------------------------------------------------------
// Aliasing
// ---------------------------------------------------------------------------------------------------

#[test]
fn aliasing_is_rejected() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        let ramp: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let big = upload(c, &ramp); // 64 bytes
        let eye = upload(c, &[1.0, 0.0, 0.0, 1.0]);
        let out = c.alloc(64).expect("alloc");

        // GEMM: C overlapping A, C == A, C == B (read-write with beta ≠ 0).
        let err = assert_err!(c.gemm(&gemm_desc(big, eye, off(big, 8), 2, 2, 2)), Aliasing);
        assert_mentions(&err, &["gemm", "overlap"]);
        assert_err!(c.gemm(&gemm_desc(big, eye, big, 2, 2, 2)), Aliasing);
        assert_err!(
            c.gemm(&GemmDesc {
                beta: 1.0,
                ..gemm_desc(eye, big, big, 2, 2, 2)
            }),
            Aliasing
        );
        // GEMV: y overlapping x
        assert_err!(c.gemv(&gemv_desc(eye, big, off(big, 4), 2, 2)), Aliasing);
        // batched GEMM whose C batches overlap
        let err = assert_err!(
            c.batched_gemm(&BatchedGemmDesc {
                gemm: gemm_desc(eye, eye, out, 2, 2, 2),
                stride_a: 0,
                stride_b: 0,
                stride_c: 2,
                batch_count: 2,
            }),
            Aliasing
        );
        assert_mentions(&err, &["stride_c"]);
        // conv2d: output overlapping input, and overlapping weight
        let err = assert_err!(
            c.conv2d_forward(&conv_desc(big, eye, off(big, 20))),
            Aliasing
        );
        assert_mentions(&err, &["conv2d"]);
        assert_err!(c.conv2d_forward(&conv_desc(big, eye, eye)), Aliasing);
        // copy_dtod of overlapping ranges (and of a range onto itself)
        let err = assert_err!(c.copy_dtod(off(big, 4), big, 8), Aliasing);
        assert_mentions(&err, &["copy_dtod"]);
        assert_err!(c.copy_dtod(big, big, 8), Aliasing);
        assert_err!(c.copy_dtod(big, off(big, 4), 8), Aliasing);
        // reduce / softmax / layer_norm outputs on their inputs
        assert_err!(
            c.reduce(&ReduceDesc {
                op: ReduceOp::Sum,
                dtype: DType::F32,
                input: StridedBuf::contiguous(big, &[2, 4]),
                axis: 1,
                output: big,
            }),
            Aliasing
        );
        assert_err!(
            c.softmax(&SoftmaxDesc {
                dtype: DType::F32,
                input: big,
                output: big,
                outer: 1,
                axis_len: 4,
                inner: 1,
                log: false,
            }),
            Aliasing
        );
        assert_err!(
            c.layer_norm(&LayerNormDesc {
                dtype: DType::F32,
                input: big,
                weight: Some(out),
                bias: None,
                output: off(out, 8),
                rows: 2,
                cols: 4,
                eps: 1e-5,
                saved_mean: None,
                saved_invstd: None,
            }),
            Aliasing
        );
        // elementwise: partial overlap, or "in place" through a non-dense view
        assert_err!(
            c.unary(&unary_desc(
                UnaryOp::Neg,
                StridedBuf::contiguous(big, &[4]),
                off(big, 4)
            )),
            Aliasing
        );
        let transposed = StridedBuf {
            ptr: big,
            layout: assert_ok!(Layout::contiguous(&[2, 2]).transpose(0, 1)),
        };
        assert_err!(
            c.unary(&unary_desc(UnaryOp::Neg, transposed, big)),
            Aliasing
        );
        // strided copy into a broadcast (stride-0) view, or a view with overlapping strides
        let broadcast = StridedBuf {
            ptr: out,
            layout: assert_ok!(Layout::contiguous(&[1, 4]).broadcast_to(&[3, 4])),
        };
        let err = assert_err!(
            c.copy_strided(&CopyDesc {
                dtype: DType::F32,
                src: StridedBuf::contiguous(big, &[3, 4]),
                dst: broadcast,
            }),
            Aliasing
        );
        assert_mentions(&err, &["copy_strided"]);
        let overlapping = StridedBuf {
            ptr: out,
            layout: assert_ok!(Layout::new(vec![3, 3], vec![1, 1], 0)),
        };
        assert_err!(
            c.copy_strided(&CopyDesc {
                dtype: DType::F32,
                src: StridedBuf::contiguous(big, &[3, 3]),
                dst: overlapping,
            }),
            Aliasing
        );
        assert_eq!(download(c, big, 16), ramp, "a rejected op wrote memory");

        // Adam: state operands aliasing each other
        let params = upload(c, &[1.0, 2.0, 3.0, 4.0]);
        let grads = upload(c, &[0.5, -0.5, 0.5, -0.5]);
        let m = upload(c, &[0.0; 4]);
        let v = upload(c, &[0.0; 4]);
        let err = assert_err!(c.adam_step(&adam_desc(params, grads, params, v)), Aliasing);
        assert_mentions(&err, &["adam_step"]);
        assert_err!(c.adam_step(&adam_desc(params, grads, m, m)), Aliasing);
        assert_err!(c.adam_step(&adam_desc(params, v, m, v)), Aliasing);
        assert_err!(c.adam_step(&adam_desc(params, params, m, v)), Aliasing);
        assert_eq!(download(c, params, 4), vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(download(c, m, 4), vec![0.0; 4]);
        assert_ok!(c.adam_step(&adam_desc(params, grads, m, v)));
        assert_close(&download(c, params, 4), &[0.9, 2.1, 2.9, 4.1], 1e-5);

        // Tensor level: copying into a broadcast view
        let row = t(&b, &[1.0, 2.0, 3.0, 4.0], &[1, 4]);
        let view = assert_ok!(row.broadcast_to(&[3, 4]));
        let err = assert_err!(view.copy_from(&seq(&b, &[3, 4])), Aliasing);
        assert_mentions(&err, &["copy_strided"]);
        assert_eq!(vals(&row), vec![1.0, 2.0, 3.0, 4.0]);

        for p in [big, eye, out, params, grads, m, v] {
            assert_ok!(c.free(p));
        }
        assert_backend_works(&b);
    }
}

#[test]
fn exact_in_place_elementwise_is_allowed() {
    for b in backends() {
        eprintln!("backend: {}", b.backend_type());
        let c = b.compute();
        let p = upload(c, &[-1.0, 2.0, -3.0, 4.0]);
        assert_ok!(c.unary(&unary_desc(
            UnaryOp::Relu,
            StridedBuf::contiguous(p, &[4]),
            p
        )));
        assert_eq!(download(c, p, 4), vec![0.0, 2.0, 0.0, 4.0]);
        assert_ok!(c.unary(&unary_desc(
            UnaryOp::Neg,
            StridedBuf::contiguous(p, &[2, 2]),
            p
        )));
        assert_eq!(download(c, p, 4), vec![0.0, -2.0, 0.0, -4.0]);
        assert_ok!(c.unary(&unary_desc(
            UnaryOp::Square,
            StridedBuf::contiguous(p, &[4]),
            p
        )));
        assert_eq!(download(c, p, 4), vec![0.0, 4.0, 0.0, 16.0]);

        // binary in place into its left operand, with a broadcast right operand
        let ones = upload(c, &[1.0; 4]);
        assert_ok!(c.binary(&BinaryDesc {
            op: BinaryOp::Add,
            dtype: DType::F32,
            lhs: StridedBuf::contiguous(p, &[4]),
            rhs: Value::Tensor(StridedBuf::contiguous(ones, &[4])),
            output: p,
        }));
        assert_eq!(download(c, p, 4), vec![1.0, 5.0, 1.0, 17.0]);
        let ten = upload(c, &[10.0]);
        assert_ok!(c.binary(&BinaryDesc {
            op: BinaryOp::Mul,
            dtype: DType::F32,
            lhs: StridedBuf::contiguous(p, &[4]),
            rhs: Value::Tensor(StridedBuf {
                ptr: ten,
                layout: assert_ok!(Layout::contiguous(&[1]).broadcast_to(&[4])),
            }),
            output: p,
        }));
        assert_eq!(download(c, p, 4), vec![10.0, 50.0, 10.0, 170.0]);
        // and with a scalar right operand
        assert_ok!(c.binary(&BinaryDesc {
            op: BinaryOp::Sub,
            dtype: DType::F32,
            lhs: StridedBuf::contiguous(p, &[4]),
            rhs: Value::Scalar(0.5),
            output: p,
        }));
        assert_eq!(download(c, p, 4), vec![9.5, 49.5, 9.5, 169.5]);

        // the tensor API never writes into its input
        let x = t(&b, &[-1.0, 2.0], &[2]);
        let y = assert_ok!(x.relu());
        assert!(!y.shares_storage(&x));
        assert_eq!(vals(&x), vec![-1.0, 2.0]);

        for q in [p, ones, ten] {
            assert_ok!(c.free(q));
        }
        assert_backend_works(&b);
    }
}

// ---------------------------------------------------------------------------------------------------
// Every operand of every op
// ---------------------------------------------------------------------------------------------------

/// An address no backend hands out.
const STRAY: DevicePtr = DevicePtr(0x4000_0000_0000_0000);

/// A backend in front of another that, after running each op, runs it once per operand with that
/// operand moved to [`STRAY`] (which must be `InvalidPointer`) and once moved onto a one-byte
/// allocation (`OutOfBounds`, or `InvalidPointer` for a view whose first element lies past its
/// base; operands of one byte fit there and skip this probe), noting every other answer.
#[derive(Debug)]
struct Prober {
    target: Backend,
    failures: Arc<Mutex<Vec<String>>>,
    probed: Arc<Mutex<BTreeSet<&'static str>>>,
}

impl Prober {
    fn device(&self) -> &dyn ComputeBackend {
        self.target.compute()
    }

    /// Runs `desc`, then, when it ran, probes it: a probe that wrote anything where the op did
    /// would show in the parity comparison after.
    fn op<D: OpDesc>(&self, desc: &D) -> Result<()> {
        desc.run(self.device())?;
        self.probe(desc, &OpDesc::accesses(desc)?);
        Ok(())
    }

    fn probe<D: OpDesc>(&self, desc: &D, acc: &Accesses) {
        let device = self.device();
        let fail = |what: String| self.failures.lock().unwrap().push(what);
        let mut names = desc.clone();
        let operands: Vec<(&str, DevicePtr)> =
            names.operands().iter().map(|o| (o.name, o.ptr())).collect();
        for (i, &(name, base)) in operands.iter().enumerate() {
            let Some(region) = acc.regions.iter().find(|r| r.name == name) else {
                fail(format!("{}: operand `{name}` has no region", D::NAME));
                continue;
            };
            if region.bytes == 0 {
                continue;
            }
            self.probed.lock().unwrap().insert(D::NAME);
            let moved = |ptr: DevicePtr| {
                let mut d = desc.clone();
                *d.operands()[i].ptr_mut() = ptr;
                d.run(device)
            };
            match moved(STRAY) {
                Err(BackendError::InvalidPointer { .. }) => {}
                other => fail(format!(
                    "{} on {}: `{name}` at a stray address gave {other:?}",
                    D::NAME,
                    device.name()
                )),
            }
            if region.bytes == 1 {
                // No allocation is shorter than a one-byte operand (a `U8` scalar).
                continue;
            }
            let Ok(short) = device.alloc(1) else {
                fail(format!("{}: no one-byte allocation", device.name()));
                continue;
            };
            match moved(short) {
                Err(BackendError::OutOfBounds { .. }) => {}
                Err(BackendError::InvalidPointer { .. }) if region.ptr != base => {}
                other => fail(format!(
                    "{} on {}: `{name}` ({} bytes) on a one-byte allocation gave {other:?}",
                    D::NAME,
                    device.name(),
                    region.bytes
                )),
            }
            let _ = device.free(short);
        }
    }
}

impl ComputeBackend for Prober {
    fn name(&self) -> &str {
        "prober"
    }
    fn backend_type(&self) -> BackendType {
        self.device().backend_type()
    }
    fn init(&mut self) -> Result<()> {
        Ok(())
    }
    fn is_initialized(&self) -> bool {
        true
    }
    fn device_info(&self) -> DeviceInfo {
        self.device().device_info()
    }
    fn synchronize(&self) -> Result<()> {
        self.device().synchronize()
    }
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.device().alloc(bytes)
    }
    fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.device().free(ptr)
    }
    fn copy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.device().copy_htod(dst, src)
    }
    fn copy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        self.device().copy_dtoh(dst, src)
    }
    fn copy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.device().copy_dtod(dst, src, bytes)
    }
    torsh_backend::for_each_op!(through_op);
}

/// Every op the parity cases issue, on every backend, is run with each of its operands moved off
/// its memory: to an address nothing allocated, and onto an allocation too short for it. Each must
/// come back as a typed error having written nothing (the op's own result, compared after, would
/// show it).
/// The ops come from the parity cases and their operands from each descriptor's `OpDesc` impl, so
/// a new op is covered by its parity case alone.
#[test]
fn every_operand_of_every_op_is_checked_against_memory() {
    let (targets, skipped) = parity_targets().unwrap_or_else(|reason| panic!("{reason}"));
    for s in &skipped {
        common::skipped(s);
    }
    let reference = Backend::reference().unwrap();
    let mut failures = Vec::new();
    let mut probed = BTreeSet::new();
    for target in targets {
        let found = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let backend = Backend::from_compute(Box::new(Prober {
            target,
            failures: Arc::clone(&found),
            probed: Arc::clone(&seen),
        }))
        .unwrap();
        for (i, case) in cases::all().iter().enumerate() {
            for &dtype in case.dtypes {
                let r = run_case(case, &backend, &reference, dtype, case_seed(i));
                match r.outcome {
                    Outcome::Passed => {}
                    Outcome::Unsupported(_) if dtype != DType::F32 => {}
                    other => {
                        failures.push(format!("{} {dtype} on {}: {other:?}", case.op, r.backend))
                    }
                }
            }
        }
        failures.extend(found.lock().unwrap().drain(..));
        probed.extend(seen.lock().unwrap().iter().copied());
    }
    macro_rules! names {
        ($($method:ident($desc:ty)),* $(,)?) => { [$(<$desc as OpDesc>::NAME),*] };
    }
    for name in torsh_backend::for_each_op!(names) {
        if !probed.contains(name) {
            failures.push(format!("no parity case issues `{name}`"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
