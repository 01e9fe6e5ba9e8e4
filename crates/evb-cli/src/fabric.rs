//! `evb fabric ...`: fabric analysis commands (issue 3). See docs/fabric.md.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use evb_fabric::conflicts::{
    analyze, analyze_with_loads, load_cells, pretty_with_compact_loads, shift_steps, Analysis,
    StepConvention,
};
use evb_fabric::io;
use evb_fabric::lft::Lfts;
use evb_fabric::optimize;
use evb_fabric::rate::link_summary;
use evb_fabric::setup::{self, FabricSource};
use evb_fabric::Topology;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `evb fabric`.
#[derive(Debug, Args)]
pub struct FabricArgs {
    #[command(subcommand)]
    cmd: FabricCmd,
}

#[derive(Debug, Subcommand)]
enum FabricCmd {
    /// Count link conflicts of a shift schedule on a fabric.
    Conflicts(ConflictsArgs),
    /// Find a rank order with the fewest conflicts; write it as a hostfile.
    Order(OrderArgs),
    /// Compute LFTs that make a given order conflict-free (for OpenSM's file engine).
    Route(RouteArgs),
    /// Write a fabric (generated or read) in other formats.
    #[command(alias = "generate")]
    Export(ExportArgs),
    /// Write a slot schedule for the slotted barrel (`event_builder.schedule_file`): conflicting flows moved to extra slots.
    Schedule(ScheduleArgs),
    /// Read every port's counters (perfquery, or perfquery/ibdiagnet2 files) into one snapshot.
    Counters(crate::diagnose::CountersArgs),
    /// Why a fabric underperforms: counters onto links, the shift's conflicts and the cabling; remedies ranked by the rate evb sim predicts.
    Diagnose(crate::diagnose::DiagnoseArgs),
}

#[derive(Debug, Args)]
struct ScheduleArgs {
    #[command(flatten)]
    input: FabricInput,
    #[arg(long, help = crate::vocab::ORDER_HELP)]
    order: Option<String>,
    /// Where local fragments go (`event_builder.local`): memory (no slot for a rank's own BU) or nic.
    #[arg(long, default_value = "memory")]
    local: String,
    /// The shift itself, conflicts kept (no flows moved).
    #[arg(long)]
    plain: bool,
    /// With --order ftree (or an OpenSM CA order dump with DUMMY lines):
    /// shift over the ranks alone, not over the ftree engine's positions
    /// (a dummy for each host a short leaf lacks).
    #[arg(long)]
    compact: bool,
    /// Only the first N ranks of the order are event-builder nodes (the
    /// hosts after them run a separate EM or consumers); default all.
    #[arg(long)]
    ranks: Option<usize>,
    /// Schedule file to write.
    #[arg(long)]
    out: PathBuf,
    #[arg(long)]
    json: Option<PathBuf>,
}

/// How nodes are named: every subcommand that reads a fabric takes it.
#[derive(Debug, Args)]
pub(crate) struct Naming {
    /// GUID-to-host-name map: `H-0002c90300080d28 r510gluster4` lines (also
    /// OpenSM's node-name-map form `0x0002c90300080d28 "r510gluster4"`).
    #[arg(long = "names")]
    pub(crate) names: Option<PathBuf>,
}

/// Where the forwarding tables come from.
#[derive(Debug, Args)]
pub(crate) struct Tables {
    /// LFT dump (opensm-lfts.dump, or dump_lfts / ibroute output).
    #[arg(long, conflicts_with = "routing")]
    pub(crate) lfts: Option<PathBuf>,
    #[arg(long, help = crate::vocab::ROUTING_HELP)]
    pub(crate) routing: Option<String>,
    /// Refuse a fabric the routing engine cannot route instead of falling
    /// back to minhop as OpenSM does.
    #[arg(long)]
    pub(crate) strict: bool,
}

/// What-if edits of a fabric, made before anything else.
#[derive(Debug, Args)]
pub(crate) struct Edits {
    /// What-if: remove a host or switch by name (repeatable).
    #[arg(long = "remove")]
    pub(crate) remove: Vec<String>,
    /// What-if: remove the cable at NAME:PORT (repeatable).
    #[arg(long = "remove-link")]
    pub(crate) remove_link: Vec<String>,
    /// What-if: swap the far ends of two cables, A:PORT,B:PORT (repeatable).
    #[arg(long = "swap-cables")]
    pub(crate) swap_cables: Vec<String>,
}

#[derive(Debug, Args)]
struct FabricInput {
    /// ibnetdiscover output, or a generator: fat-tree:radix=36,hosts=540[,levels=3][,oversub=2][,spread][,gbps=100][,uplink_gbps=200]
    #[arg(long)]
    topology: String,
    #[command(flatten)]
    naming: Naming,
    #[command(flatten)]
    tables: Tables,
    #[command(flatten)]
    edits: Edits,
    /// Shift steps to analyse, e.g. 1,2,5 or 1-10 (default all 1..N-1).
    #[arg(long)]
    steps: Option<String>,
    /// What step s means: send (rank i sends to i+s, evb's) or receive
    /// (rank i receives from i+s).
    #[arg(long, default_value = "send")]
    step_convention: String,
}

#[derive(Debug, Args)]
struct ConflictsArgs {
    #[command(flatten)]
    input: FabricInput,
    #[arg(long, help = crate::vocab::CONFLICTS_ORDER_HELP)]
    order: Option<String>,
    /// Write the report as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write per-step figures as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Write a plot (.svg or .png; repeatable).
    #[arg(long)]
    plot: Vec<PathBuf>,
    /// Number of worst links to list.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// The JSON lists every link's load in every step (`link_loads`) when the
    /// fabric's directed links times the steps are at most this (0: never).
    #[arg(long, default_value_t = 4_000_000)]
    link_loads_max_cells: usize,
    /// Time limit for --order optimized, seconds.
    #[arg(long, default_value_t = 10.0)]
    time_limit: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Debug, Args)]
struct OrderArgs {
    #[command(flatten)]
    input: FabricInput,
    /// Hostfile to write (one host name per line).
    #[arg(long)]
    out: PathBuf,
    /// Also write the order in OpenSM's ftree CA order format.
    #[arg(long)]
    ca_order: Option<PathBuf>,
    #[arg(long)]
    json: Option<PathBuf>,
    /// Search time limit, seconds.
    #[arg(long, default_value_t = 10.0)]
    time_limit: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Debug, Args)]
struct RouteArgs {
    /// Route for the shift schedule of --order (the only mode so far; required).
    #[arg(long, required = true)]
    for_shift: bool,
    /// ibnetdiscover output or a fat-tree: generator.
    #[arg(long)]
    topology: String,
    #[command(flatten)]
    naming: Naming,
    #[arg(long, help = crate::vocab::ORDER_HELP)]
    order: Option<String>,
    /// LFT file to write (opensm-lfts.dump format; load with opensm -R file -U FILE).
    #[arg(long)]
    out: PathBuf,
    #[arg(long)]
    json: Option<PathBuf>,
    #[arg(long)]
    steps: Option<String>,
    /// What step s means: send (i -> i+s) or receive (i <- i+s).
    #[arg(long, default_value = "send")]
    step_convention: String,
    #[arg(long, default_value_t = 10.0)]
    time_limit: f64,
}

#[derive(Debug, Args)]
struct ExportArgs {
    /// ibnetdiscover output or a fat-tree: generator.
    #[arg(long)]
    topology: String,
    #[command(flatten)]
    naming: Naming,
    #[arg(long, help = crate::vocab::ROUTING_HELP)]
    routing: Option<String>,
    /// Refuse a fabric the routing engine cannot route (no fallback to minhop).
    #[arg(long)]
    strict: bool,
    /// ibsim net file.
    #[arg(long)]
    ibsim: Option<PathBuf>,
    /// ibnetdiscover-format topology.
    #[arg(long)]
    ibnetdiscover: Option<PathBuf>,
    /// LFTs in opensm-lfts.dump format.
    #[arg(long)]
    lfts_out: Option<PathBuf>,
    /// Hostfile in --order.
    #[arg(long)]
    hostfile: Option<PathBuf>,
    // The rank order of --hostfile.
    #[arg(long, help = crate::vocab::ORDER_HELP)]
    order: Option<String>,
    /// Slurm topology.conf (topology/tree plugin).
    #[arg(long)]
    slurm: Option<PathBuf>,
    #[command(flatten)]
    edits: Edits,
}

/// Runs `evb fabric`.
pub fn run(args: FabricArgs) -> Result<()> {
    match args.cmd {
        FabricCmd::Conflicts(a) => conflicts(a),
        FabricCmd::Order(a) => order(a),
        FabricCmd::Route(a) => route_cmd(a),
        FabricCmd::Export(a) => export(a),
        FabricCmd::Schedule(a) => schedule(a),
        FabricCmd::Counters(a) => crate::diagnose::counters(a),
        FabricCmd::Diagnose(a) => crate::diagnose::diagnose(a),
    }
}

fn schedule(a: ScheduleArgs) -> Result<()> {
    let local = match a.local.as_str() {
        "memory" => false,
        "nic" => true,
        other => bail!("--local: `{other}` is neither memory nor nic"),
    };
    let (topo, lfts, what, _) = load(&a.input)?;
    let resolved = optimize::order_or_default(a.order.as_deref(), &topo)?;
    print_notes(resolved.note.as_slice());
    let (mut order, order_spec) = (resolved.order, resolved.spec);
    if let Some(r) = a.ranks {
        if r > order.len() {
            bail!("--ranks {r}: the order has only {} hosts", order.len());
        }
        order.truncate(r);
    }
    let n = order.len();
    if n < 2 {
        bail!("a schedule needs at least 2 ranks, the order has {n}");
    }
    let conflicts = analyze(&topo, &lfts, &order, &shift_steps(n), 0)?;
    let rated =
        evb_fabric::rated::choose_slot_rate(&topo, &lfts, &order, &order_spec, local, a.compact)?;
    let chosen = rated.chosen;
    if let Some(note) = &chosen.note {
        println!("{note}");
    }
    let (shift, positions) = (chosen.shift, chosen.positions);
    let s = if a.plain { chosen.plain } else { chosen.aware };
    let names: Vec<&str> = order.iter().map(|&h| topo.nodes[h].name.as_str()).collect();
    let header = format!(
        "evb slot schedule: {n} ranks, {} slots ({} for the plain barrel); {} on {}\n\
         {shift}\n\
         order {}: rank i is host i of: {}\n\
         use with the same order (evb sim --order, or mpirun's hostfile) and\n\
         event_builder.local = \"{}\"; slot K: destination rank of ranks 0..{}",
        s.slots.len(),
        s.plain_slots,
        what,
        a.input.topology,
        order_spec,
        names.join(" "),
        a.local,
        n - 1
    );
    io::write_text(&a.out, &s.to_text(&header))?;
    println!(
        "{what}; {n} ranks in order {}: the plain barrel has {} conflicts in {} of {} steps",
        order_spec, conflicts.total.conflicts, conflicts.total.steps_with_conflicts, s.plain_slots
    );
    if a.plain {
        println!(
            "{shift}: {} slots a rotation, {:.1}% of the plain barrel's rate on a conflict-free fabric; written to {}",
            s.slots.len(),
            s.efficiency() * 100.0,
            a.out.display()
        );
    } else {
        println!(
            "conflict-aware, from {shift}: {} flows of {} steps moved, {} extra slots; {} slots a rotation (no schedule on these routes has fewer than {}: the busiest link's flows), {:.1}% of the plain barrel's rate on a conflict-free fabric; written to {}",
            s.flows_moved,
            s.steps_split,
            s.slots.len() - s.plain_slots,
            s.slots.len(),
            s.lower_bound,
            s.efficiency() * 100.0,
            a.out.display()
        );
    }
    if let (Some(slot), Some(slowest)) = (rated.slot_gbps, rated.slowest_gbps) {
        println!(
            "slots sized for {slot} Gb/s (the slowest path between two ranks: {slowest} Gb/s; give evb the same: evb sim and evb run --fabric size them so, or set event_builder.slot_us)"
        );
    }
    if let Some(j) = &a.json {
        let v = serde_json::json!({
            "ranks": n, "order": order_spec, "routing": what, "local": a.local,
            "plain_slots": s.plain_slots, "slots": s.slots.len(),
            "steps_split": s.steps_split, "flows_moved": s.flows_moved,
            "lower_bound": s.lower_bound,
            "positions": positions.as_ref().map_or(n, Vec::len),
            "efficiency": s.efficiency(),
            "plain_conflicts": conflicts.total.conflicts,
            "slot_gbps": rated.slot_gbps, "slowest_path_gbps": rated.slowest_gbps,
        });
        io::write_text(j, &serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}

/// Prints notes for the user on stderr.
fn print_notes(notes: &[String]) {
    for n in notes {
        eprintln!("note: {n}");
    }
}

/// Reads the fabric and names its nodes (`--names`), saying on stderr
/// which nodes are named by GUID and what the map did not cover.
fn load_named(spec: &str, naming: &Naming) -> Result<Topology> {
    let (topo, notes) = setup::load_named(spec, naming.names.as_deref())?;
    print_notes(&notes);
    Ok(topo)
}

/// Loads topology and LFTs, applying what-if edits; notes on stderr.
fn load(input: &FabricInput) -> Result<(Topology, Lfts, String, Option<String>)> {
    let loaded = FabricSource {
        topology: input.topology.clone(),
        names: input.naming.names.clone(),
        lfts: input.tables.lfts.clone(),
        routing: input.tables.routing.clone(),
        strict: input.tables.strict,
        remove: input.edits.remove.clone(),
        remove_link: input.edits.remove_link.clone(),
        swap_cables: input.edits.swap_cables.clone(),
    }
    .load()?;
    print_notes(&loaded.notes);
    Ok((loaded.topo, loaded.lfts, loaded.what, loaded.fallback))
}

/// The steps asked for, as evb's send steps (what the analysis traces).
fn send_steps(s: &Option<String>, n: usize, conv: StepConvention) -> Result<Vec<usize>> {
    Ok(setup::send_steps(s.as_deref(), n, conv)?)
}

/// The rank order `spec` names (the default without one), its name, and
/// the search report of `optimized`; a note on stderr when the default
/// order could not be ftree.
fn resolve_order(
    spec: Option<&str>,
    topo: &Topology,
    lfts: Option<&Lfts>,
    steps: &[usize],
    limit: f64,
    seed: u64,
) -> Result<(Vec<usize>, String, Option<optimize::SearchReport>)> {
    let (resolved, search) = setup::resolve_order(
        spec,
        topo,
        lfts,
        steps,
        Duration::from_secs_f64(limit),
        seed,
    )?;
    print_notes(resolved.note.as_slice());
    Ok((resolved.order, resolved.spec, search))
}

fn conflicts(a: ConflictsArgs) -> Result<()> {
    let conv = StepConvention::parse(&a.input.step_convention)?;
    let (topo, lfts, what, fallback) = load(&a.input)?;
    let nh = topo.hosts().len();
    let steps = send_steps(&a.input.steps, nh, conv)?;
    let (order, order_spec, search) = resolve_order(
        a.order.as_deref(),
        &topo,
        Some(&lfts),
        &steps,
        a.time_limit,
        a.seed,
    )?;
    if order.len() != nh {
        eprintln!(
            "note: order lists {} of {} hosts; only those ranks take part",
            order.len(),
            nh
        );
    }
    let steps = if order.len() != nh {
        send_steps(&a.input.steps, order.len(), conv)?
    } else {
        steps
    };
    let t0 = std::time::Instant::now();
    // The per-link matrix only goes to the JSON.
    let max_cells = if a.json.is_some() {
        a.link_loads_max_cells
    } else {
        0
    };
    let mut an = analyze_with_loads(&topo, &lfts, &order, &steps, a.top, max_cells)?;
    an.relabel_steps(conv);
    if a.json.is_some() && an.link_loads.is_none() && max_cells > 0 {
        eprintln!(
            "note: per-link loads left out of the JSON: {} directed links x steps is over \
             --link-loads-max-cells {max_cells} (pick fewer --steps or raise the limit)",
            load_cells(&topo, steps.len())
        );
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "fabric: {} ({} hosts, {} switches), {what}, order '{}'",
        a.input.topology,
        nh,
        topo.switches().len(),
        order_spec
    );
    if conv == StepConvention::Receive {
        println!("steps numbered by the rank received from: in step s rank i receives from i+s");
    }
    print!("{}", an.summary());
    let (links, link_json) = link_summary(&topo);
    for l in &links {
        println!("{l}");
    }
    println!("analysis time {:.3} s", secs);
    if let Some(r) = &search {
        for x in &r.reasons {
            println!("  {x}");
        }
    }
    let extra = serde_json::json!({
        "routing_fallback": fallback,
        "step_convention": match conv {
            StepConvention::Send => "send: in step s rank i sends to rank i+s",
            StepConvention::Receive => "receive: in step s rank i receives from rank i+s",
        },
        "links": link_json,
    });
    write_outputs(&an, &a, &order_spec, &what, secs, search, extra)?;
    Ok(())
}

fn write_outputs(
    an: &Analysis,
    a: &ConflictsArgs,
    order: &str,
    what: &str,
    secs: f64,
    search: Option<optimize::SearchReport>,
    extra: serde_json::Value,
) -> Result<()> {
    if let Some(j) = &a.json {
        let v = serde_json::json!({
            "topology": a.input.topology,
            "routing": what,
            "routing_fallback": extra["routing_fallback"],
            "step_convention": extra["step_convention"],
            "link_rates": extra["links"]["link_rates"],
            "links_of_unknown_rate": extra["links"]["links_of_unknown_rate"],
            "degraded_links": extra["links"]["degraded_links"],
            "order": order,
            "hosts": an.hosts,
            "analysis_seconds": secs,
            "conflict_definition": "per step and directed link: max(0, flows - 1), summed",
            "total": an.total,
            "per_step": an.per_step,
            "worst_links": an.worst_links,
            "link_loads": an.link_loads,
            "order_search": search,
        });
        io::write_text(j, &pretty_with_compact_loads(v)?)?;
    }
    if let Some(c) = &a.csv {
        io::write_text(c, &an.csv())?;
    }
    for p in &a.plot {
        let title = format!(
            "{}: {} hosts, order {}, {} conflicts",
            a.input.topology, an.hosts, order, an.total.conflicts
        );
        evb_fabric::plot::plot(an, &title, p)?;
    }
    Ok(())
}

fn order(a: OrderArgs) -> Result<()> {
    let conv = StepConvention::parse(&a.input.step_convention)?;
    let (topo, lfts, what, _) = load(&a.input)?;
    let steps = send_steps(&a.input.steps, topo.hosts().len(), conv)?;
    let (order, rep) = optimize::optimize_order(
        &topo,
        &lfts,
        &steps,
        Duration::from_secs_f64(a.time_limit),
        a.seed,
    )?;
    io::write_text(&a.out, &io::write_hostfile(&topo, &order))?;
    if let Some(c) = &a.ca_order {
        io::write_text(c, &io::write_ca_order(&topo, &order))?;
    }
    println!(
        "{what}; start '{}' with {} conflicts; best order: {} conflicts ({} swaps, {:.1} s)",
        rep.start, rep.start_conflicts, rep.conflicts, rep.moves_tried, rep.seconds
    );
    if rep.conflicts == 0 {
        println!("conflict-free order written to {}", a.out.display());
    } else {
        println!("zero conflicts not reached; why:");
        for r in &rep.reasons {
            println!("  {r}");
        }
        println!("best order written to {}", a.out.display());
    }
    if let Some(j) = &a.json {
        io::write_text(j, &serde_json::to_string_pretty(&rep)?)?;
    }
    Ok(())
}

fn route_cmd(a: RouteArgs) -> Result<()> {
    let _ = a.for_shift;
    let conv = StepConvention::parse(&a.step_convention)?;
    let topo = load_named(&a.topology, &a.naming)?;
    let nh = topo.hosts().len();
    let steps = send_steps(&a.steps, nh, conv)?;
    let (order, order_spec, _) = resolve_order(a.order.as_deref(), &topo, None, &steps, 0.0, 1)?;
    let (lfts, rep) =
        optimize::route_for_shift(&topo, &order, &steps, Duration::from_secs_f64(a.time_limit))?;
    // Check the written tables with the analysis itself.
    let an = analyze(&topo, &lfts, &order, &steps, 5)?;
    io::write_text(&a.out, &io::write_opensm_lfts(&topo, &lfts))?;
    println!(
        "routing for order '{}': {} conflicts (D-mod-K by rank: {})",
        order_spec, an.total.conflicts, rep.start_conflicts
    );
    if an.total.conflicts > 0 {
        println!("zero conflicts not reached; why:");
        for r in &rep.reasons {
            println!("  {r}");
        }
    }
    println!(
        "LFTs written to {} (load with: opensm -R file -U {})",
        a.out.display(),
        a.out.display()
    );
    if let Some(j) = &a.json {
        let v = serde_json::json!({"search": rep, "total": an.total});
        io::write_text(j, &serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}

fn export(a: ExportArgs) -> Result<()> {
    let mut topo = load_named(&a.topology, &a.naming)?;
    topo.apply_edits(&a.edits.remove, &a.edits.remove_link, &a.edits.swap_cables)?;
    let mut wrote = 0;
    if let Some(p) = &a.ibsim {
        io::write_text(p, &io::write_ibsim_net(&topo))?;
        wrote += 1;
    }
    if let Some(p) = &a.ibnetdiscover {
        io::write_text(p, &io::write_ibnetdiscover(&topo))?;
        wrote += 1;
    }
    if let Some(p) = &a.lfts_out {
        let routed = setup::route_like_opensm(&topo, a.routing.as_deref(), a.strict)?;
        print_notes(&routed.notes);
        let lfts = routed.lfts;
        io::write_text(p, &io::write_opensm_lfts(&topo, &lfts))?;
        wrote += 1;
    }
    if let Some(p) = &a.hostfile {
        let (o, _, _) = resolve_order(a.order.as_deref(), &topo, None, &[], 0.0, 1)?;
        io::write_text(p, &io::write_hostfile(&topo, &o))?;
        wrote += 1;
    }
    if let Some(p) = &a.slurm {
        io::write_text(p, &io::write_slurm_topology(&topo))?;
        wrote += 1;
    }
    if wrote == 0 {
        bail!(
            "nothing to export: give --ibsim, --ibnetdiscover, --lfts-out, --hostfile or --slurm"
        );
    }
    println!(
        "{}: {} hosts, {} switches; {wrote} file(s) written",
        a.topology,
        topo.hosts().len(),
        topo.switches().len()
    );
    for l in link_summary(&topo).0 {
        println!("{l}");
    }
    let by_guid = topo
        .hosts()
        .iter()
        .filter(|&&h| {
            let n = &topo.nodes[h];
            n.name == evb_fabric::names::guid_name(n.kind, n.guid)
        })
        .count();
    if by_guid > 0 && (a.hostfile.is_some() || a.slurm.is_some()) {
        println!(
            "note: {by_guid} host(s) are named by GUID in the hostfile / topology.conf: \
             give --names FILE so that they carry the names mpirun and slurm.conf use"
        );
    }
    Ok(())
}
