//! A timing of the table's operations (ignored; run by hand).

use super::table::{Guard, Local, Table};
use std::time::Instant;

#[allow(dead_code)] // only moved around
struct Big([u64; 11]);

/// `cargo test --release -p colo-ffi timing -- --ignored --nocapture`
#[test]
#[ignore = "timing, not a test"]
fn table_operations() {
    thread_local! {
        static LOCAL: Local<Big> = const { Local::new() };
        static GUARD: Guard<Big> = const { Guard::new() };
    }
    static T: Table<Big> = Table::new(&LOCAL, &GUARD);
    let n = 5_000_000u64;
    let c = T.insert(2, Big([1; 11])).ok().unwrap();
    let t0 = Instant::now();
    for i in 0..n {
        let h = T.insert(1, Big([i; 11])).ok().unwrap();
        let b = T.take(std::hint::black_box(h), 1, |_| Ok::<(), ()>(())).ok().unwrap();
        std::hint::black_box(b);
    }
    let t1 = Instant::now();
    for _ in 0..n {
        std::hint::black_box(&*T.get(std::hint::black_box(c), 2).unwrap());
    }
    let t2 = Instant::now();
    for _ in 0..n {
        std::hint::black_box(&*T.get_cached(std::hint::black_box(c), 2).unwrap());
    }
    let t3 = Instant::now();
    let ns = |a: Instant, b: Instant| (b - a).as_nanos() as f64 / n as f64;
    println!("insert+take {:.1} ns, get+drop {:.1} ns, get_cached+drop {:.1} ns", ns(t0, t1), ns(t1, t2), ns(t2, t3));
}
