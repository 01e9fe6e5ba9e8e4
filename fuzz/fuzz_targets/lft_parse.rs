//! Arbitrary text as an LFT dump (`opensm-lfts.dump` or `dump_lfts`
//! output) for a small generated fat tree, then a conflict analysis on
//! whatever was accepted: errors, never a panic or a hang.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn topology() -> &'static evb_fabric::Topology {
    static TOPO: OnceLock<evb_fabric::Topology> = OnceLock::new();
    TOPO.get_or_init(|| evb_fabric::io::load_topology("fat-tree:radix=4,hosts=8").expect("generator"))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let topo = topology();
    if let Ok(lfts) = evb_fabric::io::parse_lfts_str(std::path::Path::new("fuzz.lfts"), text, topo) {
        let order = evb_fabric::optimize::order_by_name(topo);
        let steps = evb_fabric::conflicts::shift_steps(order.len());
        let _ = evb_fabric::conflicts::analyze(topo, &lfts, &order, &steps, 3);
    }
});
