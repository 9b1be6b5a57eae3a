//! The peers tandem is measured against, on the same inputs under the same run rule: each
//! returns a schema [`Row`](crate::schema::Row) (with `error` set when it cannot run) and its
//! outputs, so the suite can take the max abs difference from onnxruntime.
//!
//! Sits between the runners' command line (`run.rs`) and each peer: onnxruntime through
//! `scripts/ort_driver.py`, tract in-process, burn behind the `burn` feature.

pub mod burn;
pub mod ort;
pub mod tract;
