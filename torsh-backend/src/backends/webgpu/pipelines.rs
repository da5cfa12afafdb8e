//! WGSL modules, compute pipelines built once and cached by (module, entry point, constants), and the
//! one way kernels are launched: [`Kernels::dispatch`].
//!
//! Every module binds its data buffers as `read_write` storage at bindings `0..data`, followed by one
//! read-only storage buffer of `u32` parameter words. Read-write everywhere lets one wgpu buffer be
//! bound twice in a dispatch (two views of one allocation), which WebGPU forbids when one of the two
//! bindings is read-only. The bind group layout is explicit and shared by a module's entry points.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

use crate::dtype::DType;
use crate::error::{BackendError, Result};

use super::context::Gpu;
use super::memory::Binding;

/// A WGSL source file of this backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Module {
    /// The file name, in messages.
    pub name: &'static str,
    /// The WGSL text.
    pub source: &'static str,
    /// Data buffers bound before the parameter words.
    pub data: u32,
}

/// A [`Module`] named `name` with `data` data bindings, whose source is the given files of
/// `shaders/` joined in order (preludes first).
macro_rules! wgsl {
    ($name:literal, $data:literal, [$($file:literal),+ $(,)?]) => {
        Module {
            name: $name,
            source: concat!($(include_str!(concat!("shaders/", $file))),+),
            data: $data,
        }
    };
}

/// `shaders/elementwise.wgsl`: fill, copy, unary, binary, on f32 elements (`shaders/elem_f32.wgsl`).
pub(crate) const ELEMENTWISE: Module =
    wgsl!("elementwise.wgsl", 3, ["elem_f32.wgsl", "elementwise.wgsl"]);

/// [`ELEMENTWISE`] on f16 elements (`shaders/elem_f16.wgsl`), for devices with
/// `wgpu::Features::SHADER_F16`.
pub(crate) const ELEMENTWISE_F16: Module = wgsl!(
    "elementwise.wgsl+f16",
    3,
    ["elem_f16.wgsl", "elementwise.wgsl"]
);

/// `shaders/gemm.wgsl`: tiled GEMM and GEMV (with `shaders/block.wgsl`, the register block), on f32
/// elements.
pub(crate) const GEMM: Module = wgsl!("gemm.wgsl", 3, ["elem_f32.wgsl", "block.wgsl", "gemm.wgsl"]);

/// [`GEMM`] on f16 elements, for devices with `SHADER_F16`.
pub(crate) const GEMM_F16: Module = wgsl!(
    "gemm.wgsl+f16",
    3,
    ["elem_f16.wgsl", "block.wgsl", "gemm.wgsl"]
);

/// `shaders/rows.wgsl`: reductions, softmax, layer norm (input, weight, bias, output values, output
/// indices) on f32 elements, combining through a tree in workgroup memory
/// (`shaders/combine_tree.wgsl`, `shaders/combine.wgsl`).
pub(crate) const ROWS: Module = wgsl!(
    "rows.wgsl",
    5,
    [
        "elem_f32.wgsl",
        "combine_tree.wgsl",
        "combine.wgsl",
        "rows.wgsl"
    ]
);

/// [`ROWS`] combining through subgroup operations (`shaders/combine_subgroup.wgsl`).
pub(crate) const ROWS_SUBGROUP: Module = wgsl!(
    "rows.wgsl+subgroups",
    5,
    [
        "elem_f32.wgsl",
        "combine_subgroup.wgsl",
        "combine.wgsl",
        "rows.wgsl"
    ]
);

/// [`ROWS`] on f16 elements, for devices with `SHADER_F16`.
pub(crate) const ROWS_F16: Module = wgsl!(
    "rows.wgsl+f16",
    5,
    [
        "elem_f16.wgsl",
        "combine_tree.wgsl",
        "combine.wgsl",
        "rows.wgsl"
    ]
);

/// [`ROWS_SUBGROUP`] on f16 elements.
pub(crate) const ROWS_F16_SUBGROUP: Module = wgsl!(
    "rows.wgsl+f16+subgroups",
    5,
    [
        "elem_f16.wgsl",
        "combine_subgroup.wgsl",
        "combine.wgsl",
        "rows.wgsl"
    ]
);

/// `shaders/optim.wgsl`: fused Adam/AdamW (params, grads, both moments) on f32 elements.
pub(crate) const OPTIM: Module = wgsl!("optim.wgsl", 4, ["elem_f32.wgsl", "optim.wgsl"]);

/// [`OPTIM`] on f16 elements, for devices with `SHADER_F16`.
pub(crate) const OPTIM_F16: Module = wgsl!("optim.wgsl+f16", 4, ["elem_f16.wgsl", "optim.wgsl"]);

/// `shaders/unscale.wgsl`: a loss scaler's fused unscale and inf/NaN check (input, output, flag) on
/// f32 elements.
pub(crate) const UNSCALE: Module = wgsl!("unscale.wgsl", 3, ["elem_f32.wgsl", "unscale.wgsl"]);

/// [`UNSCALE`] on f16 elements, for devices with `SHADER_F16`.
pub(crate) const UNSCALE_F16: Module =
    wgsl!("unscale.wgsl+f16", 3, ["elem_f16.wgsl", "unscale.wgsl"]);

/// `shaders/conv.wgsl`: implicit-GEMM conv2d (input, weight, bias, output), with
/// `shaders/block.wgsl`, on f32 elements.
pub(crate) const CONV: Module = wgsl!("conv.wgsl", 4, ["elem_f32.wgsl", "block.wgsl", "conv.wgsl"]);

/// [`CONV`] on f16 elements, for devices with `SHADER_F16`.
pub(crate) const CONV_F16: Module = wgsl!(
    "conv.wgsl+f16",
    4,
    ["elem_f16.wgsl", "block.wgsl", "conv.wgsl"]
);

/// `shaders/conv_backward.wgsl`: the input and weight gradients of conv2d (the output gradient or
/// input, the weight or output gradient, a bias, the gradient written), on f32 elements.
pub(crate) const CONV_BACKWARD: Module = wgsl!(
    "conv_backward.wgsl",
    4,
    ["elem_f32.wgsl", "conv_backward.wgsl"]
);

/// [`CONV_BACKWARD`] on f16 elements, for devices with `SHADER_F16`.
pub(crate) const CONV_BACKWARD_F16: Module = wgsl!(
    "conv_backward.wgsl+f16",
    4,
    ["elem_f16.wgsl", "conv_backward.wgsl"]
);

/// `shaders/attention.wgsl`: flash-style attention (q, k, v, o, and the f32 statistics of a
/// launch over a range of the keys), on f32 elements.
pub(crate) const ATTENTION: Module =
    wgsl!("attention.wgsl", 5, ["elem_f32.wgsl", "attention.wgsl"]);

/// [`ATTENTION`] on f16 elements, for devices with `SHADER_F16`.
pub(crate) const ATTENTION_F16: Module =
    wgsl!("attention.wgsl+f16", 5, ["elem_f16.wgsl", "attention.wgsl"]);

/// `shaders/pool.wgsl`: max and average pooling (input, output), on f32 elements.
pub(crate) const POOL: Module = wgsl!("pool.wgsl", 2, ["elem_f32.wgsl", "pool.wgsl"]);

/// [`POOL`] on f16 elements, for devices with `SHADER_F16`.
pub(crate) const POOL_F16: Module = wgsl!("pool.wgsl+f16", 2, ["elem_f16.wgsl", "pool.wgsl"]);

/// `shaders/attention_backward.wgsl`: attention's gradients (dO, q, k, v, two outputs, and the f32
/// log-sum-exp and D rows) on f32 elements.
pub(crate) const ATTENTION_BACKWARD: Module = wgsl!(
    "attention_backward.wgsl",
    7,
    ["elem_f32.wgsl", "attention_backward.wgsl"]
);

/// [`ATTENTION_BACKWARD`] on f16 elements, for devices with `SHADER_F16`.
pub(crate) const ATTENTION_BACKWARD_F16: Module = wgsl!(
    "attention_backward.wgsl+f16",
    7,
    ["elem_f16.wgsl", "attention_backward.wgsl"]
);

/// `shaders/pool_backward.wgsl`: the max pool that writes its positions, and the pooling gradients
/// (input or gradient, output, positions, error flag), on f32 elements.
pub(crate) const POOL_BACKWARD: Module = wgsl!(
    "pool_backward.wgsl",
    4,
    ["elem_f32.wgsl", "pool_backward.wgsl"]
);

/// [`POOL_BACKWARD`] on f16 elements, for devices with `SHADER_F16`.
pub(crate) const POOL_BACKWARD_F16: Module = wgsl!(
    "pool_backward.wgsl+f16",
    4,
    ["elem_f16.wgsl", "pool_backward.wgsl"]
);

/// `shaders/batch_norm.wgsl`: batch norm (input, output, weight, bias, running mean and variance, and
/// f32 partial statistics) on f32 elements, combining through a tree in workgroup memory.
pub(crate) const BATCH_NORM: Module = wgsl!(
    "batch_norm.wgsl",
    7,
    [
        "elem_f32.wgsl",
        "combine_tree.wgsl",
        "combine.wgsl",
        "channel_walk.wgsl",
        "batch_norm.wgsl"
    ]
);

/// [`BATCH_NORM`] combining through subgroup operations.
pub(crate) const BATCH_NORM_SUBGROUP: Module = wgsl!(
    "batch_norm.wgsl+subgroups",
    7,
    [
        "elem_f32.wgsl",
        "combine_subgroup.wgsl",
        "combine.wgsl",
        "channel_walk.wgsl",
        "batch_norm.wgsl"
    ]
);

/// [`BATCH_NORM`] on f16 elements, for devices with `SHADER_F16`.
pub(crate) const BATCH_NORM_F16: Module = wgsl!(
    "batch_norm.wgsl+f16",
    7,
    [
        "elem_f16.wgsl",
        "combine_tree.wgsl",
        "combine.wgsl",
        "channel_walk.wgsl",
        "batch_norm.wgsl"
    ]
);

/// [`BATCH_NORM_SUBGROUP`] on f16 elements.
pub(crate) const BATCH_NORM_F16_SUBGROUP: Module = wgsl!(
    "batch_norm.wgsl+f16+subgroups",
    7,
    [
        "elem_f16.wgsl",
        "combine_subgroup.wgsl",
        "combine.wgsl",
        "channel_walk.wgsl",
        "batch_norm.wgsl"
    ]
);

/// `shaders/norm_backward.wgsl`: the gradients of layer norm and batch norm (output gradient,
/// input, weight, f32 statistics, two outputs and f32 partial sums) on f32 elements, combining
/// through a tree in workgroup memory.
pub(crate) const NORM_BACKWARD: Module = wgsl!(
    "norm_backward.wgsl",
    7,
    [
        "elem_f32.wgsl",
        "combine_tree.wgsl",
        "combine.wgsl",
        "channel_walk.wgsl",
        "norm_backward.wgsl"
    ]
);

/// [`NORM_BACKWARD`] combining through subgroup operations.
pub(crate) const NORM_BACKWARD_SUBGROUP: Module = wgsl!(
    "norm_backward.wgsl+subgroups",
    7,
    [
        "elem_f32.wgsl",
        "combine_subgroup.wgsl",
        "combine.wgsl",
        "channel_walk.wgsl",
        "norm_backward.wgsl"
    ]
);

/// [`NORM_BACKWARD`] on f16 elements, for devices with `SHADER_F16`.
pub(crate) const NORM_BACKWARD_F16: Module = wgsl!(
    "norm_backward.wgsl+f16",
    7,
    [
        "elem_f16.wgsl",
        "combine_tree.wgsl",
        "combine.wgsl",
        "channel_walk.wgsl",
        "norm_backward.wgsl"
    ]
);

/// [`NORM_BACKWARD_SUBGROUP`] on f16 elements.
pub(crate) const NORM_BACKWARD_F16_SUBGROUP: Module = wgsl!(
    "norm_backward.wgsl+f16+subgroups",
    7,
    [
        "elem_f16.wgsl",
        "combine_subgroup.wgsl",
        "combine.wgsl",
        "channel_walk.wgsl",
        "norm_backward.wgsl"
    ]
);

/// `shaders/loss.wgsl`: the fused cross-entropy (logits, target words, per-row gradients, output,
/// error flag) on f32 elements, combining through a tree in workgroup memory.
pub(crate) const LOSS: Module = wgsl!(
    "loss.wgsl",
    5,
    [
        "elem_f32.wgsl",
        "combine_tree.wgsl",
        "combine.wgsl",
        "loss.wgsl"
    ]
);

/// [`LOSS`] combining through subgroup operations.
pub(crate) const LOSS_SUBGROUP: Module = wgsl!(
    "loss.wgsl+subgroups",
    5,
    [
        "elem_f32.wgsl",
        "combine_subgroup.wgsl",
        "combine.wgsl",
        "loss.wgsl"
    ]
);

/// [`LOSS`] on f16 elements, for devices with `SHADER_F16`.
pub(crate) const LOSS_F16: Module = wgsl!(
    "loss.wgsl+f16",
    5,
    [
        "elem_f16.wgsl",
        "combine_tree.wgsl",
        "combine.wgsl",
        "loss.wgsl"
    ]
);

/// [`LOSS_SUBGROUP`] on f16 elements.
pub(crate) const LOSS_F16_SUBGROUP: Module = wgsl!(
    "loss.wgsl+f16+subgroups",
    5,
    [
        "elem_f16.wgsl",
        "combine_subgroup.wgsl",
        "combine.wgsl",
        "loss.wgsl"
    ]
);

/// `shaders/cast.wgsl`: conversion and copy between any dtypes (source, destination).
pub(crate) const CAST: Module = wgsl!("cast.wgsl", 2, ["cast.wgsl"]);

/// `shaders/index.wgsl`: gathers by index tensors (input, output, index, error flag).
pub(crate) const INDEX: Module = wgsl!("index.wgsl", 4, ["index.wgsl"]);

/// `shaders/scan.wgsl`: cumulative sums and products along a dim, f32 (input, output).
pub(crate) const SCAN: Module = wgsl!("scan.wgsl", 2, ["wide.wgsl", "scan.wgsl"]);

/// `shaders/select.wgsl`: comparisons and selection by a mask, any dtype (a, b, c, output).
pub(crate) const SELECT: Module = wgsl!("select.wgsl", 4, ["order.wgsl", "select.wgsl"]);

/// `shaders/sort.wgsl`: stable sorts by ranks, any dtype (input, values, indices).
pub(crate) const SORT: Module = wgsl!("sort.wgsl", 3, ["order.wgsl", "sort.wgsl"]);

/// `shaders/random.wgsl`: uniform and normal fills (output) of f32 elements.
pub(crate) const RANDOM: Module = wgsl!(
    "random.wgsl",
    1,
    ["elem_f32.wgsl", "wide.wgsl", "counter.wgsl", "random.wgsl"]
);

/// `shaders/dropout.wgsl`: dropout (input, output) of f32 elements by the counter-based stream.
pub(crate) const DROPOUT: Module = wgsl!(
    "dropout.wgsl",
    2,
    ["elem_f32.wgsl", "wide.wgsl", "counter.wgsl", "dropout.wgsl"]
);

/// [`DROPOUT`] of f16 elements, for devices with `SHADER_F16`.
pub(crate) const DROPOUT_F16: Module = wgsl!(
    "dropout.wgsl+f16",
    2,
    ["elem_f16.wgsl", "wide.wgsl", "counter.wgsl", "dropout.wgsl"]
);

/// [`RANDOM`] of f16 elements, for devices with `SHADER_F16`.
pub(crate) const RANDOM_F16: Module = wgsl!(
    "random.wgsl+f16",
    1,
    ["elem_f16.wgsl", "wide.wgsl", "counter.wgsl", "random.wgsl"]
);

/// The module of a kernel with f32 math that serves `dtype` elements, with their size in bytes:
/// `f32` for f32, `f16` for f16 where the device has `SHADER_F16`; `None` for other dtypes (staged
/// through f32 copies, `staging.rs`).
pub(crate) fn for_dtype(
    gpu: &Gpu,
    dtype: DType,
    f32: Module,
    f16: Module,
) -> Option<(Module, usize)> {
    match dtype {
        DType::F32 => Some((f32, 4)),
        DType::F16 if gpu.features.contains(wgpu::Features::SHADER_F16) => Some((f16, 2)),
        _ => None,
    }
}

/// `plain`, or `with_subgroups` where the device has subgroups: the variants of a module that
/// combines across a workgroup (`shaders/combine.wgsl`).
pub(crate) fn combining(gpu: &Gpu, plain: Module, with_subgroups: Module) -> Module {
    if gpu.features.contains(wgpu::Features::SUBGROUP) {
        with_subgroups
    } else {
        plain
    }
}

/// Threads per workgroup of the 1-D kernels.
pub(crate) const WORKGROUP: u32 = 256;

/// A cached pipeline's key: module, entry point and the values of its override constants.
type Key = (&'static str, &'static str, Vec<(&'static str, u64)>);

/// Compiled modules and pipelines of one device.
#[derive(Debug, Default)]
pub(crate) struct Kernels {
    /// Keep built pipelines (the backend's `enable_pipeline_cache`).
    keep: bool,
    layouts: Mutex<HashMap<&'static str, Arc<(wgpu::BindGroupLayout, wgpu::PipelineLayout)>>>,
    modules: Mutex<HashMap<&'static str, Arc<wgpu::ShaderModule>>>,
    pipelines: Mutex<HashMap<Key, Arc<wgpu::ComputePipeline>>>,
    /// Callers' own kernels, by hash of the source and entry point.
    custom: Mutex<HashMap<(u64, String), Arc<wgpu::ComputePipeline>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Kernels {
    /// An empty cache that keeps what it builds when `keep`.
    pub fn new(keep: bool) -> Kernels {
        Kernels {
            keep,
            ..Kernels::default()
        }
    }

    /// Pipelines kept so far, custom ones included.
    pub fn pipeline_count(&self) -> usize {
        lock(&self.pipelines).len() + lock(&self.custom).len()
    }

    /// The pipeline of a caller's WGSL `source` at `entry_point`, built on first use with the layout
    /// wgpu derives from the shader. `KernelCompile` when it does not compile or validate.
    pub fn custom(
        &self,
        gpu: &Gpu,
        source: &str,
        entry_point: &str,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        let key = super::custom::custom_key(source, entry_point);
        if let Some(p) = lock(&self.custom).get(&key) {
            return Ok(Arc::clone(p));
        }
        let p = super::custom::build_custom(gpu, source, entry_point)?;
        if self.keep {
            lock(&self.custom).insert(key, Arc::clone(&p));
        }
        Ok(p)
    }

    fn layout(
        &self,
        gpu: &Gpu,
        module: Module,
    ) -> Arc<(wgpu::BindGroupLayout, wgpu::PipelineLayout)> {
        let mut layouts = lock(&self.layouts);
        let made = layouts.entry(module.name).or_insert_with(|| {
            let storage = |binding: u32, read_only: bool| wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            };
            let entries: Vec<_> = (0..module.data)
                .map(|b| storage(b, false))
                .chain(std::iter::once(storage(module.data, true)))
                .collect();
            let group = gpu
                .device
                .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some(module.name),
                    entries: &entries,
                });
            let pipeline = gpu
                .device
                .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                    label: Some(module.name),
                    bind_group_layouts: &[Some(&group)],
                    immediate_size: 0,
                });
            Arc::new((group, pipeline))
        });
        Arc::clone(made)
    }

    /// The pipeline for `entry` of `module` with override `constants`, built on first use.
    /// `KernelCompile` when the WGSL does not compile or validate on this device.
    fn pipeline(
        &self,
        gpu: &Gpu,
        module: Module,
        entry: &'static str,
        constants: &[(&'static str, u64)],
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        let key = (module.name, entry, constants.to_vec());
        if let Some(p) = lock(&self.pipelines).get(&key) {
            return Ok(Arc::clone(p));
        }
        let kernel = format!("{}:{entry}", module.name);
        let shader = {
            let mut modules = lock(&self.modules);
            match modules.get(module.name) {
                Some(m) => Arc::clone(m),
                None => {
                    let m = gpu
                        .scoped(&kernel, 0, || {
                            gpu.device
                                .create_shader_module(wgpu::ShaderModuleDescriptor {
                                    label: Some(module.name),
                                    source: wgpu::ShaderSource::Wgsl(module.source.into()),
                                })
                        })
                        .map_err(|e| as_compile_error(&kernel, e))?;
                    let m = Arc::new(m);
                    modules.insert(module.name, Arc::clone(&m));
                    m
                }
            }
        };
        let layout = self.layout(gpu, module);
        let values: Vec<(&str, f64)> = constants.iter().map(|&(n, v)| (n, v as f64)).collect();
        let pipeline = gpu
            .scoped(&kernel, 0, || {
                gpu.device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(entry),
                        layout: Some(&layout.1),
                        module: &shader,
                        entry_point: Some(entry),
                        compilation_options: wgpu::PipelineCompilationOptions {
                            constants: &values,
                            zero_initialize_workgroup_memory: false,
                        },
                        cache: None,
                    })
            })
            .map_err(|e| as_compile_error(&kernel, e))?;
        let pipeline = Arc::new(pipeline);
        if self.keep {
            lock(&self.pipelines).insert(key, Arc::clone(&pipeline));
        }
        Ok(pipeline)
    }

    /// Runs `entry` of `module` over `groups` workgroups with `buffers` bound at `0..module.data` and
    /// `params` as the parameter words, in one submission. `FeatureUnavailable` when an invocation
    /// would run more loop passes than the device's budget (`loops.rs`): the op should have cut
    /// its work, and where it cannot, that is its answer.
    pub fn dispatch(&self, gpu: &Gpu, call: Dispatch<'_>) -> Result<()> {
        let Dispatch {
            module,
            entry,
            constants,
            buffers,
            params,
            groups,
            loops,
        } = call;
        if groups.0 == 0 || groups.1 == 0 || groups.2 == 0 {
            return Ok(());
        }
        if loops > gpu.loop_limit {
            return Err(BackendError::FeatureUnavailable {
                feature: "WebGPU loop budget",
                reason: format!(
                    "{}:{entry} would run {loops} loop passes per invocation, past the budget of {} \
                     (software Vulkan such as lavapipe silently ends every loop of an invocation \
                     after 65 535 in all); run it on smaller operands",
                    module.name, gpu.loop_limit
                ),
            });
        }
        let limit = gpu.limits.max_compute_workgroups_per_dimension;
        if groups.0 > limit || groups.1 > limit || groups.2 > limit {
            return Err(BackendError::invalid(
                entry,
                format!(
                    "{groups:?} workgroups exceed the device's {limit} per dimension (internal: the launch should have been split)"
                ),
            ));
        }
        let pipeline = self.pipeline(gpu, module, entry, constants)?;
        let layout = self.layout(gpu, module);
        gpu.scoped(entry, 0, || {
            let words: &[u32] = if params.is_empty() { &[0] } else { params };
            let param_buffer = gpu
                .device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("torsh params"),
                    contents: bytemuck::cast_slice(words),
                    usage: wgpu::BufferUsages::STORAGE,
                });
            let entries: Vec<wgpu::BindGroupEntry<'_>> = buffers
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: b.resource(),
                })
                .chain(std::iter::once(wgpu::BindGroupEntry {
                    binding: module.data,
                    resource: param_buffer.as_entire_binding(),
                }))
                .collect();
            let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(entry),
                layout: &layout.0,
                entries: &entries,
            });
            let mut encoder = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(entry) });
            {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some(entry),
                    timestamp_writes: None,
                });
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &bind_group, &[]);
                pass.dispatch_workgroups(groups.0, groups.1, groups.2);
                gpu.count_launch();
            }
            gpu.submit(encoder.finish());
        })
    }
}

/// One kernel launch.
pub(crate) struct Dispatch<'a> {
    pub module: Module,
    pub entry: &'static str,
    /// Override constants and their values.
    pub constants: &'a [(&'static str, u64)],
    /// The data buffers (whole or windows of them), in binding order (`module.data` of them).
    pub buffers: &'a [Binding<'a>],
    /// The parameter words.
    pub params: &'a [u32],
    /// Workgroups in x, y, z.
    pub groups: (u32, u32, u32),
    /// The most loop passes one invocation runs, every loop of the kernel together (`loops.rs`).
    pub loops: u64,
}

/// Workgroups for `n` invocations of a 1-D kernel of [`WORKGROUP`] threads, as a 2-D grid whose rows
/// hold at most `limit` workgroups (the kernels rebuild the linear index from both dimensions).
pub(crate) fn grid_1d(n: usize, limit: u32) -> Result<(u32, u32, u32)> {
    let groups = n.div_ceil(WORKGROUP as usize);
    let limit = limit.max(1) as usize;
    let x = groups.min(limit);
    let y = groups.div_ceil(x.max(1));
    if y > limit {
        return Err(BackendError::invalid(
            "webgpu dispatch",
            format!("{n} elements need more than {limit}² workgroups"),
        ));
    }
    Ok((x as u32, y as u32, 1))
}

/// Workgroups for `rows` rows of one workgroup each, as a 2-D grid whose rows hold at most `limit`;
/// `None` beyond `limit`².
pub(crate) fn grid_rows(rows: usize, limit: u32) -> Option<(u32, u32, u32)> {
    let limit = limit.max(1) as usize;
    let x = rows.min(limit);
    let y = rows.div_ceil(x.max(1));
    (y <= limit).then_some((x as u32, y as u32, 1))
}

/// A shader that failed to build reports `KernelCompile` naming the kernel, whatever scope caught it.
fn as_compile_error(kernel: &str, e: BackendError) -> BackendError {
    match e {
        BackendError::Driver { message, .. } => BackendError::KernelCompile {
            backend: crate::device::BackendType::WebGpu,
            kernel: kernel.to_string(),
            log: message,
        },
        other => other,
    }
}

/// The `const <prefix><NAME>: u32 = <code>u;` lines of the WGSL source `src`, as `(NAME, code)`:
/// how the tests check the shaders' op codes against the op enums'.
#[cfg(test)]
pub(crate) fn shader_codes(src: &str, prefix: &str) -> Vec<(String, u32)> {
    src.lines()
        .filter_map(|l| l.strip_prefix("const ")?.strip_prefix(prefix))
        .filter_map(|l| {
            let (name, value) = l.split_once(": u32 = ")?;
            let code = value.strip_suffix("u;")?.parse().ok()?;
            Some((name.to_string(), code))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::grid_1d;

    #[test]
    fn large_launches_split_across_two_dimensions() {
        assert_eq!(grid_1d(1, 65_535).unwrap(), (1, 1, 1));
        assert_eq!(grid_1d(256 * 65_535, 65_535).unwrap(), (65_535, 1, 1));
        assert_eq!(grid_1d(256 * 65_535 + 1, 65_535).unwrap(), (65_535, 2, 1));
        assert!(grid_1d(usize::MAX / 2, 65_535).is_err());
    }
}
