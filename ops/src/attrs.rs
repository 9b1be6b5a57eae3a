//! Operator attributes as plain values, independent of the ONNX protobuf.
//!
//! Sits between the runtime's importer (which converts ONNX attributes into [`Attrs`]) and each
//! operator's constructor (which reads and validates what it needs).

use crate::{OpError, Result, Tensor};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Int(i64),
    Float(f32),
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    String(String),
    Strings(Vec<String>),
    Tensor(Tensor),
}

/// The attributes of one node plus the opset version its domain was imported with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attrs {
    pub opset: i64,
    pub values: BTreeMap<String, AttrValue>,
}

impl Attrs {
    pub fn new(opset: i64) -> Attrs {
        Attrs {
            opset,
            values: BTreeMap::new(),
        }
    }

    pub fn with(mut self, name: &str, v: AttrValue) -> Attrs {
        self.values.insert(name.to_string(), v);
        self
    }

    fn wrong(name: &str, want: &str, got: &AttrValue) -> OpError {
        OpError::Invalid(format!("attribute `{name}` must be {want}, got {got:?}"))
    }

    pub fn has(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    pub fn int_opt(&self, name: &str) -> Result<Option<i64>> {
        match self.values.get(name) {
            None => Ok(None),
            Some(AttrValue::Int(v)) => Ok(Some(*v)),
            Some(v) => Err(Self::wrong(name, "an int", v)),
        }
    }

    pub fn int(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self.int_opt(name)?.unwrap_or(default))
    }

    pub fn float_opt(&self, name: &str) -> Result<Option<f32>> {
        match self.values.get(name) {
            None => Ok(None),
            Some(AttrValue::Float(v)) => Ok(Some(*v)),
            Some(AttrValue::Int(v)) => Ok(Some(*v as f32)),
            Some(v) => Err(Self::wrong(name, "a float", v)),
        }
    }

    pub fn float(&self, name: &str, default: f32) -> Result<f32> {
        Ok(self.float_opt(name)?.unwrap_or(default))
    }

    pub fn ints_opt(&self, name: &str) -> Result<Option<Vec<i64>>> {
        match self.values.get(name) {
            None => Ok(None),
            Some(AttrValue::Ints(v)) => Ok(Some(v.clone())),
            Some(AttrValue::Int(v)) => Ok(Some(vec![*v])),
            Some(v) => Err(Self::wrong(name, "a list of ints", v)),
        }
    }

    pub fn floats_opt(&self, name: &str) -> Result<Option<Vec<f32>>> {
        match self.values.get(name) {
            None => Ok(None),
            Some(AttrValue::Floats(v)) => Ok(Some(v.clone())),
            Some(AttrValue::Float(v)) => Ok(Some(vec![*v])),
            Some(v) => Err(Self::wrong(name, "a list of floats", v)),
        }
    }

    pub fn string_opt(&self, name: &str) -> Result<Option<String>> {
        match self.values.get(name) {
            None => Ok(None),
            Some(AttrValue::String(v)) => Ok(Some(v.clone())),
            Some(v) => Err(Self::wrong(name, "a string", v)),
        }
    }

    pub fn string(&self, name: &str, default: &str) -> Result<String> {
        Ok(self
            .string_opt(name)?
            .unwrap_or_else(|| default.to_string()))
    }

    pub fn tensor_opt(&self, name: &str) -> Result<Option<Tensor>> {
        match self.values.get(name) {
            None => Ok(None),
            Some(AttrValue::Tensor(v)) => Ok(Some(v.clone())),
            Some(v) => Err(Self::wrong(name, "a tensor", v)),
        }
    }
}
