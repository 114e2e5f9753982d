//! The `iolab` command line. Only this binary prints and picks exit codes:
//! 0 success, 1 run failure, 2 bad input.
//!
//! One rule for the two streams: standard output carries what a command was asked to print
//! (reports, tables, lists, JSON, a generated profile); standard error carries progress and
//! diagnostics, including every note about what a command stored, wrote, removed or merged
//! (`stored as run 3 in ...`, `imported ... as run 4`, `removed run 4`, `merged ...`,
//! `wrote trace.json`). So `iolab ... > out` captures only results.

mod bench;
mod calibrate;
mod compare;
mod db;
mod ids;
mod progress;
mod repeat;
mod report;
mod reproduce;
mod runs;
// sweeps, shard merging, host inspection
mod dbmerge;
mod fiojson;
mod fit;
mod host;
mod host_x86;
mod soak;
mod sweep;
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
    /// The results database, for the commands that use one (also accepted after the
    /// command's name: `iolab run --db PATH FILE`) [default: iolab-results.db].
    #[arg(long, value_name = "PATH")]
    db: Option<std::path::PathBuf>,
    /// Do not store results (reproduce, run, soak, sweep).
    #[arg(long, conflicts_with = "db")]
    no_db: bool,
    /// Hide progress bars. They are drawn on standard error only when it is a terminal
    /// (soak, sweep, reproduce, run --runs N); messages and results are printed as ever.
    #[arg(long, short = 'q', global = true)]
    quiet: bool,
}

impl Command {
    /// The command's own `--db` and `--no-db`, for the commands that use a results database
    /// (`None` for the others).
    fn db_args(&self) -> Option<(Option<&std::path::Path>, bool)> {
        match self {
            Command::Reproduce { store, .. }
            | Command::Run { store, .. }
            | Command::Soak { store, .. }
            | Command::Sweep { store, .. } => Some((store.db.as_deref(), store.no_db)),
            Command::Compare { store, .. }
            | Command::Import { store, .. }
            | Command::Report { store, .. }
            | Command::Fit { store, .. }
            | Command::Runs { store, .. } => Some((store.db.as_deref(), false)),
            _ => None,
        }
    }

    /// The name of a command that uses no results database.
    fn name(&self) -> &'static str {
        match self {
            Command::Version => "version",
            Command::Bench { .. } => "bench",
            Command::Calibrate { .. } => "calibrate",
            Command::Trace { .. } => "trace",
            Command::Db { .. } => "db",
            Command::Host { .. } => "host",
            _ => "",
        }
    }
}

/// Where a command that stores runs keeps them.
#[derive(clap::Args, Debug, Default)]
struct StoreArgs {
    /// The results database the runs are stored in (created if needed)
    /// [default: iolab-results.db].
    #[arg(long, global = true, value_name = "PATH")]
    db: Option<std::path::PathBuf>,
    /// Do not store results.
    #[arg(long, global = true, conflicts_with = "db")]
    no_db: bool,
}

/// The results database a command reads (or, for `import`, stores into).
#[derive(clap::Args, Debug, Default)]
struct DbArg {
    /// The results database [default: iolab-results.db]. A file that does not exist is
    /// refused (exit code 2), except by `import`, which creates it.
    #[arg(long, global = true, value_name = "PATH")]
    db: Option<std::path::PathBuf>,
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
        // The help text is built from the experiment lists (`reproduce_names_help`).
        #[arg(value_name = "NAMES", help = reproduce_names_help())]
        names: Vec<String>,
        /// Repetitions, as `iolab run --runs`: each experiment runs N times with seeds
        /// --seed, --seed + 1, ..., each repetition stored as a run of its own, together a
        /// group (`iolab compare gID ...`); figures and effects print as means with their
        /// spread (mean ± sd, min, max).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
        runs: u32,
        /// Seed of the first repetition.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Write each cell of the experiment files as a workload scenario,
        /// DIR/EXPERIMENT/CELL.toml, that `iolab run` accepts, instead of running them.
        #[arg(long, value_name = "DIR")]
        emit_scenarios: Option<std::path::PathBuf>,
        /// Fit each experiment's declared unknowns (calibrations with a `range`) to the
        /// figures they list, print the fit (values, residuals, identifiability) and write
        /// the lock file NAME.fit.toml beside the experiment file, instead of the report. A
        /// bundled experiment's lock is written to scenarios/experiments/ under the current
        /// directory (the repository's), and bundled by the next build.
        #[arg(long, conflicts_with_all = ["emit_scenarios", "cross_validate"])]
        refit: bool,
        /// Refit with each calibration figure left out in turn and report how well the lab
        /// then predicts it, instead of the report.
        #[arg(long, conflicts_with = "emit_scenarios")]
        cross_validate: bool,
        /// Worker threads for --refit and --cross-validate (default: the available cores).
        /// The result does not depend on it.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
        jobs: Option<u32>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Run one scenario file: a workload scenario (see docs/SCENARIOS.md and
    /// scenarios/examples/), or an experiment file as `iolab reproduce FILE` runs it.
    Run {
        /// The scenario file (TOML).
        #[arg(required_unless_present = "example")]
        scenario: Option<std::path::PathBuf>,
        /// Run a bundled example workload scenario instead of a file (e.g. fio-nvme-strict;
        /// the list is in scenarios/examples/).
        #[arg(long, value_name = "NAME", conflicts_with = "scenario")]
        example: Option<String>,
        /// Repetitions: each a run of its own with seed --seed, --seed + 1, ...; with more
        /// than one they are stored as a group (`iolab compare gID ...`).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
        runs: u32,
        /// Seed of the first repetition (default: the scenario's `seed`, else 1).
        #[arg(long)]
        seed: Option<u64>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Measure the stack's native speed on host threads against peer crates.
    Bench {
        /// Fewer, shorter samples (a smoke run; figures are noisier).
        #[arg(long)]
        quick: bool,
        /// Run only the rows whose name contains TEXT (repeat for several; e.g.
        /// `--filter gaptree`, `--filter sim/`); a peer is measured only beside its rows.
        #[arg(long, value_name = "TEXT")]
        filter: Vec<String>,
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
    /// Compare two runs or groups of runs: means, change, 95% CI, Welch's t-test p-value.
    ///
    /// For every (configuration, metric) both sides have: n, mean and standard deviation of
    /// each side, the percent change of B over A, a 95% confidence interval of the
    /// difference of means (Welch–Satterthwaite degrees of freedom) and the two-sided
    /// p-value of Welch's t-test.
    ///
    /// A and B are each a run id (`12`), a group of repetitions (`g12`, as stored by
    /// `iolab run --runs N` or a multi-row bonnie++ import), a range of run ids (`29-34`), a sweep (`sweep:NAME` or `sweep:ID`)
    /// or a comma list of them (`12,13,g7`). Metrics match by name; configurations match by
    /// name, then (lab runs measuring one configuration each) the only one on each side,
    /// then by their workload's attributes, typed (fio: rw, bs, iodepth, numjobs; `4k` is
    /// 4096), so a real fio import pairs with the lab run of the same job
    /// (docs/VOCABULARY.md). Runs without measurements compare by figure id. Measurements of
    /// one configuration that differ in an attribute other than the seed (the points of a
    /// sweep, runs of an edited scenario) are never pooled as repetitions: each value is a
    /// configuration of its own, named with those attributes (`fio-nvme [numjobs=8]`), and
    /// pairs with the same point on the other side.
    ///
    /// The text and Markdown tables print numbers for reading, about four significant
    /// digits: times in a fitting unit (`798.7 us`), integers below a million with
    /// separators (`635,983`), larger values with a decimal prefix (`2.605 G`); the 95%
    /// interval as `LOW to HIGH`. JSON and CSV carry the raw numbers.
    Compare {
        /// Side A (the baseline): `12`, `g12`, `29-34`, `sweep:NAME` or `12,13,g7`.
        a: String,
        /// Side B: `12`, `g12`, `29-34`, `sweep:NAME` or `12,13,g7`.
        b: String,
        /// Output format.
        #[arg(long, value_enum, default_value_t = compare::CompareFormat::Text)]
        format: compare::CompareFormat,
        /// Only metrics whose name matches this glob (`*` any text, `?` one character),
        /// e.g. `read.*` or `*.iops`.
        #[arg(long, value_name = "GLOB")]
        metric: Option<String>,
        #[command(flatten)]
        store: DbArg,
    },
    /// Import a real tool's output (fio, bonnie++, re-aim) as runs that compare with lab runs.
    ///
    /// fio: `--output-format=json` or `json+` (one run; a measurement per job or group).
    /// bonnie: bonnie++ CSV, 1.03 or 1.9x/2.0 layout (a run per row; several rows form a
    /// group). reaim: the re-aim-7 results table (one run; a measurement per user count).
    /// A malformed or truncated file stores nothing and exits with code 2.
    Import {
        /// The tool that wrote the file.
        #[arg(value_enum)]
        tool: runs::ImportTool,
        /// The output file.
        file: std::path::PathBuf,
        /// Label of the stored run(s) (default: the file name).
        #[arg(long)]
        label: Option<String>,
        /// An attribute of every imported configuration, saying what the real machine and
        /// run were (`--attr iommu_mode=off --attr virt_merge=false`; repeat for several),
        /// or with `CONFIG:` of one configuration only (a row of a multi-row bonnie++ CSV:
        /// `--attr superspeed:usb_speed=superspeed`). `iolab compare` breaks a tie between
        /// lab configurations of the same job by the attributes both sides carry
        /// (docs/VOCABULARY.md, Pairing).
        #[arg(long = "attr", value_name = "[CONFIG:]KEY=VALUE")]
        attrs: Vec<String>,
        #[command(flatten)]
        store: DbArg,
    },
    /// Soak the pSeries DMA path: long many-thread TCP write and read streams in virtual time
    /// with invariant checks at intervals (SEEDS.md #4), on a lab netperf scenario.
    Soak {
        /// A lab scenario file with a netperf workload (docs/SCENARIOS.md; its direction,
        /// run_ms and warmup_ms are the soak's). Default: cell 64t.write.ddw of the bundled
        /// pseries-ddw experiment (the 64-thread DDW stream the published soak ran;
        /// `iolab reproduce pseries-ddw --emit-scenarios DIR` writes it out).
        #[arg(value_name = "SCENARIO")]
        scenario: Option<std::path::PathBuf>,
        /// The same as SCENARIO (the former spelling).
        #[arg(
            long = "scenario",
            value_name = "FILE",
            hide = true,
            conflicts_with = "scenario"
        )]
        scenario_flag: Option<std::path::PathBuf>,
        /// Virtual hours to run (the published soak ran 5).
        #[arg(long, default_value_t = 5.0)]
        hours: f64,
        /// Virtual seconds between invariant checks.
        #[arg(long, default_value_t = 60.0)]
        interval_s: f64,
        /// Threads, at most the scenario's workload.threads (default: that, 64 in the
        /// default cell).
        #[arg(long)]
        threads: Option<usize>,
        /// Which stream to soak: write, read, or both one after the other (each for the
        /// whole duration), as the published soak did.
        #[arg(long, value_enum, default_value_t = soak::Directions::Both)]
        direction: soak::Directions,
        /// Soak the default DMA window instead of the scenario's DDW dynamic window: sets
        /// iommu.mode = "default-window" and iommu.ddw_policy = "direct-only" (the
        /// pseries-ddw experiment's `default` column: the pre-2020 kernel refuses the DDW).
        #[arg(long)]
        default_window: bool,
        /// Seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Write one self-contained HTML page (tables and SVG plots) about stored runs.
    ///
    /// RUNS are run ids (`12`), groups of repeated runs (`g12`: every run whose group is 12),
    /// ranges of run ids (`29-34`), the points of a sweep (`sweep:NAME` or `sweep:ID`) and comma lists of them (`3,5,g12`), from the results database (--db). The page has a
    /// table per run (figures published vs lab, effects, every measurement's metrics) and
    /// plots: IOPS or throughput against the attribute that varies (threads, iodepth,
    /// numjobs, cpus, else any numeric attribute such as a sweep's axis) with a series per
    /// IOMMU mode, latency CDFs (log x) with histograms,
    /// and CPU time split into user / system / spin / idle. Measurements plot together per
    /// experiment, and workload scenarios' runs per workload, device and platform (e.g.
    /// `iolab run` of fio-nvme-off, -lazy and -strict at several numjobs: one plot, a series
    /// per mode); an imported real run (`iolab import`) joins the plots of its workload as a
    /// series named after its file. No scripts, no network: the SVG is inline. The same database content gives
    /// the same bytes.
    Report {
        /// Runs to include: ids, `g<group>`, ranges `29-34`, `sweep:NAME`, comma lists.
        #[arg(required = true, value_name = "RUNS")]
        runs: Vec<String>,
        /// The HTML file to write.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: std::path::PathBuf,
        /// Also write every plot alone as an .svg file in this directory (created if needed).
        #[arg(long, value_name = "DIR")]
        svg: Option<std::path::PathBuf>,
        #[command(flatten)]
        store: DbArg,
    },
    /// Run a scenario file with the timeline recorder on and write a Chrome/Perfetto trace.
    ///
    /// The workload scenario (a file, or --example NAME; an experiment file is refused,
    /// naming the cell files `iolab reproduce NAME --emit-scenarios DIR` writes) runs as
    /// `iolab run` runs it, one repetition; the first --sims engine simulations it creates
    /// are recorded: a track per virtual CPU (DMA map and unmap, lock spins, command-queue
    /// waits, user and system work), the IOMMU's command consumer, and each device queue's
    /// in-flight I/Os. `--from 10ms --to 12ms` keeps only the slices that overlap that
    /// virtual-time window (steady state rather than the ramp); --max-events then caps the
    /// slices kept within it. Open the file in ui.perfetto.dev or chrome://tracing. Nothing
    /// is stored in the results database.
    Trace {
        /// The workload scenario file (TOML; docs/SCENARIOS.md).
        #[arg(required_unless_present = "example")]
        scenario: Option<std::path::PathBuf>,
        /// Trace a bundled example workload scenario instead of a file (the names of
        /// `iolab run --example`, e.g. fio-nvme-strict).
        #[arg(long, value_name = "NAME", conflicts_with = "scenario")]
        example: Option<String>,
        /// The trace file to write (JSON trace events).
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: std::path::PathBuf,
        /// Base seed (default: a workload scenario's `seed`, else 1).
        #[arg(long)]
        seed: Option<u64>,
        /// Slices kept per simulation (within --from/--to); later ones are counted, not kept
        /// (caps memory and file size: about 150 bytes per slice).
        #[arg(long, default_value_t = 200_000,
              value_parser = clap::value_parser!(u64).range(1..=50_000_000))]
        max_events: u64,
        /// Keep only slices that end after this virtual time (a number with a unit: `5ms`,
        /// `250us`, `1000ns`, `0.5s`), e.g. to skip the ramp and look at steady state.
        #[arg(long, value_name = "TIME", value_parser = trace::parse_virtual_time)]
        from: Option<u64>,
        /// Keep only slices that start before this virtual time (same units as --from).
        #[arg(long, value_name = "TIME", value_parser = trace::parse_virtual_time)]
        to: Option<u64>,
        /// How many engine simulations of the run to record, in the order they start (one
        /// for every workload but netperf on POWER, which may start more).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
        sims: u64,
    },
    /// Fit a scenario's unknown fields to stored runs (your imported fio runs) and write the fitted scenario.
    ///
    /// Each --to RUN[:CONFIG] is a stored measurement (`iolab runs list`), typically a real
    /// tool's output brought in by `iolab import`. Its lab twin is the scenario, with a fio
    /// run's own job options (rw, rwmixread, bs, iodepth, numjobs) set on the fio workload
    /// (a synchronous engine such as psync runs at iodepth 1, as fio caps it), or a re-aim
    /// row's user count as the ramp; --as-is keeps the scenario's workload. The figures are
    /// the --metric names (default: the runs' read.iops, write.iops or reaim.jobs_per_min;
    /// a re-aim row's metric is the lab row's of its user count). Each --unknown FIELD=LO..HI is a scenario field (a dotted
    /// path, as sweeps take it: device[0].read_latency_us, kernel.block_complete_ns,
    /// machine.costs."iommu.cmdq.sync_latency".value) searched within its range: a grid,
    /// then golden-section coordinate search, deterministic, every point a lab run of every
    /// --to scenario with one seed, in parallel on --jobs threads. Printed: each fitted value
    /// and whether the figures identify it (elasticities; flat or bound-hitting fits are
    /// named), each figure's residual, and with several runs the leave-one-out errors (each
    /// run left out of the fit, then predicted). Written (-o): the fitted scenario, with a
    /// [[fitted]] entry per value naming the runs; `iolab run` it with another IOMMU mode,
    /// kernel or queue for the what-if, and `iolab compare` it with the import.
    /// See docs/EXPERIMENTS.md, "Fitting the lab to your machine".
    Fit {
        /// The base workload scenario file (TOML; docs/SCENARIOS.md).
        #[arg(required_unless_present = "example")]
        scenario: Option<std::path::PathBuf>,
        /// Use a bundled example workload scenario instead of a file.
        #[arg(long, value_name = "NAME", conflicts_with = "scenario")]
        example: Option<String>,
        /// A stored run to fit to: its id, and `:CONFIG` when it has several configurations
        /// (a fio job's name). Repeat for several runs, fitted together.
        #[arg(long = "to", value_name = "RUN[:CONFIG]", required = true)]
        to: Vec<String>,
        /// A metric to fit (repeatable; default: read.iops, write.iops and reaim.jobs_per_min where the run has them).
        #[arg(long = "metric", value_name = "METRIC")]
        metric: Vec<String>,
        /// An unknown scenario field and its range (repeatable, at most 4).
        #[arg(long = "unknown", value_name = "FIELD=LO..HI", required = true)]
        unknown: Vec<String>,
        /// The fitted scenario to write.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: std::path::PathBuf,
        /// Worker threads (default: the available cores). The result does not depend on it.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
        jobs: Option<u32>,
        /// The lab's seed (default: the scenario's `seed`, else 1).
        #[arg(long)]
        seed: Option<u64>,
        /// Keep the scenario's workload for every run (do not set it from the runs' job options).
        #[arg(long)]
        as_is: bool,
        #[command(flatten)]
        store: DbArg,
    },
    /// List, show or remove the runs stored in the results database.
    Runs {
        #[command(subcommand)]
        action: RunsCommand,
        #[command(flatten)]
        store: DbArg,
    },
    // ---- sweeps, shard merging, host inspection ----
    /// Run a parameter grid over a scenario in parallel, storing every point.
    ///
    /// GRID.toml names a base workload scenario (`scenario = "fio-nvme-strict"`, a bundled
    /// example, or a path relative to the grid file, e.g. a cell written by
    /// `iolab reproduce NAME --emit-scenarios DIR`),
    /// optionally `name`, `seed`, `runs` and a seed axis
    /// `seeds = [..]`, and axes: `[[axis]]` tables with a `field` (a dotted path of TOML keys
    /// and array indices into the scenario, e.g. `workload.iodepth`) and its `values`.
    /// A `[set]` table fixes fields for every point (`"workload.runtime_ms" = 10`).
    /// Setting a `{ value = .., source = .. }` field to a plain value replaces its `value`.
    /// On a workload scenario an axis may be an optional field the base leaves out (the
    /// scenario validates it); a base field that does not apply to a point (`iommu.cmdq` at
    /// `iommu.mode = "passthrough"`) is dropped from it, and the sweep says so once.
    /// Points are the cartesian product (first axis slowest, seeds fastest); each is stored
    /// with its sweep id, point index and axis values. At the end a result table (point,
    /// axis values, configuration, key metrics) goes to standard output. See docs/SCALE.md.
    #[command(verbatim_doc_comment)]
    Sweep {
        /// The grid file (TOML).
        grid: std::path::PathBuf,
        /// Worker threads (default: the available cores).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
        jobs: Option<u32>,
        /// Run only the points whose index is I modulo N (0-based: 0 <= I < N), as one task
        /// of a Slurm array job or Kubernetes Indexed Job; join the shards with `iolab db merge`.
        #[arg(long, value_name = "I/N")]
        shard: Option<String>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Maintain results databases.
    Db {
        #[command(subcommand)]
        action: DbCommand,
    },
    /// Report this machine's IOMMU state from sysfs and the kernel command line.
    Host {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Read sys/ and proc/ under this directory instead of / (for tests and for
        /// inspecting a copy of another machine's files).
        #[arg(long, value_name = "DIR", default_value = "/")]
        sysroot: std::path::PathBuf,
    },
}

/// `iolab db` actions.
#[derive(Subcommand, Debug)]
enum DbCommand {
    /// Join results databases (the shards of a sweep) into OUT.
    ///
    /// Runs are renumbered and keep every figure, effect and sweep point; a sweep point
    /// already in OUT (same sweep id and point index) is skipped. Every input must have this
    /// iolab's schema version. All in one transaction: on failure OUT is left unchanged.
    Merge {
        /// The database to merge into (created if missing).
        out: std::path::PathBuf,
        /// The databases to merge from.
        #[arg(required = true)]
        inputs: Vec<std::path::PathBuf>,
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
    /// Show runs: their figures, effects and measurements (a table per measured
    /// configuration; JSON: everything, latency histograms included, an object for one run
    /// id and an array for a group, range or list).
    Show {
        /// The runs (from `iolab runs list`): a run id (`12`), a group (`g12`), a range of
        /// run ids (`29-34`), a sweep (`sweep:NAME`) or a comma list of them (`3,5,g12`).
        #[arg(value_name = "RUNS")]
        runs: String,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Remove runs with their figures, effects and measurements (all or none). Ids are
    /// never given to later runs.
    Rm {
        /// The runs (from `iolab runs list`): a run id (`12`), a group (`g12`), a range of
        /// run ids (`29-34`), a sweep (`sweep:NAME`) or a comma list of them (`3,5,g12`).
        #[arg(value_name = "RUNS")]
        runs: String,
    },
}

/// `iolab reproduce NAMES`'s help: every name it accepts, from the experiment lists, so a
/// new experiment appears in it without editing this text.
fn reproduce_names_help() -> String {
    format!(
        "Experiments to run: {} (default: these published ones); also {} (the lab's own, run only when named), or the path of an experiment file (docs/EXPERIMENTS.md)",
        iolab_sim::reproduce::default_names().join(", "),
        iolab_sim::reproduce::extra_names().join(", ")
    )
}

/// Makes a closed standard output (`iolab ... | head`) end the process quietly with
/// success, as it ends `cat` or `grep`, instead of the panic `println!` raises on a broken
/// pipe. Results are stored before anything is printed, so nothing is lost; any other panic
/// still reaches the default hook.
fn exit_quietly_on_broken_pipe() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // The hook's text: "panicked at LOCATION:\nMESSAGE" (the payload of a formatted
        // panic is not always a string to downcast).
        let message = info.to_string();
        if message.contains("failed printing to stdout")
            && message.to_ascii_lowercase().contains("broken pipe")
        {
            std::process::exit(0);
        }
        default_hook(info);
    }));
}

fn main() -> ExitCode {
    exit_quietly_on_broken_pipe();
    let cli = Cli::parse();
    progress::set_quiet(cli.quiet);
    let db_owned = match cli.command.db_args() {
        None => {
            if cli.db.is_some() || cli.no_db {
                eprintln!(
                    "iolab {}: this command uses no results database (--db, --no-db)",
                    cli.command.name()
                );
                return ExitCode::from(2);
            }
            None
        }
        Some((own_db, own_no_db)) => {
            let path = own_db.or(cli.db.as_deref());
            if (cli.no_db || own_no_db) && path.is_some() {
                eprintln!("iolab: --db and --no-db together: give one of them");
                return ExitCode::from(2);
            }
            (!(cli.no_db || own_no_db)).then(|| {
                path.map_or_else(|| std::path::PathBuf::from(db::DEFAULT_PATH), Into::into)
            })
        }
    };
    let db_path = db_owned.as_deref();
    match cli.command {
        Command::Version => {
            println!("iolab {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Reproduce {
            names,
            seed,
            refit,
            cross_validate,
            jobs,
            ..
        } if refit || cross_validate => {
            reproduce::refit(&names, seed, jobs.map(|j| j as usize), refit, db_path)
        }
        Command::Reproduce {
            names,
            runs,
            seed,
            format,
            emit_scenarios,
            ..
        } => reproduce::reproduce(
            &names,
            ExperimentOptions { runs, seed },
            format == Format::Json,
            db_path,
            emit_scenarios.as_deref(),
        ),
        Command::Run {
            scenario,
            example,
            runs,
            seed,
            format,
            ..
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
        Command::Bench {
            quick,
            filter,
            format,
        } => {
            let report = bench::run_all(
                bench::Sampling::new(quick),
                &bench::RowFilter::new(filter.clone()),
            );
            if report.results.is_empty() {
                eprintln!(
                    "iolab bench: --filter {}: no benchmark row name contains it (names look like \
                     iova_alloc_free/gaptree/10000, pgtable_map_unmap/lpae-4k/4k, translate/..., \
                     iotlb_lookup/..., cmdq_issue/lockfree/2, pgtable/vtd-second-stage/..., \
                     inval/vtd-strict-unmap, sim/nvme-randread-strict/64)",
                    filter.join(", --filter ")
                );
                return ExitCode::from(2);
            }
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
        Command::Compare {
            a,
            b,
            format,
            metric,
            ..
        } => match db_path {
            Some(path) => compare::run(path, &a, &b, metric.as_deref(), format),
            None => {
                eprintln!("iolab compare: --no-db leaves no results database to read");
                ExitCode::from(2)
            }
        },
        Command::Import {
            tool,
            file,
            label,
            attrs,
            ..
        } => match db_path {
            Some(path) => runs::import(path, tool, &file, label.as_deref(), &attrs),
            None => {
                eprintln!("iolab import: --no-db leaves no results database to store into");
                ExitCode::from(2)
            }
        },
        Command::Soak {
            scenario,
            scenario_flag,
            hours,
            interval_s,
            threads,
            direction,
            default_window,
            seed,
            format,
            ..
        } => soak::run(&soak::SoakArgs {
            scenario: scenario.as_deref().or(scenario_flag.as_deref()),
            hours,
            interval_s,
            threads,
            directions: direction,
            default_window,
            seed,
            json: format == Format::Json,
            db: db_path,
        }),
        Command::Report {
            runs, output, svg, ..
        } => match db_path {
            Some(path) => report::run(path, &runs, &output, svg.as_deref()),
            None => {
                eprintln!("iolab report: --no-db leaves no results database to read");
                ExitCode::from(2)
            }
        },
        Command::Trace {
            scenario,
            example,
            output,
            seed,
            max_events,
            from,
            to,
            sims,
        } => trace::run(&trace::TraceArgs {
            scenario,
            example,
            output,
            seed,
            max_events: max_events as usize,
            from_ns: from.unwrap_or(0),
            to_ns: to.unwrap_or(u64::MAX),
            sims: sims as usize,
        }),
        Command::Fit {
            scenario,
            example,
            to,
            metric,
            unknown,
            output,
            jobs,
            seed,
            as_is,
            ..
        } => match db_path {
            Some(path) => fit::run(&fit::FitArgs {
                scenario: scenario.as_deref(),
                example: example.as_deref(),
                to: &to,
                metrics: &metric,
                unknowns: &unknown,
                output: &output,
                jobs: jobs.map(|j| j as usize),
                seed,
                as_is,
                db: path,
            }),
            None => {
                eprintln!("iolab fit: --no-db leaves no results database to read the runs from");
                ExitCode::from(2)
            }
        },
        Command::Runs { action, .. } => match db_path {
            Some(path) => runs::run(path, action),
            None => {
                eprintln!("iolab runs: --no-db leaves no results database to read");
                ExitCode::from(2)
            }
        },
        // ---- sweeps, shard merging, host inspection ----
        Command::Sweep {
            grid, jobs, shard, ..
        } => sweep::run(&grid, jobs.map(|j| j as usize), shard.as_deref(), db_path),
        Command::Db {
            action: DbCommand::Merge { out, inputs },
        } => dbmerge::run(&out, &inputs),
        Command::Host { format, sysroot } => host::run(&sysroot, format == Format::Json),
    }
}
