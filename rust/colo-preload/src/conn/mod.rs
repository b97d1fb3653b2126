//! The descriptor table and the state of each accelerated connection.

pub mod entry;
pub mod holders;
pub mod holders_file;
pub mod io;
pub mod options;
pub mod regs;
pub mod state;
pub mod table;
pub mod turns;
pub mod waking;
