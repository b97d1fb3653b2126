//! The `colo` command's answers to wrong usage: a clear message on stderr and a status a script
//! can tell apart, before any time is spent measuring.

use std::process::{Command, Output};

fn colo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_colo")).args(args).output().expect("running colo")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn run_tells_a_missing_command_from_one_that_cannot_run() {
    // As a shell: 127 for a command that is not there, 126 for one that cannot be executed.
    let o = colo(&["run", "--", "colo-no-such-command-xyz"]);
    assert_eq!(o.status.code(), Some(127), "{}", stderr(&o));
    assert!(stderr(&o).contains("colo-no-such-command-xyz: command not found"), "{}", stderr(&o));
    let o = colo(&["run", "--", "/nonexistent/prog"]);
    assert_eq!(o.status.code(), Some(127), "{}", stderr(&o));
    assert!(stderr(&o).contains("/nonexistent/prog: no such file"), "{}", stderr(&o));
    let dir = std::env::temp_dir().join(format!("colo-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let o = colo(&["run", "--", dir.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(o.status.code(), Some(126), "{}", stderr(&o));
    assert!(stderr(&o).contains("cannot run it"), "{}", stderr(&o));
}

#[test]
fn run_help_gives_the_ring_default_the_shim_uses() {
    let o = colo(&["run", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    assert!(help.contains("colo run -- CMD"), "{help}");
    assert!(!help.contains("default 256"), "{help}");
    assert!(help.contains("COLO_RING_KB (the most a ring grows to"), "{help}");
}

#[test]
fn bench_refuses_an_only_that_matches_nothing() {
    let o = colo(&["bench", "--only", "no-such-measurement"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("matches no measurement"), "{}", stderr(&o));
    assert!(stderr(&o).contains("short-lived"), "names what there is: {}", stderr(&o));
    assert!(o.stdout.is_empty(), "{}", String::from_utf8_lossy(&o.stdout));
}

#[test]
fn bench_refuses_a_plot_it_cannot_write_before_measuring() {
    let o = colo(&["bench", "--quick", "--plot", "/nonexistent/dir/bench.png"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--plot /nonexistent/dir/bench.png: No such file or directory"), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "it measured first: {}", String::from_utf8_lossy(&o.stdout));
}

#[test]
fn bench_says_what_each_transport_it_shows_is() {
    let o = colo(&["bench", "--only", "short", "--seconds", "0.1"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.contains("connect + 64 B + close"), "{out}");
    for line in ["tcp                TCP loopback", "unix               a Unix stream socket", "colo               colo's byte stream"] {
        assert!(out.contains(line), "no {line:?} in {out}");
    }
    assert!(!out.contains("bare ring"), "a transport the table does not show: {out}");
}
