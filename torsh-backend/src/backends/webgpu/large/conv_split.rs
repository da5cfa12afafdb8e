//! conv2d where even one image is larger than one storage binding (a high-resolution feature map,
//! say), which the cut by image ([`pieces::conv2d`]) cannot fit, or where a group's (input channel,
//! tap) pairs are more than one launch takes within the loop budget (`loops.rs`).
//!
//! Each image is cut by channels instead, the fewest pieces first:
//! - blocks of whole groups (grouped and depthwise convolutions), each a convolution of its own;
//! - else, group by group, blocks of output channels (a block of the weight and of the output, the
//!   group's input whole);
//! - else, also blocks of input channels, whose partial sums accumulate into each output block. The
//!   block's weights (strided in the weight tensor) are copied dense first, the first input block
//!   adds the bias, and each later one is convolved into a scratch block and added. 16-bit operands
//!   are cast to f32 blocks and the sum is rounded once at the end, as one launch rounds it, so no
//!   partial sum is rounded to 16 bits.
//!
//! Blocks without an input cut run in the operands' dtype, as any convolution does; those with one
//! are budgeted for their f32 copies. Only cuts whose blocks of input channels a launch takes
//! within the loop budget are tried. A convolution no cut fits (one output channel of one image
//! over one input channel larger than a binding, or one input channel's taps more than the loop
//! budget allows) answers `FeatureUnavailable`.
//!
//! [`pieces::conv2d`]: super::pieces::conv2d

use crate::compute::{
    Access, Accesses, BinaryDesc, BinaryOp, CastDesc, ComputeBackend, Conv2dDesc, CopyDesc,
    DevicePtr, InPlace, StridedBuf, Temporaries, Value,
};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::shape::Layout;

use super::super::conv;
use super::super::WebGpuBackend;
use super::cuts::{advance, cuts, Cut};

/// One piece of one image: a range of groups (several whole ones, or one), and within a single
/// group ranges of its output and input channels, each `(start, len)`.
#[derive(Clone, Copy, Debug)]
struct Part {
    image: usize,
    groups: (usize, usize),
    outputs: (usize, usize),
    inputs: (usize, usize),
}

/// The sizes of `desc` a part needs.
struct Dims {
    c: usize,
    plane: usize,
    k: usize,
    kg: usize,
    cg: usize,
    taps: usize,
    out_plane: usize,
}

impl Dims {
    fn of(desc: &Conv2dDesc) -> Dims {
        let [_, c, h, w] = desc.input_shape;
        let [k, cg, r, s] = desc.weight_shape;
        let [_, _, oh, ow] = desc.output_shape;
        Dims {
            c,
            plane: h * w,
            k,
            kg: k / desc.groups,
            cg,
            taps: r * s,
            out_plane: oh * ow,
        }
    }
}

impl Part {
    /// Whether the part takes a block of its group's input channels, so that its sums accumulate.
    fn cuts_inputs(&self, d: &Dims) -> bool {
        self.inputs.1 < d.cg
    }

    /// First output channel and number of output channels.
    fn output_channels(&self, d: &Dims) -> (usize, usize) {
        (
            self.groups.0 * d.kg + self.outputs.0,
            self.groups.1 * self.outputs.1,
        )
    }

    /// First input channel and number of input channels.
    fn input_channels(&self, d: &Dims) -> (usize, usize) {
        (
            self.groups.0 * d.cg + self.inputs.0,
            self.groups.1 * self.inputs.1,
        )
    }

    /// The part as a convolution of `desc`'s own operands; its weight block is dense only when the
    /// part does not cut the input channels (`weight_shape` then is its shape, else the shape of
    /// its dense copy).
    fn desc(&self, desc: &Conv2dDesc, d: &Dims) -> Result<Conv2dDesc> {
        let size = desc.dtype.size_in_bytes();
        let (k0, kn) = self.output_channels(d);
        let (c0, cn) = self.input_channels(d);
        let [_, _, h, w] = desc.input_shape;
        let [_, _, r, s] = desc.weight_shape;
        let [_, _, oh, ow] = desc.output_shape;
        Ok(Conv2dDesc {
            input: advance(desc.input, self.image * d.c * d.plane + c0 * d.plane, size)?,
            input_shape: [1, cn, h, w],
            weight: advance(
                desc.weight,
                k0 * d.cg * d.taps + self.inputs.0 * d.taps,
                size,
            )?,
            weight_shape: [kn, cn / self.groups.1, r, s],
            bias: desc.bias.map(|b| advance(b, k0, size)).transpose()?,
            output: advance(
                desc.output,
                self.image * d.k * d.out_plane + k0 * d.out_plane,
                size,
            )?,
            output_shape: [1, kn, oh, ow],
            groups: self.groups.1,
            ..desc.clone()
        })
    }

    /// The part's weight block as a view: one row per output channel, its input channels' taps.
    fn weight_view(&self, desc: &Conv2dDesc, d: &Dims) -> Result<StridedBuf> {
        let (k0, kn) = self.output_channels(d);
        let offset = k0 * d.cg * d.taps + self.inputs.0 * d.taps;
        Ok(StridedBuf {
            ptr: desc.weight,
            layout: Layout::new(
                vec![kn, self.inputs.1 * d.taps],
                vec![d.cg * d.taps, 1],
                offset,
            )?,
        })
    }

    /// The regions the part touches in `desc`'s operands: with an input cut, its weight block
    /// spans whole rows of the weight tensor but the last.
    fn accesses(&self, desc: &Conv2dDesc, d: &Dims) -> Result<Accesses> {
        let part = self.desc(desc, d)?;
        if !self.cuts_inputs(d) {
            return part.accesses();
        }
        let (_, kn) = self.output_channels(d);
        let weight_span = (kn - 1) * d.cg * d.taps + self.inputs.1 * d.taps;
        let mut acc = Accesses::new("conv2d", InPlace::Forbidden);
        let dtype = desc.dtype;
        acc.push_dense("input", part.input, &part.input_shape, dtype, Access::Read)?;
        acc.push_dense("weight", part.weight, &[weight_span], dtype, Access::Read)?;
        if let Some(bias) = part.bias {
            acc.push_dense("bias", bias, &[kn], dtype, Access::Read)?;
        }
        acc.push_dense(
            "output",
            part.output,
            &part.output_shape,
            dtype,
            Access::ReadWrite,
        )?;
        Ok(acc)
    }
}

/// A cut of each image: ranges of whole groups, or in every group ranges of its output channels
/// and of its input channels.
enum ChannelCut {
    Groups(Cut),
    Channels(Cut, Cut),
}

impl ChannelCut {
    /// The (input channel, tap) pairs of a group one launch of the cut's parts runs over.
    fn depth(&self, d: &Dims) -> usize {
        match *self {
            ChannelCut::Groups(_) => d.cg * d.taps,
            ChannelCut::Channels(_, ins) => ins.longest() * d.taps,
        }
    }

    /// The cut's parts of image `image` of a convolution of `groups` groups, in the order they run
    /// (the input blocks of one output block in turn).
    fn parts(&self, image: usize, groups: usize, d: &Dims) -> Box<dyn Iterator<Item = Part>> {
        let (kg, cg) = (d.kg, d.cg);
        match *self {
            ChannelCut::Groups(blocks) => Box::new(blocks.ranges().map(move |groups| Part {
                image,
                groups,
                outputs: (0, kg),
                inputs: (0, cg),
            })),
            ChannelCut::Channels(outs, ins) => Box::new((0..groups).flat_map(move |g| {
                outs.ranges().flat_map(move |outputs| {
                    ins.ranges().map(move |inputs| Part {
                        image,
                        groups: (g, 1),
                        outputs,
                        inputs,
                    })
                })
            })),
        }
    }
}

/// The candidate cuts, fewest parts first: blocks of whole groups, then within each group blocks
/// of output channels, then blocks of output and input channels.
fn candidates(desc: &Conv2dDesc, d: &Dims) -> Vec<ChannelCut> {
    let mut all = Vec::new();
    if desc.groups > 1 {
        all.extend(cuts(desc.groups).into_iter().map(ChannelCut::Groups));
    }
    let (outs, ins) = (cuts(d.kg), cuts(d.cg));
    let mut blocks: Vec<(Cut, Cut)> = outs
        .iter()
        .flat_map(|&o| ins.iter().map(move |&i| (o, i)))
        .collect();
    blocks.sort_by_key(|&(o, i)| (i.count() > 1, o.count() * i.count()));
    all.extend(blocks.into_iter().map(|(o, i)| ChannelCut::Channels(o, i)));
    all
}

/// `desc`, a convolution one of whose images is larger than a binding, by channels of each image.
pub(crate) fn conv2d(be: &WebGpuBackend, desc: &Conv2dDesc) -> Result<()> {
    let d = Dims::of(desc);
    let f32_copies = (4 / desc.dtype.size_in_bytes()).max(1);
    let fits = |p: &Part| -> Result<bool> {
        let widen = if p.cuts_inputs(&d) { f32_copies } else { 1 };
        be.fits(&p.accesses(desc, &d)?, desc.dtype, widen)
    };
    let images = 0..desc.input_shape[0];
    let max_depth = conv::max_depth(&be.state()?.device.gpu).unwrap_or(0);
    'cuts: for cut in candidates(desc, &d) {
        if cut.depth(&d) > max_depth {
            continue;
        }
        for image in images.clone() {
            for p in cut.parts(image, desc.groups, &d) {
                if !fits(&p)? {
                    continue 'cuts;
                }
            }
        }
        let temps = Temporaries::new(be);
        let mut scratch = None;
        for image in images {
            for p in cut.parts(image, desc.groups, &d) {
                run(be, desc, &d, &p, &temps, &mut scratch)?;
            }
        }
        return Ok(());
    }
    if d.taps > max_depth {
        return Err(BackendError::FeatureUnavailable {
            feature: "WebGPU loop budget",
            reason: format!(
                "conv2d: the {} taps of one input channel need more loop passes than the \
                 budget of {}; run it with a smaller kernel",
                d.taps,
                be.state()?.device.gpu.loop_limit
            ),
        });
    }
    Err(BackendError::FeatureUnavailable {
        feature: "ops spanning more than one storage binding",
        reason: "conv2d: one output channel of one image over one input channel takes more than \
                 a storage binding; run it on smaller images"
            .into(),
    })
}

/// Runs part `p`: without an input cut as a convolution of its own, with one accumulating into
/// its output block in f32 (`scratch` made at the first such part, as large as the largest).
fn run(
    be: &WebGpuBackend,
    desc: &Conv2dDesc,
    d: &Dims,
    p: &Part,
    temps: &Temporaries<'_, WebGpuBackend>,
    scratch: &mut Option<Scratch>,
) -> Result<()> {
    if !p.cuts_inputs(d) {
        return be.run(&p.desc(desc, d)?, conv::conv2d);
    }
    let buffers = match *scratch {
        Some(s) => s,
        None => *scratch.insert(Scratch::new(temps, desc, d, p)?),
    };
    accumulate(be, desc, d, p, buffers)
}

/// f32 scratch for the parts with an input cut, each as large as the largest part needs.
#[derive(Clone, Copy)]
struct Scratch {
    /// The dense copy of a weight block.
    weight: DevicePtr,
    /// A later input block's partial sums.
    partial: DevicePtr,
    /// 16-bit operands only: an input block, the output block's sums and a bias block, in f32.
    input: Option<DevicePtr>,
    sums: Option<DevicePtr>,
    bias: Option<DevicePtr>,
}

impl Scratch {
    /// Scratch for parts like `p`: all of one cut's parts with an input cut are as large as it or
    /// smaller (the last block of each range is the shortest).
    fn new(
        temps: &Temporaries<'_, WebGpuBackend>,
        desc: &Conv2dDesc,
        d: &Dims,
        p: &Part,
    ) -> Result<Scratch> {
        let outputs = p.outputs.1 * d.out_plane * 4;
        let widened = desc.dtype != DType::F32;
        let f32_only = |bytes: usize| -> Result<Option<DevicePtr>> {
            widened.then(|| temps.alloc(bytes)).transpose()
        };
        Ok(Scratch {
            weight: temps.alloc(p.outputs.1 * p.inputs.1 * d.taps * 4)?,
            partial: temps.alloc(outputs)?,
            input: f32_only(p.inputs.1 * d.plane * 4)?,
            sums: f32_only(outputs)?,
            bias: match desc.bias {
                Some(_) => f32_only(p.outputs.1 * 4)?,
                None => None,
            },
        })
    }
}

/// The f32 view `dense` of `view`: a cast into it, or for f32 a copy.
fn dense_f32(be: &WebGpuBackend, dtype: DType, view: StridedBuf, dense: DevicePtr) -> Result<()> {
    if dtype == DType::F32 {
        let shape = view.layout.shape().to_vec();
        return be.copy_strided(&CopyDesc {
            dtype,
            src: view,
            dst: StridedBuf::contiguous(dense, &shape),
        });
    }
    be.cast(&CastDesc {
        src_dtype: dtype,
        dst_dtype: DType::F32,
        input: view,
        output: dense,
    })
}

/// Part `p` (one input block of one output block): convolves its input block with its weight
/// block (plus the bias when it is the group's first input block) in f32, into the output block
/// for the first and added to it for the others; the last rounds 16-bit sums into the output.
fn accumulate(be: &WebGpuBackend, desc: &Conv2dDesc, d: &Dims, p: &Part, s: Scratch) -> Result<()> {
    let part = p.desc(desc, d)?;
    let (_, kn) = p.output_channels(d);
    let first = p.inputs.0 == 0;
    let last = p.inputs.0 + p.inputs.1 == d.cg;
    let outputs = kn * d.out_plane;
    let contiguous = |ptr: DevicePtr, len: usize| StridedBuf::contiguous(ptr, &[len]);
    let input = match s.input {
        Some(f32_input) => {
            let len = part.input_shape.iter().product();
            dense_f32(be, desc.dtype, contiguous(part.input, len), f32_input)?;
            f32_input
        }
        None => part.input,
    };
    dense_f32(be, desc.dtype, p.weight_view(desc, d)?, s.weight)?;
    let bias = match (part.bias, s.bias) {
        _ if !first => None,
        (Some(b), Some(f32_bias)) => {
            dense_f32(be, desc.dtype, contiguous(b, kn), f32_bias)?;
            Some(f32_bias)
        }
        (b, _) => b,
    };
    let sums = s.sums.unwrap_or(part.output);
    be.run(
        &Conv2dDesc {
            dtype: DType::F32,
            input,
            weight: s.weight,
            bias,
            output: if first { sums } else { s.partial },
            ..part.clone()
        },
        conv::conv2d,
    )?;
    if !first {
        be.binary(&BinaryDesc {
            op: BinaryOp::Add,
            dtype: DType::F32,
            lhs: contiguous(sums, outputs),
            rhs: Value::Tensor(contiguous(s.partial, outputs)),
            output: sums,
        })?;
    }
    if last && s.sums.is_some() {
        be.cast(&CastDesc {
            src_dtype: DType::F32,
            dst_dtype: desc.dtype,
            input: contiguous(sums, outputs),
            output: part.output,
        })?;
    }
    Ok(())
}
