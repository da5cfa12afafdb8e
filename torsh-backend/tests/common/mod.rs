//! What the integration tests share: the backends to run on, raw f32 uploads and downloads, and
//! `TORSH_REQUIRE` (a comma-separated list of backends or libraries whose absence fails a test
//! instead of skipping it). Each test file takes what it needs (`mod common;`), so an item unused by
//! one file is not dead code.
#![allow(dead_code, unused_macros, unused_imports)]

pub mod special_values;

use torsh_backend::{Backend, BackendType, ComputeBackend, DevicePtr};

/// The reference, the CPU, and every device backend available on this machine (CUDA where a GPU
/// is present, WebGPU where an adapter is). Panics when a backend probed available does not build.
pub fn backends() -> Vec<Backend> {
    let mut all = vec![
        Backend::reference().expect("the reference backend is always available"),
        Backend::cpu()
            .build()
            .expect("the CPU backend is always available"),
    ];
    for kind in Backend::available() {
        if !matches!(kind, BackendType::Cpu | BackendType::Reference) {
            all.push(Backend::new(kind).unwrap_or_else(|e| panic!("{kind} probed available: {e}")));
        }
    }
    all
}

/// Whether `TORSH_REQUIRE` names `token` (`cuda`, `webgpu`, `nvrtc`, `cudnn`, ...).
pub fn required(token: &str) -> bool {
    std::env::var("TORSH_REQUIRE").is_ok_and(|v| v.split(',').any(|t| t.trim() == token))
}

/// Fails the test where `TORSH_REQUIRE` names `token`; otherwise reports it skipped ([`skipped`]).
pub fn skip(token: &str, reason: impl std::fmt::Display) {
    assert!(!required(token), "TORSH_REQUIRE names {token}: {reason}");
    skipped(reason);
}

/// Prints `skipped: <reason>` on the process's stderr, past the test harness's capture (which
/// holds back what a passing test prints), so a test that could not run does not pass silently.
pub fn skipped(reason: impl std::fmt::Display) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "skipped: {reason}");
}

/// A new allocation of `c` holding `data` as little-endian f32.
pub fn upload(c: &dyn ComputeBackend, data: &[f32]) -> DevicePtr {
    let p = c.alloc(data.len() * 4).expect("alloc");
    let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    c.copy_htod(p, &bytes).expect("copy_htod");
    p
}

/// `n` f32 values read from `p` on `c`.
pub fn download(c: &dyn ComputeBackend, p: DevicePtr, n: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; n * 4];
    c.copy_dtoh(&mut bytes, p).expect("copy_dtoh");
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Inside `impl ComputeBackend for X`, with `torsh_backend::for_each_op!(through_op)`: every op
/// method, each handing its descriptor to X's generic `fn op<D: OpDesc>(&self, desc: &D) -> Result<()>`,
/// which may look at the op (`(desc as &dyn Any).downcast_ref::<GemmDesc>()`) before running it on
/// the backend it stands in front of (`desc.run(&self.inner)`).
macro_rules! through_op {
    ($($method:ident($desc:ty)),* $(,)?) => {
        $(
            fn $method(&self, desc: &$desc) -> torsh_backend::Result<()> {
                self.op(desc)
            }
        )*
    };
}
pub(crate) use through_op;

/// Inside `impl ComputeBackend for X`: the device and memory methods every backend must have,
/// passed to `self.$inner`.
macro_rules! forward_device {
    ($inner:ident) => {
        fn init(&mut self) -> torsh_backend::Result<()> {
            self.$inner.init()
        }
        fn is_initialized(&self) -> bool {
            self.$inner.is_initialized()
        }
        fn device_info(&self) -> torsh_backend::DeviceInfo {
            self.$inner.device_info()
        }
        fn synchronize(&self) -> torsh_backend::Result<()> {
            self.$inner.synchronize()
        }
        fn alloc(&self, bytes: usize) -> torsh_backend::Result<torsh_backend::DevicePtr> {
            self.$inner.alloc(bytes)
        }
        fn free(&self, ptr: torsh_backend::DevicePtr) -> torsh_backend::Result<()> {
            self.$inner.free(ptr)
        }
        fn copy_htod(
            &self,
            dst: torsh_backend::DevicePtr,
            src: &[u8],
        ) -> torsh_backend::Result<()> {
            self.$inner.copy_htod(dst, src)
        }
        fn copy_dtoh(
            &self,
            dst: &mut [u8],
            src: torsh_backend::DevicePtr,
        ) -> torsh_backend::Result<()> {
            self.$inner.copy_dtoh(dst, src)
        }
        fn copy_dtod(
            &self,
            dst: torsh_backend::DevicePtr,
            src: torsh_backend::DevicePtr,
            bytes: usize,
        ) -> torsh_backend::Result<()> {
            self.$inner.copy_dtod(dst, src, bytes)
        }
    };
}
pub(crate) use forward_device;
