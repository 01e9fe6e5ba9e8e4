//! The `evb` command tested whole, as a user runs it: one test binary for
//! every area (each module below), so that the suite links the command's
//! dependencies into one test executable instead of one per file (about
//! 14 s of compiling and linking each on the 2-core CI machine).

mod backpressure;
mod chaos;
mod cluster;
mod consumers;
mod delay;
mod diagnose;
mod fabric_cli;
mod failure;
mod libevb;
mod metrics;
mod netfaults;
mod plan;
mod prealloc;
mod readout;
mod report_cli;
mod run;
mod run_key;
mod sim_cli;
mod slurm;
mod store_cli;
mod stranger;
mod transports;
