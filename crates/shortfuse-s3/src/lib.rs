//! An S3-compatible server over a directory, for distfs's scale-out mode
//! (`shortfuse dist up --s3 URL`): the requests are handled by `s3s-fs`
//! (buckets are directories under the root, objects files in them); this
//! crate binds the socket, serves HTTP/1.1 on it and stops on drop.
//!
//! It is a real S3 server as far as a client can tell (signature V4
//! authentication, ListObjectsV2, ranges), not a mock: distfs's tests and
//! benchmarks run it to measure and exercise the S3 path. It is not a
//! production store: `s3s-fs` does not fsync what it writes, so a PUT it
//! has answered survives the server process but not a crash of the
//! machine.

use std::net::SocketAddr;
use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use tokio::net::TcpListener;
use tokio::runtime::Runtime;

/// What [`S3Server::start`] serves.
#[derive(Clone, Debug)]
pub struct S3Config {
    /// Buckets are the directories under it.
    pub root: PathBuf,
    pub listen: SocketAddr,
    /// Buckets made at start if missing (directories under `root`).
    pub buckets: Vec<String>,
    /// Access key and secret that requests must be signed with; `None`
    /// takes unsigned requests.
    pub credentials: Option<(String, String)>,
}

/// A running server; dropping it stops it.
pub struct S3Server {
    rt: Option<Runtime>,
    addr: SocketAddr,
}

fn invalid(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, msg)
}

fn valid_bucket(name: &str) -> bool {
    // S3's rule (3 to 63 of lower-case letters, digits, dots and hyphens),
    // which also keeps the name a plain directory name.
    (3..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !name.starts_with(['.', '-'])
}

impl S3Server {
    /// Creates the root and buckets, binds `listen` and serves in
    /// background threads.
    pub fn start(cfg: S3Config) -> std::io::Result<S3Server> {
        std::fs::create_dir_all(&cfg.root)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", cfg.root.display())))?;
        for b in &cfg.buckets {
            if !valid_bucket(b) {
                return Err(invalid(format!(
                    "bucket name {b:?}: 3 to 63 lower-case letters, digits, dots or hyphens"
                )));
            }
            std::fs::create_dir_all(cfg.root.join(b))?;
        }
        let fs = s3s_fs::FileSystem::new(&cfg.root)
            .map_err(|e| std::io::Error::other(format!("{}: {e:?}", cfg.root.display())))?;
        let mut service = S3ServiceBuilder::new(fs);
        if let Some((key, secret)) = cfg.credentials {
            service.set_auth(SimpleAuth::from_single(key, secret));
        }
        let service = service.build();
        // Two threads: the file I/O of s3s-fs goes through tokio's blocking
        // pool, so the workers only parse and answer.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shortfuse-s3")
            .enable_all()
            .build()?;
        let listener = std::net::TcpListener::bind(cfg.listen)
            .map_err(|e| std::io::Error::new(e.kind(), format!("listen on {}: {e}", cfg.listen)))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let listener = {
            let _guard = rt.enter();
            TcpListener::from_std(listener)?
        };
        rt.spawn(async move {
            let http = hyper::server::conn::http1::Builder::new();
            loop {
                let sock = match listener.accept().await {
                    Ok((sock, _)) => sock,
                    // Out of descriptors and the like: try again shortly
                    // rather than spin.
                    Err(_) => {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = sock.set_nodelay(true);
                let conn = http.serve_connection(TokioIo::new(sock), service.clone());
                tokio::spawn(async move {
                    // A client that goes away mid-request is its own problem.
                    let _ = conn.await;
                });
            }
        });
        Ok(S3Server { rt: Some(rt), addr })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until the process is stopped.
    pub fn wait(self) {
        if let Some(rt) = &self.rt {
            rt.block_on(std::future::pending::<()>());
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(std::time::Duration::from_secs(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::valid_bucket;

    #[test]
    fn bucket_names() {
        assert!(valid_bucket("distfs"));
        assert!(valid_bucket("a.b-c1"));
        for bad in ["ab", "Dist", "a/b", "..x", "-ab", &"x".repeat(64)] {
            assert!(!valid_bucket(bad), "{bad}");
        }
    }
}
