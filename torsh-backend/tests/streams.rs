//! Streams, events, pinned buffers and async ops, on every available backend: the reference and the
//! CPU (whose ops complete before they return) and CUDA where a GPU is present.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use torsh_backend::{Backend, BackendError, BackendType, DType};

mod common;
use common::backends;

/// A minimal executor: polls `f` on this thread, parking between wake-ups.
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000) as f32 / 250.0 - 2.0
        })
        .collect()
}

#[test]
fn matmul_async_equals_matmul_on_a_side_stream() {
    for b in backends() {
        let (m, k, n) = (37, 19, 23);
        let a = b.from_slice(&values(m * k, 1), &[m, k]).unwrap();
        let w = b.from_slice(&values(k * n, 2), &[k, n]).unwrap();
        let want = b.matmul(&a, &w).unwrap().to_vec::<f32>().unwrap();
        let s1 = b.create_stream().unwrap();
        let s2 = b.create_stream().unwrap();
        let f1 = b.matmul_async(&a, &w, &s1);
        let f2 = b.matmul_async(
            &w.transpose(0, 1).unwrap(),
            &a.transpose(0, 1).unwrap(),
            &s2,
        );
        let got1 = block_on(f1).unwrap().to_vec::<f32>().unwrap();
        let got2 = f2.wait().unwrap();
        assert_eq!(got1, want, "{:?}", b.backend_type());
        assert_eq!(got2.shape(), &[n, m]);
        let want_t = b
            .matmul(&w.transpose(0, 1).unwrap(), &a.transpose(0, 1).unwrap())
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(got2.to_vec::<f32>().unwrap(), want_t);
        // The default stream is current again after the async op.
        assert_eq!(
            b.default_stream().id(),
            torsh_backend::compute::StreamId::DEFAULT
        );
        s1.synchronize().unwrap();
        b.synchronize().unwrap();
    }
}

#[test]
fn pinned_buffers_round_trip_through_async_copies() {
    for b in backends() {
        for n in [1usize, 13, 4099] {
            let data = values(n, n as u32);
            let mut host = b.alloc_pinned(&[n], DType::F32).unwrap();
            assert_eq!(host.as_slice::<f32>().unwrap(), vec![0.0; n].as_slice());
            host.as_mut_slice::<f32>().unwrap().copy_from_slice(&data);
            let dev = b.empty(&[n], DType::F32).unwrap();
            block_on(b.copy_host_to_device_async(&host, &dev)).unwrap();
            assert_eq!(dev.to_vec::<f32>().unwrap(), data);
            let doubled = dev.add(&dev).unwrap();
            let mut back = b.alloc_pinned(&[n], DType::F32).unwrap();
            b.copy_device_to_host_async(&doubled, &mut back)
                .wait()
                .unwrap();
            let want: Vec<f32> = data.iter().map(|x| x + x).collect();
            assert_eq!(back.as_slice::<f32>().unwrap(), want.as_slice());
            assert_eq!(
                back.is_page_locked(),
                b.backend_type() == BackendType::Cuda,
                "{:?}",
                b.backend_type()
            );
        }
    }
}

#[test]
fn async_ops_reject_bad_operands_with_typed_errors() {
    for b in backends() {
        let host = b.alloc_pinned(&[2, 3], DType::F32).unwrap();
        let wrong_dtype = b.empty(&[2, 3], DType::F64).unwrap();
        assert!(matches!(
            block_on(b.copy_host_to_device_async(&host, &wrong_dtype)),
            Err(BackendError::DTypeMismatch { .. })
        ));
        let wrong_shape = b.empty(&[3, 2], DType::F32).unwrap();
        assert!(matches!(
            b.copy_host_to_device_async(&host, &wrong_shape).wait(),
            Err(BackendError::ShapeMismatch { .. })
        ));
        let strided = b
            .empty(&[3, 2], DType::F32)
            .unwrap()
            .transpose(0, 1)
            .unwrap();
        assert!(matches!(
            b.copy_host_to_device_async(&host, &strided).wait(),
            Err(BackendError::ShapeMismatch { .. })
        ));
        assert!(matches!(
            host.as_slice::<f64>(),
            Err(BackendError::DTypeMismatch { .. })
        ));
        let other = Backend::reference().unwrap();
        let foreign = other.empty(&[2, 3], DType::F32).unwrap();
        assert!(matches!(
            b.copy_host_to_device_async(&host, &foreign).wait(),
            Err(BackendError::DeviceMismatch { .. })
        ));
        let a = b.ones(&[2, 2], DType::F32).unwrap();
        assert!(matches!(
            b.matmul_async(&a, &a, &other.create_stream().unwrap())
                .wait(),
            Err(BackendError::DeviceMismatch { .. })
        ));
        assert!(matches!(
            b.matmul_async(
                &a,
                &b.ones(&[3, 2], DType::F32).unwrap(),
                &b.create_stream().unwrap()
            )
            .wait(),
            Err(BackendError::ShapeMismatch { .. })
        ));
        assert!(matches!(
            b.alloc_pinned(&[usize::MAX, 2], DType::F32),
            Err(BackendError::SizeOverflow { .. })
        ));
    }
}

#[test]
fn events_order_streams_and_time_device_work() {
    for b in backends() {
        let s = b.create_stream().unwrap();
        let x = b.ones(&[64, 64], DType::F32).unwrap();
        let start = s.record_event().unwrap();
        let y = s.run(|| x.matmul(&x)).unwrap();
        let end = s.record_event().unwrap();
        b.default_stream().wait_event(&end).unwrap();
        end.synchronize().unwrap();
        assert!(end.is_complete().unwrap());
        assert_eq!(y.to_vec::<f32>().unwrap()[0], 64.0);
        // Device backends time events (CUDA events; WebGPU timestamp queries, where the adapter has
        // them); host backends say they cannot.
        let device = matches!(b.backend_type(), BackendType::Cuda | BackendType::WebGpu);
        match start.elapsed_ms(&end) {
            Ok(ms) => assert!(ms >= 0.0 && device),
            Err(e) => assert!(
                matches!(e, BackendError::FeatureUnavailable { .. })
                    && b.backend_type() != BackendType::Cuda,
                "{e}"
            ),
        }
        let other = Backend::reference().unwrap();
        let foreign = other.default_stream().record_event().unwrap();
        assert!(matches!(
            s.wait_event(&foreign),
            Err(BackendError::DeviceMismatch { .. })
        ));
        // A stream the backend never handed out is refused at the raw trait.
        assert!(matches!(
            b.compute()
                .set_current_stream(torsh_backend::compute::StreamId(1 << 40)),
            Err(BackendError::InvalidArgument { .. })
        ));
        // A failing closure still restores the previous stream.
        let err = s.run(|| x.matmul(&b.ones(&[3, 3], DType::F32)?));
        assert!(err.is_err());
        assert_eq!(x.add(&x).unwrap().to_vec::<f32>().unwrap()[0], 2.0);
    }
}
