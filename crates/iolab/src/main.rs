//! The `iolab` command line. Only this binary prints and picks exit codes:
//! 0 success, 1 run failure, 2 bad input.

mod bench;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

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
}

/// The published experiments `iolab reproduce` knows by name.
const EXPERIMENTS: [&str; 4] = ["ipmmu-usb", "smmuv3-cmdq", "sba-vmerge", "pseries-ddw"];

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("iolab {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Reproduce { names } => {
            if let Some(unknown) = names.iter().find(|n| !EXPERIMENTS.contains(&n.as_str())) {
                eprintln!(
                    "iolab reproduce: unknown experiment '{unknown}': expected one of {}",
                    EXPERIMENTS.join(", ")
                );
                return ExitCode::from(2);
            }
            println!(
                "iolab reproduce: no experiment is implemented yet. The functional IOMMU stack \
                 is in place (try `iolab bench --quick`); the lab and the four reproductions \
                 ({}) are still being built.",
                EXPERIMENTS.join(", ")
            );
            ExitCode::SUCCESS
        }
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
    }
}
