//! The top: the exported symbols and the logic of each interposed call.

pub mod behind;
pub mod exports;
pub mod poll;
pub mod repeat;
pub mod semantics;
pub mod shim;
