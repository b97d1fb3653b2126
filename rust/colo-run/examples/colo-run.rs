//! `colo-run CMD ARGS...`: the `colo run` launcher as a stand-alone program (for tests).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).skip_while(|a| a == "--").collect();
    std::process::exit(colo_run::run(&args));
}
