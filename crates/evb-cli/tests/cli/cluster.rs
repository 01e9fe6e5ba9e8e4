//! `evb node --control launcher`: the event builder started by a cluster
//! launcher. Real OpenMPI `mpirun` and MPICH `mpiexec` (installed by
//! scripts/setup.sh); real Slurm `srun` is in tests/cli/slurm.rs.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use evb_testkit::{evb, evb_path, mpich_evb, run_bounded};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("evb-cluster-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// OpenMPI's `mpirun` starting evb on 4 ranks, as root, on 2 cores, with
/// `extra` options.
fn openmpi(extra: &[&str]) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
    ])
    .args(extra)
    .args(["-np", "4"])
    .arg(evb_path());
    cmd
}

/// The final reports the nodes wrote into the rendezvous directory.
fn finals(dir: &std::path::Path, nodes: usize) -> Vec<Value> {
    (0..nodes)
        .map(|r| {
            let path = dir.join("run1").join(format!("final-{r}.json"));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            serde_json::from_str(&text).unwrap()
        })
        .collect()
}

/// Every MEP the EM assigned was built, none incomplete or lost.
fn assert_exact(reports: &[Value], nodes: usize, text: &str) {
    assert_eq!(reports.len(), nodes, "{text}");
    let em = &reports[0];
    let assigned = em["meps_assigned"].as_u64().unwrap();
    assert!(assigned > 10, "{text}");
    assert_eq!(em["em_meps_built"].as_u64().unwrap(), assigned, "{text}");
    let built: u64 = reports
        .iter()
        .map(|r| r["batches_built"].as_u64().unwrap())
        .sum();
    assert_eq!(built, assigned, "{text}");
    for r in reports {
        assert_eq!(r["batches_incomplete"], 0, "{text}");
        assert!(
            r.get("peers_lost")
                .is_none_or(|p| p.as_array().unwrap().is_empty()),
            "{text}"
        );
    }
}

#[test]
fn under_openmpi_mpirun() {
    let mpirun = Command::new("mpirun").arg("--version").output();
    assert!(
        mpirun.is_ok_and(|o| o.status.success()),
        "mpirun is missing: scripts/setup.sh installs openmpi-bin"
    );
    for transport in ["tcp", "shm", "mpi"] {
        let dir = tmp(transport);
        let (out, text) = run_bounded(
            openmpi(&[])
                .args(["node", "--control", "launcher", "--rendezvous"])
                .arg(&dir)
                .args(["--set", "run.duration_s=1.5", "--set"])
                .arg(format!("transport.kind={transport}"))
                .args(["--set", "source.events_per_mep=256"]),
            "mpirun",
            Duration::from_secs(90),
        );
        assert!(out.status.success(), "{transport}: {text}");
        assert_exact(&finals(&dir, 4), 4, &text);
        // (Ranks' stderr lines may interleave: look for the launcher only.)
        assert!(text.contains("of 4 from OpenMPI"), "{text}");
    }
}

/// Kills, after `after`, the rank-`rank` process of the mpirun job whose
/// command line names `dir`; returns when (Unix time), if it found it.
fn kill_rank_after(
    dir: &std::path::Path,
    rank: u16,
    after: Duration,
) -> std::thread::JoinHandle<Option<f64>> {
    let needle = dir.display().to_string();
    std::thread::spawn(move || {
        std::thread::sleep(after);
        let env = format!("OMPI_COMM_WORLD_RANK={rank}");
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let path = entry.path();
            let cmdline = std::fs::read(path.join("cmdline")).unwrap_or_default();
            let environ = std::fs::read(path.join("environ")).unwrap_or_default();
            let has =
                |bytes: &[u8], what: &str| bytes.split(|&b| b == 0).any(|w| w == what.as_bytes());
            if has(&cmdline, &needle) && has(&environ, &env) {
                let pid: i32 = entry.file_name().to_string_lossy().parse().unwrap();
                let at = evb_control::report::unix_now();
                // SAFETY: a process of this test's own mpirun job.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return Some(at);
            }
        }
        None
    })
}

/// Rank `r`'s final report in the rendezvous directory.
fn final_of(dir: &std::path::Path, r: u16, text: &str) -> Value {
    let path = dir.join("run1").join(format!("final-{r}.json"));
    let report = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()));
    serde_json::from_str(&report).unwrap()
}

/// Every MEP the EM assigned has exactly one fate.
fn assert_em_accounts_for_every_mep(em: &Value) {
    let n = |k: &str| em[k].as_u64().unwrap_or_else(|| panic!("{k} in {em}"));
    assert_eq!(
        n("meps_assigned"),
        n("em_meps_built")
            + n("em_meps_incomplete")
            + n("em_meps_corrupt")
            + n("em_meps_lost_bu_gone"),
        "every assigned MEP has one fate: {em}"
    );
}

/// `kill -9` of one rank under OpenMPI's `mpirun --enable-recovery` (the
/// transport is tcp; MPI only launches): the other ranks notice within a
/// second, go on building and end normally, and the EM's accounting of the
/// run is exact.
#[test]
fn a_killed_rank_under_mpirun_is_survived() {
    let dir = tmp("kill");
    let killer = kill_rank_after(&dir, 2, Duration::from_millis(1500));
    let (out, text) = run_bounded(
        openmpi(&["--enable-recovery"])
            .args(["node", "--control", "launcher", "--rendezvous"])
            .arg(&dir)
            .args(["--set", "run.duration_s=4", "--set", "transport.kind=tcp"])
            .args(["--set", "source.events_per_mep=256"]),
        "mpirun",
        Duration::from_secs(90),
    );
    let killed_at = killer.join().unwrap().expect("rank 2 was found and killed");
    assert!(out.status.success(), "{text}");
    assert!(
        !dir.join("run1/final-2.json").exists(),
        "the killed rank wrote no final report"
    );
    let reports: Vec<Value> = [0, 1, 3]
        .iter()
        .map(|&r| final_of(&dir, r, &text))
        .collect();
    assert_em_accounts_for_every_mep(&reports[0]);
    for r in &reports {
        assert_eq!(r["drain_timed_out"], false, "{text}");
        assert!(r["batches_built"].as_u64().unwrap() > 0, "{text}");
        let lost = r["peers_lost"].as_array().expect("peers_lost");
        let seen = lost
            .iter()
            .find(|p| p["peer"] == 2)
            .unwrap_or_else(|| panic!("rank {} never saw rank 2 die: {r}", r["node"]));
        let after = seen["at_unix_s"].as_f64().unwrap() - killed_at;
        assert!(
            (-0.05..1.0).contains(&after),
            "noticed {after} s after the kill"
        );
    }
}

/// A rank killed under `mpirun --enable-recovery` is started again by hand,
/// outside the job (`evb node --control launcher --rendezvous DIR --rank 2
/// --rejoin`), as an operator or a supervisor would: it listens where it
/// published, the others re-dial it, the EM re-admits it, it builds again,
/// and the EM's accounting stays exact.
#[test]
fn a_killed_rank_under_mpirun_is_restarted_and_rejoins() {
    let dir = tmp("rejoin");
    let killer = kill_rank_after(&dir, 2, Duration::from_millis(1500));
    let settings = [
        "--set",
        "transport.kind=tcp",
        "--set",
        "source.events_per_mep=256",
    ];
    let job = {
        let dir = dir.clone();
        std::thread::spawn(move || {
            run_bounded(
                openmpi(&["--enable-recovery"])
                    .args(["node", "--control", "launcher", "--rendezvous"])
                    .arg(&dir)
                    .args(["--set", "run.duration_s=6"])
                    .args(settings),
                "mpirun",
                Duration::from_secs(90),
            )
        })
    };
    let killed_at = killer.join().unwrap().expect("rank 2 was found and killed");
    std::thread::sleep(Duration::from_millis(1000));
    let (rejoined, rejoin_text) = run_bounded(
        evb()
            .args(["node", "--control", "launcher", "--rendezvous"])
            .arg(&dir)
            .args(["--rank", "2", "--rejoin"])
            .args(settings),
        "evb node --rejoin",
        Duration::from_secs(60),
    );
    let (out, text) = job.join().unwrap();
    let text = format!("{text}\n--- restarted rank 2:\n{rejoin_text}");
    assert!(out.status.success(), "{text}");
    assert!(rejoined.status.success(), "{text}");
    assert!(text.contains("rank 2 of 4 rejoins run 1"), "{text}");
    let fresh = final_of(&dir, 2, &text);
    assert_eq!(fresh["restarted"], true, "{text}");
    assert!(
        fresh["batches_built"].as_u64().unwrap() > 0,
        "the restarted rank built nothing: {text}"
    );
    assert!(fresh["fragments_sent"].as_u64().unwrap() > 0, "{text}");
    let reports: Vec<Value> = [0, 1, 3]
        .iter()
        .map(|&r| final_of(&dir, r, &text))
        .collect();
    assert_em_accounts_for_every_mep(&reports[0]);
    for r in &reports {
        assert_eq!(r["drain_timed_out"], false, "{text}");
        let back = r["rejoins"]
            .as_array()
            .unwrap_or_else(|| panic!("rank {} saw no rejoin: {text}", r["node"]));
        let at = back
            .iter()
            .find(|p| p["peer"] == 2)
            .unwrap_or_else(|| panic!("rank {} never saw rank 2 back: {text}", r["node"]))
            ["at_unix_s"]
            .as_f64()
            .unwrap();
        assert!(at - killed_at > 0.9 && at - killed_at < 4.0, "{text}");
    }
}

#[test]
fn under_mpich_mpiexec() {
    let evb = mpich_evb();
    // tcp takes addresses from the rendezvous; mpi moves every fragment
    // through MPICH's own MPI_Isend/MPI_Irecv.
    for transport in ["tcp", "mpi"] {
        let dir = tmp(&format!("mpich-{transport}"));
        let (out, text) = run_bounded(
            Command::new("mpiexec.mpich")
                .args(["-n", "4"])
                .arg(&evb)
                .args(["node", "--control", "launcher", "--rendezvous"])
                .arg(&dir)
                .args(["--set", "run.duration_s=1.5", "--set"])
                .arg(format!("transport.kind={transport}"))
                .args(["--set", "source.events_per_mep=256"]),
            "mpiexec.mpich (scripts/setup.sh installs mpich)",
            Duration::from_secs(90),
        );
        assert!(out.status.success(), "{transport}: {text}");
        assert_exact(&finals(&dir, 4), 4, &text);
        assert!(text.contains("of 4 from PMI (MPICH/Hydra)"), "{text}");
    }
}

#[test]
fn launcher_without_environment_is_a_clear_error() {
    let out = evb()
        .args(["node", "--control", "launcher", "--rendezvous", "/tmp"])
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("PMI_RANK")
        .env_remove("PMIX_RANK")
        .env_remove("SLURM_PROCID")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no launcher environment") && err.contains("--rank"),
        "{err}"
    );
}
