//! `p.assign(&new)` inside a compiled function: an in-place update (an optimizer's step written as
//! torch's `p.sub_(..)` under `no_grad`) becomes part of the traced graph.
//!
//! The trace notes the new value against the tensor; later ops in the function read that value, and
//! when the graph runs its result is stored in the tensor (a graph break runs it then, so code after a
//! break reads the new value as a weight). A cached entry records which output each assigned tensor
//! receives, so a call that does not trace updates the same tensors.

use super::{active, Tracer};
use crate::trace::Tensor;

impl Tracer {
    /// Notes that `target` (a concrete tensor) holds `value` from here on in this trace.
    pub(crate) fn assign(&self, target: &Tensor, value: &Tensor) {
        let mut st = self.st.borrow_mut();
        // An assigned tensor that is itself another assignment's target reads through to its value.
        let value = match st.assigned.iter().find(|(t, _)| t.id() == value.id()) {
            Some((_, v)) => v.clone(),
            None => value.clone(),
        };
        st.assigned.retain(|(t, _)| t.id() != target.id());
        st.assigned.push((target.clone(), value));
    }

    /// The tensors assigned in the current graph and their values (call before the final flush, which
    /// stores them).
    pub(crate) fn assignments(&self) -> Vec<(Tensor, Tensor)> {
        self.st.borrow().assigned.clone()
    }

    /// Whether `id` names a tensor this trace assigned a value not yet stored (a host read of it must
    /// run the graph first).
    pub(crate) fn assigned_pending(&self, id: u64) -> bool {
        self.st.try_borrow().is_ok_and(|st| st.assigned.iter().any(|(t, _)| t.id() == id))
    }
}

/// Whether the active trace holds an unstored value for the tensor `id`.
pub(crate) fn pending(id: u64) -> bool {
    active().is_some_and(|t| t.assigned_pending(id))
}
