//! The `iolab` command line. Only this binary prints and picks exit codes:
//! 0 success, 1 run failure, 2 bad input.

mod bench;
mod calibrate;
mod db;
mod reproduce;
mod runs;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use iolab_sim::experiment::ExperimentOptions;

/// iolab: a DMA-remapping (IOMMU) stack and a deterministic lab for the DMA-mapping path.
#[derive(Parser, Debug)]
#[command(name = "iolab", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The results database every `reproduce` and `run` is stored in.
    #[arg(long, global = true, value_name = "PATH", default_value = db::DEFAULT_PATH)]
    db: std::path::PathBuf,
    /// Do not store results (reproduce, run).
    #[arg(long, global = true, conflicts_with = "db")]
    no_db: bool,
}

/// Output format of a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// Human-readable text.
    Text,
    /// JSON on standard output.
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the iolab version.
    Version,
    /// Re-run the published experiments and print them beside the published figures.
    Reproduce {
        /// Experiments to run: ipmmu-usb, smmuv3-cmdq, sba-vmerge, pseries-ddw (default: all).
        names: Vec<String>,
        /// Runs per configuration (seeds derived from --seed).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
        runs: u32,
        /// Base seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Run one scenario file: a workload scenario (see docs/SCENARIOS.md and
    /// scenarios/examples/) or a published experiment's (a copy of one in scenarios/).
    Run {
        /// The scenario file (TOML).
        #[arg(required_unless_present = "example")]
        scenario: Option<std::path::PathBuf>,
        /// Run a bundled example workload scenario instead of a file (e.g. fio-nvme-strict;
        /// the list is in scenarios/examples/).
        #[arg(long, value_name = "NAME", conflicts_with = "scenario")]
        example: Option<String>,
        /// Runs per configuration (seeds derived from the base seed).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
        runs: u32,
        /// Base seed (default: the scenario's `seed`, else 1).
        #[arg(long)]
        seed: Option<u64>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Measure the stack's native speed on host threads against peer crates.
    Bench {
        /// Fewer, shorter samples (a smoke run; figures are noisier).
        #[arg(long)]
        quick: bool,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Measure the stack's step costs on this host and write a `host` platform profile.
    Calibrate {
        /// Write the profile to this file (default: standard output).
        #[arg(short = 'o', long = "output")]
        output: Option<std::path::PathBuf>,
        /// Overwrite the output file if it exists.
        #[arg(long)]
        force: bool,
        /// Fewer, shorter samples (a smoke run; figures are noisier).
        #[arg(long)]
        quick: bool,
        /// The bundled profile the costs the host cannot measure are copied from.
        #[arg(long, default_value = calibrate::DEFAULT_BASE)]
        base: String,
    },
    /// List, show or remove the runs stored in the results database.
    Runs {
        #[command(subcommand)]
        action: RunsCommand,
    },
}

#[derive(Subcommand, Debug)]
enum RunsCommand {
    /// List the stored runs.
    List {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Show one run's figures and effects.
    Show {
        /// The run id (from `iolab runs list`).
        id: i64,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Remove one run with its figures and effects.
    Rm {
        /// The run id (from `iolab runs list`).
        id: i64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let db_path = (!cli.no_db).then_some(cli.db.as_path());
    match cli.command {
        Command::Version => {
            println!("iolab {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Reproduce {
            names,
            runs,
            seed,
            format,
        } => reproduce::reproduce(
            &names,
            ExperimentOptions { runs, seed },
            format == Format::Json,
            db_path,
        ),
        Command::Run {
            scenario,
            example,
            runs,
            seed,
            format,
        } => match (scenario, example) {
            (Some(path), _) => {
                reproduce::run_file(&path, runs, seed, format == Format::Json, db_path)
            }
            (None, Some(name)) => {
                reproduce::run_example(&name, runs, seed, format == Format::Json, db_path)
            }
            (None, None) => {
                eprintln!("iolab run: expected a scenario file or --example NAME");
                ExitCode::from(2)
            }
        },
        Command::Bench { quick, format } => {
            let report = bench::run_all(bench::Sampling::new(quick));
            match format {
                Format::Text => print!("{}", bench::render_text(&report)),
                Format::Json => match serde_json::to_string_pretty(&report) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("iolab bench: cannot encode the report as JSON: {e}");
                        return ExitCode::from(1);
                    }
                },
            }
            ExitCode::SUCCESS
        }
        Command::Calibrate {
            output,
            force,
            quick,
            base,
        } => calibrate::run(output.as_deref(), force, quick, &base),
        Command::Runs { action } => match db_path {
            Some(path) => runs::run(path, action),
            None => {
                eprintln!("iolab runs: --no-db leaves no results database to read");
                ExitCode::from(2)
            }
        },
    }
}
