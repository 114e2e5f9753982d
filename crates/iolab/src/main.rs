//! The `iolab` command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// iolab: a deterministic lab for the DMA-mapping path.
#[derive(Parser, Debug)]
#[command(name = "iolab", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the iolab version.
    Version,
    /// Re-run the published experiments and print them beside the published figures.
    Reproduce {
        /// Experiments to run (default: all).
        names: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("iolab {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Reproduce { .. } => {
            println!("iolab reproduce: no experiment is implemented yet.");
            ExitCode::SUCCESS
        }
    }
}
