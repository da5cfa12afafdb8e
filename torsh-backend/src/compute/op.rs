//! One definition per op. Every descriptor implements [`OpDesc`]: its name, the checks and regions
//! of `accesses()`, the device operands it names and how to run it on a device. Everything that
//! handles ops in general — graph capture and replay, relocation of captured pointers, WebGPU
//! staging, backends that stand in front of another, the error tests — works from that trait, and
//! [`for_each_op!`](crate::for_each_op), next to the trait in `compute/mod.rs`, lists the op methods
//! of [`ComputeBackend`] once for the places that must write one method per op.

use std::any::Any;
use std::fmt::Debug;

use super::access::Accesses;
use super::desc::StridedBuf;
use super::{ComputeBackend, DevicePtr};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// Where a descriptor keeps one operand's address.
#[derive(Debug)]
pub enum Slot<'a> {
    /// A dense operand: its base pointer.
    Dense(&'a mut DevicePtr),
    /// A strided view: base pointer and layout.
    Strided(&'a mut StridedBuf),
}

/// One device operand of an op, borrowed from its descriptor.
#[derive(Debug)]
pub struct Operand<'a> {
    /// The name of its region in the descriptor's `accesses()` ("a", "input", "found_inf", ...).
    pub name: &'static str,
    /// Its element dtype.
    pub dtype: DType,
    /// Where the descriptor keeps its address.
    pub slot: Slot<'a>,
}

impl<'a> Operand<'a> {
    /// A dense operand named `name`, of `dtype` elements, at `*ptr`.
    pub fn dense(name: &'static str, dtype: DType, ptr: &'a mut DevicePtr) -> Self {
        Operand {
            name,
            dtype,
            slot: Slot::Dense(ptr),
        }
    }

    /// A strided operand named `name`, of `dtype` elements, viewed by `*buf`.
    pub fn strided(name: &'static str, dtype: DType, buf: &'a mut StridedBuf) -> Self {
        Operand {
            name,
            dtype,
            slot: Slot::Strided(buf),
        }
    }

    /// The operand's base pointer.
    pub fn ptr(&self) -> DevicePtr {
        match &self.slot {
            Slot::Dense(p) => **p,
            Slot::Strided(b) => b.ptr,
        }
    }

    /// The base pointer, to move the operand elsewhere.
    pub fn ptr_mut(&mut self) -> &mut DevicePtr {
        match &mut self.slot {
            Slot::Dense(p) => p,
            Slot::Strided(b) => &mut b.ptr,
        }
    }
}

/// An op's descriptor: what the layers that handle every op alike need to know of it.
pub trait OpDesc: Clone + Debug + PartialEq + Send + Sync + 'static {
    /// The op's name: the [`ComputeBackend`] method that runs it.
    const NAME: &'static str;

    /// Checks the descriptor's own numbers and lists the regions it touches (the shape checks every
    /// backend makes first); `ShapeMismatch`, `InvalidArgument` or `SizeOverflow` on bad numbers.
    fn accesses(&self) -> Result<Accesses>;

    /// Every device operand the descriptor names, each with the name of its region in
    /// [`OpDesc::accesses`]; optional operands that are absent are left out.
    fn operands(&mut self) -> Vec<Operand<'_>>;

    /// The element dtype the op is run in (a cast's source dtype).
    fn dtype(&self) -> DType;

    /// The element dtype, to restate the op over converted copies of its operands.
    fn dtype_mut(&mut self) -> &mut DType;

    /// Runs the op on `device` through its [`ComputeBackend`] method.
    fn run(&self, device: &dyn ComputeBackend) -> Result<()>;

    /// The `Unsupported` error a backend that lacks the op answers (the provided bodies of the op
    /// methods).
    fn unsupported(&self, device: &(impl ComputeBackend + ?Sized)) -> BackendError {
        BackendError::Unsupported {
            op: Self::NAME,
            backend: device.backend_type(),
            dtype: self.dtype(),
        }
    }
}

/// Any op as one value: [`OpDesc`] behind a pointer, for code that keeps ops of every kind (a captured
/// graph) or inspects them one by one (a backend that stands in front of another).
pub trait AnyOp: Debug + Send + Sync {
    /// [`OpDesc::NAME`].
    fn name(&self) -> &'static str;
    /// [`OpDesc::accesses`].
    fn accesses(&self) -> Result<Accesses>;
    /// [`OpDesc::operands`].
    fn operands(&mut self) -> Vec<Operand<'_>>;
    /// [`OpDesc::dtype`].
    fn dtype(&self) -> DType;
    /// [`OpDesc::run`].
    fn run(&self, device: &dyn ComputeBackend) -> Result<()>;
    /// A copy of the descriptor.
    fn clone_op(&self) -> Box<dyn AnyOp>;
    /// The descriptor, to downcast to its type.
    fn as_any(&self) -> &dyn Any;
}

impl<D: OpDesc> AnyOp for D {
    fn name(&self) -> &'static str {
        D::NAME
    }
    fn accesses(&self) -> Result<Accesses> {
        OpDesc::accesses(self)
    }
    fn operands(&mut self) -> Vec<Operand<'_>> {
        OpDesc::operands(self)
    }
    fn dtype(&self) -> DType {
        OpDesc::dtype(self)
    }
    fn run(&self, device: &dyn ComputeBackend) -> Result<()> {
        OpDesc::run(self, device)
    }
    fn clone_op(&self) -> Box<dyn AnyOp> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Clone for Box<dyn AnyOp> {
    fn clone(&self) -> Self {
        self.clone_op()
    }
}

/// A built-in backend's implementation of the op `D`, written in the backend's file of the op's
/// family (`backends/cpu/elementwise/`, `backends/cuda/norm.rs`, ...). The backend's
/// `ComputeBackend` impl writes every op method with [`ops_by_impl!`], each calling
/// `OpImpl::<D>::op`. A backend that does not run an op yet writes the impl empty: the provided
/// body answers `Unsupported`.
pub(crate) trait OpImpl<D: OpDesc>: ComputeBackend {
    /// Runs `desc`; the errors of the op's trait method.
    fn op(&self, desc: &D) -> Result<()> {
        Err(desc.unsupported(self))
    }
}

/// Inside a built-in backend's `impl ComputeBackend`, with `crate::for_each_op!(ops_by_impl)`:
/// every op method, each running the backend's [`OpImpl`] of its descriptor.
macro_rules! ops_by_impl {
    ($($method:ident($desc:ty)),* $(,)?) => {
        $(
            fn $method(&self, desc: &$desc) -> $crate::error::Result<()> {
                $crate::compute::op::OpImpl::<$desc>::op(self, desc)
            }
        )*
    };
}
pub(crate) use ops_by_impl;

/// Implements [`OpDesc`] for a descriptor: its method, its dtype field and its operands, each as
/// `dense "name": field` or `strided "name": field` (an `Option` field with `optional "name": field`,
/// a [`Value`](crate::compute::Value) field with `value "name": field`),
/// with a function of the descriptor after `as` giving the operand's dtype when it is not the
/// descriptor's.
macro_rules! op_desc {
    ($desc:ty => $method:ident, dtype: $dt:ident, {
        $($kind:ident $name:literal: $field:ident $(as $odt:expr)?),* $(,)?
    }) => {
        impl $crate::compute::OpDesc for $desc {
            const NAME: &'static str = stringify!($method);
            fn accesses(&self) -> $crate::error::Result<$crate::compute::Accesses> {
                <$desc>::accesses(self)
            }
            fn operands(&mut self) -> Vec<$crate::compute::Operand<'_>> {
                let dtype = self.$dt;
                let dtypes = [$($crate::compute::op::op_desc!(@dtype self, dtype $(, $odt)?)),*];
                let mut dtypes = dtypes.into_iter();
                let mut out = Vec::new();
                $(
                    let operand_dtype = dtypes.next().unwrap_or(dtype);
                    $crate::compute::op::op_desc!(@push out, $kind, $name, operand_dtype, self.$field);
                )*
                out
            }
            fn dtype(&self) -> $crate::dtype::DType {
                self.$dt
            }
            fn dtype_mut(&mut self) -> &mut $crate::dtype::DType {
                &mut self.$dt
            }
            fn run(&self, device: &dyn $crate::compute::ComputeBackend) -> $crate::error::Result<()> {
                device.$method(self)
            }
        }
    };
    (@dtype $self:ident, $dtype:ident) => {
        $dtype
    };
    (@dtype $self:ident, $dtype:ident, $odt:expr) => {
        ($odt)(&*$self)
    };
    (@push $out:ident, dense, $name:literal, $dtype:expr, $place:expr) => {
        $out.push($crate::compute::Operand::dense($name, $dtype, &mut $place))
    };
    (@push $out:ident, strided, $name:literal, $dtype:expr, $place:expr) => {
        $out.push($crate::compute::Operand::strided($name, $dtype, &mut $place))
    };
    (@push $out:ident, value, $name:literal, $dtype:expr, $place:expr) => {
        if let $crate::compute::Value::Tensor(b) = &mut $place {
            $out.push($crate::compute::Operand::strided($name, $dtype, b))
        }
    };
    (@push $out:ident, optional, $name:literal, $dtype:expr, $place:expr) => {
        if let Some(p) = $place.as_mut() {
            $out.push($crate::compute::Operand::dense($name, $dtype, p))
        }
    };
}
pub(crate) use op_desc;
