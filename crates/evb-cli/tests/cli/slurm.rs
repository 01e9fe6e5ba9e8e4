//! `evb node` under a real Slurm: a one-node cluster made for the test
//! (Debian's munge, slurmctld and slurmd, installed by scripts/setup.sh,
//! each with its own socket, ports, state and spool in a temporary
//! directory), and real `srun` steps of 4 tasks on it, as
//! docs/cluster.md's batch script runs them on a cluster.

use std::path::Path;

use serde_json::Value;

use evb_testkit::evb_path_str;
use evb_testkit::slurm::{read, Cluster};

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
                evb_path_str(),
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
