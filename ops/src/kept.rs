//! A value an op derives from one of its model constants (W's Winograd transform, a packed
//! MatMul B) on its first CPU call and keeps for every later call, shared by clones of the op.
//!
//! Sits between the ops that keep such values (`conv.rs`, `cpu_gemm_packed.rs`) and
//! `std::sync::OnceLock`.

use std::sync::{Arc, OnceLock};

pub(crate) struct Kept<T>(Arc<OnceLock<T>>);

// By hand: derived impls would ask `T: Default` / `T: Clone`, which an `Arc` does not need.
impl<T> Default for Kept<T> {
    fn default() -> Self {
        Kept(Arc::default())
    }
}

impl<T> Clone for Kept<T> {
    fn clone(&self) -> Self {
        Kept(Arc::clone(&self.0))
    }
}

impl<T> std::fmt::Debug for Kept<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = if self.0.get().is_some() {
            "kept"
        } else {
            "not yet computed"
        };
        write!(f, "Kept({state})")
    }
}

impl<T> Kept<T> {
    /// The kept value, computed by `make` on the first call. `make` runs with no lock held:
    /// racing first calls each compute it, and one result is kept.
    pub(crate) fn get_or_make(&self, make: impl FnOnce() -> T) -> &T {
        if self.0.get().is_none() {
            let _ = self.0.set(make());
        }
        self.0.get().expect("set above")
    }
}
