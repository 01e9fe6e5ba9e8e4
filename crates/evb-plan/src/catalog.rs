//! What can be bought: link generations (rate, how far each kind of cable
//! reaches, what each costs) and switch models (radix, price, height,
//! power; directors). The shipped tables are **examples**: only the EDR
//! cable prices (copper up to 3 m ~150 CHF, optics up to 100 m ~500 CHF)
//! and the 36-, 48- and 648-port switch sizes are the published DAQ
//! studies' figures; every other price is a placeholder of the right
//! order, there so that the ranking runs. A purchase needs the buyer's
//! own quotes (`[[generation]]` and `[[switch]]` in the requirement).

use serde::{Deserialize, Serialize};

/// A link generation and its cables.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generation {
    /// `EDR`, `HDR`, `NDR`, `XDR`, `100GbE`, ...
    pub name: String,
    /// Data rate of one port, Gb/s.
    pub gbps: f64,
    /// `InfiniBand` or `Ethernet` (simulated alike: a lossless,
    /// credit-based fabric, i.e. RoCE with PFC for Ethernet).
    #[serde(default = "ib")]
    pub family: String,
    /// Passive copper (DAC) reaches this far, m, and costs this much.
    pub dac_max_m: f64,
    pub dac_price: f64,
    /// Active copper (ACC/AEC) reaches this far (0: none), m.
    #[serde(default)]
    pub active_copper_max_m: f64,
    #[serde(default)]
    pub active_copper_price: f64,
    /// Optics (AOC, or two transceivers and fibre) up to this far, m.
    #[serde(default = "hundred")]
    pub optics_max_m: f64,
    pub optics_price: f64,
}

fn ib() -> String {
    "InfiniBand".into()
}
fn hundred() -> f64 {
    100.0
}

/// A switch model (or a director chassis).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchModel {
    pub name: String,
    /// The generation its ports run at (a name from the generations).
    pub generation: String,
    /// Ports (a director: its front ports, 648 or 800).
    pub ports: usize,
    pub price: f64,
    /// Ports per rack unit (a 1U 36-port switch: 36).
    pub ports_per_ru: f64,
    /// Typical power, W.
    pub power_w: f64,
    /// A director chassis: used as the spine of a tree of leaf switches,
    /// or with the nodes cabled straight into it.
    #[serde(default)]
    pub director: bool,
}

impl SwitchModel {
    /// Rack units it takes.
    pub fn rack_units(&self) -> f64 {
        (self.ports as f64 / self.ports_per_ru).ceil()
    }
}

/// Builds a generation row of the shipped table.
fn generation(
    name: &str,
    gbps: f64,
    family: &str,
    dac: (f64, f64),
    acc: (f64, f64),
    optics_price: f64,
) -> Generation {
    Generation {
        name: name.into(),
        gbps,
        family: family.into(),
        dac_max_m: dac.0,
        dac_price: dac.1,
        active_copper_max_m: acc.0,
        active_copper_price: acc.1,
        optics_max_m: 100.0,
        optics_price,
    }
}

/// The shipped generations (example prices, CHF; see the module doc).
pub fn default_generations() -> Vec<Generation> {
    let (ib, eth) = ("InfiniBand", "Ethernet");
    vec![
        // Published: copper up to 3 m ~150 CHF, optics up to 100 m ~500 CHF.
        generation("EDR", 100.0, ib, (3.0, 150.0), (0.0, 0.0), 500.0),
        generation("HDR", 200.0, ib, (2.0, 300.0), (4.0, 600.0), 1000.0),
        generation("NDR", 400.0, ib, (1.5, 500.0), (3.0, 900.0), 1600.0),
        generation("XDR", 800.0, ib, (1.0, 900.0), (2.5, 1500.0), 2800.0),
        generation("100GbE", 100.0, eth, (3.0, 100.0), (0.0, 0.0), 400.0),
        generation("200GbE", 200.0, eth, (3.0, 200.0), (0.0, 0.0), 700.0),
        generation("400GbE", 400.0, eth, (2.5, 350.0), (4.0, 650.0), 1200.0),
        generation("800GbE", 800.0, eth, (2.0, 600.0), (4.0, 1100.0), 2200.0),
    ]
}

/// Builds a switch row of the shipped table.
fn switch(
    name: &str,
    generation: &str,
    ports: usize,
    price: f64,
    per_ru: f64,
    w: f64,
) -> SwitchModel {
    SwitchModel {
        name: name.into(),
        generation: generation.into(),
        ports,
        price,
        ports_per_ru: per_ru,
        power_w: w,
        director: false,
    }
}

/// The shipped switch models (example prices, CHF; see the module doc).
pub fn default_switches() -> Vec<SwitchModel> {
    let director = |s: SwitchModel| SwitchModel {
        director: true,
        ..s
    };
    vec![
        switch("EDR-36", "EDR", 36, 12_000.0, 36.0, 140.0),
        // The published studies' 48-port switch (Omni-Path class, 100 Gb/s).
        switch("EDR-48", "EDR", 48, 15_000.0, 48.0, 190.0),
        director(switch("EDR-dir648", "EDR", 648, 260_000.0, 22.0, 9_000.0)),
        switch("HDR-40", "HDR", 40, 22_000.0, 40.0, 250.0),
        director(switch("HDR-dir800", "HDR", 800, 480_000.0, 28.0, 14_000.0)),
        switch("NDR-64", "NDR", 64, 40_000.0, 64.0, 750.0),
        switch("XDR-144", "XDR", 144, 140_000.0, 36.0, 3_000.0),
        switch("100GbE-32", "100GbE", 32, 7_000.0, 32.0, 150.0),
        switch("100GbE-64", "100GbE", 64, 14_000.0, 32.0, 300.0),
        switch("200GbE-64", "200GbE", 64, 22_000.0, 32.0, 450.0),
        switch("400GbE-32", "400GbE", 32, 22_000.0, 32.0, 450.0),
        switch("400GbE-64", "400GbE", 64, 40_000.0, 32.0, 900.0),
        switch("800GbE-64", "800GbE", 64, 70_000.0, 32.0, 1_600.0),
    ]
}

/// `defaults`, with the user's rows replacing those of the same name and
/// the others added after them.
pub fn merged<T: Clone>(defaults: Vec<T>, user: &[T], name: impl Fn(&T) -> &str) -> Vec<T> {
    let mut out: Vec<T> = defaults
        .into_iter()
        .map(|d| {
            user.iter()
                .find(|u| name(u) == name(&d))
                .cloned()
                .unwrap_or(d)
        })
        .collect();
    for u in user {
        if !out.iter().any(|o| name(o) == name(u)) {
            out.push(u.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_figures_are_the_edr_defaults() {
        let g = default_generations();
        let edr = g.iter().find(|g| g.name == "EDR").unwrap();
        assert_eq!((edr.dac_max_m, edr.dac_price), (3.0, 150.0));
        assert_eq!((edr.optics_max_m, edr.optics_price), (100.0, 500.0));
        let s = default_switches();
        for ports in [36, 48, 648] {
            assert!(s.iter().any(|s| s.ports == ports && s.generation == "EDR"));
        }
        // Every switch's generation exists.
        for sw in &s {
            assert!(g.iter().any(|g| g.name == sw.generation), "{}", sw.name);
        }
    }

    #[test]
    fn user_rows_replace_and_add() {
        let mut mine = default_switches()[0].clone();
        mine.price = 1.0;
        let extra = SwitchModel {
            name: "mine".into(),
            ..mine.clone()
        };
        let m = merged(default_switches(), &[mine, extra], |s| s.name.as_str());
        assert_eq!(m.len(), default_switches().len() + 1);
        assert_eq!(m[0].price, 1.0);
        assert_eq!(m.last().unwrap().name, "mine");
    }
}
