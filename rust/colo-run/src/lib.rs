//! The launcher behind `colo run -- CMD ARGS`: runs CMD with the colo LD_PRELOAD shim
//! (`libcolo_preload.so`), so its loopback TCP connections to and from other programs under
//! `colo run` (or colo API programs) move into shared memory.
//!
//! It warns when CMD cannot be accelerated because it does not go through the dynamic linker's
//! preloading: statically linked (no `PT_INTERP`), Go (a `.go.buildinfo` section or a Go build
//! ID note: Go makes its own system calls), or setuid/setgid (the loader ignores LD_PRELOAD).
//! CMD still runs, over plain TCP.
//!
//! The shim is found, in order, at `$COLO_PRELOAD`, next to the running executable, in `../lib`
//! and `../lib/colo` relative to it, and in the cargo target directories (`$CARGO_TARGET_DIR`,
//! `target/{release,debug}` above the executable), each taken only if it and every directory
//! above it are writable by this user or root alone ([`untrusted`]). The `colo` binary carries its own copy as a
//! last resort ([`embedded`]), written to a per-user cache directory, so an installed or copied
//! `colo` needs nothing else on disk.

pub mod embedded;

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const SHIM: &str = "libcolo_preload.so";

/// Why a binary cannot be accelerated by the shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsupported {
    /// No program interpreter: the dynamic loader (and so LD_PRELOAD) is not involved.
    Static,
    /// A Go binary: makes system calls directly, not through libc.
    Go,
    /// setuid or setgid: the loader ignores LD_PRELOAD.
    Setuid,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unsupported::Static => "it is statically linked",
            Unsupported::Go => "it is a Go program (Go makes its own system calls, not through libc)",
            Unsupported::Setuid => "it is setuid/setgid (the loader ignores LD_PRELOAD)",
        })
    }
}

/// Finds the shim library.
pub fn find_shim() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("COLO_PRELOAD") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Some(p);
        }
    }
    let mut dirs = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(d) = exe.parent() {
            dirs.push(d.to_path_buf());
            dirs.push(d.join("../lib"));
            dirs.push(d.join("../lib/colo"));
            if let Some(up) = d.parent() {
                dirs.push(up.to_path_buf());
            }
            for a in d.ancestors() {
                if a.file_name().is_some_and(|n| n == "target") {
                    dirs.push(a.join("release"));
                    dirs.push(a.join("debug"));
                }
            }
        }
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        dirs.push(PathBuf::from(&t).join("release"));
        dirs.push(PathBuf::from(&t).join("debug"));
    }
    dirs.into_iter().map(|d| d.join(SHIM)).filter(|p| p.is_file()).find(|p| match untrusted(p) {
        None => true,
        Some(why) => {
            eprintln!("colo run: warning: ignoring {}: {why}", p.display());
            false
        }
    })
}

/// Why a shim found by searching must not be loaded, if it must not: it would run inside every
/// program started under `colo run`, so it and every directory above it must be writable by
/// this user or root alone (a directory others may write, such as `/tmp`, only with its sticky
/// bit, which keeps them from replacing what is not theirs). Otherwise anyone who can create
/// `libcolo_preload.so` (or a directory holding one) where it is looked for runs code as this user.
pub fn untrusted(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let euid = rustix::process::geteuid().as_raw();
    let path = match path.canonicalize() {
        Ok(p) => p,
        Err(e) => return Some(e.to_string()),
    };
    let ours = |m: &std::fs::Metadata| m.uid() == 0 || m.uid() == euid;
    match std::fs::metadata(&path) {
        Ok(m) if !ours(&m) => return Some(format!("owned by uid {}", m.uid())),
        Ok(m) if m.mode() & 0o022 != 0 => return Some(format!("writable by others (mode {:o})", m.mode() & 0o7777)),
        Ok(_) => {}
        Err(e) => return Some(e.to_string()),
    }
    for dir in path.ancestors().skip(1) {
        match std::fs::metadata(dir) {
            Ok(m) if !ours(&m) => return Some(format!("{} is owned by uid {}", dir.display(), m.uid())),
            Ok(m) if m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 => {
                return Some(format!("{} is writable by others (mode {:o})", dir.display(), m.mode() & 0o7777))
            }
            Ok(_) => {}
            Err(e) => return Some(format!("{}: {e}", dir.display())),
        }
    }
    None
}

/// Finds `cmd` on PATH (or as given when it contains a slash).
pub fn which(cmd: &str) -> Option<PathBuf> {
    if cmd.contains('/') {
        return Some(PathBuf::from(cmd));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(cmd)).find(|p| {
        p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// Inspects an ELF file (64-bit little-endian). `None`: fine (or not an ELF file: a script,
/// whose interpreter is dynamically linked in practice). Reads the headers and the section
/// names only, so its cost does not grow with the program's size.
pub fn inspect(path: &Path) -> Option<Unsupported> {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let meta = std::fs::metadata(path).ok()?;
    // The loader ignores LD_PRELOAD in secure-execution mode: when the set-id bit changes the
    // effective user or group (root running a setuid-root program is not).
    let mode = meta.permissions().mode();
    let (euid, egid) = (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw());
    if (mode & 0o4000 != 0 && meta.uid() != euid) || (mode & 0o2000 != 0 && meta.gid() != egid) {
        return Some(Unsupported::Setuid);
    }
    let f = std::fs::File::open(path).ok()?;
    // `len` bytes at `off`, when the file has them (a header's sizes are not trusted for an
    // allocation before that).
    let at = |off: u64, len: usize| -> Option<Vec<u8>> {
        if off.checked_add(len as u64)? > meta.len() {
            return None;
        }
        let mut v = vec![0; len];
        f.read_exact_at(&mut v, off).ok()?;
        Some(v)
    };
    let h = at(0, 64)?;
    if &h[0..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return None;
    }
    // Go: a `.go.buildinfo` section, or the "Go" build-ID note.
    let shoff = u64_at(&h, 0x28)?;
    let shentsize = u16_at(&h, 0x3A)? as usize;
    let shnum = u16_at(&h, 0x3C)? as usize;
    let shstrndx = u16_at(&h, 0x3E)? as usize;
    if shoff != 0 && shstrndx < shnum {
        let sh = at(shoff, shnum * shentsize)?;
        let strtab = shstrndx * shentsize;
        let names = at(u64_at(&sh, strtab + 0x18)?, usize::try_from(u64_at(&sh, strtab + 0x20)?).ok()?)?;
        for i in 0..shnum {
            let name = u32_at(&sh, i * shentsize)? as usize;
            let s = names.get(name..)?;
            let end = s.iter().position(|&c| c == 0).unwrap_or(0);
            let n = &s[..end];
            if n == b".go.buildinfo" || n == b".note.go.buildid" {
                return Some(Unsupported::Go);
            }
        }
    }
    // Static: no PT_INTERP (type 3) program header.
    let phoff = u64_at(&h, 0x20)?;
    let phentsize = u16_at(&h, 0x36)? as usize;
    let phnum = u16_at(&h, 0x38)? as usize;
    let ph = at(phoff, phnum * phentsize)?;
    let interp = (0..phnum).any(|i| u32_at(&ph, i * phentsize) == Some(3));
    if !interp {
        return Some(Unsupported::Static);
    }
    None
}

/// The settings the shim reads, each with what it accepts: a value it would not understand is
/// ignored there (the default applies), so say so before CMD starts.
pub fn env_warnings(get: impl Fn(&str) -> Option<String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |key: &str, ok: &dyn Fn(&str) -> bool, accepts: &str| {
        if let Some(v) = get(key) {
            if !ok(&v) {
                out.push(format!("{key}={v:?} is not valid ({accepts}); the default applies"));
            }
        }
    };
    check("COLO_LOG", &|v| matches!(v.to_ascii_lowercase().as_str(), "" | "off" | "info" | "debug"), "info or debug");
    check("COLO_DISABLE", &|v| matches!(v.to_ascii_lowercase().as_str(), "" | "0" | "1" | "true" | "false" | "yes" | "no"), "1 to disable");
    check("COLO_SPIN_US", &|v| colo_ring::spin::SpinMode::parse(v).is_some(), "microseconds, 0 for never, inf for always");
    check("COLO_CARRIER_TIMEOUT_MS", &|v| v.parse::<u64>().is_ok(), "milliseconds");
    check("COLO_RING_KB", &|v| v.parse::<u32>().is_ok_and(|kb| (4..=1 << 16).contains(&kb)), "KiB from 4 to 65536");
    check("COLO_SHORT_LIVED", &|v| v.is_empty() || v == "accelerate", "accelerate");
    for key in ["COLO_MAX_MAPPED_MB", "COLO_MAX_MAPPED_PER_UID_MB"] {
        check(key, &|v| v.trim().parse::<u64>().is_ok_and(|mb| mb > 0), "MiB, more than 0");
    }
    check("COLO_MAX_SEGMENTS", &|v| v.trim().parse::<u64>().is_ok_and(|n| n > 0), "a count, more than 0");
    out
}

/// Replaces this process with `cmd[0]` (arguments `cmd[1..]`) under the shim, so CMD keeps our
/// pid: signals, job control and supervisors reach it directly, and its exit status is ours.
/// Returns only on failure: 127 if CMD was not found, 126 if it could not be executed (as a
/// shell does). With the shim missing, CMD runs without it (with a warning).
pub fn run(cmd: &[String]) -> i32 {
    run_with(cmd, None)
}

/// [`run`], with `embedded` as the shim when none is found on disk.
pub fn run_with(cmd: &[String], embedded: Option<embedded::Embedded>) -> i32 {
    let Some(prog) = cmd.first() else {
        eprintln!("colo run: usage: colo run -- CMD [ARGS...]");
        return 2;
    };
    for w in env_warnings(|k| std::env::var(k).ok()) {
        eprintln!("colo run: warning: {w}");
    }
    if let Some(path) = which(prog) {
        if let Some(why) = inspect(&path) {
            eprintln!("colo run: warning: {} cannot be accelerated: {why}; its connections use plain TCP", path.display());
        }
    }
    let mut c = std::process::Command::new(prog);
    c.args(&cmd[1..]);
    let debug = std::env::var("COLO_LOG").is_ok_and(|v| v.eq_ignore_ascii_case("debug"));
    let shim = find_shim().or_else(|| {
        let e = embedded?;
        embedded::materialise(e)
            .inspect_err(|why| eprintln!("colo run: warning: cannot write the embedded shim to a cache directory ({why})"))
            .ok()
    });
    match shim {
        Some(shim) => {
            let shim = shim.canonicalize().unwrap_or(shim);
            if debug {
                eprintln!("colo run: shim {}", shim.display());
            }
            let mut pre = OsString::from(shim);
            if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
                pre.push(" ");
                pre.push(old);
            }
            c.env("LD_PRELOAD", pre);
        }
        None => eprintln!("colo run: warning: {SHIM} not found (set COLO_PRELOAD); running without acceleration"),
    }
    use std::os::unix::process::CommandExt;
    let e = c.exec();
    exec_failed(prog, &e)
}

/// Reports a CMD that could not be started and returns the shell's status for it: 127 when it
/// was not found, 126 when it was found but could not be executed.
fn exec_failed(prog: &str, e: &std::io::Error) -> i32 {
    if e.kind() == std::io::ErrorKind::NotFound {
        if prog.contains('/') {
            eprintln!("colo run: {prog}: no such file");
        } else {
            eprintln!("colo run: {prog}: command not found (PATH has no such program)");
        }
        return 127;
    }
    eprintln!("colo run: {prog}: cannot run it: {e}");
    126
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_the_shim_would_ignore_are_named() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(key, _)| *key == k).map(|(_, v)| v.to_string())
        };
        let bad = env_warnings(env(&[("COLO_SPIN_US", "abc"), ("COLO_RING_KB", "5000000"), ("COLO_LOG", "verbose"), ("COLO_CARRIER_TIMEOUT_MS", "-5"), ("COLO_MAX_MAPPED_MB", "0"), ("COLO_MAX_SEGMENTS", "x")]));
        assert_eq!(bad.len(), 6, "{bad:?}");
        assert!(bad[0].starts_with("COLO_LOG=\"verbose\""), "{bad:?}");
        let good = env_warnings(env(&[("COLO_SPIN_US", "inf"), ("COLO_RING_KB", "64"), ("COLO_LOG", "INFO"), ("COLO_DISABLE", "1"), ("COLO_MAX_MAPPED_MB", "1024"), ("COLO_MAX_SEGMENTS", "50")]));
        assert!(good.is_empty(), "{good:?}");
    }

    /// The bytes this thread has read so far (`rchar`), files and /proc alike.
    fn bytes_read() -> u64 {
        let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
        io.lines().find_map(|l| l.strip_prefix("rchar: ")).unwrap().parse().unwrap()
    }

    #[test]
    fn inspect_reads_the_headers_not_the_program() {
        let me = std::env::current_exe().unwrap();
        let size = std::fs::metadata(&me).unwrap().len();
        assert!(size > 1 << 20, "the test binary is {size} bytes");
        let before = bytes_read();
        assert_eq!(inspect(&me), None, "a dynamically linked program");
        let read = bytes_read() - before;
        assert!(read < 64 << 10, "read {read} bytes of a {size}-byte program");
        // glibc's ldconfig is static; a Go toolchain's own binaries are Go.
        for (p, want) in [("/sbin/ldconfig", Unsupported::Static), ("/usr/local/go/bin/gofmt", Unsupported::Go)] {
            if Path::new(p).exists() {
                assert_eq!(inspect(Path::new(p)), Some(want), "{p}");
            }
        }
        // A script, and a file too short for an ELF header.
        let dir = std::env::temp_dir().join(format!("colo-run-inspect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, body) in [("script", &b"#!/bin/sh\nexit 0\n"[..]), ("short", &b"\x7fELF\x02\x01"[..])] {
            std::fs::write(dir.join(name), body).unwrap();
            assert_eq!(inspect(&dir.join(name)), None, "{name}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_shim_others_could_have_planted_is_not_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("colo-run-trust-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let open = base.join("open");
        let sticky = base.join("sticky");
        for (d, mode) in [(&base, 0o755), (&open, 0o777), (&sticky, 0o1777)] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let plant = |dir: &Path, mode: u32| {
            let p = dir.join(SHIM);
            std::fs::write(&p, b"x").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        };
        // A directory anyone may write: anyone could have put it there.
        assert!(untrusted(&plant(&open, 0o644)).is_some_and(|w| w.contains("writable by others")));
        // Ours, in a sticky directory (as /tmp): no one else can replace it.
        let mine = plant(&sticky, 0o644);
        assert_eq!(untrusted(&mine), None);
        // Writable by others itself.
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(untrusted(&mine).is_some_and(|w| w.contains("writable by others")));
        // Another user's (as root only: chown).
        if rustix::process::geteuid().is_root() {
            std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o644)).unwrap();
            std::os::unix::fs::chown(&mine, Some(65534), Some(65534)).unwrap();
            assert!(untrusted(&mine).is_some_and(|w| w.contains("owned by uid 65534")));
            let theirs = sticky.join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            assert!(untrusted(&plant(&theirs, 0o644)).is_some_and(|w| w.contains("owned by uid 65534")));
        }
        std::fs::remove_dir_all(&base).unwrap();
    }
}
