//! The results of `colo bench`: one [`Row`] per measurement, the median of a measurement's
//! slices, the ratios against TCP loopback and Unix sockets, and the table they are printed in.

/// One line of results.
#[derive(Debug, Clone)]
pub struct Row {
    pub group: String,
    pub case: String,
    pub transport: String,
    /// Round-trip latencies: p50, p99 in microseconds; throughput in GB/s or connections/s.
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub rate: Option<f64>,
    pub unit: &'static str,
}

/// The median of one measurement's slices, field by field (`None` if every slice failed).
pub fn median_row(mut slices: Vec<Row>) -> Option<Row> {
    let median = |v: &mut Vec<f64>| -> Option<f64> {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let field = |f: fn(&Row) -> Option<f64>, s: &[Row]| median(&mut s.iter().filter_map(f).collect());
    let (p50, p99, rate) = (field(|r| r.p50_us, &slices), field(|r| r.p99_us, &slices), field(|r| r.rate, &slices));
    let mut row = slices.pop()?;
    (row.p50_us, row.p99_us, row.rate) = (p50, p99, rate);
    Some(row)
}

/// The value compared across transports: p50 for latency (lower is better), rate otherwise.
pub fn metric(r: &Row) -> Option<f64> {
    r.p50_us.or(r.rate)
}

pub fn ratio(r: &Row, base: Option<&Row>) -> Option<f64> {
    let (a, b) = (metric(r)?, metric(base?)?);
    Some(if r.p50_us.is_some() { b / a } else { a / b })
}

pub fn find<'a>(rows: &'a [Row], r: &Row, transport: &str) -> Option<&'a Row> {
    rows.iter().find(|x| x.group == r.group && x.case == r.case && x.transport == transport)
}

pub fn print_table(rows: &[Row]) {
    let mut group = "";
    for r in rows {
        if r.group != group {
            group = &r.group;
            println!("\n{}", r.group);
            if r.p50_us.is_some() {
                println!("  {:<10} {:<22} {:>10} {:>10} {:>8} {:>8}", "size", "transport", "p50 us", "p99 us", "x TCP", "x Unix");
            } else {
                println!("  {:<24} {:<22} {:>12} {:>8} {:>8}", "case", "transport", "rate", "x TCP", "x Unix");
            }
        }
        let fx = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2}x"));
        let (xt, xu) = (fx(ratio(r, find(rows, r, "tcp"))), fx(ratio(r, find(rows, r, "unix"))));
        if let (Some(p50), Some(p99)) = (r.p50_us, r.p99_us) {
            println!("  {:<10} {:<22} {:>10.2} {:>10.2} {:>8} {:>8}", r.case, r.transport, p50, p99, xt, xu);
        } else if let Some(rate) = r.rate {
            let v = if r.unit == "GB/s" { format!("{rate:.2} GB/s") } else { format!("{rate:.0} {}", r.unit) };
            println!("  {:<24} {:<22} {:>12} {:>8} {:>8}", r.case, r.transport, v, xt, xu);
        }
    }
    println!("\nratios: how many times better than TCP loopback / Unix sockets in this run (latency: p50).");
    for (shown, name, what) in LEGEND {
        if rows.iter().any(|r| shown(&r.transport)) {
            println!("  {name:<18} {what}");
        }
    }
}

/// Whether a row's transport is the one a legend line explains.
type Shown = fn(&str) -> bool;

/// What each transport of the table is, printed under the table for the transports it shows
/// (the first field tells a row's transport it explains).
const LEGEND: [(Shown, &str, &str); 6] = [
    (|t| t == "tcp", "tcp", "TCP loopback, client and server in two processes (so are unix and colo)"),
    (|t| t == "unix", "unix", "a Unix stream socket"),
    (|t| t == "colo", "colo", "colo's byte stream as programs get it by default (spins up to 5 us, adaptive)"),
    (|t| t.starts_with("colo (spin"), "colo (spin ...)", "colo spinning never / always before it sleeps (COLO_SPIN_US=0 / inf)"),
    (|t| t.starts_with("colo msg"), "colo msg", "colo's zero-copy messages: a loaned slot sent as a descriptor, read in place"),
    (|t| t.starts_with("bare ring"), "bare ring (floor)", "two threads of one process on a colo ring alone, no connection: the floor"),
];
