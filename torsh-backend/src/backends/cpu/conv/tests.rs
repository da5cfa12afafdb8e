//! Tests of the CPU conv2d against the reference.

use super::*;
use crate::backends::cpu::simd::SimdLevel;
use crate::compute::{Conv2dBackwardInputDesc, Conv2dBackwardWeightDesc};
use crate::dtype::DType;
use crate::rng::HostRng;

const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// A convolution to test: shapes and window parameters.
#[derive(Clone, Copy, Debug)]
struct Case {
    input: [usize; 4],
    k: usize,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    bias: bool,
}

impl Case {
    /// A stride-1, unpadded, undilated, ungrouped convolution with bias.
    fn new(input: [usize; 4], k: usize, kernel: [usize; 2]) -> Case {
        Case {
            input,
            k,
            kernel,
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            bias: true,
        }
    }
}

/// Norm-wise relative error bound per dtype.
fn bound(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        _ => 1e-2,
    }
}

/// A buffer of `n` random values in [−1, 1) of `dtype`.
fn random(mem: &mut HostMemory, rng: &mut HostRng, dtype: DType, n: usize) -> DevicePtr {
    let ptr = mem.alloc((n * dtype.size_in_bytes()).max(1)).unwrap();
    mem.store(dtype, ptr, &rng.uniform_vec(n, -1.0, 1.0))
        .unwrap();
    ptr
}

/// Runs `f` with a context of `threads` threads, inside a team of that size.
fn on_threads<R>(threads: usize, f: impl FnOnce(Ctx) -> R) -> R {
    crate::backends::cpu::team::on_threads(threads, f)
}

/// Compares every kernel that can compute `case` (the default, im2col, direct and, where it
/// applies, Winograd) with the reference in `dtype` on `threads` threads, each output poisoned with NaN
/// first.
fn check(case: Case, dtype: DType, threads: usize) {
    let mut mem = HostMemory::default();
    let mut rng = HostRng::new(case.input.iter().sum::<usize>() as u64 + case.k as u64);
    let [n, c, _, _] = case.input;
    let weight_shape = [case.k, c / case.groups, case.kernel[0], case.kernel[1]];
    let output_shape = Conv2dDesc::expected_output_shape(
        case.input,
        weight_shape,
        case.stride,
        case.padding,
        case.dilation,
        case.groups,
    )
    .unwrap();
    let outputs: usize = output_shape.iter().product();
    let input = random(&mut mem, &mut rng, dtype, case.input.iter().product());
    let weight = random(&mut mem, &mut rng, dtype, weight_shape.iter().product());
    let bias = case.bias.then(|| random(&mut mem, &mut rng, dtype, case.k));
    let size = dtype.size_in_bytes();
    let out = mem.alloc((outputs * size).max(1)).unwrap();
    let expected = mem.alloc((outputs * size).max(1)).unwrap();
    let desc = Conv2dDesc {
        dtype,
        input,
        input_shape: case.input,
        weight,
        weight_shape,
        bias,
        output: out,
        output_shape,
        stride: case.stride,
        padding: case.padding,
        dilation: case.dilation,
        groups: case.groups,
    };
    desc.accesses().unwrap();
    let oracle = Conv2dDesc {
        output: expected,
        ..desc
    };
    reference::conv2d(&mut mem, &oracle).unwrap();
    let mut algorithms = vec![
        Algorithm::Auto,
        Algorithm::Im2col,
        Algorithm::Direct,
        // The tiles of AVX-512 and of 16-byte vectors.
        Algorithm::DirectTiled(64),
        Algorithm::DirectTiled(16),
    ];
    if winograd_applies(&desc) {
        algorithms.push(Algorithm::Winograd);
    }
    for algorithm in algorithms {
        // The direct kernel's and the Winograd products' tiles are typed vectors of the level:
        // every level this CPU runs.
        // So are the depthwise kernel's tiles of several rows.
        let depthwise = case.groups == c && c > 0;
        let levels = match algorithm {
            Algorithm::Direct | Algorithm::DirectTiled(_) | Algorithm::Winograd => {
                SimdLevel::runnable()
            }
            Algorithm::Auto if depthwise => SimdLevel::runnable(),
            _ => vec![SimdLevel::detect()],
        };
        for simd in levels {
            mem.store(dtype, out, &vec![f64::NAN; outputs]).unwrap();
            on_threads(threads, |ctx| {
                conv2d_by(&mut mem, &desc, Ctx { simd, ..ctx }, algorithm)
            })
            .unwrap();
            let what = format!(
                "{algorithm:?} at {simd:?} {case:?} {dtype:?} on {threads} threads ({n} images)"
            );
            assert_close(&mut mem, dtype, (out, expected), outputs, &what);
        }
    }
}

/// Asserts that the `len` elements of `dtype` at `got` are those at `want` within the dtype's
/// norm-wise bound, NaN where they are NaN.
fn assert_close(
    mem: &mut HostMemory,
    dtype: DType,
    (got, want): (DevicePtr, DevicePtr),
    len: usize,
    what: &str,
) {
    let got = mem.load_dense(dtype, got, len).unwrap();
    let want = mem.load_dense(dtype, want, len).unwrap();
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.is_nan(), b.is_nan(), "{what}: element {i}");
        err += (a - b) * (a - b);
        norm += b * b;
    }
    let rel = (err / norm.max(f64::MIN_POSITIVE)).sqrt();
    assert!(rel <= bound(dtype), "{what}: relative error {rel:e}");
}

/// Compares both gradients of `case` (the input's with a bias when the case has one, as a
/// transposed convolution adds) with the reference in `dtype` on `threads` threads, each output
/// poisoned with NaN first.
fn check_backward(case: Case, dtype: DType, threads: usize) {
    let mut mem = HostMemory::default();
    let mut rng = HostRng::new(case.input.iter().sum::<usize>() as u64 + 7 * case.k as u64);
    let [_, c, _, _] = case.input;
    let weight_shape = [case.k, c / case.groups, case.kernel[0], case.kernel[1]];
    let window = (case.stride, case.padding, case.dilation, case.groups);
    let output_shape = Conv2dDesc::expected_output_shape(
        case.input,
        weight_shape,
        window.0,
        window.1,
        window.2,
        window.3,
    )
    .unwrap();
    let (inputs, weights): (usize, usize) =
        (case.input.iter().product(), weight_shape.iter().product());
    let size = dtype.size_in_bytes();
    let x = random(&mut mem, &mut rng, dtype, inputs);
    let w = random(&mut mem, &mut rng, dtype, weights);
    let dy = random(&mut mem, &mut rng, dtype, output_shape.iter().product());
    let bias = case.bias.then(|| random(&mut mem, &mut rng, dtype, c));
    let poisoned = |mem: &mut HostMemory, n: usize| {
        let p = mem.alloc((n * size).max(1)).unwrap();
        mem.store(dtype, p, &vec![f64::NAN; n]).unwrap();
        p
    };
    let (dx, dx_want) = (poisoned(&mut mem, inputs), poisoned(&mut mem, inputs));
    let input_desc = Conv2dBackwardInputDesc {
        dtype,
        grad_output: dy,
        grad_output_shape: output_shape,
        weight: w,
        weight_shape,
        bias,
        grad_input: dx,
        grad_input_shape: case.input,
        stride: case.stride,
        padding: case.padding,
        dilation: case.dilation,
        groups: case.groups,
    };
    input_desc.accesses().unwrap();
    on_threads(threads, |ctx| {
        backward::backward_input(&mut mem, &input_desc, ctx)
    })
    .unwrap();
    let oracle = Conv2dBackwardInputDesc {
        grad_input: dx_want,
        ..input_desc
    };
    reference::conv2d_backward_input(&mut mem, &oracle).unwrap();
    let what = format!("input gradient {case:?} {dtype:?} on {threads} threads");
    assert_close(&mut mem, dtype, (dx, dx_want), inputs, &what);

    let (dw, dw_want) = (poisoned(&mut mem, weights), poisoned(&mut mem, weights));
    let weight_desc = Conv2dBackwardWeightDesc {
        dtype,
        input: x,
        input_shape: case.input,
        grad_output: dy,
        grad_output_shape: output_shape,
        grad_weight: dw,
        weight_shape,
        stride: case.stride,
        padding: case.padding,
        dilation: case.dilation,
        groups: case.groups,
    };
    weight_desc.accesses().unwrap();
    on_threads(threads, |ctx| {
        backward::backward_weight(&mut mem, &weight_desc, ctx)
    })
    .unwrap();
    let oracle = Conv2dBackwardWeightDesc {
        grad_weight: dw_want,
        ..weight_desc
    };
    reference::conv2d_backward_weight(&mut mem, &oracle).unwrap();
    let what = format!("weight gradient {case:?} {dtype:?} on {threads} threads");
    assert_close(&mut mem, dtype, (dw, dw_want), weights, &what);
}

/// The gradients of `cases` in every dtype on 1, 2 and 3 threads.
fn check_backward_all(cases: &[Case]) {
    for &case in cases {
        for dtype in DTYPES {
            for threads in [1, 2, 3] {
                check_backward(case, dtype, threads);
            }
        }
    }
}

#[test]
fn gradients_match_the_reference() {
    check_backward_all(&[
        Case {
            padding: [1, 1],
            ..Case::new([2, 5, 9, 11], 7, [3, 3])
        },
        Case {
            stride: [2, 3],
            padding: [1, 2],
            dilation: [2, 1],
            bias: false,
            ..Case::new([3, 3, 13, 17], 4, [3, 2])
        },
        Case {
            groups: 2,
            padding: [1, 0],
            stride: [2, 1],
            ..Case::new([2, 6, 7, 5], 4, [3, 3])
        },
        // Depthwise with a channel multiplier, pointwise, strided pointwise, one element.
        Case {
            groups: 4,
            padding: [2, 1],
            dilation: [2, 2],
            ..Case::new([1, 4, 9, 10], 8, [3, 3])
        },
        Case::new([2, 6, 5, 7], 3, [1, 1]),
        Case {
            stride: [2, 2],
            ..Case::new([1, 6, 5, 7], 3, [1, 1])
        },
        Case::new([1, 1, 1, 1], 1, [1, 1]),
    ]);
}

/// Enough patch rows and positions that both gradients work in several blocks of positions and
/// several items, in parallel.
#[test]
fn blocked_gradients_match_the_reference() {
    for dtype in [DType::F32, DType::BF16] {
        for threads in [1, 4] {
            check_backward(
                Case {
                    padding: [1, 1],
                    ..Case::new([2, 64, 29, 31], 24, [3, 3])
                },
                dtype,
                threads,
            );
            check_backward(Case::new([1, 96, 41, 37], 40, [1, 1]), dtype, threads);
        }
    }
}

/// Every dtype on 1 and 2 threads.
fn check_all(case: Case) {
    for dtype in DTYPES {
        for threads in [1, 2] {
            check(case, dtype, threads);
        }
    }
}

#[test]
fn wide_pointwise_matches_the_reference() {
    // More output channels than one `NO_REPACK_COLS` block, which a pointwise product on one
    // thread computes whole; two images, so that two threads take a block of positions each.
    check_all(Case::new([2, 70, 13, 11], 67, [1, 1]));
    check_all(Case {
        bias: false,
        ..Case::new([1, 70, 13, 11], 67, [1, 1])
    });
}

#[test]
fn padded_3x3_matches_the_reference() {
    // Short output rows gather their patches through a table; rows of 32 or more copy segments.
    for input in [[2, 5, 9, 11], [1, 3, 5, 37]] {
        check_all(Case {
            padding: [1, 1],
            ..Case::new(input, 7, [3, 3])
        });
        check_backward_all(&[Case {
            padding: [1, 1],
            ..Case::new(input, 7, [3, 3])
        }]);
    }
}

#[test]
fn winograd_matches_the_reference() {
    // Odd and even output sizes (half tiles on the right and bottom), one output pixel, every
    // padding up to 2 and asymmetric, prime channel counts, deep channels, several images in a
    // group, planes cut into several blocks of tile rows, and a short last register tile.
    let cases = [
        (Case::new([1, 16, 3, 3], 16, [3, 3]), [0, 0]),
        (Case::new([2, 17, 7, 9], 19, [3, 3]), [1, 1]),
        (Case::new([1, 16, 5, 4], 23, [3, 3]), [0, 2]),
        (Case::new([1, 20, 13, 31], 16, [3, 3]), [2, 1]),
        (Case::new([3, 16, 12, 12], 16, [3, 3]), [1, 0]),
        (Case::new([1, 300, 6, 5], 24, [3, 3]), [1, 1]),
        (Case::new([1, 24, 61, 67], 32, [3, 3]), [1, 1]),
        (Case::new([1, 3, 1, 2], 5, [3, 3]), [1, 1]),
        // Output channels past a block of two vectors (a short last block), in five groups of
        // one image each (taken whole by two threads, shared out within by three).
        (Case::new([5, 64, 22, 23], 37, [3, 3]), [1, 1]),
    ];
    for (case, padding) in cases {
        let case = Case {
            padding,
            bias: padding != [1, 0],
            ..case
        };
        for dtype in DTYPES {
            for threads in [1, 2, 3] {
                check(case, dtype, threads);
            }
        }
    }
}

#[test]
fn winograd_reads_nothing_that_kept_scratch_held() {
    // Every kind of scratch kept between calls holds NaN before each call: the input transform's
    // padding, the products and the filters must all be written before they are read. One group
    // whose blocks transform their own filters (one thread), shared out by pieces of tiles (two),
    // and whole groups per thread, with tiles ending mid-panel.
    let cases = [
        (Case::new([1, 40, 14, 14], 40, [3, 3]), [1, 1]),
        (Case::new([5, 16, 11, 13], 20, [3, 3]), [1, 1]),
        (Case::new([1, 24, 61, 67], 32, [3, 3]), [0, 1]),
    ];
    for (case, padding) in cases {
        let case = Case { padding, ..case };
        for threads in [1, 2] {
            for dtype in [DType::F32, DType::F64] {
                winograd::keep_poisoned_scratch(f32::NAN, 1 << 16);
                winograd::keep_poisoned_scratch(f64::NAN, 1 << 16);
                check(case, dtype, threads);
            }
        }
    }
}

#[test]
fn direct_kernel_matches_the_reference() {
    // First layers: an RGB 7×7/2 stem whose output rows end in a short tile, a 5×5 grey layer of
    // two images, 11×11/4 with output channels past a register block, asymmetric windows,
    // strides, dilations and paddings (wider than the window), RGBA in two groups, one output
    // column, enough rows to cut the plane into bands, and a stem with more output channels than
    // a tile holds.
    let cases = [
        Case {
            stride: [2, 2],
            padding: [3, 3],
            ..Case::new([1, 3, 45, 37], 13, [7, 7])
        },
        Case::new([2, 1, 12, 28], 6, [5, 5]),
        Case {
            stride: [4, 4],
            padding: [2, 2],
            ..Case::new([1, 3, 47, 51], 7, [11, 11])
        },
        Case {
            stride: [3, 2],
            padding: [4, 5],
            dilation: [2, 3],
            bias: false,
            ..Case::new([1, 2, 17, 23], 5, [3, 2])
        },
        Case {
            groups: 2,
            stride: [1, 3],
            padding: [1, 1],
            ..Case::new([2, 4, 9, 40], 8, [3, 3])
        },
        Case::new([1, 3, 4, 4], 4, [4, 4]),
        Case {
            padding: [1, 1],
            ..Case::new([1, 4, 150, 131], 12, [3, 3])
        },
        // More output channels than two vectors of any level hold, the last block partial.
        Case {
            stride: [2, 2],
            padding: [3, 3],
            ..Case::new([1, 3, 29, 31], 37, [7, 7])
        },
        // Rows whose last tile of two vectors of channels is cut short to 8 pixels (19 = 12 + 7
        // on AVX-512) or left whole (22 = 12 + 10).
        Case {
            stride: [2, 2],
            padding: [3, 3],
            ..Case::new([1, 3, 11, 37], 37, [7, 7])
        },
        Case {
            stride: [2, 2],
            padding: [3, 3],
            ..Case::new([1, 3, 9, 43], 20, [7, 7])
        },
        // Rows narrower than the padding, so that some stride phases lie wholly in it.
        Case {
            stride: [2, 3],
            padding: [2, 2],
            bias: false,
            ..Case::new([3, 3, 6, 1], 3, [3, 4])
        },
        Case {
            stride: [2, 2],
            padding: [1, 3],
            ..Case::new([1, 3, 3, 1], 5, [3, 7])
        },
    ];
    for case in cases {
        for dtype in DTYPES {
            for threads in [1, 2, 3] {
                check(case, dtype, threads);
            }
        }
    }
}

#[test]
fn direct_kernel_is_the_default_for_few_input_channels() {
    let desc = |c: usize, kernel: usize, groups: usize| Conv2dDesc {
        dtype: DType::F32,
        input: DevicePtr(0),
        input_shape: [1, c, 32, 32],
        weight: DevicePtr(0),
        weight_shape: [16, c / groups, kernel, kernel],
        bias: None,
        output: DevicePtr(0),
        output_shape: [1, 16, 32 - kernel + 1, 32 - kernel + 1],
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
        groups,
    };
    for first_layer in [desc(3, 7, 1), desc(1, 5, 1), desc(4, 3, 1)] {
        assert!(direct_preferred(&first_layer), "{first_layer:?}");
    }
    for other in [
        desc(5, 3, 1),
        desc(3, 1, 1),
        desc(4, 3, 2),
        desc(64, 3, 1),
        desc(2, 3, 1),
    ] {
        assert!(!direct_preferred(&other), "{other:?}");
    }
    // Not the default, but timed by the autotuner.
    assert!(direct_offered(&desc(2, 3, 1)) && direct_offered(&desc(8, 3, 1)));
    assert!(!direct_offered(&desc(3, 7, 1)) && !direct_offered(&desc(32, 3, 1)));
}

#[test]
fn winograd_is_the_default_for_channel_rich_3x3() {
    let desc = |c: usize, k: usize, kernel: usize, stride: usize, groups: usize| Conv2dDesc {
        dtype: DType::F32,
        input: DevicePtr(0),
        input_shape: [1, c, 14, 14],
        weight: DevicePtr(0),
        weight_shape: [k, c / groups, kernel, kernel],
        bias: None,
        output: DevicePtr(0),
        output_shape: [1, k, 14 / stride, 14 / stride],
        stride: [stride, stride],
        padding: [kernel / 2, kernel / 2],
        dilation: [1, 1],
        groups,
    };
    assert!(winograd_preferred(&desc(64, 64, 3, 1, 1)));
    // One 7×7 image has 16 tiles, too few to repay the filter transform; two have 32.
    let small = |n: usize| Conv2dDesc {
        input_shape: [n, 512, 7, 7],
        weight_shape: [512, 512, 3, 3],
        output_shape: [n, 512, 7, 7],
        ..desc(64, 64, 3, 1, 1)
    };
    assert!(winograd_applies(&small(1)) && !winograd_preferred(&small(1)));
    assert!(winograd_preferred(&small(2)));
    // The parity cases' Winograd layer: 6 × 7 tiles.
    let deep = Conv2dDesc {
        input_shape: [1, 16, 11, 13],
        weight_shape: [17, 16, 3, 3],
        output_shape: [1, 17, 11, 13],
        ..desc(64, 64, 3, 1, 1)
    };
    assert!(winograd_preferred(&deep));
    assert!(winograd_applies(&desc(3, 64, 3, 1, 1)) && !winograd_preferred(&desc(3, 64, 3, 1, 1)));
    for other in [
        desc(64, 64, 5, 1, 1),
        desc(64, 64, 3, 2, 1),
        desc(64, 64, 3, 1, 2),
    ] {
        assert!(!winograd_applies(&other), "{other:?}");
    }
}

#[test]
fn winograd_on_a_shape_it_does_not_take_is_an_invalid_argument() {
    // A 5×5 window: the descriptor is valid, the kernel family is not, and nothing is written.
    let mut mem = HostMemory::default();
    let mut rng = HostRng::new(3);
    let input = random(&mut mem, &mut rng, DType::F32, 16 * 9 * 9);
    let weight = random(&mut mem, &mut rng, DType::F32, 16 * 16 * 25);
    let out = mem.alloc(16 * 9 * 9 * 4).unwrap();
    mem.store(DType::F32, out, &vec![f64::NAN; 16 * 81])
        .unwrap();
    let desc = Conv2dDesc {
        dtype: DType::F32,
        input,
        input_shape: [1, 16, 9, 9],
        weight,
        weight_shape: [16, 16, 5, 5],
        bias: None,
        output: out,
        output_shape: [1, 16, 9, 9],
        stride: [1, 1],
        padding: [2, 2],
        dilation: [1, 1],
        groups: 1,
    };
    desc.accesses().unwrap();
    let err = on_threads(1, |ctx| {
        conv2d_by(&mut mem, &desc, ctx, Algorithm::Winograd)
    });
    assert!(
        matches!(err, Err(BackendError::InvalidArgument { .. })),
        "{err:?}"
    );
    let untouched = mem.load_dense(DType::F32, out, 16 * 81).unwrap();
    assert!(untouched.iter().all(|v| v.is_nan()));
}

#[test]
fn winograd_blocks_with_non_finite_values_match_the_direct_sum() {
    // An infinity or NaN in the input, a transform that overflows, or an infinite or huge weight
    // must not turn outputs whose window does not read it into NaN (the transforms mix a 4×4
    // tile): those blocks, and convolutions with such weights, take the im2col path. On one
    // thread each block of output channels transforms its own filters; on two they are
    // transformed first.
    let (c, k, h, w) = (16, 16, 9, 10);
    let mut rng = HostRng::new(11);
    for (at, value, weight_at, threads) in [
        (Some(3 * h * w + 4 * w + 5), f64::INFINITY, None, 1),
        (Some(3 * h * w + 4 * w + 5), f64::INFINITY, None, 2),
        (Some(h * w - 1), f64::NAN, None, 2),
        (Some(8), 3e38, None, 1),
        (None, f64::INFINITY, Some(5), 1),
        (None, f64::INFINITY, Some(5), 2),
        (None, 3e38, Some(9 * c * k - 1), 1),
        (None, 3e38, Some(9 * c * k - 1), 2),
    ] {
        let mut mem = HostMemory::default();
        let input = random(&mut mem, &mut rng, DType::F32, 2 * c * h * w);
        let weight = random(&mut mem, &mut rng, DType::F32, k * c * 9);
        if let Some(at) = at {
            mem.store(DType::F32, input.offset(4 * at).unwrap(), &[value, value])
                .unwrap();
        }
        if let Some(at) = weight_at {
            mem.store(DType::F32, weight.offset(4 * at).unwrap(), &[value])
                .unwrap();
        }
        let outputs = 2 * k * h * w;
        let [out, expected] = [0, 1].map(|_| mem.alloc(outputs * 4).unwrap());
        let desc = Conv2dDesc {
            dtype: DType::F32,
            input,
            input_shape: [2, c, h, w],
            weight,
            weight_shape: [k, c, 3, 3],
            bias: None,
            output: out,
            output_shape: [2, k, h, w],
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
        };
        mem.store(DType::F32, out, &vec![f64::NAN; outputs])
            .unwrap();
        on_threads(threads, |ctx| {
            conv2d_by(&mut mem, &desc, ctx, Algorithm::Winograd)
        })
        .unwrap();
        let oracle = Conv2dDesc {
            output: expected,
            ..desc
        };
        on_threads(1, |ctx| {
            conv2d_by(&mut mem, &oracle, ctx, Algorithm::Im2col)
        })
        .unwrap();
        let got = mem.load_dense(DType::F32, out, outputs).unwrap();
        let want = mem.load_dense(DType::F32, expected, outputs).unwrap();
        assert!(want.iter().any(|v| v.is_finite()));
        for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
            let close = a == b || (a - b).abs() <= 1e-5 * (1.0 + b.abs());
            assert!(
                a.is_nan() == b.is_nan() && (b.is_nan() || close),
                "{value} at {at:?}, weight {weight_at:?}, {threads} threads: element {i}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn empty_input_planes_with_padding_match_the_reference() {
    // Every tap falls in the padding: the output is the bias (or zeros), the input gradient empty.
    for (input, kernel, padding) in [
        ([1, 1, 0, 3], [1, 1], [1, 1]),
        ([2, 3, 0, 0], [3, 3], [2, 2]),
    ] {
        let case = Case {
            padding,
            ..Case::new(input, 4, kernel)
        };
        check_all(case);
        check_backward_all(&[case]);
    }
}

#[test]
fn stride_padding_and_dilation_match_the_reference() {
    check_all(Case {
        stride: [2, 3],
        padding: [1, 2],
        dilation: [2, 1],
        bias: false,
        ..Case::new([3, 3, 13, 17], 4, [3, 2])
    });
    check_all(Case {
        stride: [2, 2],
        padding: [3, 3],
        ..Case::new([1, 3, 23, 23], 8, [7, 7])
    });
}

#[test]
fn groups_match_the_reference() {
    check_all(Case {
        groups: 2,
        padding: [1, 0],
        bias: false,
        ..Case::new([2, 6, 7, 5], 4, [3, 3])
    });
    check_all(Case {
        groups: 3,
        stride: [2, 1],
        ..Case::new([1, 6, 8, 9], 9, [1, 2])
    });
}

#[test]
fn depthwise_matches_the_reference() {
    // One output channel per input channel, strides 1 and 2, then a channel multiplier of 2.
    for stride in [[1, 1], [2, 2], [1, 3]] {
        check_all(Case {
            groups: 8,
            stride,
            padding: [1, 1],
            ..Case::new([2, 8, 11, 13], 8, [3, 3])
        });
    }
    check_all(Case {
        groups: 4,
        padding: [2, 1],
        dilation: [2, 2],
        bias: false,
        ..Case::new([1, 4, 9, 10], 8, [3, 3])
    });
    // A single input channel takes the same kernel.
    check_all(Case::new([2, 1, 6, 7], 3, [2, 2]));
}

#[test]
fn unit_stride_depthwise_tiles_match_the_reference() {
    // Stride 1 runs in tiles of 64, 32, 16 or 8 columns, partial ones at the row's end: widths that
    // take each tile (and 1, 9, 33, 49 and 70, just past a width), with rows of 3, 5 and 7 taps (the
    // unrolled kernels), 2 and 3 with dilation 2 (the general one), and a channel multiplier of 2.
    for width in [1, 8, 9, 17, 28, 33, 49, 56, 70] {
        for (kernel, padding, dilation) in [
            ([3, 3], [1, 1], [1, 1]),
            ([5, 5], [2, 2], [1, 1]),
            ([1, 7], [0, 3], [1, 1]),
            ([2, 3], [1, 2], [2, 2]),
        ] {
            check_all(Case {
                groups: 3,
                padding,
                dilation,
                bias: width % 2 == 0,
                ..Case::new([1, 3, 4, width], 3 * (1 + width % 2), kernel)
            });
        }
    }
}

#[test]
fn multi_row_depthwise_tiles_match_the_reference() {
    // Stride-1 square windows of 3, 5 and 7 taps at dilation 1 run several output rows per
    // register tile (f32 and f64): heights that leave every remainder of rows to the one-row
    // tiles, vertical padding on either side or none, widths past one and several vectors, and
    // channel multipliers of 1 and 2; on 2 threads the bands split the rows as well.
    for height in [1, 2, 3, 4, 5, 6, 7, 9, 13] {
        for (k, padding) in [(3, [1, 1]), (3, [0, 2]), (5, [2, 2]), (7, [3, 1])] {
            if height + 2 * padding[0] < k {
                continue;
            }
            check_all(Case {
                groups: 2,
                padding,
                bias: height % 2 == 1,
                ..Case::new([2, 2, height, 3 + 7 * height], 2 * (1 + height % 2), [k, k])
            });
        }
    }
    // The tiles read the input rows in place, loading only the lanes inside a row: horizontal
    // padding past the window's reach (output columns that read padding alone), rows narrower
    // than a vector, and rows several tiles wide, whose inner tiles read whole vectors.
    for (width, padding) in [
        (5, [1, 4]),
        (2, [2, 3]),
        (20, [2, 6]),
        (131, [1, 1]),
        (131, [3, 2]),
    ] {
        for k in [3, 5, 7] {
            check_all(Case {
                groups: 2,
                padding,
                ..Case::new([1, 2, 9, width], 2, [k, k])
            });
        }
    }
    // Vertical strides other than 1 with stride 1 along the row take the one-row tiles.
    for stride in [[2, 1], [3, 1], [1, 2]] {
        for k in [3, 5] {
            check_all(Case {
                groups: 3,
                stride,
                padding: [2, 1],
                ..Case::new([1, 3, 17, 23], 3, [k, k])
            });
        }
    }
}

#[test]
fn pointwise_matches_the_reference() {
    check_all(Case::new([2, 6, 5, 7], 5, [1, 1]));
    check_all(Case {
        groups: 2,
        bias: false,
        ..Case::new([1, 4, 3, 3], 6, [1, 1])
    });
    // 1×1 with a stride or padding goes through im2col.
    check_all(Case {
        stride: [2, 2],
        padding: [1, 0],
        ..Case::new([1, 3, 7, 6], 4, [1, 1])
    });
}

#[test]
fn large_convolutions_block_and_thread() {
    // Two column blocks of patches, items in parallel.
    check_all(Case {
        padding: [1, 1],
        ..Case::new([1, 16, 41, 39], 16, [3, 3])
    });
    // Several images in parallel, no bias.
    check_all(Case {
        padding: [1, 1],
        bias: false,
        ..Case::new([3, 8, 29, 28], 8, [3, 3])
    });
    // A small image with deep channels: one block, threads inside the GEMM.
    check_all(Case {
        padding: [1, 1],
        ..Case::new([1, 48, 7, 7], 48, [3, 3])
    });
    // Patch rows beyond the budget: the rows are split and the GEMMs accumulate.
    check_all(Case {
        padding: [1, 1],
        ..Case::new([1, 260, 4, 5], 3, [3, 3])
    });
    // Pointwise over a large image, split across threads; a large depthwise layer.
    check_all(Case::new([1, 32, 40, 41], 24, [1, 1]));
    check_all(Case {
        groups: 16,
        padding: [1, 1],
        ..Case::new([2, 16, 45, 47], 16, [3, 3])
    });
    check_all(Case {
        groups: 6,
        stride: [2, 2],
        padding: [2, 3],
        dilation: [1, 2],
        bias: false,
        ..Case::new([1, 6, 21, 75], 12, [3, 4])
    });
    // Few, wide planes: several bands of rows per plane (by the cache budget, and for threads).
    check_all(Case {
        groups: 2,
        padding: [1, 1],
        ..Case::new([1, 2, 60, 1500], 2, [3, 3])
    });
    check_all(Case {
        groups: 3,
        stride: [2, 2],
        padding: [2, 0],
        dilation: [2, 1],
        ..Case::new([1, 3, 71, 901], 3, [3, 5])
    });
}

#[test]
fn no_input_channels_gives_the_bias() {
    for dtype in DTYPES {
        check(Case::new([2, 0, 4, 4], 3, [3, 3]), dtype, 1);
    }
}

#[test]
fn non_finite_inputs_propagate() {
    let mut mem = HostMemory::default();
    let mut rng = HostRng::new(7);
    let input = random(&mut mem, &mut rng, DType::F32, 2 * 3 * 5 * 5);
    let weight = random(&mut mem, &mut rng, DType::F32, 4 * 3 * 3 * 3);
    mem.store(DType::F32, input, &[f64::NAN, f64::INFINITY])
        .unwrap();
    let [out, expected] = [0, 1].map(|_| mem.alloc(2 * 4 * 25 * 4).unwrap());
    let desc = Conv2dDesc {
        dtype: DType::F32,
        input,
        input_shape: [2, 3, 5, 5],
        weight,
        weight_shape: [4, 3, 3, 3],
        bias: None,
        output: out,
        output_shape: [2, 4, 5, 5],
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
        groups: 1,
    };
    on_threads(1, |ctx| conv2d(&mut mem, &desc, ctx)).unwrap();
    let oracle = Conv2dDesc {
        output: expected,
        ..desc
    };
    reference::conv2d(&mut mem, &oracle).unwrap();
    let got = mem.load_dense(DType::F32, out, 200).unwrap();
    let want = mem.load_dense(DType::F32, expected, 200).unwrap();
    assert!(want.iter().any(|v| v.is_nan()) && want.iter().any(|v| v.is_infinite()));
    for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
        let close = a == b || (a - b).abs() <= 1e-5 * (1.0 + b.abs());
        assert!(
            a.is_nan() == b.is_nan() && (b.is_nan() || close),
            "element {i}: {a} vs {b}"
        );
    }
}

#[test]
fn plans_bound_the_patch_block() {
    let g = |input: [usize; 4], k, r, oh| Geometry {
        n: input[0],
        c: input[1],
        h: input[2],
        w: input[3],
        k,
        cg: input[1],
        r,
        s: r,
        oh,
        ow: oh,
        groups: 1,
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
    };
    let resnet = g([1, 64, 56, 56], 64, 3, 56);
    let one = Plan::new(&resnet, 1, 4, false);
    assert!(one.rows * one.cols * 4 <= COL_BYTES && one.rows == 576);
    assert!(!one.parallel && one.blocks * one.cols >= 3136);
    let two = Plan::new(&resnet, 2, 4, false);
    assert!(two.parallel && two.blocks >= 4);
    let deep = g([1, 512, 7, 7], 512, 3, 7);
    let plan = Plan::new(&deep, 2, 4, false);
    assert!(!plan.parallel && matches!(plan.inner, Parallelism::Rayon(2)));
    assert!(plan.rows * plan.cols * 4 <= COL_BYTES.max(MIN_COLS * 4 * plan.rows));
}
