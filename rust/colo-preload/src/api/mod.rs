//! The top: the exported symbols (`exports`) and the logic of each interposed call. Within it,
//! `route` (how a call picks libc or the rings) is below the calls, `forget` below `fds`, and
//! `fds` below `behind` (the raw `syscall` path); `exports` is above all of them.

pub mod behind;
pub mod confine;
pub mod copy;
pub mod creds;
pub mod data;
pub mod dumpable;
pub mod exports;
pub mod dprintf;
pub mod fdopen;
pub mod std_streams;
pub mod fds;
pub mod forget;
pub mod lregs;
pub mod names;
pub mod nofile;
pub mod passed;
pub mod epoll;
pub mod ppoll;
pub mod repeat;
pub mod route;
pub mod sockopt;
