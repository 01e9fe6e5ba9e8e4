//! Real hosts for tests: network namespaces joined by veth pairs, either
//! directly (two hosts) or through bridges in a namespace of their own
//! (a switch per network). Needs root (the CI runs as root); a test that
//! cannot create them fails, it does not skip. Everything a [`Lab`]
//! creates lives in namespaces it removes on drop, so nothing is left on
//! the machine and no traffic leaves it.

use std::process::Command;

/// Runs `args` (in namespace `ns` if given); panics with its stderr if it fails.
pub fn sh(ns: Option<&str>, args: &[&str]) {
    let mut cmd = match ns {
        Some(n) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", n]);
            c.args(args);
            c
        }
        None => {
            let mut c = Command::new(args[0]);
            c.args(&args[1..]);
            c
        }
    };
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("{args:?}: {e} (scripts/setup.sh installs iproute2 and nftables)")
    });
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Hosts in namespaces, each attached to switches (bridges in the lab's
/// switch namespace) by veth links. Removed on drop.
pub struct Lab {
    prefix: String,
    switch: String,
    namespaces: Vec<String>,
    ports: usize,
}

impl Lab {
    /// An empty lab; `tag` keeps labs of one test process apart.
    pub fn new(tag: u8) -> Lab {
        let prefix = format!("evb{}l{tag}", std::process::id() % 100000);
        let switch = format!("{prefix}sw");
        sh(None, &["ip", "netns", "add", &switch]);
        sh(Some(&switch), &["ip", "link", "set", "lo", "up"]);
        Lab {
            prefix,
            namespaces: vec![switch.clone()],
            switch,
            ports: 0,
        }
    }

    /// A switch: a bridge named `name` (at most 15 characters), forwarding
    /// at once (no spanning tree).
    pub fn switch(&mut self, name: &str) {
        let sw = Some(self.switch.as_str());
        sh(
            sw,
            &[
                "ip",
                "link",
                "add",
                name,
                "type",
                "bridge",
                "stp_state",
                "0",
                "forward_delay",
                "0",
            ],
        );
        sh(sw, &["ip", "link", "set", name, "up"]);
    }

    /// A new host (namespace) with loopback up; returns its namespace name.
    pub fn host(&mut self, name: &str) -> String {
        let ns = format!("{}{name}", self.prefix);
        sh(None, &["ip", "netns", "add", &ns]);
        sh(Some(&ns), &["ip", "link", "set", "lo", "up"]);
        self.namespaces.push(ns.clone());
        ns
    }

    /// Links host namespace `ns` to switch `bridge`: interface `dev` in the
    /// host with address `cidr` (e.g. `10.0.0.1/24`).
    pub fn link(&mut self, ns: &str, dev: &str, bridge: &str, cidr: &str) {
        self.ports += 1;
        let port = format!("p{}", self.ports);
        sh(
            None,
            &[
                "ip",
                "link",
                "add",
                "name",
                dev,
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                "name",
                &port,
                "netns",
                &self.switch,
            ],
        );
        let sw = Some(self.switch.as_str());
        sh(sw, &["ip", "link", "set", &port, "master", bridge]);
        sh(sw, &["ip", "link", "set", &port, "up"]);
        sh(Some(ns), &["ip", "addr", "add", cidr, "dev", dev]);
        sh(Some(ns), &["ip", "link", "set", dev, "up"]);
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Bytes interface `dev` of namespace `ns` has received and sent, from its
/// counters (`/sys/class/net/DEV/statistics`, as the namespace sees it).
pub fn dev_bytes(ns: &str, dev: &str) -> (u64, u64) {
    let read = |what: &str| -> u64 {
        let path = format!("/sys/class/net/{dev}/statistics/{what}");
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "cat", &path])
            .output()
            .expect("ip netns exec runs");
        assert!(
            out.status.success(),
            "{ns}: {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{ns}: {path}: {e}"))
    };
    (read("rx_bytes"), read("tx_bytes"))
}
