//! Processes bounded in time. A test never hangs: every process it starts
//! is waited for with a limit, killed when it overruns, and the failure
//! shows what the process printed until then. Output is read while the
//! process runs, since a process that fills a pipe (64 KiB) blocks on its
//! next write and would look hung, or, for a node, silent to its peers.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How much of each stream a timeout message shows (the end of it).
const SHOWN_BYTES: usize = 8192;

/// Runs `cmd` to its end with stdin closed and its stdout and stderr
/// captured; kills it and panics, with what it printed so far, after
/// `limit`. `what` names it in the message. Returns the output and its
/// stdout followed by its stderr as text.
pub fn run_bounded(cmd: &mut Command, what: &str, limit: Duration) -> (Output, String) {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {:?}: {e}", cmd.get_program()));
    let out = Running::watch_named(vec![child], vec![what.to_string()])
        .wait(limit)
        .pop()
        .expect("one output");
    let text = text_of(&out);
    (out, text)
}

/// [`run_bounded`] for a command's own tests: (success, stdout, stderr),
/// failing the test if the process panicked, whatever its exit status.
pub fn run_unpanicked(cmd: &mut Command, what: &str, limit: Duration) -> (bool, String, String) {
    let (out, _) = run_bounded(cmd, what, limit);
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(!e.contains("panicked"), "{what} panicked: {e}");
    (out.status.success(), o, e)
}

/// A process's stdout followed by its stderr, as text.
pub fn text_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Waits for every child, reading their piped output meanwhile; after
/// `limit` kills those still running and panics with their output so far.
/// The outputs come in the children's order.
pub fn wait_all(children: Vec<Child>, limit: Duration) -> Vec<Output> {
    Running::watch(children).wait(limit)
}

/// Children whose output is being read while they run: start watching
/// them at once (before, say, injecting a fault into their network) and
/// wait for them later.
pub struct Running {
    children: Vec<Watched>,
    done: Receiver<(usize, std::io::Result<ExitStatus>)>,
}

struct Watched {
    name: String,
    pid: u32,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    status: Option<ExitStatus>,
}

impl Running {
    /// Starts reading the piped stdout and stderr of each child.
    pub fn watch(children: Vec<Child>) -> Running {
        let names = (0..children.len())
            .map(|i| format!("process {i}"))
            .collect();
        Running::watch_named(children, names)
    }

    /// As [`Running::watch`], with a name per child for the messages.
    pub fn watch_named(children: Vec<Child>, names: Vec<String>) -> Running {
        assert_eq!(children.len(), names.len(), "a name per child");
        let (tx, done) = channel();
        let children = children
            .into_iter()
            .zip(names)
            .enumerate()
            .map(|(i, (child, name))| watch_one(i, child, name, tx.clone()))
            .collect();
        Running { children, done }
    }

    /// Waits for every child to end and close its output; after `limit`
    /// (from now) kills those still running and panics with their output.
    pub fn wait(mut self, limit: Duration) -> Vec<Output> {
        let deadline = Instant::now() + limit;
        let mut left = self.children.len();
        while left > 0 {
            match self
                .done
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok((i, status)) => {
                    let status = status
                        .unwrap_or_else(|e| panic!("waiting for {}: {e}", self.children[i].name));
                    self.children[i].status = Some(status);
                    left -= 1;
                }
                Err(RecvTimeoutError::Timeout) => self.overran(limit),
                Err(RecvTimeoutError::Disconnected) => unreachable!("a sender per child"),
            }
        }
        self.children
            .into_iter()
            .map(|c| Output {
                status: c.status.expect("finished"),
                stdout: std::mem::take(&mut *c.stdout.lock().unwrap()),
                stderr: std::mem::take(&mut *c.stderr.lock().unwrap()),
            })
            .collect()
    }

    fn overran(&self, limit: Duration) -> ! {
        let mut message = String::new();
        for c in self.children.iter().filter(|c| c.status.is_none()) {
            // SAFETY: signalling a child of ours that has not been reaped
            // (its waiting thread has not reported), so the pid is still its.
            unsafe { libc::kill(c.pid as i32, libc::SIGKILL) };
            message += &format!(
                "\n{} (pid {}) did not finish within {limit:?}; its output so far:\n\
                 --- stdout ---\n{}\n--- stderr ---\n{}",
                c.name,
                c.pid,
                tail(&c.stdout.lock().unwrap()),
                tail(&c.stderr.lock().unwrap()),
            );
        }
        panic!("{}", message.trim_start());
    }
}

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let cut = text.len().saturating_sub(SHOWN_BYTES);
    let start = (cut..=text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    if start > 0 {
        format!("[... {start} bytes ...]{}", &text[start..])
    } else {
        text.into_owned()
    }
}

fn watch_one(
    index: usize,
    mut child: Child,
    name: String,
    done: Sender<(usize, std::io::Result<ExitStatus>)>,
) -> Watched {
    let stdout = Arc::new(Mutex::new(Vec::new()));
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let readers: Vec<JoinHandle<()>> = [
        child.stdout.take().map(|s| read_into(s, stdout.clone())),
        child.stderr.take().map(|s| read_into(s, stderr.clone())),
    ]
    .into_iter()
    .flatten()
    .collect();
    let pid = child.id();
    std::thread::spawn(move || {
        let status = child.wait();
        // The output is complete once both pipes are closed.
        for r in readers {
            let _ = r.join();
        }
        let _ = done.send((index, status));
    });
    Watched {
        name,
        pid,
        stdout,
        stderr,
        status: None,
    }
}

fn read_into(mut pipe: impl Read + Send + 'static, buf: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.lock().unwrap().extend_from_slice(&chunk[..n]),
            }
        }
    })
}

/// Waits for `child` (whose output goes elsewhere, e.g. to files); kills
/// it and panics after `limit`.
pub fn wait_exit(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for a child") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A child that is killed (and reaped) when the test lets go of it, even
/// when the test fails half-way.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The path of program `prog`, looked for on `PATH` and in the sbin
/// directories (root's tools, e.g. opensm); panics with `install_hint`
/// when it is not there.
pub fn require_program(prog: &str, install_hint: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let sbin = ["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from);
    std::env::split_paths(&path)
        .chain(sbin)
        .map(|dir| dir.join(prog))
        .find(|p| is_executable(p))
        .unwrap_or_else(|| panic!("{prog} not found: {install_hint}"))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A point in time a polling loop must not pass: `check` fails the test
/// naming what was being waited for.
pub struct Deadline {
    end: Instant,
    what: &'static str,
}

impl Deadline {
    pub fn new(secs: u64, what: &'static str) -> Deadline {
        Deadline {
            end: Instant::now() + Duration::from_secs(secs),
            what,
        }
    }

    /// Panics ("timed out: WHAT") once the deadline has passed.
    pub fn check(&self) {
        assert!(Instant::now() < self.end, "timed out: {}", self.what);
    }

    pub fn passed(&self) -> bool {
        Instant::now() >= self.end
    }
}

/// Ends the whole test process (exit code 3) if the returned sender is
/// neither used nor dropped within `limit`: for code that can hang where
/// no deadline can reach it (inside a C library). Keep the sender alive
/// for the test's length.
pub fn watchdog(name: &'static str, limit: Duration) -> Sender<()> {
    let (tx, rx) = channel::<()>();
    std::thread::spawn(move || {
        if let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
            eprintln!("test {name} still running after {limit:?}: aborting");
            std::process::exit(3);
        }
    });
    tx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        cmd
    }

    #[test]
    fn a_finished_process_gives_its_status_and_output() {
        let (out, text) = run_bounded(
            &mut sh("echo out; echo err >&2; exit 3"),
            "sh",
            Duration::from_secs(30),
        );
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(text, "out\nerr\n");
    }

    #[test]
    fn an_overrun_is_killed_and_shows_what_it_printed() {
        let started = Instant::now();
        let failure = std::panic::catch_unwind(|| {
            run_bounded(
                &mut sh("echo started; echo trouble >&2; exec sleep 30"),
                "the sleeper",
                Duration::from_millis(300),
            )
        })
        .expect_err("an overrun fails the test");
        let message = failure
            .downcast_ref::<String>()
            .expect("a formatted message");
        assert!(
            message.contains("the sleeper") && message.contains("did not finish within 300ms"),
            "{message}"
        );
        assert!(
            message.contains("started") && message.contains("trouble"),
            "{message}"
        );
        assert!(started.elapsed() < Duration::from_secs(10), "not killed");
    }

    #[test]
    fn outputs_come_in_the_childrens_order() {
        let spawn = |script: &str| {
            sh(script)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let slow = spawn("sleep 0.3; echo slow");
        let fast = spawn("echo fast");
        let outs = wait_all(vec![slow, fast], Duration::from_secs(30));
        assert_eq!(outs[0].stdout, b"slow\n");
        assert_eq!(outs[1].stdout, b"fast\n");
    }
}
