//! Backend kinds and device descriptions: [`BackendType`], [`Device`], [`DeviceInfo`].

use std::fmt;

/// A kind of compute backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendType {
    /// Pick the best available backend at run time (CUDA, then a GPU through WebGPU, then the CPU).
    Auto,
    /// The CPU: SIMD and threads.
    Cpu,
    /// NVIDIA GPUs through CUDA.
    Cuda,
    /// Apple GPUs through Metal.
    Metal,
    /// AMD GPUs through ROCm/HIP.
    Rocm,
    /// Any GPU that wgpu reaches (Vulkan, Metal, DX12).
    WebGpu,
    /// The scalar reference backend: f64 accumulation, the oracle every other backend is tested against.
    Reference,
}

impl BackendType {
    /// Every concrete backend kind (everything but `Auto`), in order of preference for `Auto`
    /// among GPUs, then the CPU, then the reference.
    pub const CONCRETE: [BackendType; 6] = [
        BackendType::Cuda,
        BackendType::Rocm,
        BackendType::Metal,
        BackendType::WebGpu,
        BackendType::Cpu,
        BackendType::Reference,
    ];

    /// The lowercase name used in messages, reports and `TORSH_REQUIRE` (`"cuda"`, `"webgpu"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            BackendType::Auto => "auto",
            BackendType::Cpu => "cpu",
            BackendType::Cuda => "cuda",
            BackendType::Metal => "metal",
            BackendType::Rocm => "rocm",
            BackendType::WebGpu => "webgpu",
            BackendType::Reference => "reference",
        }
    }

    /// Parses a name as printed by [`BackendType::name`] (case-insensitive); `None` for anything else.
    pub fn from_name(name: &str) -> Option<BackendType> {
        let name = name.trim().to_ascii_lowercase();
        [BackendType::Auto]
            .into_iter()
            .chain(BackendType::CONCRETE)
            .find(|b| b.name() == name)
    }
}

impl fmt::Display for BackendType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One device: a backend kind and the device's index within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    /// The backend kind serving the device.
    pub backend_type: BackendType,
    /// The device index within that backend (0 for the CPU and the reference).
    pub index: usize,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.backend_type, self.index)
    }
}

/// A description of one device, as listed by [`crate::Backend::list_devices`].
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    /// The device this describes.
    pub device: Device,
    /// A human-readable name ("NVIDIA H200", the CPU model, ...).
    pub name: String,
    /// Total memory in bytes (host memory for CPU-side backends).
    pub memory_bytes: u64,
    /// The API that really serves the device ("scalar reference", "Vulkan", "CUDA 13.0", ...).
    pub api: String,
    /// Further facts worth showing (core count, SIMD level, compute capability, ...), as key/value pairs.
    pub details: Vec<(String, String)>,
}

impl DeviceInfo {
    /// The device index within its backend.
    pub fn id(&self) -> usize {
        self.device.index
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Total memory in GiB (rounded to two decimals).
    pub fn memory_gb(&self) -> f64 {
        (self.memory_bytes as f64 / (1u64 << 30) as f64 * 100.0).round() / 100.0
    }

    /// The backend kind serving the device.
    pub fn backend_type(&self) -> BackendType {
        self.device.backend_type
    }
}

/// Total physical memory of this host in bytes, or 0 where it cannot be read.
pub(crate) fn host_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// The CPU model name of this host, or the architecture name where it cannot be read.
pub(crate) fn host_cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| format!("{} CPU", std::env::consts::ARCH))
}

/// Logical cores this process may use.
pub(crate) fn host_core_count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
