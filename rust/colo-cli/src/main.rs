//! The `colo` command: `bench` measures colo against TCP loopback and Unix sockets on this
//! machine; `stat` lists this host's colo listeners and connections, read from the live segments.

mod bench;
mod plot;
mod results;
mod stat;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "colo", version, about = "Same-host connections through shared memory")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure round trips, throughput and connection rate: TCP, Unix sockets, colo (about a minute).
    Bench(bench::Args),
    /// List colo listeners and connections on this host that you may see (like `ss`).
    Stat(stat::Args),
    /// Run an unmodified program with its loopback TCP moved into shared memory (LD_PRELOAD).
    #[command(trailing_var_arg = true, override_usage = "colo run -- CMD [ARGS]...")]
    #[command(after_help = "Environment: COLO_LOG=info (accelerated connections and one-time decisions) or debug \
(also every connection left on plain TCP, and why); COLO_SPIN_US (microseconds to spin before sleeping, 0 never, \
inf always); COLO_RING_KB (the most a ring grows to, in KiB; default twice net.ipv4.tcp_wmem's maximum, 8192 on most hosts); COLO_CARRIER_TIMEOUT_MS (how long a client waits for the \
server to take its connection, default 500); COLO_SHORT_LIVED=accelerate (keep shared memory for short-lived \
connections); COLO_MAX_MAPPED_MB and COLO_MAX_MAPPED_PER_UID_MB (peers' segments a server maps at once, in all \
and per client uid; default 65536, or half of ulimit -v, and a quarter of that); COLO_MAX_SEGMENTS (how many \
peers' segments a server maps at once; default a quarter of vm.max_map_count); COLO_DISABLE=1; COLO_PRELOAD (a shim to use instead of the one found beside colo or carried in it). Values the shim would not understand are named \
before CMD starts.")]
    Run {
        /// The command and its arguments (after `--`).
        #[arg(required = true, allow_hyphen_values = true)]
        cmd: Vec<String>,
    },
    /// Internal: the server side of `colo bench`, in its own process.
    #[command(hide = true, name = "__bench-serve")]
    BenchServe(bench::ServeArgs),
}

/// The LD_PRELOAD shim, built and embedded by build.rs: `colo run` writes it to a per-user cache
/// directory when no shim is found on disk (see colo_run::embedded).
const SHIM: colo_run::embedded::Embedded = colo_run::embedded::Embedded {
    bytes: include_bytes!(concat!(env!("OUT_DIR"), "/libcolo_preload.so")),
    hash: env!("COLO_EMBEDDED_SHIM_HASH"),
};

fn main() -> ExitCode {
    // Like other command-line tools: end quietly when the reader of our output goes away.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Bench(a) => bench::run(a),
        Command::Stat(a) => stat::run(a),
        Command::BenchServe(a) => bench::serve(a),
        Command::Run { cmd } => return ExitCode::from(colo_run::run_with(&cmd, Some(SHIM)).clamp(0, 255) as u8),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("colo: {e}");
            ExitCode::FAILURE
        }
    }
}
