//! `evb node` under a real Slurm: a one-node cluster made for the test
//! (Debian's munge, slurmctld and slurmd, installed by scripts/setup.sh,
//! each with its own socket, ports, state and spool in a temporary
//! directory), and real `srun` steps of 4 tasks on it, as
//! docs/cluster.md's batch script runs them on a cluster.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::run_bounded;

/// A Slurm controller and compute daemon on this machine, stopped on drop.
struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
    daemons: Vec<Child>,
}

impl Cluster {
    fn start(name: &str) -> Cluster {
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
                 PartitionName=evb Nodes={host} Default=YES MaxTime=10 State=UP OverSubscribe=FORCE:8\n",
                port + 1,
                socket.display(),
            ),
        )
        .unwrap();
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
            daemons: Vec::new(),
        };
        cluster.daemons.push(daemon("slurmctld"));
        cluster.daemons.push(daemon("slurmd"));
        cluster.wait_idle(&host);
        cluster
    }

    /// Until the node reports idle (the controller is up and the compute
    /// daemon registered); panics with the daemons' logs after 30 s.
    fn wait_idle(&self, host: &str) {
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
    fn srun(&self, args: &[&str], what: &str) -> (std::process::Output, String) {
        run_bounded(
            Command::new("srun")
                .args(args)
                .env("SLURM_CONF", &self.conf),
            what,
            Duration::from_secs(90),
        )
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

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("{}: {e}", path.display()))
}

/// The final reports of a 4-node run: every MEP the EM assigned was built,
/// by the 4 ranks Slurm numbered, none incomplete or lost.
fn assert_exact(rendezvous: &Path, text: &str) {
    let reports: Vec<Value> = (0..4)
        .map(|r| {
            let path = rendezvous.join("run1").join(format!("final-{r}.json"));
            serde_json::from_str(&read(&path)).unwrap_or_else(|e| panic!("{e}\n{text}"))
        })
        .collect();
    let assigned = reports[0]["meps_assigned"].as_u64().unwrap();
    assert!(assigned > 10, "{text}");
    assert_eq!(
        reports[0]["em_meps_built"].as_u64().unwrap(),
        assigned,
        "{text}"
    );
    let built: u64 = reports
        .iter()
        .map(|r| r["batches_built"].as_u64().unwrap())
        .sum();
    assert_eq!(built, assigned, "{text}");
    for (rank, r) in reports.iter().enumerate() {
        assert_eq!(r["node"], rank, "{text}");
        assert_eq!(r["batches_incomplete"], 0, "{text}");
    }
    for rank in 0..4 {
        assert!(
            text.contains(&format!("rank {rank} of 4 from Slurm")),
            "{text}"
        );
    }
}

/// 4 tasks of one `srun` step over tcp and shm (Slurm only launches; the
/// nodes meet in the rendezvous directory), then over MPI itself with
/// Slurm's PMIx (`srun --mpi=pmix`: OpenMPI's MPI_Init gets its ranks from
/// slurmd, no mpirun anywhere).
#[test]
fn srun_steps_build_every_event() {
    let cluster = Cluster::start("steps");
    for (transport, mpi) in [("tcp", "none"), ("shm", "none"), ("mpi", "pmix")] {
        let rdv = cluster.dir.join(format!("rdv-{transport}"));
        let (out, text) = cluster.srun(
            &[
                &format!("--mpi={mpi}"),
                "-n",
                "4",
                env!("CARGO_BIN_EXE_evb"),
                "node",
                "--control",
                "launcher",
                "--rendezvous",
                rdv.to_str().unwrap(),
                "--set",
                "run.duration_s=1.5",
                "--set",
                &format!("transport.kind={transport}"),
                "--set",
                "source.events_per_mep=256",
            ],
            &format!("srun over {transport}"),
        );
        assert!(out.status.success(), "{transport}: {text}");
        assert_exact(&rdv, &text);
    }
}
