//! Process-wide records below the descriptor table: what the table's entries name and what both
//! a connection's end and the services write to. None of them knows the table or a connection.

pub mod adapt;
pub mod app_nofile;
pub mod handover_file;
pub mod lineage;
pub mod marker;
pub mod relayed;
