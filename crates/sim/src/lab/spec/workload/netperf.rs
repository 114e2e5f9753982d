//! `[workload]` of kind `netperf`: TCP streams on a NIC.

use serde::Deserialize;

use crate::lab::caps::*;
use crate::lab::defaults as d;
use crate::lab::spec::device::nic::NicDirect;
use crate::lab::spec::fields::{range, Fields};
use crate::lab::spec::Common;
use crate::tomlfile::{InputError, TomlDoc};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::lab::spec) struct NetperfSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    direction: Option<String>,
    #[serde(default)]
    threads: Option<usize>,
    #[serde(default)]
    flow_cpus: Option<usize>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    message_bytes: Option<u64>,
    run_ms: u64,
    #[serde(default)]
    warmup_ms: Option<u64>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    tso_max_bytes: Option<u64>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    page_bytes: Option<u64>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    linear_bytes: Option<u64>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    tx_inflight_bytes: Option<u64>,
    #[serde(default)]
    rx_window_messages: Option<usize>,
    #[serde(default)]
    tx_per_skb_ns: Option<f64>,
    #[serde(default)]
    tx_completion_ns: Option<f64>,
    #[serde(default)]
    irq_ns: Option<f64>,
    #[serde(default)]
    rx_per_packet_ns: Option<f64>,
    #[serde(default)]
    rx_per_skb_ns: Option<f64>,
    #[serde(default)]
    jitter_pct: Option<u32>,
    #[serde(default)]
    sender_burst_packets: Option<u64>,
    #[serde(default)]
    ack_ns: Option<f64>,
    #[serde(default)]
    tcp_ack_delay_us: Option<f64>,
    #[serde(default)]
    tcp_init_cwnd: Option<u64>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    tcp_rwnd_bytes: Option<u64>,
}

impl NetperfSpec {
    /// The first of the TCP fields (pause frames off only) the file gives.
    fn tcp_field_given(&self) -> Option<&'static str> {
        [
            ("tcp_ack_delay_us", self.tcp_ack_delay_us.is_some()),
            ("tcp_init_cwnd", self.tcp_init_cwnd.is_some()),
            ("tcp_rwnd_bytes", self.tcp_rwnd_bytes.is_some()),
        ]
        .into_iter()
        .find(|&(_, given)| given)
        .map(|(field, _)| field)
    }
}

/// A validated netperf-like stream workload.
#[derive(Clone, Debug, PartialEq)]
pub struct NetperfSetup {
    /// Threads, direction, message size, rings, run length.
    pub stream: crate::workloads::netperf::StreamConfig,
    /// Network-stack CPU costs.
    pub costs: crate::workloads::netperf::StackCosts,
    /// Whether the hypervisor serialises TCE updates per table.
    pub serialisation: crate::devices::nic::HvSerialisation,
    /// The direct-DMA receive test (x86 IOMMUs or none), when the scenario runs it.
    pub direct: Option<DirectRx>,
}

/// A receive test on the direct-DMA NIC path ([`crate::workloads::rx_stream`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DirectRx {
    /// The test's configuration.
    pub config: crate::workloads::rx_stream::RxStreamConfig,
    /// The receiving stack's CPU costs.
    pub costs: crate::workloads::rx_stream::RxCosts,
    /// The send test's own parameters, when the scenario sends (`direction = "write"`):
    /// then the test is `workloads::tx_stream`'s, on the same NIC and rings.
    pub send: Option<crate::workloads::tx_stream::TxParams>,
}

/// The netperf `[workload]` table: threads, direction, message and skb sizes, the TCP byte
/// bounds, the stack's CPU costs (defaults: the `NETPERF_*` constants of [`d`]).
pub(in crate::lab::spec) fn netperf(
    doc: &TomlDoc<'_>,
    s: &NetperfSpec,
    c: &Common,
    mut stream: crate::workloads::netperf::StreamConfig,
    direct: Option<NicDirect>,
) -> Result<NetperfSetup, InputError> {
    let wl = Fields::new(doc, "workload");
    use crate::devices::nic::HvSerialisation;
    use crate::workloads::netperf::{StackCosts, StreamDirection};
    stream.direction = match s.direction.as_deref().unwrap_or("write") {
        "write" => StreamDirection::Write,
        "read" => StreamDirection::Read,
        other => {
            return Err(doc.field_error(
                "workload.direction",
                format!(
                    "unknown direction \"{other}\": expected \"write\" (transmit) or \"read\" (receive)"
                ),
            ))
        }
    };
    stream.threads = if direct.is_some() {
        wl.int(
            "threads",
            s.threads.unwrap_or(1),
            1..=MAX_THREADS as usize,
            "flows (cap MAX_THREADS; flow i runs on CPU i mod workload.flow_cpus)",
        )?
    } else {
        let max_threads = c.cpus.min(MAX_THREADS as usize);
        wl.int(
            "threads",
            s.threads.unwrap_or(1),
            1..=max_threads,
            "(at most machine.cpus; cap MAX_THREADS)",
        )?
    };
    wl.set_int(
        &mut stream.message_bytes,
        "message_bytes",
        s.message_bytes,
        1..=16 << 20,
        "bytes",
    )?;
    let page_bytes = wl.int(
        "page_bytes",
        s.page_bytes.unwrap_or(if direct.is_some() {
            d::NETPERF_DIRECT_PAGE_BYTES.0
        } else {
            d::NETPERF_PAGE_BYTES.0
        }),
        4096..=1 << 16,
        "bytes (a kernel page size)",
    )?;
    if !page_bytes.is_power_of_two() {
        return Err(doc.field_error(
            "workload.page_bytes",
            format!("expected a power of two, got {page_bytes}"),
        ));
    }
    stream.page_bytes = page_bytes;
    range(
        doc,
        "device[0].rx_stride_bytes",
        stream.rx_stride_bytes,
        64,
        page_bytes,
        "bytes (at most workload.page_bytes)",
    )?;
    stream.tso_max_bytes = wl.int(
        "tso_max_bytes",
        s.tso_max_bytes.unwrap_or(d::NETPERF_TSO_MAX_BYTES.0),
        1..=1 << 18,
        "bytes",
    )?;
    stream.linear_bytes = wl.int(
        "linear_bytes",
        s.linear_bytes.unwrap_or(d::NETPERF_LINEAR_BYTES.0),
        0..=4096 - 64,
        "bytes (headers in the skb's linear part)",
    )?;
    stream.tx_inflight_bytes = wl.int(
        "tx_inflight_bytes",
        s.tx_inflight_bytes
            .unwrap_or(d::NETPERF_TX_INFLIGHT_BYTES.0),
        1..=1 << 30,
        "bytes",
    )?;
    stream.rx_window_messages = wl.int(
        "rx_window_messages",
        s.rx_window_messages
            .unwrap_or(d::NETPERF_RX_WINDOW_MESSAGES.0),
        1..=1 << 16,
        "messages",
    )?;
    let run_ms = wl.int(
        "run_ms",
        s.run_ms,
        1..=MAX_RUN_MS,
        "ms of virtual time (cap MAX_RUN_MS)",
    )?;
    let warmup_ms = s.warmup_ms.unwrap_or(d::NETPERF_WARMUP_MS.0);
    if warmup_ms >= run_ms {
        return Err(doc.field_error(
            "workload.warmup_ms",
            format!("expected less than run_ms = {run_ms}"),
        ));
    }
    stream.run_ns = run_ms * 1_000_000;
    stream.warmup_ns = warmup_ms * 1_000_000;
    // Each queue's buffers live in their own 4 GiB of physical memory (workloads::netperf).
    let queues = stream.queues.max(stream.threads) as u64;
    let needed_gib = 4 * (queues + 1);
    if c.memory_bytes >> 30 < needed_gib {
        return Err(doc.field_error(
            "machine.memory_gib",
            format!(
                "the NIC model places each queue's buffers in its own 4 GiB: {queues} queues need at least {needed_gib} GiB"
            ),
        ));
    }
    let ns =
        |field: &str, v: Option<f64>, default: f64| wl.real(field, v.unwrap_or(default), 0.0..=1e9);
    let costs = StackCosts {
        syscall_ns: 0.0,
        copy_bytes_per_ns: 0.0,
        tx_per_skb_ns: ns("tx_per_skb_ns", s.tx_per_skb_ns, d::NETPERF_TX_PER_SKB_NS.0)?,
        tx_completion_ns: ns(
            "tx_completion_ns",
            s.tx_completion_ns,
            d::NETPERF_TX_COMPLETION_NS.0,
        )?,
        irq_ns: ns("irq_ns", s.irq_ns, d::NETPERF_IRQ_NS.0)?,
        rx_per_packet_ns: ns(
            "rx_per_packet_ns",
            s.rx_per_packet_ns,
            d::NETPERF_RX_PER_PACKET_NS.0,
        )?,
        rx_per_skb_ns: ns("rx_per_skb_ns", s.rx_per_skb_ns, d::NETPERF_RX_PER_SKB_NS.0)?,
        doorbell_ns: 0.0,
        jitter_pct: wl.int(
            "jitter_pct",
            s.jitter_pct.unwrap_or(d::NETPERF_JITTER_PCT.0),
            0..=50,
            "percent",
        )?,
    }
    .with_profile(&c.profile);
    let direct = match direct {
        Some(n) => Some(direct_rx(doc, s, &stream, &costs, c, n)?),
        None => {
            let given = [
                s.sender_burst_packets.map(|_| "sender_burst_packets"),
                s.flow_cpus.map(|_| "flow_cpus"),
                s.ack_ns.map(|_| "ack_ns"),
                s.tcp_field_given(),
            ];
            if let Some(field) = given.into_iter().flatten().next() {
                return Err(doc.field_error(
                    &format!("workload.{field}"),
                    "applies to the direct-DMA receive path (iommu.model = \"vtd\", \"amd-vi\" or \"none\"), not to the POWER TCE path",
                ));
            }
            None
        }
    };
    Ok(NetperfSetup {
        stream,
        costs,
        serialisation: if c.iommu.serialise_tce_updates {
            HvSerialisation::PerTable
        } else {
            HvSerialisation::None
        },
        direct,
    })
}

/// The direct-DMA test of a netperf scenario on an x86 IOMMU (or none): the receive test,
/// or with `direction = "write"` the send test on the same NIC.
fn direct_rx(
    doc: &TomlDoc<'_>,
    s: &NetperfSpec,
    stream: &crate::workloads::netperf::StreamConfig,
    costs: &crate::workloads::netperf::StackCosts,
    c: &Common,
    n: NicDirect,
) -> Result<DirectRx, InputError> {
    use crate::workloads::netperf::StreamDirection;
    use crate::workloads::rx_stream::{RxCosts, RxStreamConfig, ETH_HEADER_BYTES};
    let wl = Fields::new(doc, "workload");
    let send = (stream.direction == StreamDirection::Write).then_some(
        crate::workloads::tx_stream::TxParams {
            tso_max_bytes: stream.tso_max_bytes,
            linear_bytes: stream.linear_bytes,
            inflight_bytes: stream.tx_inflight_bytes,
            coalescing: stream.tx_coalescing,
            per_skb_ns: costs.tx_per_skb_ns,
            completion_ns: costs.tx_completion_ns,
            doorbell_ns: costs.doorbell_ns,
            irq_ns: costs.irq_ns,
            copy_bytes_per_ns: costs.copy_bytes_per_ns,
        },
    );
    let frame = n.mtu + ETH_HEADER_BYTES;
    if frame > stream.page_bytes {
        return Err(doc.field_error(
            "device[0].mtu",
            format!(
                "the direct-DMA NIC path puts one packet in one receive buffer of workload.page_bytes = {}: expected at most {}, got {}",
                stream.page_bytes,
                stream.page_bytes - ETH_HEADER_BYTES,
                n.mtu
            ),
        ));
    }
    // One packet per fragment of device.rx_stride_bytes; a frame that does not fit the
    // stride takes a page of its own (the driver's linear buffer for a large MTU).
    let stride = if frame <= stream.rx_stride_bytes {
        stream.rx_stride_bytes
    } else {
        stream.page_bytes
    };
    let loss = if n.pause_frames {
        if let Some(field) = s.tcp_field_given() {
            return Err(doc.field_error(
                &format!("workload.{field}"),
                "applies when the NIC drops packets: set device[0].pause_frames = false (with pause frames on the sender waits and TCP's loss recovery never runs)",
            ));
        }
        None
    } else {
        if send.is_some() {
            return Err(doc.field_error(
                "device[0].pause_frames",
                "applies to the receive test (workload.direction = \"read\"): the send test's NIC does not drop",
            ));
        }
        let mss = n.mss.max(1);
        let rwnd = wl.int(
            "tcp_rwnd_bytes",
            s.tcp_rwnd_bytes.unwrap_or(d::NETPERF_TCP_RWND_BYTES.0),
            mss..=1 << 30,
            "bytes (at least one segment)",
        )?;
        Some(crate::workloads::rx_stream::LossyTransport {
            tcp: crate::workloads::tcp_flow::TcpParams {
                init_cwnd: wl.int(
                    "tcp_init_cwnd",
                    s.tcp_init_cwnd.unwrap_or(d::NETPERF_TCP_INIT_CWND.0),
                    1..=1 << 16,
                    "segments",
                )? as f64,
                rwnd: (rwnd / mss) as f64,
                min_pto_ns: d::NETPERF_TCP_PTO_FLOOR_NS.0,
            },
            ack_delay_ns: (wl.real(
                "tcp_ack_delay_us",
                s.tcp_ack_delay_us.unwrap_or(d::NETPERF_TCP_ACK_DELAY_US.0),
                0.0..=1e6,
            )? * 1000.0)
                .round() as u64,
        })
    };
    if n.recycle_given {
        return Err(doc.field_error(
            "device[0].rx_recycle_pct",
            "applies to the POWER TCE path's NIC; the direct-DMA path (iommu.model = \"vtd\", \"amd-vi\" or \"none\") recycles through mlx5's page cache: set device[0].rx_page_cache_pages",
        ));
    }
    let config = RxStreamConfig {
        flows: stream.threads,
        cpus: wl.int(
            "flow_cpus",
            s.flow_cpus.unwrap_or(c.cpus),
            1..=c.cpus,
            "cores the flows run on (at most machine.cpus)",
        )?,
        ring_pages: stream.rx_ring_pages,
        tx_ring_entries: stream.tx_ring_entries,
        page_bytes: stream.page_bytes,
        stride_bytes: stride,
        frame_bytes: frame,
        burst_packets: wl.int(
            "sender_burst_packets",
            s.sender_burst_packets
                .unwrap_or(d::NETPERF_SENDER_BURST_PACKETS.0),
            1..=1 << 16,
            "packets",
        )?,
        fifo_bytes: n.rx_fifo_bytes,
        dma_link: n.dma_link,
        dma_ns_per_4k: n.dma_ns_per_4k,
        coalesce_frames: stream.rx_coalescing.frames,
        coalesce_ns: stream.rx_coalescing.usecs * 1000,
        adaptive: n.adaptive,
        gro_bytes: stream.tso_max_bytes,
        page_cache_pages: n.page_cache_pages,
        run_ns: stream.run_ns,
        warmup_ns: stream.warmup_ns,
        loss,
    };
    let costs = RxCosts {
        irq_ns: costs.irq_ns,
        per_packet_ns: costs.rx_per_packet_ns,
        per_skb_ns: costs.rx_per_skb_ns,
        ack_ns: wl.real("ack_ns", s.ack_ns.unwrap_or(d::NETPERF_ACK_NS.0), 0.0..=1e9)?,
        copy_bytes_per_ns: costs.copy_bytes_per_ns,
    };
    Ok(DirectRx {
        config,
        costs,
        send,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::spec::testing::*;
    use crate::lab::spec::Workload;
    use crate::workloads::netperf::StreamDirection;

    fn netperf_of(text: &str) -> NetperfSetup {
        *variant!(ok(text).workload, Workload::Netperf)
    }

    #[test]
    fn netperf_fields_set_the_streams_with_defaults() {
        let n = netperf_of(NETPERF_NIC);
        assert_eq!(
            (n.stream.threads, n.stream.direction),
            (1, StreamDirection::Write)
        );
        assert_eq!(n.stream.message_bytes, d::NETPERF_MESSAGE_BYTES.0);
        assert_eq!(
            (n.stream.run_ns, n.stream.warmup_ns),
            (20_000_000, d::NETPERF_WARMUP_MS.0 * 1_000_000)
        );
        assert_eq!(n.costs.jitter_pct, d::NETPERF_JITTER_PCT.0);
        let n = netperf_of(&with(
            NETPERF_NIC,
            "workload",
            "direction = \"read\"\nthreads = 8\nmessage_bytes = \"64k\"\nwarmup_ms = 5",
        ));
        assert_eq!(
            (n.stream.threads, n.stream.direction),
            (8, StreamDirection::Read)
        );
        assert_eq!(
            (n.stream.message_bytes, n.stream.warmup_ns),
            (65536, 5_000_000)
        );
    }

    #[test]
    fn netperf_fields_out_of_range_of_the_wrong_type_or_unknown_are_refused() {
        refused(
            &with(NETPERF_NIC, "workload", "threads = 17"),
            "workload.threads",
            "expected 1..=16 (at most machine.cpus; cap MAX_THREADS), got 17",
        );
        refused(
            &with(NETPERF_NIC, "workload", "warmup_ms = 20"),
            "workload.warmup_ms",
            "expected less than run_ms = 20",
        );
        refused(
            &with(NETPERF_NIC, "workload", "page_bytes = 5000"),
            "workload.page_bytes",
            "expected a power of two, got 5000",
        );
        refused(
            &with(NETPERF_NIC, "workload", "direction = \"both\""),
            "workload.direction",
            "unknown direction \"both\": expected \"write\" (transmit) or \"read\" (receive)",
        );
        refused(
            &with(NETPERF_NIC, "workload", "direction = 1"),
            "workload.direction",
            "invalid type: integer `1`, expected a string",
        );
        refused(
            &with(NETPERF_NIC, "workload", "rw = \"read\""),
            "workload.rw",
            "unknown field `rw`, expected one of `kind`, `direction`",
        );
        refused(
            &NETPERF_NIC.replace("memory_gib = 128", "memory_gib = 32"),
            "machine.memory_gib",
            "the NIC model places each queue's buffers in its own 4 GiB: 16 queues need at least 68 GiB",
        );
    }
}
