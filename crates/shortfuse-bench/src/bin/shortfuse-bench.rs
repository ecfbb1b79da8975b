//! `shortfuse bench` on its own: `shortfuse-bench [SUITE...] [--quick]
//! [--configs a,b] [--out DIR]`, the same arguments `shortfuse bench` takes.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(shortfuse_bench::cli_main(&args));
}
