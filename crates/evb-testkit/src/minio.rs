//! A real MinIO server for the S3 tests: built by `scripts/minio.sh`
//! (in the background of `scripts/test.sh`; the tests that need it are
//! named `s3_...` and run last), started on free loopback ports with a
//! scratch data directory, stopped when dropped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::net::free_port;
use crate::process::run_bounded;
use crate::repo_root;
use crate::scratch::scratch_dir;

/// The server's root credentials.
pub const ACCESS_KEY: &str = "evbtest";
pub const SECRET_KEY: &str = "evbtest-secret";

/// How long a test waits for MinIO's build: a fresh Go build takes about
/// 5 minutes of both cores.
const MINIO_BUILD_LIMIT: Duration = Duration::from_secs(1200);

/// A running MinIO server.
pub struct Minio {
    /// The server process (a test may stop and resume it).
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

impl Drop for Minio {
    fn drop(&mut self) {
        // SAFETY: plain syscall on our own child's pid; resumes it in case
        // a test stopped it, so the kill below takes effect.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGCONT);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds MinIO if needed (never skipped: the S3 tests need a real
/// server), starts it, and waits until its health check answers.
pub fn start_minio(tag: &str) -> Minio {
    let script = repo_root().join("scripts/minio.sh");
    let (install, text) = run_bounded(
        Command::new(&script).arg("install"),
        "scripts/minio.sh install",
        MINIO_BUILD_LIMIT,
    );
    assert!(
        install.status.success(),
        "MinIO could not be built (scripts/minio.sh install): {text}"
    );
    let out = Command::new(&script)
        .arg("path")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "MinIO is missing after scripts/minio.sh install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let binary = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let port = free_port();
    // One directory a server: tests run side by side.
    let data = scratch_dir(&format!("minio-{tag}-{port}"));
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(&data).unwrap();
    let console = free_port();
    let child = Command::new(&binary)
        .args(["server", "--quiet", "--address"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--console-address")
        .arg(format!("127.0.0.1:{console}"))
        .arg(&data)
        .env("MINIO_ROOT_USER", ACCESS_KEY)
        .env("MINIO_ROOT_PASSWORD", SECRET_KEY)
        .env("MINIO_BROWSER", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
    let minio = Minio {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready(port) {
        assert!(Instant::now() < deadline, "MinIO not ready after 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    minio
}

/// MinIO's readiness check answers 200, and so does its S3 API: the
/// health check can pass while the object layer still answers every
/// request 503 `XMinioServerNotInitialized` (seen under load: a test's
/// create-bucket failed so); an anonymous listing is refused (403) once
/// it is up.
fn ready(port: u16) -> bool {
    status(port, "/minio/health/ready") == Some(*b"200")
        && status(port, "/").is_some_and(|code| code != *b"503")
}

/// The HTTP status code of `GET path`, if the server answered.
fn status(port: u16, path: &str) -> Option<[u8; 3]> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    s.write_all(request.as_bytes()).ok()?;
    // "HTTP/1.1 200"
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    Some([head[9], head[10], head[11]])
}
