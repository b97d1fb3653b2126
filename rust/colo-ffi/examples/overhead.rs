//! The cost of the C ABI layer: the same in-process loops as tests/c (see README), through the
//! Rust API directly. `cargo run --release -p colo-ffi --example overhead`
use colo::{Listener, Stream};
use std::io::{Read, Write};
use std::time::Instant;

fn main() -> std::io::Result<()> {
    let l = Listener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let t = std::thread::spawn(move || l.accept().map(|(s, _)| s));
    let c = Stream::connect(addr)?;
    let s = t.join().expect("accept thread")?;
    let n = 1_000_000;
    let tl = Instant::now();
    for _ in 0..n {
        drop(c.loan(64)?);
    }
    let t0 = Instant::now();
    for _ in 0..n {
        let mut loan = c.loan(64)?;
        loan.fill(1);
        loan.send()?;
        let m = s.recv_message()?.expect("a message");
        drop(m);
    }
    let t1 = Instant::now();
    let mut buf = [0u8; 64];
    for _ in 0..n {
        (&c).write_all(&buf)?;
        (&s).read_exact(&mut buf)?;
    }
    let t2 = Instant::now();
    println!(
        "loan+cancel {:.0} ns, msg cycle {:.0} ns, stream cycle {:.0} ns",
        (t0 - tl).as_nanos() as f64 / n as f64,
        (t1 - t0).as_nanos() as f64 / n as f64,
        (t2 - t1).as_nanos() as f64 / n as f64
    );
    Ok(())
}
