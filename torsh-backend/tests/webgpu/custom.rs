//! Custom WGSL kernels on tensors, and their mistakes as typed errors.

use super::*;

/// A custom kernel: doubles each element, guarded by `arrayLength`.
const DOUBLE: &str = r#"
@group(0) @binding(0) var<storage, read> input: array<f32>;
@group(0) @binding(1) var<storage, read_write> output: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) global_id: vec3<u32>) {
    let index = global_id.x;
    if (index >= arrayLength(&output)) {
        return;
    }
    output[index] = input[index] * 2.0;
}
"#;

#[test]
fn custom_kernels_run_on_tensors() {
    let Some(b) = backend() else { return };
    let exec = webgpu::WebGpuKernelExecutor::new(&b).unwrap();
    let xs: Vec<f32> = (0..1000).map(|i| i as f32 * 0.25 - 7.0).collect();
    let input = b.from_slice(&xs, &[1000]).unwrap();
    let output = b.full(&[1000], f64::NAN, DType::F32).unwrap();
    webgpu::block_on(exec.execute_custom_kernel(
        DOUBLE,
        "main",
        &[&input, &output],
        (64, 1, 1),
        (16, 1, 1),
        None,
    ))
    .unwrap();
    let got = output.to_vec::<f32>().unwrap();
    assert_eq!(got, xs.iter().map(|x| x * 2.0).collect::<Vec<_>>());
    assert!(exec.pipeline_stats().pipeline_count >= 1);

    // Uniform data at the binding after the buffers.
    let scale = r#"
@group(0) @binding(0) var<storage, read_write> data: array<f32>;
struct Params { factor: f32, bias: f32 }
@group(0) @binding(1) var<uniform> params: Params;
@compute @workgroup_size(32, 2)
fn scale(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x * 2u + id.y;
    if (i < arrayLength(&data)) { data[i] = data[i] * params.factor + params.bias; }
}
"#;
    let uniforms: Vec<u8> = [3.0f32, 0.5].iter().flat_map(|v| v.to_le_bytes()).collect();
    webgpu::block_on(exec.execute_custom_kernel(
        scale,
        "scale",
        &[&output],
        (32, 2, 1),
        (16, 1, 1),
        Some(&uniforms),
    ))
    .unwrap();
    let scaled = output.to_vec::<f32>().unwrap();
    assert_eq!(
        scaled,
        xs.iter().map(|x| x * 2.0 * 3.0 + 0.5).collect::<Vec<_>>()
    );
}

#[test]
fn custom_kernel_mistakes_are_typed_errors() {
    let Some(b) = backend() else { return };
    let exec = webgpu::WebGpuKernelExecutor::new(&b).unwrap();
    let input = b.ones(&[64], DType::F32).unwrap();
    let output = b.zeros(&[64], DType::F32).unwrap();
    let run = |src: &str, entry: &str, bufs: &[&torsh_backend::Tensor], size, count| {
        webgpu::block_on(exec.execute_custom_kernel(src, entry, bufs, size, count, None))
    };
    // A syntax error: naga's message names the line.
    let broken = DOUBLE.replace("input[index] * 2.0;", "input[index] * ;");
    match run(&broken, "main", &[&input, &output], (64, 1, 1), (1, 1, 1)) {
        Err(BackendError::KernelCompile { log, .. }) => assert!(log.contains(':'), "{log}"),
        other => panic!("expected KernelCompile, got {other:?}"),
    }
    // A type error only validation finds.
    let mistyped = DOUBLE.replace("input[index] * 2.0", "input[index] * 2u");
    assert!(matches!(
        run(&mistyped, "main", &[&input, &output], (64, 1, 1), (1, 1, 1)),
        Err(BackendError::KernelCompile { .. })
    ));
    for (entry, size, count) in [
        ("missing", (64, 1, 1), (1, 1, 1)),
        ("main", (32, 1, 1), (1, 1, 1)),
        ("main", (64, 1, 1), (1 << 20, 1, 1)),
    ] {
        let r = run(DOUBLE, entry, &[&input, &output], size, count);
        assert!(
            matches!(r, Err(BackendError::InvalidArgument { .. })),
            "{entry} {size:?} {count:?}: {r:?}"
        );
    }
    let too_big = DOUBLE.replace("@workgroup_size(64)", "@workgroup_size(4096)");
    let r = run(
        &too_big,
        "main",
        &[&input, &output],
        (4096, 1, 1),
        (1, 1, 1),
    );
    assert!(
        matches!(r, Err(BackendError::InvalidArgument { .. })),
        "{r:?}"
    );
    // One buffer where the shader binds two: the driver's validation, as InvalidArgument.
    let r = run(DOUBLE, "main", &[&input], (64, 1, 1), (1, 1, 1));
    assert!(
        matches!(r, Err(BackendError::InvalidArgument { .. })),
        "{r:?}"
    );
    // A strided view, and a tensor of another backend.
    let m = b.ones(&[8, 8], DType::F32).unwrap();
    let r = run(
        DOUBLE,
        "main",
        &[&m.t().unwrap(), &output],
        (64, 1, 1),
        (1, 1, 1),
    );
    assert!(
        matches!(r, Err(BackendError::InvalidArgument { .. })),
        "{r:?}"
    );
    let cpu = Backend::cpu().build().unwrap();
    let foreign = cpu.ones(&[64], DType::F32).unwrap();
    let r = run(DOUBLE, "main", &[&foreign, &output], (64, 1, 1), (1, 1, 1));
    assert!(
        matches!(r, Err(BackendError::DeviceMismatch { .. })),
        "{r:?}"
    );
    assert!(matches!(
        webgpu::WebGpuKernelExecutor::new(&cpu),
        Err(BackendError::InvalidArgument { .. })
    ));
    // The backend still works after all of that.
    run(DOUBLE, "main", &[&input, &output], (64, 1, 1), (1, 1, 1)).unwrap();
    assert_eq!(output.to_vec::<f32>().unwrap(), vec![2.0; 64]);
}
