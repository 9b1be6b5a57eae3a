//! Element types and tensors: the values that flow between operators on the host.
//!
//! Sits between the ONNX importer (which builds them from initializers and inputs) and the CPU
//! kernels (which read and write them). GPU buffers hold the same values as 4-byte elements
//! (see `tandem_shaders`); conversion lives in the runtime's GPU layer.

use half::f16;
use std::fmt;

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    F64,
    I64,
    I32,
    I8,
    U8,
    Bool,
}

impl DType {
    /// Bytes per element on the host.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::F64)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32 | DType::I8 | DType::U8)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::F64 => "f64",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::Bool => "bool",
        };
        f.write_str(s)
    }
}

/// The elements of a tensor, row-major.
#[derive(Clone, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    F16(Vec<f16>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    Bool(Vec<bool>),
}

impl Data {
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::F16(_) => DType::F16,
            Data::F64(_) => DType::F64,
            Data::I64(_) => DType::I64,
            Data::I32(_) => DType::I32,
            Data::I8(_) => DType::I8,
            Data::U8(_) => DType::U8,
            Data::Bool(_) => DType::Bool,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F16(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::I8(v) => v.len(),
            Data::U8(v) => v.len(),
            Data::Bool(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `len` zeros (false for bool) of `dtype`.
    pub fn zeros(dtype: DType, len: usize) -> Data {
        match dtype {
            DType::F32 => Data::F32(vec![0.0; len]),
            DType::F16 => Data::F16(vec![f16::ZERO; len]),
            DType::F64 => Data::F64(vec![0.0; len]),
            DType::I64 => Data::I64(vec![0; len]),
            DType::I32 => Data::I32(vec![0; len]),
            DType::I8 => Data::I8(vec![0; len]),
            DType::U8 => Data::U8(vec![0; len]),
            DType::Bool => Data::Bool(vec![false; len]),
        }
    }

    /// The elements as little-endian bytes, row-major (bool as one byte, 0 or 1): ONNX raw
    /// data, `.npy` payloads, and a float compared by its bits.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        fn each<const N: usize, T>(v: &[T], f: impl Fn(&T) -> [u8; N]) -> Vec<u8> {
            v.iter().flat_map(f).collect()
        }
        match self {
            Data::F32(v) => each(v, |x| x.to_le_bytes()),
            Data::F16(v) => each(v, |x| x.to_le_bytes()),
            Data::F64(v) => each(v, |x| x.to_le_bytes()),
            Data::I64(v) => each(v, |x| x.to_le_bytes()),
            Data::I32(v) => each(v, |x| x.to_le_bytes()),
            Data::I8(v) => each(v, |x| x.to_le_bytes()),
            Data::U8(v) => v.clone(),
            Data::Bool(v) => each(v, |&x| [x as u8]),
        }
    }

    /// Elements the allocation can hold without growing.
    pub fn capacity(&self) -> usize {
        match self {
            Data::F32(v) => v.capacity(),
            Data::F16(v) => v.capacity(),
            Data::F64(v) => v.capacity(),
            Data::I64(v) => v.capacity(),
            Data::I32(v) => v.capacity(),
            Data::I8(v) => v.capacity(),
            Data::U8(v) => v.capacity(),
            Data::Bool(v) => v.capacity(),
        }
    }

    /// Appends `other`'s elements (growing the allocation as a `Vec` does, by doubling);
    /// false, with nothing appended, when the element types differ.
    /// Large tails are copied in parallel on the current rayon pool.
    pub fn append(&mut self, other: &Data) -> bool {
        fn extend<T: Copy + Send + Sync>(v: &mut Vec<T>, o: &[T]) {
            /// Elements of a piece copied by one task: 64 KB and up are worth a second thread.
            const PIECE: usize = 1 << 14;
            if o.len() < 2 * PIECE {
                return v.extend_from_slice(o);
            }
            let old = v.len();
            v.reserve(o.len());
            crate::parallel::for_each_chunk_mut(
                &mut v.spare_capacity_mut()[..o.len()],
                PIECE,
                |i, dst| {
                    for (d, s) in dst.iter_mut().zip(&o[i * PIECE..]) {
                        d.write(*s);
                    }
                },
            );
            // SAFETY: the `o.len()` elements past `old` were written just above.
            unsafe { v.set_len(old + o.len()) };
        }
        match (self, other) {
            (Data::F32(v), Data::F32(o)) => extend(v, o),
            (Data::F16(v), Data::F16(o)) => extend(v, o),
            (Data::F64(v), Data::F64(o)) => extend(v, o),
            (Data::I64(v), Data::I64(o)) => extend(v, o),
            (Data::I32(v), Data::I32(o)) => extend(v, o),
            (Data::I8(v), Data::I8(o)) => extend(v, o),
            (Data::U8(v), Data::U8(o)) => extend(v, o),
            (Data::Bool(v), Data::Bool(o)) => extend(v, o),
            _ => return false,
        }
        true
    }

    /// Makes this `len` zeros (false for bool), keeping the allocation when it is big enough
    /// and growing it to exactly `len` otherwise.
    pub fn reset_zeroed(&mut self, len: usize) {
        self.reset_len(0);
        self.reset_len(len);
    }

    /// Makes this `len` elements, keeping the allocation when it is big enough (else growing it
    /// to exactly `len`) and, unlike [`Data::reset_zeroed`], whatever values the kept elements
    /// hold (zeros past the old length): for the outputs of kernels that overwrite every
    /// element.
    pub fn reset_len(&mut self, len: usize) {
        fn reset<T: Clone>(v: &mut Vec<T>, len: usize, zero: T) {
            v.truncate(len);
            v.reserve_exact(len - v.len());
            v.resize(len, zero);
        }
        match self {
            Data::F32(v) => reset(v, len, 0.0),
            Data::F16(v) => reset(v, len, f16::ZERO),
            Data::F64(v) => reset(v, len, 0.0),
            Data::I64(v) => reset(v, len, 0),
            Data::I32(v) => reset(v, len, 0),
            Data::I8(v) => reset(v, len, 0),
            Data::U8(v) => reset(v, len, 0),
            Data::Bool(v) => reset(v, len, false),
        }
    }

    /// Element `i` as f64 (exact for every type but i64 beyond 2^53).
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            Data::F32(v) => v[i] as f64,
            Data::F16(v) => v[i].to_f64(),
            Data::F64(v) => v[i],
            Data::I64(v) => v[i] as f64,
            Data::I32(v) => v[i] as f64,
            Data::I8(v) => v[i] as f64,
            Data::U8(v) => v[i] as f64,
            Data::Bool(v) => v[i] as u8 as f64,
        }
    }

    /// Element `i` as i64 (floats truncate toward zero).
    pub fn get_i64(&self, i: usize) -> i64 {
        match self {
            Data::I64(v) => v[i],
            Data::I32(v) => v[i] as i64,
            Data::I8(v) => v[i] as i64,
            Data::U8(v) => v[i] as i64,
            Data::Bool(v) => v[i] as i64,
            other => other.get_f64(i) as i64,
        }
    }
}

impl fmt::Debug for Data {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.dtype(), self.len())
    }
}

/// A host tensor: a shape and its row-major elements.
#[derive(Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Data,
}

impl Tensor {
    /// A tensor from a shape and data; panics if the lengths disagree (a caller bug).
    pub fn new(shape: Vec<usize>, data: Data) -> Tensor {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "tensor shape {shape:?} does not match {} elements",
            data.len()
        );
        Tensor { shape, data }
    }

    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            data: Data::zeros(dtype, shape.iter().product()),
        }
    }

    pub fn f32(shape: &[usize], v: Vec<f32>) -> Tensor {
        Tensor::new(shape.to_vec(), Data::F32(v))
    }

    pub fn i64(shape: &[usize], v: Vec<i64>) -> Tensor {
        Tensor::new(shape.to_vec(), Data::I64(v))
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    pub fn meta(&self) -> TensorMeta {
        TensorMeta::new(self.dtype(), self.shape.clone())
    }

    /// The elements as i64 (for shape-like inputs: axes, pads, shapes); floats truncate.
    pub fn to_i64_vec(&self) -> Vec<i64> {
        (0..self.numel()).map(|i| self.data.get_i64(i)).collect()
    }

    /// The elements as f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.numel()).map(|i| self.data.get_f64(i)).collect()
    }

    /// Copy elements `range` of `src` into the same positions of `self`. Both must have the
    /// same dtype and hold the range (a caller bug otherwise: panics saying which).
    pub fn copy_from(&mut self, src: &Tensor, range: std::ops::Range<usize>) {
        fn copy<T: Copy>(s: &[T], d: &mut [T], r: std::ops::Range<usize>) {
            d[r.clone()].copy_from_slice(&s[r]);
        }
        match (&src.data, &mut self.data) {
            (Data::F32(s), Data::F32(d)) => copy(s, d, range),
            (Data::F16(s), Data::F16(d)) => copy(s, d, range),
            (Data::F64(s), Data::F64(d)) => copy(s, d, range),
            (Data::I64(s), Data::I64(d)) => copy(s, d, range),
            (Data::I32(s), Data::I32(d)) => copy(s, d, range),
            (Data::I8(s), Data::I8(d)) => copy(s, d, range),
            (Data::U8(s), Data::U8(d)) => copy(s, d, range),
            (Data::Bool(s), Data::Bool(d)) => copy(s, d, range),
            (s, d) => panic!("copy_from: dtype {} into {}", s.dtype(), d.dtype()),
        }
    }

    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_f32_mut(&mut self) -> Option<&mut [f32]> {
        match &mut self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({}{:?})", self.dtype(), self.shape)
    }
}

/// What is known of a value at plan time: its type, its shape, and, when it is a constant (an
/// initializer or a value folded from constants), its contents.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorMeta {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub value: Option<std::sync::Arc<Tensor>>,
}

impl TensorMeta {
    pub fn new(dtype: DType, shape: Vec<usize>) -> TensorMeta {
        TensorMeta {
            dtype,
            shape,
            value: None,
        }
    }

    pub fn constant(t: Tensor) -> TensorMeta {
        TensorMeta {
            dtype: t.dtype(),
            shape: t.shape.clone(),
            value: Some(std::sync::Arc::new(t)),
        }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Bytes on the host.
    pub fn bytes(&self) -> u64 {
        (self.numel() * self.dtype.size()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `append` gives the two sequences one after another, for tails copied in one piece and
    /// in parallel pieces (including a part piece), keeps the allocation where it has room,
    /// and refuses another element type without appending.
    #[test]
    fn append_is_concatenation() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for (a, b) in [(5, 7), (1000, (1 << 15) + 3), ((1 << 16) + 1, 1 << 17)] {
            let x: Vec<f32> = (0..a).map(|i| i as f32).collect();
            let y: Vec<f32> = (0..b).map(|i| -(i as f32) - 0.5).collect();
            let mut d = Data::F32(Vec::with_capacity(a + b));
            d.append(&Data::F32(x.clone()));
            let held = d.capacity();
            pool.install(|| assert!(d.append(&Data::F32(y.clone()))));
            assert_eq!(d, Data::F32([x, y].concat()), "{a} + {b}");
            assert_eq!(d.capacity(), held, "{a} + {b}: no new allocation");
            let u: Vec<u8> = (0..b).map(|i| i as u8).collect();
            let mut e = Data::U8(vec![7; a]);
            e.append(&Data::U8(u.clone()));
            assert_eq!(e, Data::U8([vec![7; a], u].concat()));
            assert!(!e.append(&d));
            assert_eq!(e.len(), a + b);
        }
    }
}
