//! The `iolab` command line. Only this binary prints and picks exit codes:
//! 0 success, 1 run failure, 2 bad input.

mod bench;
mod calibrate;
mod db;
mod report;
mod reproduce;
mod runs;
mod trace;

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
    /// Run one scenario file (for example a modified copy of a bundled one in scenarios/).
    Run {
        /// The scenario file (TOML).
        scenario: std::path::PathBuf,
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
    /// Write one self-contained HTML page (tables and SVG plots) about stored runs.
    ///
    /// RUNS are run ids (`12`), groups of repeated runs (`g12`: every run whose group is 12)
    /// and comma lists of both (`3,5,g12`), from the results database (--db). The page has a
    /// table per run (figures published vs lab, effects, every measurement's metrics) and
    /// plots: IOPS or throughput against the attribute that varies (threads, iodepth,
    /// numjobs, cpus) with a series per IOMMU mode, latency CDFs (log x) with histograms,
    /// and CPU time split into user / system / spin / idle. No scripts, no network: the
    /// SVG is inline. The same database content gives the same bytes.
    Report {
        /// Runs to include: ids, `g<group>`, comma lists.
        #[arg(required = true, value_name = "RUNS")]
        runs: Vec<String>,
        /// The HTML file to write.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: std::path::PathBuf,
        /// Also write every plot alone as an .svg file in this directory (created if needed).
        #[arg(long, value_name = "DIR")]
        svg: Option<std::path::PathBuf>,
    },
    /// Run a scenario file with the timeline recorder on and write a Chrome/Perfetto trace.
    ///
    /// The scenario runs as `iolab run` runs it (one run per configuration); the first
    /// --sims simulations it creates (one per configuration, in the report's order) are
    /// recorded: a track per virtual CPU (DMA map and unmap, lock spins, command-queue
    /// waits, user and system work), the IOMMU's command consumer, and each device queue's
    /// in-flight I/Os. Open the file in ui.perfetto.dev or chrome://tracing. Nothing is
    /// stored in the results database.
    Trace {
        /// The scenario file (TOML).
        scenario: std::path::PathBuf,
        /// The trace file to write (JSON trace events).
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: std::path::PathBuf,
        /// Base seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Slices kept per simulation; later ones are counted, not kept (caps memory and
        /// file size: about 150 bytes per slice).
        #[arg(long, default_value_t = 200_000,
              value_parser = clap::value_parser!(u64).range(1..=50_000_000))]
        max_events: u64,
        /// How many simulations (configurations) to trace, in the order they run.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
        sims: u64,
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
            runs,
            seed,
            format,
        } => reproduce::run_file(
            &scenario,
            ExperimentOptions { runs, seed },
            format == Format::Json,
            db_path,
        ),
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
        Command::Report { runs, output, svg } => match db_path {
            Some(path) => report::run(path, &runs, &output, svg.as_deref()),
            None => {
                eprintln!("iolab report: --no-db leaves no results database to read");
                ExitCode::from(2)
            }
        },
        Command::Trace {
            scenario,
            output,
            seed,
            max_events,
            sims,
        } => trace::run(&trace::TraceArgs {
            scenario,
            output,
            seed,
            max_events: max_events as usize,
            sims: sims as usize,
        }),
        Command::Runs { action } => match db_path {
            Some(path) => runs::run(path, action),
            None => {
                eprintln!("iolab runs: --no-db leaves no results database to read");
                ExitCode::from(2)
            }
        },
    }
}
