//! The `iolab` command line. Only this binary prints and picks exit codes:
//! 0 success, 1 run failure, 2 bad input.

mod bench;
mod calibrate;
mod reproduce;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use iolab_sim::experiment::ExperimentOptions;

/// iolab: a DMA-remapping (IOMMU) stack and a deterministic lab for the DMA-mapping path.
#[derive(Parser, Debug)]
#[command(name = "iolab", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    }
}
