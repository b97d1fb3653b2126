//! `colo bench`: every number comes from this run, with TCP loopback and Unix sockets measured
//! side by side, each server in its own process.

use crate::results::{find, median_row, print_table, ratio, Row};
use colo::{Options, SpinMode, Stream};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also draw the results into this PNG file.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<std::path::PathBuf>,
    /// Seconds per measurement (the default run takes about a minute).
    #[arg(long, default_value_t = 0.6)]
    seconds: f64,
    /// Only the 64 B round trip (quick check).
    #[arg(long)]
    quick: bool,
    /// Only the measurements whose group, case or transport contains this text (e.g. `short`);
    /// comma-separated words must all match (e.g. `short,colo`).
    #[arg(long)]
    only: Option<String>,
}

#[derive(clap::Args)]
pub struct ServeArgs {
    transport: String,
    op: String,
    spin: String,
    #[arg(long)]
    pin: Option<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Net {
    Tcp,
    Unix,
    Colo,
}

impl Net {
    fn name(self) -> &'static str {
        match self {
            Net::Tcp => "tcp",
            Net::Unix => "unix",
            Net::Colo => "colo",
        }
    }
}

fn spin_of(s: &str) -> Option<SpinMode> {
    match s {
        "never" => Some(SpinMode::Never),
        "always" => Some(SpinMode::Always),
        _ => None,
    }
}

fn bench_options(spin: &str) -> Options {
    let o = Options::new().ring_capacity(1 << 20).pool(1 << 20, 8);
    match spin_of(spin) {
        Some(m) => o.spin(m),
        None => o,
    }
}

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` < CPU_SETSIZE on any machine this runs on.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
}

fn unpin() {
    // SAFETY: as in `pin_to`, with every CPU set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for c in 0..libc::CPU_SETSIZE as usize {
        // SAFETY: `c` < CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
}

// ---- the server process ------------------------------------------------------------------

trait Conn: Read + Write + Send {}
impl<T: Read + Write + Send> Conn for T {}

/// Serves one connection; `buf` is the server's one scratch buffer (allocating and zeroing 1 MiB
/// per connection would dominate the short-lived case for every transport).
fn handle(op: &str, c: &mut dyn Conn, colo: Option<&Stream>, buf: &mut [u8]) -> io::Result<()> {
    match op {
        "echo" => loop {
            let n = c.read(buf)?;
            if n == 0 {
                return Ok(());
            }
            c.write_all(&buf[..n])?;
        },
        "sink" => {
            let mut total = 0u64;
            loop {
                let n = c.read(buf)?;
                if n == 0 {
                    return c.write_all(&total.to_le_bytes());
                }
                total += n as u64;
            }
        }
        "msg" => {
            let s = colo.expect("messages need colo");
            while let Some(m) = s.recv_message()? {
                let mut out = s.loan(m.len())?;
                out.copy_from_slice(&m);
                drop(m);
                out.send()?;
            }
            Ok(())
        }
        "msgsink" => {
            let s = colo.expect("messages need colo");
            let (mut count, mut check) = (0u64, 0u64);
            while let Some(m) = s.recv_message()? {
                // Read the message in place: its header and its last byte.
                check = check.wrapping_add(u64::from(m[0]) + u64::from(m[m.len() - 1]));
                count += 1;
            }
            let mut out = s.loan(16)?;
            out[..8].copy_from_slice(&count.to_le_bytes());
            out[8..].copy_from_slice(&check.to_le_bytes());
            out.send()
        }
        "short" => {
            let mut req = [0u8; 64];
            c.read_exact(&mut req)?;
            c.write_all(&req)
        }
        _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "unknown op")),
    }
}

pub fn serve(a: ServeArgs) -> io::Result<()> {
    if let Some(cpu) = a.pin {
        pin_to(cpu);
    }
    // The parent closes our stdin when it is done with us.
    std::thread::spawn(|| {
        let _ = io::stdin().read(&mut [0u8; 1]);
        std::process::exit(0);
    });
    let op = a.op.clone();
    let out = io::stdout();
    let mut buf = vec![0u8; 1 << 20];
    match a.transport.as_str() {
        "tcp" => {
            let l = TcpListener::bind("127.0.0.1:0")?;
            writeln!(out.lock(), "READY {}", l.local_addr()?)?;
            for s in l.incoming() {
                let mut s = s?;
                s.set_nodelay(true)?;
                let _ = handle(&op, &mut s, None, &mut buf);
            }
        }
        "unix" => {
            let path = std::env::temp_dir().join(format!("colo-bench-{}.sock", std::process::id()));
            let _ = std::fs::remove_file(&path);
            let l = UnixListener::bind(&path)?;
            writeln!(out.lock(), "READY {}", path.display())?;
            for s in l.incoming() {
                let _ = handle(&op, &mut s?, None, &mut buf);
            }
        }
        _ => {
            let l = colo::Listener::bind_with("127.0.0.1:0", bench_options(&a.spin))?;
            writeln!(out.lock(), "READY {}", l.local_addr()?)?;
            loop {
                let (s, _) = l.accept()?;
                let mut r = &s;
                let _ = handle(&op, &mut r, Some(&s), &mut buf);
            }
        }
    }
    Ok(())
}

// ---- the measuring process -----------------------------------------------------------------

struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(net: Net, op: &str, spin: &str, pin: Option<usize>) -> io::Result<Server> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(["__bench-serve", net.name(), op, spin]);
        if let Some(cpu) = pin {
            cmd.args(["--pin", &cpu.to_string()]);
        }
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
        let addr = line.strip_prefix("READY ").map(|s| s.trim().to_string());
        let addr = addr.ok_or_else(|| io::Error::other(format!("bench server said {line:?}")))?;
        Ok(Server { child, addr })
    }

    fn connect(&self, net: Net, spin: &str) -> io::Result<Box<dyn ConnExt>> {
        Ok(match net {
            Net::Tcp => {
                let s = TcpStream::connect(&self.addr)?;
                s.set_nodelay(true)?;
                Box::new(s)
            }
            Net::Unix => Box::new(UnixStream::connect(&self.addr)?),
            Net::Colo => {
                let s = Stream::connect_with(self.addr.as_str(), &bench_options(spin))?;
                if s.transport() != colo::Transport::SharedMemory {
                    return Err(io::Error::other("colo bench connection fell back to TCP"));
                }
                Box::new(s)
            }
        })
    }
}

impl Server {
    /// A connection with the library's default options (what an application gets).
    fn connect_default(&self, net: Net) -> io::Result<Box<dyn ConnExt>> {
        if net != Net::Colo {
            return self.connect(net, "default");
        }
        let s = Stream::connect(self.addr.as_str())?;
        if s.transport() != colo::Transport::SharedMemory {
            return Err(io::Error::other("colo bench connection fell back to TCP"));
        }
        Ok(Box::new(s))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
        if self.addr.starts_with('/') {
            let _ = std::fs::remove_file(&self.addr);
        }
    }
}

trait ConnExt: Read + Write {
    fn colo(&self) -> Option<&Stream> {
        None
    }
    fn finish(&mut self) -> io::Result<()>;
}

impl ConnExt for TcpStream {
    fn finish(&mut self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}
impl ConnExt for UnixStream {
    fn finish(&mut self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}
impl ConnExt for Stream {
    fn colo(&self) -> Option<&Stream> {
        Some(self)
    }
    fn finish(&mut self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn round_trips(c: &mut dyn ConnExt, size: usize, msg: bool, secs: f64) -> io::Result<(f64, f64)> {
    let buf = vec![7u8; size];
    let mut back = vec![0u8; size];
    let mut once = |c: &mut dyn ConnExt| -> io::Result<()> {
        if msg {
            let s = c.colo().expect("colo");
            let mut l = s.loan(size)?;
            l[0] = 7;
            l.send()?;
            let m = s.recv_message()?.ok_or_else(|| io::Error::other("eof"))?;
            if m.len() != size {
                return Err(io::Error::other("short message"));
            }
            Ok(())
        } else {
            c.write_all(&buf)?;
            c.read_exact(&mut back)
        }
    };
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_secs_f64(secs / 5.0) {
        once(c)?;
    }
    let mut samples = Vec::with_capacity(1 << 20);
    let start = Instant::now();
    let until = Duration::from_secs_f64(secs);
    while start.elapsed() < until || samples.len() < 50 {
        let t = Instant::now();
        once(c)?;
        samples.push(t.elapsed().as_nanos() as u64);
    }
    samples.sort_unstable();
    Ok((percentile(&samples, 0.5), percentile(&samples, 0.99)))
}

fn throughput(c: &mut dyn ConnExt, size: usize, msg: bool, secs: f64) -> io::Result<f64> {
    let buf = vec![1u8; size];
    let start = Instant::now();
    let until = Duration::from_secs_f64(secs);
    let mut sent = 0u64;
    if msg {
        let s = c.colo().expect("colo").try_clone()?;
        let mut count = 0u64;
        while start.elapsed() < until {
            let mut l = s.loan(size)?;
            // Produced in place: a header and a trailer; the receiver reads them in place.
            l[0] = count as u8;
            l[size - 1] = 1;
            l.send()?;
            count += 1;
        }
        s.shutdown(Shutdown::Write)?;
        let m = s.recv_message()?.ok_or_else(|| io::Error::other("no ack"))?;
        let got = u64::from_le_bytes(m[..8].try_into().expect("8"));
        if got != count {
            return Err(io::Error::other(format!("receiver saw {got} of {count} messages")));
        }
        sent = count * size as u64;
    } else {
        while start.elapsed() < until {
            c.write_all(&buf)?;
            sent += size as u64;
        }
        c.finish()?;
        let mut ack = [0u8; 8];
        c.read_exact(&mut ack)?;
        if u64::from_le_bytes(ack) != sent {
            return Err(io::Error::other("receiver count differs"));
        }
    }
    Ok(sent as f64 / start.elapsed().as_secs_f64() / 1e9)
}

fn short_lived(srv: &Server, net: Net, secs: f64) -> io::Result<f64> {
    let start = Instant::now();
    let mut n = 0u64;
    let req = [3u8; 64];
    let mut resp = [0u8; 64];
    while start.elapsed() < Duration::from_secs_f64(secs) {
        let mut c = srv.connect_default(net)?;
        c.write_all(&req)?;
        c.read_exact(&mut resp)?;
        drop(c);
        n += 1;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// The bare ring floor: two threads ping-ponging 64 B over colo-ring rings, spinning only.
fn ring_floor(size: usize, secs: f64) -> (f64, f64) {
    use colo::internal::segment::{Role, Segment};
    let geometry = colo_ring::layout::Geometry { ring_capacity: 1 << 20, slot_size: 0, slot_count: 0 };
    let layout = geometry.layout().expect("valid");
    let (fd, map) = colo_sys::segment::create(layout.segment_size).expect("memfd");
    Segment::start_rings(&map, &layout);
    let fd2 = fd.try_clone().expect("dup");
    let map2 = colo_sys::segment::attach(&fd, layout.segment_size).unwrap_or_else(|_| panic!("attach"));
    // SAFETY: both mappings are the whole segment laid out by `layout`.
    let (a, b) = unsafe { (Segment::new(map, layout, fd), Segment::new(map2, layout, fd2)) };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let t = std::thread::spawn(move || {
        // SAFETY: one producer and one consumer per role; `b` lives in this thread's frame.
        let (mut p, mut c) = unsafe { (b.producer(Role::Server), b.consumer(Role::Server)) };
        let mut buf = vec![0u8; size];
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let mut got = 0;
            while got < size && !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                got += c.read(&mut buf[got..]).expect("ring");
            }
            let mut put = 0;
            while put < got {
                put += p.write(&buf[put..got]).expect("ring");
            }
        }
    });
    // SAFETY: as above, for the client role, in this thread.
    let (mut p, mut c) = unsafe { (a.producer(Role::Client), a.consumer(Role::Client)) };
    let buf = vec![5u8; size];
    let mut back = vec![0u8; size];
    let mut samples = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs_f64(secs) {
        let t0 = Instant::now();
        let mut put = 0;
        while put < size {
            put += p.write(&buf[put..]).expect("ring");
        }
        let mut got = 0;
        while got < size {
            got += c.read(&mut back[got..]).expect("ring");
        }
        samples.push(t0.elapsed().as_nanos() as u64);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // Unblock the echo thread if it waits for bytes.
    let _ = p.write(&vec![0u8; size]);
    let _ = t.join();
    samples.sort_unstable();
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

struct Plan {
    group: &'static str,
    case: String,
    transport: String,
    /// Measures once for the given seconds; called once per round.
    work: Box<dyn Fn(f64) -> io::Result<Row>>,
}

fn rtt_case(net: Net, spin: &'static str, size: usize, msg: bool, pin: Option<usize>) -> Plan {
    let label = match (net, msg, spin) {
        (Net::Colo, true, "default") => "colo msg".to_string(),
        (Net::Colo, true, s) => format!("colo msg (spin {s})"),
        (Net::Colo, false, "default") => "colo".to_string(),
        (Net::Colo, false, s) => format!("colo (spin {s})"),
        (n, _, _) => n.name().to_string(),
    };
    let group = if pin.is_some() { "round trip, both on one CPU" } else { "round trip" };
    let case = format!("{} B", size);
    let (c2, l2) = (case.clone(), label.clone());
    Plan {
        group,
        case,
        transport: label,
        work: Box::new(move |secs| {
            if let Some(cpu) = pin {
                pin_to(cpu);
            }
            let srv = Server::start(net, if msg { "msg" } else { "echo" }, spin, pin)?;
            let mut c = srv.connect(net, spin)?;
            let r = round_trips(&mut *c, size, msg, secs);
            if pin.is_some() {
                unpin();
            }
            let (p50, p99) = r?;
            Ok(Row { group: group.into(), case: c2.clone(), transport: l2.clone(), p50_us: Some(p50), p99_us: Some(p99), rate: None, unit: "us" })
        }),
    }
}

fn tput_case(net: Net, size: usize, msg: bool) -> Plan {
    let label = match (net, msg) {
        (Net::Colo, true) => "colo msg (zero-copy)".to_string(),
        (n, _) => n.name().to_string(),
    };
    let case = if size >= 1 << 20 { format!("{} MiB writes", size >> 20) } else { format!("{} KiB writes", size >> 10) };
    let (c2, l2) = (case.clone(), label.clone());
    Plan {
        group: "throughput",
        case,
        transport: label,
        work: Box::new(move |secs| {
            let srv = Server::start(net, if msg { "msgsink" } else { "sink" }, "default", None)?;
            let mut c = srv.connect(net, "default")?;
            let gbps = throughput(&mut *c, size, msg, secs)?;
            Ok(Row { group: "throughput".into(), case: c2.clone(), transport: l2.clone(), p50_us: None, p99_us: None, rate: Some(gbps), unit: "GB/s" })
        }),
    }
}

fn short_case(net: Net) -> Plan {
    Plan {
        group: "short-lived connections",
        case: "connect + 64 B + close".into(),
        transport: net.name().into(),
        work: Box::new(move |secs| {
            let srv = Server::start(net, "short", "default", None)?;
            let rate = short_lived(&srv, net, secs)?;
            Ok(Row {
                group: "short-lived connections".into(),
                case: "connect + 64 B + close".into(),
                transport: net.name().into(),
                p50_us: None,
                p99_us: None,
                rate: Some(rate),
                unit: "conn/s",
            })
        }),
    }
}

fn floor_case(size: usize) -> Plan {
    let case = format!("{} B", size);
    let c2 = case.clone();
    Plan {
        group: "round trip",
        case,
        transport: "bare ring (floor)".into(),
        work: Box::new(move |secs| {
            let (p50, p99) = ring_floor(size, secs);
            Ok(Row { group: "round trip".into(), case: c2.clone(), transport: "bare ring (floor)".into(), p50_us: Some(p50), p99_us: Some(p99), rate: None, unit: "us" })
        }),
    }
}

fn plans(quick: bool) -> Vec<Plan> {
    let mut v = Vec::new();
    let sizes: &[usize] = if quick { &[64] } else { &[64, 1024, 16 * 1024, 64 * 1024] };
    for &size in sizes {
        v.push(rtt_case(Net::Tcp, "default", size, false, None));
        v.push(rtt_case(Net::Unix, "default", size, false, None));
        v.push(rtt_case(Net::Colo, "default", size, false, None));
        v.push(rtt_case(Net::Colo, "never", size, false, None));
        v.push(rtt_case(Net::Colo, "always", size, false, None));
        v.push(rtt_case(Net::Colo, "default", size, true, None));
        v.push(floor_case(size));
    }
    if quick {
        return v;
    }
    for net in [Net::Tcp, Net::Unix, Net::Colo] {
        v.push(rtt_case(net, "default", 64, false, Some(0)));
    }
    for size in [64 * 1024, 1 << 20] {
        v.push(tput_case(Net::Tcp, size, false));
        v.push(tput_case(Net::Unix, size, false));
        v.push(tput_case(Net::Colo, size, false));
        v.push(tput_case(Net::Colo, size, true));
    }
    for net in [Net::Tcp, Net::Unix, Net::Colo] {
        v.push(short_case(net));
    }
    v
}

/// Slices each measurement is taken in (see `run`).
const ROUNDS: usize = 3;

pub fn run(a: Args) -> io::Result<()> {
    colo_sys::preload::raise_fd_limit();
    let mut plans = plans(a.quick);
    if let Some(f) = &a.only {
        // Comma-separated words: a measurement runs if every word is in its group, case or transport.
        let names = |field: fn(&Plan) -> &str| {
            let mut v: Vec<&str> = Vec::new();
            for p in &plans {
                if !v.contains(&field(p)) {
                    v.push(field(p));
                }
            }
            v.join("; ")
        };
        let known = format!("groups: {}\ncases: {}\ntransports: {}", names(|p| p.group), names(|p| &p.case), names(|p| &p.transport));
        plans.retain(|p| f.split(',').all(|w| p.group.contains(w) || p.case.contains(w) || p.transport.contains(w)));
        if plans.is_empty() {
            let msg = format!("--only {f:?} matches no measurement; it takes words of these:\n{known}");
            return Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        }
    }
    // The plot's file is created before the minute of measuring, so that a path that cannot be
    // written fails at once.
    if let Some(path) = &a.plot {
        std::fs::File::create(path).map_err(|e| io::Error::new(e.kind(), format!("--plot {}: {e}", path.display())))?;
    }
    let bar = ProgressBar::new((plans.len() * ROUNDS) as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").expect("template"));
    if a.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    // Every measurement runs in ROUNDS slices, the plans taking turns, and reports the median
    // of its slices: on a shared 2-core VM the host's placement of the vCPUs changes within
    // seconds (the bare ring's round trip alone moves between 0.25 and 0.9 us), and a ratio of
    // two measurements taken a minute apart would compare two different machines.
    let mut results: Vec<Vec<Row>> = plans.iter().map(|_| Vec::new()).collect();
    for _ in 0..ROUNDS {
        for (p, got) in plans.iter().zip(results.iter_mut()) {
            bar.set_message(format!("{} {} {}", p.group, p.case, p.transport));
            match (p.work)(a.seconds / ROUNDS as f64) {
                Ok(r) => got.push(r),
                Err(e) => {
                    bar.suspend(|| eprintln!("colo bench: {} {} {}: {e}", p.group, p.case, p.transport));
                }
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let rows: Vec<Row> = results.into_iter().filter_map(median_row).collect();
    if a.json {
        let v: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "group": r.group, "case": r.case, "transport": r.transport,
                    "p50_us": r.p50_us, "p99_us": r.p99_us, "rate": r.rate, "unit": r.unit,
                    "x_tcp": ratio(r, find(&rows, r, "tcp")), "x_unix": ratio(r, find(&rows, r, "unix")),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
    } else {
        print_table(&rows);
    }
    if let Some(path) = a.plot {
        crate::plot::draw(&rows, &path).map_err(|e| io::Error::other(format!("--plot {}: {e}", path.display())))?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(())
}
