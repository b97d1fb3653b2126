//! Materialises a shim embedded in the `colo` binary as a file the dynamic loader can preload.
//!
//! LD_PRELOAD needs a path that every process of the command can open, including children that
//! exec as another user (a memfd's `/proc/self/fd/N` does not survive that). The file goes in a
//! per-user cache directory, the first of `/tmp/colo-<euid>`, `$XDG_RUNTIME_DIR/colo`,
//! `$XDG_CACHE_HOME/colo` (or `~/.cache/colo`) that passes these checks:
//!
//! - the directory is a real directory (not a symlink) owned by the effective user, writable by
//!   nobody else; its parent is writable by nobody else or sticky (so no other user can rename
//!   it away and put another in its place); its file system allows executable mappings;
//! - the file, `libcolo_preload-<hash>.so` (the hash of the embedded bytes, so each build has a
//!   name of its own), is a regular file (not a symlink) owned by the effective user, writable
//!   by no one else, and of the embedded length.
//!
//! Otherwise a new copy is written to a temporary name (O_EXCL, mode 0444 from its creation),
//! flushed, and renamed over the final one. The file is trusted by those checks alone, without
//! reading it: only this user (or root) can create or rename a name in the directory or write to
//! a file of this user's that no one else may write, and this user's `colo` only ever puts a
//! complete, flushed copy of the build the name stands for under that name, so another user
//! cannot substitute a library and a reader (the loader, another `colo run`) never sees a
//! partial one. A truncated copy fails the length check and is replaced. The directory is 0755
//! and the file 0444: other users' processes may read and load it (a child that changes uid
//! keeps its acceleration) but cannot change it.

use rustix::fd::AsFd;
use rustix::fs::{self, FileType, Mode, OFlags, StatVfsMountFlags};
use rustix::io::Errno;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A shim carried in the running binary.
#[derive(Clone, Copy)]
pub struct Embedded {
    /// The contents of `libcolo_preload.so`.
    pub bytes: &'static [u8],
    /// A hash of `bytes` that names the cached file (hex).
    pub hash: &'static str,
}

/// The candidate cache directories, in order.
fn candidates() -> Vec<PathBuf> {
    let euid = rustix::process::geteuid().as_raw();
    let mut v = vec![PathBuf::from(format!("/tmp/colo-{euid}"))];
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(d) = env("XDG_RUNTIME_DIR") {
        v.push(d.join("colo"));
    }
    match env("XDG_CACHE_HOME") {
        Some(d) => v.push(d.join("colo")),
        None => {
            if let Some(h) = env("HOME") {
                v.push(h.join(".cache/colo"));
            }
        }
    }
    v
}

/// Writes (or finds) the shim in the first usable cache directory and returns its path. The
/// error names why each candidate was refused.
pub fn materialise(shim: Embedded) -> Result<PathBuf, String> {
    let mut why = Vec::new();
    for dir in candidates() {
        match materialise_in(&dir, shim) {
            Ok(p) => return Ok(p),
            Err(e) => why.push(format!("{}: {e}", dir.display())),
        }
    }
    Err(why.join("; "))
}

/// Materialises the shim in `dir` (created 0755 if missing), after the checks in the module
/// documentation.
pub fn materialise_in(dir: &Path, shim: Embedded) -> Result<PathBuf, String> {
    let euid = rustix::process::geteuid().as_raw();
    let parent = dir.parent().ok_or("no parent directory")?;
    // ~/.cache may not exist yet (its parent, the home directory, does).
    if !parent.exists() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o755).create(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    }
    let ps = fs::stat(parent).map_err(|e| format!("parent: {e}"))?;
    let pmode = ps.st_mode;
    if pmode & 0o022 != 0 && pmode & 0o1000 == 0 {
        return Err("its parent is writable by others and not sticky".into());
    }
    match fs::mkdir(dir, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(format!("mkdir: {e}")),
    }
    let d = fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| format!("open: {e}"))?;
    let st = fs::fstat(&d).map_err(|e| format!("fstat: {e}"))?;
    if st.st_uid != euid {
        return Err(format!("owned by uid {}, not {euid}", st.st_uid));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(format!("writable by others (mode {:o})", st.st_mode & 0o7777));
    }
    let vfs = fs::fstatvfs(&d).map_err(|e| format!("statvfs: {e}"))?;
    if vfs.f_flag.contains(StatVfsMountFlags::NOEXEC) {
        return Err("mounted noexec".into());
    }
    let name = format!("libcolo_preload-{}.so", shim.hash);
    let path = dir.join(&name);
    if is_intact(&d, &name, shim.bytes.len(), euid) {
        return Ok(path);
    }
    let tmp = format!(".{name}.{}.tmp", std::process::id());
    let create = || fs::openat(&d, &tmp, OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::from_raw_mode(0o444));
    let f = match create() {
        // A leftover of an earlier process with our pid that ended before renaming it.
        Err(Errno::EXIST) => {
            let _ = fs::unlinkat(&d, &tmp, fs::AtFlags::empty());
            create()
        }
        r => r,
    }
    .map_err(|e| format!("create: {e}"))?;
    let mut f = std::fs::File::from(f);
    let written = f.write_all(shim.bytes).and_then(|()| f.sync_data());
    drop(f);
    if let Err(e) = written {
        let _ = fs::unlinkat(&d, &tmp, fs::AtFlags::empty());
        return Err(format!("write: {e}"));
    }
    fs::renameat(&d, &tmp, &d, &name).map_err(|e| {
        let _ = fs::unlinkat(&d, &tmp, fs::AtFlags::empty());
        format!("rename: {e}")
    })?;
    Ok(path)
}

/// Whether `dir/name` is a regular file (not a symlink) owned by `euid`, writable by no one
/// else, `len` bytes long: a copy this user's `colo` wrote (see the module documentation).
fn is_intact(dir: &impl AsFd, name: &str, len: usize, euid: u32) -> bool {
    fs::statat(dir, name, fs::AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
        FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
            && st.st_uid == euid
            && st.st_mode & 0o022 == 0
            && st.st_size as u64 == len as u64
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    const FAKE: Embedded = Embedded { bytes: b"\x7fELF not really a shim", hash: "0123456789abcdef" };

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("colo-embed-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    #[test]
    fn writes_once_then_reuses_and_repairs() {
        let base = scratch("reuse");
        let dir = base.join("cache");
        let p = materialise_in(&dir, FAKE).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), FAKE.bytes);
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o444);
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o755);
        let ino = m.ino();
        // Found intact: the same file, not rewritten.
        assert_eq!(materialise_in(&dir, FAKE).unwrap(), p);
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), ino);
        // A copy of another length (truncated, or changed) is replaced by a fresh copy.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&p, b"tampered").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444)).unwrap();
        assert_eq!(materialise_in(&dir, FAKE).unwrap(), p);
        assert_eq!(std::fs::read(&p).unwrap(), FAKE.bytes);
        // No temporary files are left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// Plays the other user and the torn write: each copy below stands where the shim is looked
    /// for with the right name, and each must be replaced by a fresh copy of the embedded bytes,
    /// this user's and writable by no one else, before its path is handed to the loader.
    #[test]
    fn a_copy_others_could_write_or_a_torn_one_is_replaced() {
        let base = scratch("planted");
        let dir = base.join("cache");
        let p = materialise_in(&dir, FAKE).unwrap();
        let evil = vec![b'!'; FAKE.bytes.len()];
        let plant = |bytes: &[u8], mode: u32| {
            let _ = std::fs::remove_file(&p);
            std::fs::write(&p, bytes).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        let replaced = |what: &str| {
            assert_eq!(materialise_in(&dir, FAKE).unwrap(), p, "{what}");
            let m = std::fs::symlink_metadata(&p).unwrap();
            assert!(m.file_type().is_file(), "{what}: not a regular file");
            assert_eq!((m.uid(), m.mode() & 0o777), (rustix::process::geteuid().as_raw(), 0o444), "{what}");
            assert_eq!(std::fs::read(&p).unwrap(), FAKE.bytes, "{what}: contents");
            assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "{what}: files left behind");
        };
        // Writable by others (its group, or everyone): anyone could have changed it in place.
        for mode in [0o666, 0o664, 0o646] {
            plant(&evil, mode);
            replaced(&format!("mode {mode:o}"));
        }
        // A torn write: the right name, owner and mode, part of the contents.
        plant(&FAKE.bytes[..FAKE.bytes.len() / 2], 0o444);
        replaced("truncated");
        plant(b"", 0o444);
        replaced("empty");
        // A symlink, even to an intact copy: what it points to may change under the loader.
        let elsewhere = base.join("elsewhere.so");
        std::fs::write(&elsewhere, FAKE.bytes).unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o444)).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &p).unwrap();
        replaced("symlink");
        // Another user's file, read-only, of the right length (chown needs root; CI runs as root).
        if rustix::process::geteuid().is_root() {
            plant(&evil, 0o444);
            std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
            replaced("owned by uid 65534");
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// A copy this user's `colo` wrote is trusted by its owner, mode and length, without being
    /// read: the start-up of `colo run` costs the same whatever the size of the shim.
    #[test]
    fn this_users_copy_of_the_right_length_is_used_without_being_read() {
        let base = scratch("unread");
        let dir = base.join("cache");
        let p = materialise_in(&dir, FAKE).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let other = vec![b'?'; FAKE.bytes.len()];
        std::fs::write(&p, &other).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444)).unwrap();
        let ino = std::fs::metadata(&p).unwrap().ino();
        assert_eq!(materialise_in(&dir, FAKE).unwrap(), p);
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), ino);
        assert_eq!(std::fs::read(&p).unwrap(), other);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn refuses_a_directory_others_can_write_or_a_symlink() {
        let base = scratch("refuse");
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = materialise_in(&open, FAKE).unwrap_err();
        assert!(e.contains("writable by others"), "{e}");
        let link = base.join("link");
        std::os::unix::fs::symlink(&open, &link).unwrap();
        assert!(materialise_in(&link, FAKE).is_err());
        // A parent anyone may write to, without the sticky bit.
        let inner = open.join("cache");
        let e = materialise_in(&inner, FAKE).unwrap_err();
        assert!(e.contains("parent"), "{e}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn refuses_a_directory_owned_by_another_user() {
        if !rustix::process::geteuid().is_root() {
            return; // chown needs root; CI runs as root
        }
        let base = scratch("owner");
        let theirs = base.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let e = materialise_in(&theirs, FAKE).unwrap_err();
        assert!(e.contains("owned by uid 65534"), "{e}");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
