//! `shortfuse-s3 ROOT [--listen ADDR] [--bucket NAME]...`: an S3-compatible
//! server over ROOT (see the library's documentation). Prints
//! `shortfuse-s3: serving ROOT on ADDR` once it listens.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use shortfuse_s3::{S3Config, S3Server};

#[derive(Parser)]
#[command(
    version,
    about = "An S3-compatible server over a directory (buckets are its subdirectories)"
)]
struct Args {
    /// Directory that holds the buckets.
    root: PathBuf,
    /// Address to listen on (port 0: any free port, printed).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8014")]
    listen: SocketAddr,
    /// Bucket to create at start if missing (repeatable).
    #[arg(long, value_name = "NAME")]
    bucket: Vec<String>,
    /// Access key that requests must be signed with (with --secret-key;
    /// without both, unsigned requests are served).
    #[arg(long, value_name = "KEY", requires = "secret_key")]
    access_key: Option<String>,
    #[arg(long, value_name = "SECRET", requires = "access_key")]
    secret_key: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let cfg = S3Config {
        root: args.root.clone(),
        listen: args.listen,
        buckets: args.bucket,
        credentials: args.access_key.zip(args.secret_key),
    };
    match S3Server::start(cfg) {
        Ok(server) => {
            println!("shortfuse-s3: serving {} on {}", args.root.display(), server.addr());
            use std::io::Write;
            let _ = std::io::stdout().flush();
            server.wait();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("shortfuse-s3: {e}");
            ExitCode::FAILURE
        }
    }
}
