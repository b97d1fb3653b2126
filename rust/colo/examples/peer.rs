//! The cross-language test peer (tests/xlang/PEER.md), Rust edition.

use colo::{Listener, Options, Stream};
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::process::exit;

fn pattern(i: u64) -> u8 {
    (i % 251) as u8
}

fn msg_byte(k: u64, j: u64) -> u8 {
    ((k + j) % 251) as u8
}

fn options() -> Options {
    Options::new().pool(4 << 20, 8)
}

fn serve(addr: &str, mode: &str) -> io::Result<()> {
    let listener = Listener::bind_with(addr, options())?;
    println!("READY {}", listener.local_addr()?);
    io::stdout().flush()?;
    // Nothing a client does ends the server: a failed accept (out of descriptors, say) or a
    // thread that cannot be had costs that connection only, with a line on stderr.
    let mut delay = std::time::Duration::ZERO;
    // PEER_ACCEPT_DELAY_MS: wait that long before each accept (a busy server, whose connections
    // wait in the backlog: tests/attack/t_rt_offer_displace.sh).
    let late = std::env::var("PEER_ACCEPT_DELAY_MS").ok().and_then(|v| v.parse().ok()).map(std::time::Duration::from_millis);
    loop {
        if let Some(late) = late {
            std::thread::sleep(late);
        }
        let s = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) => {
                eprintln!("peer server: accept: {e}");
                // EMFILE and the like leave the connection queued: do not spin on it.
                delay = (delay * 2).clamp(std::time::Duration::from_millis(5), std::time::Duration::from_secs(1));
                std::thread::sleep(delay);
                continue;
            }
        };
        delay = std::time::Duration::ZERO;
        let mode = mode.to_string();
        // A small stack: the echo loops need little, and under a `ulimit -v` more threads fit.
        let spawned = std::thread::Builder::new().stack_size(256 * 1024).spawn(move || {
            let r = if mode == "msg" { echo_messages(&s) } else { echo_stream(&s) };
            if let Err(e) = r {
                eprintln!("peer server: connection: {e}");
            }
        });
        if let Err(e) = spawned {
            // The connection (moved into the closure) is closed as the closure is dropped.
            eprintln!("peer server: no thread for a connection: {e}; closed it");
        }
    }
}

fn echo_stream(s: &Stream) -> io::Result<()> {
    // Out of memory (a `ulimit -v`) fails this connection, not the process.
    let mut buf = Vec::new();
    buf.try_reserve_exact(256 * 1024).map_err(|e| io::Error::new(io::ErrorKind::OutOfMemory, e))?;
    buf.resize(256 * 1024, 0u8);
    loop {
        let n = (&*s).read(&mut buf)?;
        if n == 0 {
            return s.shutdown(Shutdown::Write);
        }
        (&*s).write_all(&buf[..n])?;
    }
}

fn echo_messages(s: &Stream) -> io::Result<()> {
    while let Some(m) = s.recv_message()? {
        let mut out = s.loan(m.len())?;
        out.copy_from_slice(&m);
        drop(m);
        out.send()?;
    }
    Ok(())
}

fn client_stream(s: Stream, total: u64) -> io::Result<()> {
    let reader = s.try_clone()?;
    let check = std::thread::spawn(move || -> io::Result<()> {
        let mut buf = vec![0u8; 256 * 1024];
        let mut got = 0u64;
        loop {
            let n = (&reader).read(&mut buf)?;
            if n == 0 {
                break;
            }
            for (i, b) in buf[..n].iter().enumerate() {
                if *b != pattern(got + i as u64) {
                    return Err(io::Error::other(format!("mismatch at byte {}", got + i as u64)));
                }
            }
            got += n as u64;
        }
        if got != total {
            return Err(io::Error::other(format!("echo ended after {got} of {total} bytes")));
        }
        Ok(())
    });
    let mut sent = 0u64;
    let mut chunk = vec![0u8; 64 * 1024];
    while sent < total {
        let n = chunk.len().min((total - sent) as usize);
        for (i, b) in chunk[..n].iter_mut().enumerate() {
            *b = pattern(sent + i as u64);
        }
        (&s).write_all(&chunk[..n])?;
        sent += n as u64;
    }
    s.shutdown(Shutdown::Write)?;
    check.join().map_err(|_| io::Error::other("reader panicked"))?
}

/// Writes every byte before reading any of the echo: the connection must buffer them all, as TCP
/// does (the rings grow).
fn client_write_first(s: Stream, total: u64) -> io::Result<()> {
    let mut sent = 0u64;
    let mut chunk = vec![0u8; 64 * 1024];
    while sent < total {
        let n = chunk.len().min((total - sent) as usize);
        for (i, b) in chunk[..n].iter_mut().enumerate() {
            *b = pattern(sent + i as u64);
        }
        (&s).write_all(&chunk[..n])?;
        sent += n as u64;
    }
    s.shutdown(Shutdown::Write)?;
    let mut got = 0u64;
    loop {
        let n = (&s).read(&mut chunk)?;
        if n == 0 {
            break;
        }
        if let Some(i) = chunk[..n].iter().enumerate().position(|(i, b)| *b != pattern(got + i as u64)) {
            return Err(io::Error::other(format!("mismatch at byte {}", got + i as u64)));
        }
        got += n as u64;
    }
    if got != total {
        return Err(io::Error::other(format!("echo ended after {got} of {total} bytes")));
    }
    Ok(())
}

fn client_msg(s: &Stream, count: u64, size: usize) -> io::Result<()> {
    for k in 0..count {
        let mut loan = s.loan(size)?;
        for (j, b) in loan.iter_mut().enumerate() {
            *b = msg_byte(k, j as u64);
        }
        loan.send()?;
        let m = s.recv_message()?.ok_or_else(|| io::Error::other("early end of stream"))?;
        if m.len() != size || m.iter().enumerate().any(|(j, b)| *b != msg_byte(k, j as u64)) {
            return Err(io::Error::other(format!("message {k} differs")));
        }
    }
    Ok(())
}

/// `count` round trips of 64 bytes through the echo server (after as many to warm up): the
/// median and the 99th percentile, in microseconds.
fn client_rtt(mut s: Stream, count: usize) -> io::Result<(f64, f64)> {
    let mut out = [0u8; 64];
    let mut back = [0u8; 64];
    let mut took = Vec::with_capacity(count);
    for k in 0..2 * count {
        out[0] = k as u8;
        let t = std::time::Instant::now();
        s.write_all(&out)?;
        s.read_exact(&mut back)?;
        if k >= count {
            took.push(t.elapsed().as_nanos() as u64);
        }
        if back != out {
            return Err(io::Error::other(format!("round trip {k} differs")));
        }
    }
    took.sort_unstable();
    let at = |p: f64| took[((took.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    Ok((at(0.5), at(0.99)))
}

fn client_halfclose(mut s: Stream) -> io::Result<()> {
    s.write_all(b"hello")?;
    s.shutdown(Shutdown::Write)?;
    let mut got = Vec::new();
    s.read_to_end(&mut got)?;
    if got != b"hello" {
        return Err(io::Error::other(format!("got {got:?}")));
    }
    Ok(())
}

/// A first connection echoed and closed; once the file `gate` exists, a second one to the same
/// address read to its end (tests/attack/t_rt_known_pid_reuse.sh).
fn client_redial(s: Stream, addr: &str, gate: &str) -> io::Result<()> {
    client_halfclose(s)?;
    println!("FIRST");
    io::stdout().flush()?;
    while !std::path::Path::new(gate).exists() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut s = Stream::connect_with(addr, &options())?;
    s.write_all(b"x")?;
    let mut n = 0;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    println!("client read {n}");
    io::stdout().flush()?;
    std::thread::sleep(std::time::Duration::from_millis(1500));
    drop(s);
    std::thread::sleep(std::time::Duration::from_secs(2));
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = || -> ! {
        eprintln!("usage: peer server ADDR stream|msg | peer client ADDR stream BYTES | peer client ADDR writefirst BYTES | peer client ADDR msg COUNT SIZE | peer client ADDR halfclose | peer client ADDR redial GATE | peer client ADDR rtt COUNT (prints RTT <p50 us> <p99 us> <transport>)");
        exit(2)
    };
    if args.len() < 4 {
        usage();
    }
    let r = match (args[1].as_str(), args[3].as_str()) {
        ("server", mode @ ("stream" | "msg")) => serve(&args[2], mode),
        ("client", kind) => (|| {
            let s = Stream::connect_with(args[2].as_str(), &options())?;
            let transport = s.transport();
            let count = match kind {
                "stream" => {
                    let total: u64 = args.get(4).and_then(|v| v.parse().ok()).unwrap_or_else(|| usage());
                    client_stream(s, total)?;
                    total
                }
                "writefirst" => {
                    let total: u64 = args.get(4).and_then(|v| v.parse().ok()).unwrap_or_else(|| usage());
                    client_write_first(s, total)?;
                    total
                }
                "msg" => {
                    let count: u64 = args.get(4).and_then(|v| v.parse().ok()).unwrap_or_else(|| usage());
                    let size: usize = args.get(5).and_then(|v| v.parse().ok()).unwrap_or_else(|| usage());
                    client_msg(&s, count, size)?;
                    count
                }
                "halfclose" => {
                    client_halfclose(s)?;
                    5
                }
                "redial" => {
                    let gate = args.get(4).unwrap_or_else(|| usage());
                    return client_redial(s, &args[2], gate);
                }
                "rtt" => {
                    let count: usize = args.get(4).and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or_else(|| usage());
                    let (p50, p99) = client_rtt(s, count)?;
                    println!("RTT {p50:.2} {p99:.2} {transport}");
                    return Ok(());
                }
                _ => usage(),
            };
            println!("OK {count} {transport}");
            Ok(())
        })(),
        _ => usage(),
    };
    if let Err(e) = r {
        eprintln!("peer: {e}");
        exit(1);
    }
}
