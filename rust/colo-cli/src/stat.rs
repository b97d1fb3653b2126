//! `colo stat`: colo listeners (abstract sockets named `colo/1/...` in /proc/net/unix) and
//! connections (memfds named `colo-seg` held by processes we may inspect), read from the live
//! segments themselves. No daemon.

use colo::wire::{Header, HEADER_FIELDS};
use std::collections::HashMap;
use std::io;

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

struct Listening {
    name: String,
    inode: u64,
}

/// The text of a file another user's choices can put any bytes in (a socket's name, a program
/// name, a mapped file's path): invalid UTF-8 is replaced, never a reason to read nothing.
fn read_lossy(path: &str) -> Option<String> {
    std::fs::read(path).ok().map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// `s` for the terminal: control characters (escape sequences another user put in a socket's or
/// a program's name) are shown escaped, never sent as they are.
fn shown(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

fn listeners() -> Vec<Listening> {
    let text = read_lossy("/proc/net/unix").unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Num RefCount Protocol Flags Type St Inode Path; St 01 = listening (unconnected).
        if f.len() >= 8 && f[7].starts_with("@colo/1/") && f[3] == "00010000" {
            out.push(Listening { name: f[7][8..].to_string(), inode: f[6].parse().unwrap_or(0) });
        }
    }
    out
}

fn comm(pid: u32) -> String {
    read_lossy(&format!("/proc/{pid}/comm")).map_or_else(|| "?".into(), |s| s.trim_end_matches('\n').to_string())
}

/// (pid, fd) of every socket inode and every colo segment we can see.
fn scan() -> (HashMap<u64, u32>, Vec<(u32, std::path::PathBuf)>) {
    let mut sockets = HashMap::new();
    let mut segments = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return (sockets, segments) };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else { continue };
            let link = link.to_string_lossy();
            if let Some(inode) = link.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                if let Ok(i) = inode.parse() {
                    sockets.insert(i, pid);
                }
            } else if link.starts_with("/memfd:colo-seg") {
                segments.push((pid, fd.path()));
            }
        }
        segments.extend(mapped_only(pid, &segments));
    }
    (sockets, segments)
}

/// The segments `pid` maps without holding their memfd (the colo API closes it once mapped),
/// as `/proc/PID/map_files` paths: one per mapping of a segment beyond the descriptors of it
/// already in `listed`. Opening those needs the privilege the kernel asks for them
/// (`CAP_SYS_ADMIN` or `CAP_CHECKPOINT_RESTORE`); without it they are left out.
fn mapped_only(pid: u32, listed: &[(u32, std::path::PathBuf)]) -> Vec<(u32, std::path::PathBuf)> {
    use std::os::unix::fs::MetadataExt;
    let Some(maps) = read_lossy(&format!("/proc/{pid}/maps")) else { return Vec::new() };
    let mut by_fd: HashMap<u64, usize> = HashMap::new();
    for (_, p) in listed.iter().filter(|(p, _)| *p == pid) {
        if let Ok(m) = std::fs::metadata(p) {
            *by_fd.entry(m.ino()).or_insert(0) += 1;
        }
    }
    let mut out = Vec::new();
    for line in maps.lines() {
        // start-end perms offset dev inode path
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !f[5].starts_with("/memfd:colo-seg") || !f[2].trim_start_matches('0').is_empty() {
            continue;
        }
        let Ok(ino) = f[4].parse::<u64>() else { continue };
        match by_fd.get_mut(&ino) {
            Some(n) if *n > 0 => *n -= 1,
            _ => {
                let path = std::path::PathBuf::from(format!("/proc/{pid}/map_files/{}", f[0]));
                // Without the privilege map_files asks for, the segment is not ours to read: not
                // listed (rather than reported as an invalid segment).
                if std::fs::metadata(&path).is_ok() {
                    out.push((pid, path));
                }
            }
        }
    }
    out
}

struct ConnInfo {
    pid: u32,
    header: Header,
    role: &'static str,
    sent: u64,
    received: u64,
    msgs_out: u64,
    msgs_in: u64,
    fill_out: u64,
    state: String,
    /// Set up across network namespaces (the header's proof field is not zero: spec/WIRE.md
    /// section 11).
    other_netns: bool,
}

/// Reads the little-endian value of `N` bytes at `off` of the segment file, with `pread`: the
/// file is never mapped, so one that its owner resizes (a hostile "segment" another user made)
/// gives a short read, never SIGBUS. Counters are read one at a time, as a live connection moves
/// them; each is one consistent read of its own bytes.
fn read_le<const N: usize>(file: &std::fs::File, off: usize) -> Result<u64, String> {
    let mut b = [0u8; 8];
    match colo_sys::segment::read_at(file, &mut b[..N], off as u64) {
        Ok(n) if n == N => Ok(u64::from_le_bytes(b)),
        Ok(_) => Err(format!("segment ends before offset {off}")),
        Err(e) => Err(format!("unreadable: {e}")),
    }
}

/// What `colo stat` makes of one descriptor named `colo-seg`.
enum Seen {
    Conn(ConnInfo),
    /// Not shown: a segment this side parked for reuse.
    Parked,
    /// Not a valid segment (unsealed, mis-sized, bad header, unreadable): why.
    Bad(u32, String),
}

/// One connection end: the segment at `path` as process `pid` holds it. `seen_before`: how many
/// descriptors of this same segment `pid` was already listed with (a process connected to its own
/// listener holds the client's and the server's).
fn inspect(pid: u32, path: &std::path::Path, seen_before: usize) -> Seen {
    match inspect_file(pid, path, seen_before) {
        Ok(Some(c)) => Seen::Conn(c),
        Ok(None) => Seen::Parked,
        Err(why) => Seen::Bad(pid, why),
    }
}

fn inspect_file(pid: u32, path: &std::path::Path, seen_before: usize) -> Result<Option<ConnInfo>, String> {
    // Another user may hold a FIFO or a device whose path reads like a segment's (a file at
    // `/memfd:colo-seg` in a mount namespace of its own): a plain open of a FIFO waits for a
    // writer that never comes, and opening a device can act on it. So the file is first opened
    // with O_PATH (which opens nothing), and only a regular file (a memfd is one) is opened for
    // reading, through that descriptor, so it is the same file whatever the holder does meanwhile.
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let pinned = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("cannot open: {e}"))?;
    if !pinned.metadata().is_ok_and(|m| m.file_type().is_file()) {
        return Err("not a regular file: not a colo segment".into());
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(format!("/proc/self/fd/{}", pinned.as_raw_fd()))
        .map_err(|e| format!("cannot open: {e}"))?;
    // Every colo segment is sealed against resizing: another file with the name is not one.
    if !colo_sys::segment::is_sealed(&file) {
        return Err("not sealed against resizing: not a colo segment".into());
    }
    let mut head = [0u8; HEADER_FIELDS];
    match colo_sys::segment::read_at(&file, &mut head, 0) {
        Ok(HEADER_FIELDS) => {}
        Ok(n) => return Err(format!("header truncated ({n} bytes)")),
        Err(e) => return Err(format!("unreadable: {e}")),
    }
    let (header, layout) = Header::decode(&head).map_err(|e| format!("bad header: {e}"))?;
    let size = colo_sys::segment::file_size(&file).map_err(|e| format!("unreadable: {e}"))?;
    if size != layout.segment_size as u64 {
        return Err(format!("file is {size} bytes, its header says {}", layout.segment_size));
    }
    let u64_at = |off| read_le::<8>(&file, off);
    let u32_at = |off| read_le::<4>(&file, off).map(|v| v as u32);
    let own_peer = header.client_pid == pid && header.server_pid == pid;
    let role = if header.client_pid == pid && !(own_peer && seen_before > 0) { "client" } else { "server" };
    let out_c2s = role == "client";
    // A segment this side parked for reuse is not a connection any more.
    use colo_ring::layout::{CLIENT_PARKED, PARKED, SERVER_PARKED};
    if u32_at(PARKED)? & if out_c2s { CLIENT_PARKED } else { SERVER_PARKED } != 0 {
        return Ok(None);
    }
    let blk = |c2s: bool| layout.block_offset(c2s);
    use colo_ring::layout::block;
    let out = blk(out_c2s);
    let inn = blk(!out_c2s);
    let sent = u64_at(out + block::RING_HEAD)?;
    let received = u64_at(inn + block::RING_TAIL)?;
    let fill_out = sent.wrapping_sub(u64_at(out + block::RING_TAIL)?);
    let (fo, fi) = (u32_at(out + block::RING_FLAGS)?, u32_at(inn + block::RING_FLAGS)?);
    let state = match (fo & 1 != 0, fi & 1 != 0, (fo | fi) & 2 != 0) {
        (_, _, true) => "reset",
        (true, true, _) => "closed",
        (true, false, _) => "write-shut",
        (false, true, _) => "peer-write-shut",
        _ => "open",
    };
    Ok(Some(ConnInfo {
        pid,
        header,
        role,
        sent,
        received,
        msgs_out: u64_at(out + block::MSG_HEAD)?,
        msgs_in: u64_at(inn + block::MSG_TAIL)?,
        fill_out,
        state: state.into(),
        other_netns: head[colo::wire::PROOF_OFFSET..colo::wire::PROOF_OFFSET + colo::wire::PROOF_LEN].iter().any(|b| *b != 0),
    }))
}

pub fn run(a: Args) -> io::Result<()> {
    let (sockets, segments) = scan();
    let ls = listeners();
    let mut seen: HashMap<(u32, u64), usize> = HashMap::new();
    let mut conns = Vec::new();
    let mut bad = Vec::new();
    for (pid, p) in &segments {
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(p).map_or(0, |m| m.ino());
        let n = seen.entry((*pid, ino)).or_insert(0);
        *n += 1;
        match inspect(*pid, p, *n - 1) {
            Seen::Conn(c) => conns.push(c),
            Seen::Parked => {}
            Seen::Bad(pid, why) => bad.push((pid, p.display().to_string(), why)),
        }
    }
    let fmt = |a: Option<std::net::SocketAddr>| a.map_or("-".to_string(), |a| a.to_string());
    if a.json {
        let v = serde_json::json!({
            "listeners": ls.iter().map(|l| {
                let pid = sockets.get(&l.inode).copied();
                serde_json::json!({"address": l.name, "pid": pid, "program": pid.map(comm)})
            }).collect::<Vec<_>>(),
            "connections": conns.iter().map(|c| serde_json::json!({
                "pid": c.pid, "program": comm(c.pid), "role": c.role,
                "local": fmt(if c.role == "client" { c.header.client_addr } else { c.header.server_addr }),
                "remote": fmt(if c.role == "client" { c.header.server_addr } else { c.header.client_addr }),
                "transport": "colo", "bytes_sent": c.sent, "bytes_received": c.received,
                "messages_sent": c.msgs_out, "messages_received": c.msgs_in,
                "ring_fill": c.fill_out, "ring_capacity": c.header.geometry.ring_capacity, "state": c.state,
                "other_netns": c.other_netns,
            })).collect::<Vec<_>>(),
            "not_segments": bad.iter().map(|(pid, path, why)| serde_json::json!({
                "pid": pid, "program": comm(*pid), "fd": path, "problem": why,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
        return Ok(());
    }
    println!("{:<8} {:<26} {:>8}  Program", "State", "Local", "Pid");
    for l in &ls {
        let pid = sockets.get(&l.inode).copied();
        println!("{:<8} {:<26} {:>8}  {}", "LISTEN", shown(&l.name), pid.map_or("-".into(), |p| p.to_string()), pid.map_or("-".into(), |p| shown(&comm(p))));
    }
    println!();
    println!(
        "{:<15} {:<22} {:<22} {:>8} {:<14} {:>12} {:>12} {:>8} {:>8} {:>9}",
        "State", "Local", "Remote", "Pid", "Program", "Bytes out", "Bytes in", "Msg out", "Msg in", "Ring fill"
    );
    for c in &conns {
        let (l, r) = if c.role == "client" { (c.header.client_addr, c.header.server_addr) } else { (c.header.server_addr, c.header.client_addr) };
        println!(
            "{:<15} {:<22} {:<22} {:>8} {:<14} {:>12} {:>12} {:>8} {:>8} {:>8.1}%",
            if c.other_netns { format!("{}+netns", c.state) } else { c.state.clone() }, fmt(l), fmt(r), c.pid, shown(&comm(c.pid)), c.sent, c.received, c.msgs_out, c.msgs_in,
            100.0 * c.fill_out as f64 / f64::from(c.header.geometry.ring_capacity)
        );
    }
    if !bad.is_empty() {
        println!();
        println!("Files named colo-seg that are not valid segments (not read further):");
        for (pid, path, why) in &bad {
            println!("  {path} (pid {pid}, {}): {why}", shown(&comm(*pid)));
        }
    }
    Ok(())
}
