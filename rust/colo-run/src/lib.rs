pub fn run(_cmd: &[String]) -> i32 { 0 }
