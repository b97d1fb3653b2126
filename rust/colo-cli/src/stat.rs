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

fn listeners() -> Vec<Listening> {
    let text = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
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
    std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim().to_string()).unwrap_or_else(|_| "?".into())
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
    }
    (sockets, segments)
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
}

fn read_u64(base: *const u8, off: usize) -> u64 {
    // SAFETY: callers pass offsets inside the read-only mapping, checked against its length.
    unsafe { std::ptr::read_volatile(base.add(off) as *const u64) }
}

fn read_u32(base: *const u8, off: usize) -> u32 {
    // SAFETY: as in `read_u64`.
    unsafe { std::ptr::read_volatile(base.add(off) as *const u32) }
}

/// One connection end: the segment at `path` as process `pid` holds it. `seen_before`: how many
/// descriptors of this same segment `pid` was already listed with (a process connected to its own
/// listener holds the client's and the server's).
fn inspect(pid: u32, path: &std::path::Path, seen_before: usize) -> Option<ConnInfo> {
    let file = std::fs::File::open(path).ok()?;
    let map = colo_sys::segment::map_readonly(&file).ok()?;
    if map.len() < 4096 {
        return None;
    }
    // SAFETY: the mapping is at least 4096 bytes and readable.
    let head = unsafe { std::slice::from_raw_parts(map.as_ptr(), HEADER_FIELDS) };
    let (header, layout) = Header::decode(head).ok()?;
    if map.len() < layout.segment_size {
        return None;
    }
    let own_peer = header.client_pid == pid && header.server_pid == pid;
    let role = if header.client_pid == pid && !(own_peer && seen_before > 0) { "client" } else { "server" };
    let (out_c2s, base) = (role == "client", map.as_ptr() as *const u8);
    // A segment this side parked for reuse is not a connection any more.
    use colo_ring::layout::{CLIENT_PARKED, PARKED, SERVER_PARKED};
    if read_u32(base, PARKED) & if out_c2s { CLIENT_PARKED } else { SERVER_PARKED } != 0 {
        return None;
    }
    let blk = |c2s: bool| layout.block_offset(c2s);
    use colo_ring::layout::block;
    let out = blk(out_c2s);
    let inn = blk(!out_c2s);
    let sent = read_u64(base, out + block::RING_HEAD);
    let received = read_u64(base, inn + block::RING_TAIL);
    let fill_out = sent.wrapping_sub(read_u64(base, out + block::RING_TAIL));
    let (fo, fi) = (read_u32(base, out + block::RING_FLAGS), read_u32(base, inn + block::RING_FLAGS));
    let state = match (fo & 1 != 0, fi & 1 != 0, (fo | fi) & 2 != 0) {
        (_, _, true) => "reset",
        (true, true, _) => "closed",
        (true, false, _) => "write-shut",
        (false, true, _) => "peer-write-shut",
        _ => "open",
    };
    Some(ConnInfo {
        pid,
        header,
        role,
        sent,
        received,
        msgs_out: read_u64(base, out + block::MSG_HEAD),
        msgs_in: read_u64(base, inn + block::MSG_TAIL),
        fill_out,
        state: state.into(),
    })
}

pub fn run(a: Args) -> io::Result<()> {
    let (sockets, segments) = scan();
    let ls = listeners();
    let mut seen: HashMap<(u32, u64), usize> = HashMap::new();
    let conns: Vec<ConnInfo> = segments
        .iter()
        .filter_map(|(pid, p)| {
            use std::os::unix::fs::MetadataExt;
            let ino = std::fs::metadata(p).map_or(0, |m| m.ino());
            let n = seen.entry((*pid, ino)).or_insert(0);
            *n += 1;
            inspect(*pid, p, *n - 1)
        })
        .collect();
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
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
        return Ok(());
    }
    println!("{:<8} {:<26} {:>8}  {}", "State", "Local", "Pid", "Program");
    for l in &ls {
        let pid = sockets.get(&l.inode).copied();
        println!("{:<8} {:<26} {:>8}  {}", "LISTEN", l.name, pid.map_or("-".into(), |p| p.to_string()), pid.map_or("-".into(), comm));
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
            c.state, fmt(l), fmt(r), c.pid, comm(c.pid), c.sent, c.received, c.msgs_out, c.msgs_in,
            100.0 * c.fill_out as f64 / f64::from(c.header.geometry.ring_capacity)
        );
    }
    Ok(())
}
