//! Engine speed: events per host second, iolab-sim's own executor against nexosim.
//!
//! ```text
//! cargo bench -p iolab-sim --bench engine_events                       # own engine only
//! cargo bench -p iolab-sim --bench engine_events --features nexosim    # both
//! ```
//!
//! Workloads (the same on both engines, same random durations):
//! - `cpus`: 64 workers, each repeatedly busy for a random 500..=1500 ns, one timer event
//!   per step (own engine: `Cpu::spend`; nexosim: a self-scheduled input).
//! - `ping-pong`: two models; A sends to B, B answers at once, A waits 100 ns and sends
//!   again: three events per round.
//! - `io` (own engine only): each CPU runs a thread doing submit (spend), wait for a
//!   completion fired by the device model at a future time, complete (spend); three
//!   events per I/O. Run at 1 to 1024 CPUs to see how the cost per event scales.
//!
//! Each measurement is the best of three runs (plain `std::time::Instant` timing), except
//! nexosim on several threads (one run). Free arguments select parts: `compare` (the whole
//! engine comparison) or its parts `own`, `nexosim1`, `nexosim-mt`; `io` (all I/O rows)
//! or `io1`, `io4`, ... `io1024`.

use std::hint::black_box;
use std::time::Instant;

use iolab_sim::engine::rng::splitmix64;
use iolab_sim::engine::{Channel, Completion};
use iolab_sim::{Account, Sim, SimConfig, SimDuration, SimTime};

/// A random step of 500..=1500 ns (mean 1000) from a splitmix64 stream.
fn step_ns(state: &mut u64) -> u64 {
    500 + splitmix64(state) % 1001
}

const WORKERS: usize = 64;
/// Virtual time per `cpus` run: 64 workers x 100k steps = 6.4M events.
const CPUS_HORIZON_NS: u64 = 100_000_000;
/// Ping-pong rounds: 3 events each.
const ROUNDS: u64 = 2_000_000;
const PING_GAP_NS: u64 = 100;

struct Measure {
    events: u64,
    secs: f64,
}

impl Measure {
    fn rate(&self) -> f64 {
        self.events as f64 / self.secs
    }
}

fn best_of<F: FnMut() -> Measure>(n: usize, mut f: F) -> Measure {
    let mut best: Option<Measure> = None;
    for _ in 0..n {
        let m = f();
        if best.as_ref().map_or(true, |b| m.rate() > b.rate()) {
            best = Some(m);
        }
    }
    best.expect("n > 0")
}

fn own_cpus() -> Measure {
    let mut sim = Sim::new(SimConfig {
        cpus: WORKERS,
        seed: 1,
    })
    .expect("valid config");
    for cpu in 0..WORKERS {
        sim.spawn_on(cpu, move |ctx| async move {
            let mut rng = cpu as u64;
            loop {
                let d = step_ns(&mut rng);
                ctx.cpu().spend(SimDuration::ns(d), Account::System).await;
            }
        })
        .expect("spawn");
    }
    let t0 = Instant::now();
    let r = sim.run_until(SimTime(CPUS_HORIZON_NS)).expect("run");
    let secs = t0.elapsed().as_secs_f64();
    black_box(&r);
    Measure {
        events: r.events,
        secs,
    }
}

fn own_ping_pong() -> Measure {
    let mut sim = Sim::new(SimConfig { cpus: 1, seed: 1 }).expect("valid config");
    let h = sim.handle().clone();
    let ab: Channel<u64> = Channel::new(&h, 4);
    let ba: Channel<u64> = Channel::new(&h, 4);
    let (ab2, ba2) = (ab.clone(), ba.clone());
    sim.spawn_agent(move |ctx| async move {
        let mut n = 0;
        loop {
            ctx.sleep(SimDuration::ns(PING_GAP_NS)).await;
            ab.send(n).expect("room");
            n = ba.recv(&ctx).await + 1;
        }
    })
    .expect("spawn");
    sim.spawn_agent(move |ctx| async move {
        loop {
            let n = ab2.recv(&ctx).await;
            ba2.send(n).expect("room");
        }
    })
    .expect("spawn");
    let t0 = Instant::now();
    let r = sim.run_until(SimTime(ROUNDS * PING_GAP_NS)).expect("run");
    let secs = t0.elapsed().as_secs_f64();
    Measure {
        events: r.events,
        secs,
    }
}

/// Returns (measure, I/Os completed).
fn own_io(cpus: usize, total_ios: u64) -> (Measure, u64) {
    let mut sim = Sim::new(SimConfig { cpus, seed: 1 }).expect("valid config");
    let per_cpu = total_ios / cpus as u64;
    for cpu in 0..cpus {
        sim.spawn_on(cpu, move |ctx| async move {
            // One command slot per thread, recycled (as a driver reuses command ids).
            let done: Completion<()> = Completion::new(ctx.handle());
            for _ in 0..per_cpu {
                let submit = ctx.rng().jitter(1_500, 20);
                ctx.cpu()
                    .spend(SimDuration::ns(submit), Account::System)
                    .await;
                done.reset();
                let service = ctx.rng().jitter(80_000, 25);
                let _ = done.fire_at(ctx.now() + SimDuration::ns(service), ());
                done.wait(&ctx).await;
                let complete = ctx.rng().jitter(1_000, 20);
                ctx.cpu()
                    .spend(SimDuration::ns(complete), Account::System)
                    .await;
            }
        })
        .expect("spawn");
    }
    let t0 = Instant::now();
    let r = sim.run().expect("run");
    let secs = t0.elapsed().as_secs_f64();
    (
        Measure {
            events: r.events,
            secs,
        },
        per_cpu * cpus as u64,
    )
}

#[cfg(feature = "nexosim")]
mod nexo {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use nexosim::model::{schedulable, Context, Model};
    use nexosim::ports::Output;
    use nexosim::simulation::{Mailbox, SimInit};
    use nexosim::time::MonotonicTime;
    use serde::{Deserialize, Serialize};

    use super::{step_ns, Measure, CPUS_HORIZON_NS, PING_GAP_NS, ROUNDS, WORKERS};

    /// Input invocations (nexosim does not report an event count).
    static EVENTS: AtomicU64 = AtomicU64::new(0);

    #[derive(Serialize, Deserialize)]
    pub struct Worker {
        rng: u64,
        busy_ns: u64,
    }

    #[Model]
    impl Worker {
        #[nexosim(init)]
        async fn init(&mut self, cx: &Context<Self>) {
            let d = step_ns(&mut self.rng);
            cx.schedule_event(Duration::from_nanos(d), schedulable!(Self::step), ())
                .expect("future deadline");
        }

        #[nexosim(schedulable)]
        async fn step(&mut self, _: (), cx: &Context<Self>) {
            EVENTS.fetch_add(1, Ordering::Relaxed);
            let d = step_ns(&mut self.rng);
            self.busy_ns += d;
            cx.schedule_event(Duration::from_nanos(d), schedulable!(Self::step), ())
                .expect("future deadline");
        }
    }

    #[derive(Serialize, Deserialize)]
    pub struct Pinger {
        pub out: Output<u64>,
    }

    #[Model]
    impl Pinger {
        #[nexosim(init)]
        async fn init(&mut self, cx: &Context<Self>) {
            cx.schedule_event(
                Duration::from_nanos(PING_GAP_NS),
                schedulable!(Self::ping),
                0,
            )
            .expect("future deadline");
        }

        #[nexosim(schedulable)]
        async fn ping(&mut self, n: u64) {
            EVENTS.fetch_add(1, Ordering::Relaxed);
            self.out.send(n).await;
        }

        pub async fn pong(&mut self, n: u64, cx: &Context<Self>) {
            EVENTS.fetch_add(1, Ordering::Relaxed);
            cx.schedule_event(
                Duration::from_nanos(PING_GAP_NS),
                schedulable!(Self::ping),
                n + 1,
            )
            .expect("future deadline");
        }
    }

    #[derive(Serialize, Deserialize)]
    pub struct Ponger {
        pub out: Output<u64>,
    }

    #[Model]
    impl Ponger {
        pub async fn ping(&mut self, n: u64) {
            EVENTS.fetch_add(1, Ordering::Relaxed);
            self.out.send(n).await;
        }
    }

    pub fn cpus(threads: usize) -> Measure {
        let mut bench = SimInit::with_num_threads(threads);
        for i in 0..WORKERS {
            let w = Worker {
                rng: i as u64,
                busy_ns: 0,
            };
            bench = bench.add_model(w, Mailbox::new(), &format!("w{i}"));
        }
        let mut simu = bench.init(MonotonicTime::EPOCH).expect("init");
        EVENTS.store(0, Ordering::Relaxed);
        let t0 = Instant::now();
        simu.step_until(Duration::from_nanos(CPUS_HORIZON_NS))
            .expect("run");
        let secs = t0.elapsed().as_secs_f64();
        Measure {
            events: EVENTS.load(Ordering::Relaxed),
            secs,
        }
    }

    pub fn ping_pong(threads: usize) -> Measure {
        let mut pinger = Pinger {
            out: Output::default(),
        };
        let mut ponger = Ponger {
            out: Output::default(),
        };
        let pinger_mbox = Mailbox::new();
        let ponger_mbox = Mailbox::new();
        pinger.out.connect(Ponger::ping, &ponger_mbox);
        ponger.out.connect(Pinger::pong, &pinger_mbox);
        let mut simu = SimInit::with_num_threads(threads)
            .add_model(pinger, pinger_mbox, "pinger")
            .add_model(ponger, ponger_mbox, "ponger")
            .init(MonotonicTime::EPOCH)
            .expect("init");
        EVENTS.store(0, Ordering::Relaxed);
        let t0 = Instant::now();
        simu.step_until(Duration::from_nanos(ROUNDS * PING_GAP_NS))
            .expect("run");
        let secs = t0.elapsed().as_secs_f64();
        Measure {
            events: EVENTS.load(Ordering::Relaxed),
            secs,
        }
    }
}

fn row(engine: &str, workload: &str, m: &Measure) {
    println!(
        "| {engine:<22} | {workload:<10} | {:>11} | {:>8.3} | {:>8.2} M/s | {:>6.1} ns |",
        m.events,
        m.secs,
        m.rate() / 1e6,
        1e9 / m.rate()
    );
}

fn main() {
    // `cargo bench` passes `--bench`; free arguments select workloads by name
    // (`compare`, `io`, or an I/O CPU count such as `io256`).
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let want = |name: &str| {
        filters.is_empty()
            || filters
                .iter()
                .any(|f| f == name || (f == "io" && name.starts_with("io")))
    };
    let parts = ["own", "nexosim1", "nexosim-mt"];
    let chosen: Vec<&str> = parts
        .into_iter()
        .filter(|p| want("compare") || filters.iter().any(|f| f == p))
        .collect();
    if !chosen.is_empty() {
        compare(&chosen);
    }
    let mut header = false;
    for cpus in [1usize, 4, 16, 64, 256, 1024] {
        if want(&format!("io{cpus}")) {
            if !header {
                io_header();
                header = true;
            }
            io_row(cpus);
        }
    }
}

/// The engine comparison; `parts` picks `own`, `nexosim1` (one thread) and `nexosim-mt`
/// (one worker per host core).
fn compare(parts: &[&str]) {
    println!("| engine                 | workload   |      events |   host s |   events/s   | per event |");
    println!("|------------------------|------------|-------------|----------|--------------|-----------|");
    if parts.contains(&"own") {
        row("iolab-sim", "cpus", &best_of(3, own_cpus));
        row("iolab-sim", "ping-pong", &best_of(3, own_ping_pong));
    }
    #[cfg(feature = "nexosim")]
    {
        if parts.contains(&"nexosim1") {
            row("nexosim 1 thread", "cpus", &best_of(3, || nexo::cpus(1)));
            row(
                "nexosim 1 thread",
                "ping-pong",
                &best_of(3, || nexo::ping_pong(1)),
            );
        }
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        if n > 1 && parts.contains(&"nexosim-mt") {
            let label = format!("nexosim {n} threads");
            // One run each: on a shared machine these take tens of seconds.
            row(&label, "cpus", &best_of(1, || nexo::cpus(n)));
            row(&label, "ping-pong", &best_of(1, || nexo::ping_pong(n)));
        }
    }
    #[cfg(not(feature = "nexosim"))]
    if parts.iter().any(|p| p.starts_with("nexosim")) {
        println!("(nexosim side skipped: add `--features nexosim`)");
    }
}

fn io_header() {
    println!();
    println!("| own engine, io workload | CPUs |  I/Os    |   events/s   | ns per I/O (host) |");
    println!("|-------------------------|------|----------|--------------|-------------------|");
}

fn io_row(cpus: usize) {
    {
        let mut best: Option<(Measure, u64)> = None;
        for _ in 0..3 {
            let (m, ios) = own_io(cpus, 1_000_000);
            if best.as_ref().map_or(true, |b| m.rate() > b.0.rate()) {
                best = Some((m, ios));
            }
        }
        let (m, ios) = best.expect("measured");
        println!(
            "| {:<23} | {cpus:>4} | {ios:>8} | {:>8.2} M/s | {:>17.1} |",
            "submit/wait/complete",
            m.rate() / 1e6,
            m.secs * 1e9 / ios as f64
        );
    }
}
