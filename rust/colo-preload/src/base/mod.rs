//! The bottom of the shim: helpers every layer above uses and none of them is imported by.
//! Nothing here names a connection, the descriptor table or a service.

pub mod addr;
pub mod env;
pub mod guard;
pub mod log;
pub mod mem;
pub mod own_code;
pub mod uids;
pub mod uring;
pub mod vm;
