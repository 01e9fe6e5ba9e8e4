//! Which process a peer is, and whether it is waiting for a CPU.
//!
//! A peer silent for the peer timeout is lost, unless its process is on
//! this host and runnable: then its silence is starvation on a loaded
//! machine (more busy processes than cores), not a hang, and the liveness
//! core gives it a grace ([`evb_core::liveness::STARVED_GRACE`]). Each
//! endpoint names its process in its Hello ([`evb_core::wire::Message::Hello`]:
//! `host`, `pid`); a transport that keeps the peer's [`PeerProcess`] can
//! answer [`crate::Transport::peer_runnable`] whatever carries its bytes
//! (TCP, UCX, libfabric, MPI). A peer on another host is never runnable
//! here: its process table is not ours to read.

use std::sync::OnceLock;

/// A peer's process as its Hello named it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerProcess {
    /// [`this_host`] of the peer (0: unknown).
    pub host: u64,
    pub pid: u32,
}

impl PeerProcess {
    /// This process, as its Hello names it.
    pub fn ours() -> Self {
        PeerProcess {
            host: this_host(),
            pid: std::process::id(),
        }
    }

    /// The process is on this host (the same kernel and process-id
    /// namespace) and one of its threads is running or waiting for a CPU.
    pub fn runnable(&self) -> bool {
        self.host != 0
            && self.host == this_host()
            && i32::try_from(self.pid).is_ok_and(process_runnable)
    }
}

/// What identifies this host: the kernel's boot id (one per boot of one
/// machine), the process-id namespace we run in (two containers on one
/// kernel number their processes apart) and the network namespace (a test
/// that stands hosts up as network namespaces on one machine gets hosts
/// that are apart: a cut link between two of them must not pass for a
/// starved peer). 0 when any cannot be read, and never for a real host.
pub fn this_host() -> u64 {
    static HOST: OnceLock<u64> = OnceLock::new();
    *HOST.get_or_init(|| {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id");
        let namespace = |kind: &str| {
            std::fs::read_link(format!("/proc/self/ns/{kind}"))
                .map(|ns| ns.to_string_lossy().into_owned())
        };
        match (boot, namespace("pid"), namespace("net")) {
            (Ok(boot), Ok(pid), Ok(net)) => host_key(&[boot.trim(), &pid, &net]),
            _ => 0,
        }
    })
}

/// FNV-1a over the names, each ended by a 0 byte (stable across builds
/// and processes, unlike std's randomly keyed hasher); never 0, which
/// means "unknown".
fn host_key(names: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in names.iter().flat_map(|n| n.bytes().chain([0])) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(1)
}

/// Whether a thread of process `pid` is running or waiting for a CPU. Any
/// thread, not only the first (which `/proc/PID/stat` describes): the
/// thread that runs a node's event loop need not be the process's first.
/// A stopped, hung (sleeping) or gone process is not runnable.
pub fn process_runnable(pid: i32) -> bool {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    threads
        .flatten()
        .any(|t| state_in(&t.path().join("stat")) == Some('R'))
}

/// The state letter of process `pid` from `/proc/PID/stat` (`R` running or
/// runnable, `S` sleeping, `T` stopped, `Z` zombie, ...), `None` if it is
/// gone. The field follows the command name, which is in parentheses and
/// may itself hold spaces or parentheses: read after the last `)`.
pub fn process_state(pid: i32) -> Option<char> {
    state_in(std::path::Path::new(&format!("/proc/{pid}/stat")))
}

/// The state letter in a `stat` file of /proc (a process's or a thread's).
fn state_in(stat: &std::path::Path) -> Option<char> {
    let stat = std::fs::read_to_string(stat).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command};
    use std::time::Duration;

    /// A child process killed and reaped when the test ends, passed or not.
    struct Kid(Child);

    impl Drop for Kid {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    impl Kid {
        fn spinning() -> Kid {
            Kid(Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap())
        }

        fn pid(&self) -> i32 {
            self.0.id() as i32
        }

        fn stop(&self) {
            // SAFETY: signalling a process this test started.
            unsafe { libc::kill(self.pid(), libc::SIGSTOP) };
        }
    }

    /// Polls `f` for up to a second: a state letter is a sample, and a
    /// loaded machine may show a spinning process between two runs.
    fn within_a_second(f: impl Fn() -> bool) -> bool {
        (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            f()
        })
    }

    /// A running process is runnable, a sleeping one is not, a stopped
    /// one is not, a reaped one is gone.
    #[test]
    fn process_state_tells_runnable_from_stopped() {
        let spin = Kid::spinning();
        let sleep = Kid(Command::new("sleep").arg("30").spawn().unwrap());
        let (spin_pid, sleep_pid) = (spin.pid(), sleep.pid());
        assert!(within_a_second(|| process_state(spin_pid) == Some('R')));
        assert!(within_a_second(|| process_state(sleep_pid) == Some('S')));
        spin.stop();
        assert!(within_a_second(|| process_state(spin_pid) == Some('T')));
        drop((spin, sleep));
        assert_eq!(process_state(spin_pid), None, "reaped");
    }

    /// This process is runnable while one of its threads (this test's,
    /// not the first) runs, though its first thread waits.
    #[test]
    fn a_process_is_runnable_when_any_of_its_threads_is() {
        assert!(process_runnable(std::process::id() as i32));
        assert!(PeerProcess::ours().runnable());
    }

    /// A peer named by a Hello from this host is runnable while it spins
    /// and not once stopped; the same process named from another host, or
    /// from an unknown one, never is.
    #[test]
    fn only_a_runnable_process_on_this_host_is_runnable() {
        let spin = Kid::spinning();
        let here = PeerProcess {
            host: this_host(),
            pid: spin.pid() as u32,
        };
        assert_ne!(here.host, 0, "this host has a boot id and a pid namespace");
        assert!(within_a_second(|| here.runnable()));
        for host in [0, here.host ^ 1] {
            let elsewhere = PeerProcess { host, ..here };
            assert!((0..20).all(|_| !elsewhere.runnable()), "host {host:x}");
        }
        spin.stop();
        assert!(within_a_second(|| !here.runnable()));
        drop(spin);
        assert!(!here.runnable(), "reaped");
        assert_eq!(PeerProcess::ours().pid, std::process::id());
    }

    /// The key is the same for the same names, differs when any differs
    /// (the boot, the process-id or the network namespace), and is never
    /// the 0 that means unknown.
    #[test]
    fn the_host_key_names_the_boot_and_the_namespaces() {
        let k = host_key(&["b1", "pid:[1]", "net:[1]"]);
        assert_eq!(k, host_key(&["b1", "pid:[1]", "net:[1]"]));
        assert_ne!(k, host_key(&["b2", "pid:[1]", "net:[1]"]));
        assert_ne!(k, host_key(&["b1", "pid:[2]", "net:[1]"]));
        assert_ne!(k, host_key(&["b1", "pid:[1]", "net:[2]"]));
        assert_ne!(host_key(&["b", "1"]), host_key(&["b1", ""]));
        assert_ne!(k, 0);
        assert_eq!(this_host(), this_host());
    }
}
