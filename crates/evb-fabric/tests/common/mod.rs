//! Harness for tests against the real subnet manager: starts `ibsim` on a
//! net file written by evb and runs OpenSM and the diagnostics on it through
//! `libumad2sim.so`. Everything is bounded in time and killed on drop.
#![allow(dead_code)]

use evb_fabric::io::write_ibsim_net;
use evb_fabric::Topology;
use evb_testkit::process::{require_program, wait_exit};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// ibsim instances are serialised: one simulated fabric at a time.
pub static SIM_LOCK: Mutex<()> = Mutex::new(());

pub const UMAD2SIM: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so",
    "/usr/lib/aarch64-linux-gnu/umad2sim/libumad2sim.so",
    "/usr/lib/umad2sim/libumad2sim.so",
    "/usr/local/lib/umad2sim/libumad2sim.so",
];

/// Finds a program or fails the test with an install hint (never skips).
pub fn require(prog: &str) -> PathBuf {
    require_program(
        prog,
        "install the Debian packages opensm, ibsim-utils, libumad2sim0 and infiniband-diags (scripts/setup.sh)",
    )
}

pub fn umad2sim() -> PathBuf {
    UMAD2SIM
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("libumad2sim.so not found: install ibsim-utils / libumad2sim0 (scripts/setup.sh)")
}

pub struct Sim {
    pub dir: PathBuf,
    child: Child,
    sock: String,
    sim_host: String,
    preload: PathBuf,
}

impl Sim {
    /// Writes the fabric as an ibsim net file and starts ibsim on it.
    pub fn start(topo: &Topology, dir: &Path, tag: &str) -> Sim {
        let ibsim = require("ibsim");
        let preload = umad2sim();
        std::fs::create_dir_all(dir).unwrap();
        let net = dir.join("net");
        std::fs::write(&net, write_ibsim_net(topo)).unwrap();
        let sock = format!("evbsim{}{}", std::process::id(), tag);
        let log = std::fs::File::create(dir.join("ibsim.log")).unwrap();
        let nodes = topo.nodes.len() + 16;
        let sws = topo.switches().len() + 16;
        let ports: usize = topo.nodes.iter().map(|n| n.ports.len()).sum::<usize>() + 64;
        let child = Command::new(ibsim)
            .args([
                "-s",
                "-n",
                "-N",
                &nodes.max(2048).to_string(),
                "-S",
                &sws.max(256).to_string(),
                "-P",
                &ports.max(13312).to_string(),
            ])
            .arg(&net)
            .env("IBSIM_SOCKNAME", &sock)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start ibsim");
        // The SM attaches to the first host, named by its net-file id.
        let sim_host = evb_fabric::io::ibsim_node_id(topo, topo.hosts()[0]);
        let mut sim = Sim {
            dir: dir.to_path_buf(),
            child,
            sock,
            sim_host,
            preload,
        };
        let t0 = Instant::now();
        loop {
            let text = std::fs::read_to_string(dir.join("ibsim.log")).unwrap_or_default();
            if text.contains("simulator ready") {
                break;
            }
            if let Some(st) = sim.child.try_wait().unwrap() {
                panic!("ibsim exited ({st}) before it was ready:\n{text}");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "ibsim not ready in 30 s:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        sim
    }

    /// The environment that points the diagnostics at this ibsim.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), self.preload.display().to_string()),
            ("IBSIM_SOCKNAME".into(), self.sock.clone()),
            ("SIM_HOST".into(), self.sim_host.clone()),
        ]
    }

    fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new(require(prog));
        c.env("LD_PRELOAD", &self.preload)
            .env("IBSIM_SOCKNAME", &self.sock)
            .env("SIM_HOST", &self.sim_host)
            .env("OSM_CACHE_DIR", &self.dir)
            .env("OSM_TMP_DIR", &self.dir)
            .stdin(Stdio::null());
        c
    }

    /// Runs `opensm --once` with a routing engine; returns its dump dir.
    pub fn opensm(&self, engine: &str, extra: &[&str]) -> PathBuf {
        self.opensm_tagged(engine, engine, extra)
    }

    /// Like `opensm`, with `tag` naming the dump dir and logs.
    pub fn opensm_tagged(&self, engine: &str, tag: &str, extra: &[&str]) -> PathBuf {
        let dump = self.dir.join(format!("dump-{tag}"));
        std::fs::create_dir_all(&dump).unwrap();
        let log = self.dir.join(format!("opensm-{tag}.log"));
        let out = std::fs::File::create(self.dir.join(format!("opensm-{tag}.out"))).unwrap();
        let mut child = self
            .cmd("opensm")
            // Routing dumps (0x40), errors and info (0x03): the log says
            // which engine configured the tables, and why one gave up.
            .args(["--once", "-R", engine, "-D", "0x43", "--dump_files_dir"])
            .arg(&dump)
            .arg("-f")
            .arg(&log)
            .args(extra)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start opensm");
        let st = wait_exit(&mut child, Duration::from_secs(120), "opensm");
        assert!(
            st.success(),
            "opensm -R {engine} failed ({st}); see {}",
            log.display()
        );
        assert!(
            dump.join("opensm-lfts.dump").exists(),
            "opensm -R {engine} wrote no opensm-lfts.dump in {}",
            dump.display()
        );
        dump
    }

    /// The engine that configured the tables in the run tagged `tag`
    /// (OpenSM logs "<engine> tables configured on all switches"), and the
    /// log's error lines.
    pub fn engine_used(&self, tag: &str) -> (String, Vec<String>) {
        let log = std::fs::read_to_string(self.dir.join(format!("opensm-{tag}.log")))
            .expect("opensm log");
        let used = log
            .lines()
            .filter_map(|l| l.split_once(" tables configured on all switches"))
            .filter_map(|(a, _)| a.rsplit(' ').next())
            .next_back()
            .unwrap_or_else(|| panic!("no 'tables configured' line in opensm-{tag}.log"))
            .to_string();
        let errors = log
            .lines()
            .filter(|l| l.contains(" 0x01 -> "))
            .map(|l| l.split_once(" 0x01 -> ").unwrap().1.to_string())
            .collect();
        (used, errors)
    }

    fn capture(&self, prog: &str, args: &[&str], out_name: &str) -> PathBuf {
        let path = self.dir.join(out_name);
        let out = std::fs::File::create(&path).unwrap();
        let mut child = self
            .cmd(prog)
            .args(args)
            .stdout(out)
            .stderr(std::fs::File::create(self.dir.join(format!("{out_name}.err"))).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("start {prog}: {e}"));
        let st = wait_exit(&mut child, Duration::from_secs(120), prog);
        assert!(st.success(), "{prog} failed ({st})");
        path
    }

    pub fn ibnetdiscover(&self) -> PathBuf {
        self.capture("ibnetdiscover", &[], "ibnetdiscover.out")
    }

    /// `dump_lfts` (infiniband-diags' dump_lfts.sh) output.
    pub fn dump_lfts(&self, name: &str) -> PathBuf {
        self.capture("dump_lfts", &[], name)
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Per-test scratch directory under the target dir (kept for inspection).
pub fn test_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
