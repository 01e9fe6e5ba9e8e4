//! A one-node Slurm made for a test: Debian's munge, slurmctld and slurmd
//! (installed by scripts/setup.sh), each with its own socket, ports, state
//! and spool in a temporary directory. Used by evb-cli's tests/cli/slurm.rs
//! (real `srun` steps) and tests/cli/fabric_cli.rs (slurmctld reading evb's
//! topology.conf).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::run_bounded;

/// A Slurm controller and compute daemon on this machine, stopped on drop.
pub struct Cluster {
    pub dir: PathBuf,
    pub conf: PathBuf,
    /// This machine's short host name: the cluster's one compute node.
    pub host: String,
    daemons: Vec<Child>,
}

impl Cluster {
    pub fn start(name: &str) -> Cluster {
        Cluster::start_with(name, "", &[])
    }

    /// A cluster whose slurm.conf ends with `extra` lines, with `files`
    /// (name, text) written beside slurm.conf first (where slurmctld looks
    /// for topology.conf).
    pub fn start_with(name: &str, extra: &str, files: &[(&str, &str)]) -> Cluster {
        for tool in ["munged", "slurmctld", "slurmd", "srun", "sinfo"] {
            let found = Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .is_ok_and(|o| o.status.success());
            assert!(found, "{tool} is missing: scripts/setup.sh installs munge, slurmctld, slurmd and slurm-client");
        }
        let dir = std::env::temp_dir().join(format!("evb-slurm-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["state", "spool", "munge", "log"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join("munge"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        let key = dir.join("munge/munge.key");
        let socket = dir.join("munge/munge.sock");
        run_ok(Command::new("mungekey").arg("-c").arg("-k").arg(&key));
        // munged goes to the background by itself; stopped in Drop.
        run_ok(
            Command::new("munged")
                .arg("--force")
                .arg(format!("--socket={}", socket.display()))
                .arg(format!("--key-file={}", key.display()))
                .arg(format!(
                    "--log-file={}",
                    dir.join("log/munged.log").display()
                ))
                .arg(format!(
                    "--pid-file={}",
                    dir.join("munge/munged.pid").display()
                ))
                .arg(format!("--seed-file={}", dir.join("munge/seed").display())),
        );
        let host = String::from_utf8(run_ok(Command::new("hostname").arg("-s")).stdout)
            .unwrap()
            .trim()
            .to_string();
        // Ports of their own, so that a Slurm already on the machine (or a
        // test running beside this one) is not disturbed.
        let port = 20000 + (std::process::id() % 10000) as u16 * 2;
        let conf = dir.join("slurm.conf");
        let d = dir.display();
        std::fs::write(
            &conf,
            format!(
                "ClusterName=evbtest\n\
                 SlurmctldHost={host}(127.0.0.1)\n\
                 SlurmctldPort={port}\n\
                 SlurmdPort={}\n\
                 SlurmUser=root\n\
                 SlurmdUser=root\n\
                 AuthType=auth/munge\n\
                 AuthInfo=socket={}\n\
                 CredType=cred/munge\n\
                 StateSaveLocation={d}/state\n\
                 SlurmdSpoolDir={d}/spool\n\
                 SlurmctldPidFile={d}/slurmctld.pid\n\
                 SlurmdPidFile={d}/slurmd.pid\n\
                 SlurmctldLogFile={d}/log/slurmctld.log\n\
                 SlurmdLogFile={d}/log/slurmd.log\n\
                 ProctrackType=proctrack/pgid\n\
                 TaskPlugin=task/none\n\
                 SchedulerType=sched/builtin\n\
                 SelectType=select/linear\n\
                 MpiDefault=none\n\
                 ReturnToService=2\n\
                 SlurmdParameters=config_overrides\n\
                 NodeName={host} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN\n\
                 PartitionName=evb Nodes={host} Default=YES MaxTime=10 State=UP OverSubscribe=FORCE:8\n\
                 {extra}",
                port + 1,
                socket.display(),
            ),
        )
        .unwrap();
        for (f, text) in files {
            std::fs::write(dir.join(f), text).unwrap();
        }
        let daemon = |exe: &str| {
            Command::new(exe)
                .arg("-D")
                .arg("-f")
                .arg(&conf)
                .env("SLURM_CONF", &conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("{exe}: {e}"))
        };
        let mut cluster = Cluster {
            dir,
            conf: conf.clone(),
            host: host.clone(),
            daemons: Vec::new(),
        };
        cluster.daemons.push(daemon("slurmctld"));
        cluster.daemons.push(daemon("slurmd"));
        cluster.wait_idle(&host);
        cluster
    }

    /// Until the node reports idle (the controller is up and the compute
    /// daemon registered); panics with the daemons' logs after 30 s.
    pub fn wait_idle(&self, host: &str) {
        let start = Instant::now();
        loop {
            let state = Command::new("sinfo")
                .args(["-h", "-n", host, "-o", "%t"])
                .env("SLURM_CONF", &self.conf)
                .output();
            if state.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle") {
                return;
            }
            if start.elapsed() > Duration::from_secs(30) {
                panic!(
                    "the test's Slurm did not come up within 30 s\n{}\n{}",
                    read(&self.dir.join("log/slurmctld.log")),
                    read(&self.dir.join("log/slurmd.log"))
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `srun` with `args` on this cluster, bounded in time.
    pub fn srun(&self, args: &[&str], what: &str) -> (std::process::Output, String) {
        run_bounded(
            Command::new("srun")
                .args(args)
                .env("SLURM_CONF", &self.conf),
            what,
            Duration::from_secs(90),
        )
    }
}

impl Cluster {
    /// A Slurm client command (`scontrol`, `sinfo`, ...) on this cluster,
    /// bounded in time; panics with its output when it fails.
    pub fn client(&self, prog: &str, args: &[&str]) -> String {
        let (out, text) = run_bounded(
            Command::new(prog).args(args).env("SLURM_CONF", &self.conf),
            prog,
            Duration::from_secs(30),
        );
        assert!(out.status.success(), "{prog} {args:?}: {text}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The controller's log so far.
    pub fn ctld_log(&self) -> String {
        read(&self.dir.join("log/slurmctld.log"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            let _ = d.kill();
            let _ = d.wait();
        }
        let _ = Command::new("munged")
            .arg("--stop")
            .arg(format!(
                "--socket={}",
                self.dir.join("munge/munge.sock").display()
            ))
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The text of `path`, or a line saying why it could not be read (for
/// failure messages: a daemon's log may not exist yet).
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("{}: {e}", path.display()))
}
