//! `[[device]]` of kind `nic`: the NIC port, its framing, rings, moderation and receive pages.

use serde::Deserialize;

use crate::lab::caps::*;
use crate::lab::defaults as d;
use crate::lab::spec::fields::Fields;
use crate::tomlfile::{InputError, TomlDoc};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::lab::spec) struct NicSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    link_gbps: Option<f64>,
    #[serde(default)]
    mtu: Option<u64>,
    #[serde(default)]
    queues: Option<usize>,
    #[serde(default)]
    tx_ring_entries: Option<usize>,
    #[serde(default)]
    rx_ring_pages: Option<usize>,
    #[serde(default)]
    tcpip_header_bytes: Option<u64>,
    #[serde(default)]
    ethernet_overhead_bytes: Option<u64>,
    #[serde(default)]
    tx_coalesce_frames: Option<u64>,
    #[serde(default)]
    tx_coalesce_usecs: Option<u64>,
    #[serde(default)]
    rx_coalesce_frames: Option<u64>,
    #[serde(default)]
    rx_coalesce_usecs: Option<u64>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    rx_stride_bytes: Option<u64>,
    #[serde(default)]
    rx_recycle_pct: Option<u32>,
    #[serde(default)]
    rx_page_cache_pages: Option<usize>,
    #[serde(default)]
    rx_adaptive: Option<bool>,
    #[serde(default)]
    dma_ns_per_4k: Option<f64>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    rx_fifo_bytes: Option<u64>,
    #[serde(default)]
    dma_outstanding_pages: Option<u32>,
    #[serde(default)]
    relaxed_ordering: Option<bool>,
    #[serde(default)]
    pause_frames: Option<bool>,
}

/// The NIC fields only the direct-DMA receive path (x86 IOMMUs or none) reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(in crate::lab::spec) struct NicDirect {
    /// The IP MTU, bytes.
    pub mtu: u64,
    /// TCP payload per segment (the MTU less the TCP/IP headers), bytes.
    pub mss: u64,
    /// DMA engine time per 4 KiB, ns.
    pub dma_ns_per_4k: f64,
    /// Receive FIFO, bytes.
    pub rx_fifo_bytes: u64,
    /// How far the NIC's DMA runs ahead at the IOMMU's port.
    pub dma_link: crate::iommu::port::DeviceLink,
    /// Ethernet pause frames (flow control): on, the sender waits while the FIFO is full;
    /// off, the NIC drops what finds it full.
    pub pause_frames: bool,
    /// Slots of each receive queue's page cache (mlx5's).
    pub page_cache_pages: usize,
    /// Adaptive receive moderation (DIM) instead of the fixed `rx_coalesce_*`.
    pub adaptive: bool,
    /// Whether the file gives `rx_recycle_pct` (the POWER NIC model's page recycling,
    /// which the direct-DMA path replaces with its page cache).
    pub recycle_given: bool,
    /// The first of those fields the file gives (the POWER TCE path refuses them).
    pub given: Option<&'static str>,
}

/// The NIC's `[[device]]` table: the port, its framing, rings, moderation and receive
/// pages (defaults: [`d::NIC_LINK_GBPS`] and the other `NIC_*` constants). Returns the
/// wire and a stream configuration with the NIC's part set (the workload sets the rest).
pub(in crate::lab::spec) fn nic(
    doc: &TomlDoc<'_>,
    s: &NicSpec,
) -> Result<
    (
        crate::devices::nic::LinkConfig,
        crate::workloads::netperf::StreamConfig,
        NicDirect,
    ),
    InputError,
> {
    use crate::devices::nic::{Coalescing, LinkConfig};
    use crate::workloads::netperf::{StreamConfig, StreamDirection};
    let dev = Fields::new(doc, "device[0]");
    // A named NIC gives the port's and the host link's defaults.
    let preset = match s.model.as_deref() {
        None => None,
        Some(name) => {
            use crate::lab::presets::{names, NIC};
            Some(NIC.iter().find(|p| p.name == name).ok_or_else(|| {
                doc.field_error(
                    "device[0].model",
                    format!(
                        "unknown NIC \"{name}\": expected one of {}",
                        names(NIC, |p| p.name)
                    ),
                )
            })?)
        }
    };
    let gbps = dev.real(
        "link_gbps",
        s.link_gbps
            .unwrap_or(preset.map_or(d::NIC_LINK_GBPS.0, |p| p.link_gbps.0)),
        0.001..=10_000.0,
    )?;
    let mtu = dev.int("mtu", s.mtu.unwrap_or(d::NIC_MTU.0), 576..=65_535, "bytes")?;
    let headers = dev.int(
        "tcpip_header_bytes",
        s.tcpip_header_bytes.unwrap_or(d::NIC_TCPIP_HEADER_BYTES.0),
        20..=200,
        "bytes",
    )?;
    let framing = dev.int(
        "ethernet_overhead_bytes",
        s.ethernet_overhead_bytes
            .unwrap_or(d::NIC_ETHERNET_OVERHEAD_BYTES.0),
        0..=200,
        "bytes",
    )?;
    let coalescing = |frames: &str, f: Option<u64>, fd: u64, usecs: &str, u: Option<u64>, ud| {
        Ok::<_, InputError>(Coalescing {
            frames: dev.int(
                frames,
                f.unwrap_or(fd),
                1..=1 << 16,
                "completions per interrupt",
            )?,
            usecs: dev.int(usecs, u.unwrap_or(ud), 0..=100_000, "us")?,
        })
    };
    let stream = StreamConfig {
        threads: 1,
        direction: StreamDirection::Write,
        message_bytes: d::NETPERF_MESSAGE_BYTES.0,
        tso_max_bytes: d::NETPERF_TSO_MAX_BYTES.0,
        page_bytes: d::NETPERF_PAGE_BYTES.0,
        linear_bytes: d::NETPERF_LINEAR_BYTES.0,
        tx_ring_entries: dev.int(
            "tx_ring_entries",
            s.tx_ring_entries.unwrap_or(d::NIC_TX_RING_ENTRIES.0),
            1..=MAX_IODEPTH as usize,
            "(cap MAX_IODEPTH)",
        )?,
        tx_inflight_bytes: d::NETPERF_TX_INFLIGHT_BYTES.0,
        tx_coalescing: coalescing(
            "tx_coalesce_frames",
            s.tx_coalesce_frames,
            d::NIC_TX_COALESCE_FRAMES.0,
            "tx_coalesce_usecs",
            s.tx_coalesce_usecs,
            d::NIC_TX_COALESCE_USECS.0,
        )?,
        rx_coalescing: coalescing(
            "rx_coalesce_frames",
            s.rx_coalesce_frames,
            d::NIC_RX_COALESCE_FRAMES.0,
            "rx_coalesce_usecs",
            s.rx_coalesce_usecs,
            d::NIC_RX_COALESCE_USECS.0,
        )?,
        rx_window_messages: d::NETPERF_RX_WINDOW_MESSAGES.0,
        // Checked against the workload's page size in `netperf`.
        rx_stride_bytes: s.rx_stride_bytes.unwrap_or(d::NIC_RX_STRIDE_BYTES.0),
        rx_ring_pages: dev.int(
            "rx_ring_pages",
            s.rx_ring_pages.unwrap_or(d::NIC_RX_RING_PAGES.0),
            1..=MAX_IODEPTH as usize,
            "(cap MAX_IODEPTH)",
        )?,
        queues: dev.int(
            "queues",
            s.queues.unwrap_or(d::NIC_QUEUES.0),
            1..=MAX_DEVICE_QUEUES,
            "(cap MAX_DEVICE_QUEUES)",
        )?,
        rx_recycle_pct: dev.int(
            "rx_recycle_pct",
            s.rx_recycle_pct.unwrap_or(d::NIC_RX_RECYCLE_PCT.0),
            0..=100,
            "percent",
        )?,
        run_ns: 0,
        warmup_ns: 0,
    };
    if mtu <= headers {
        return Err(doc.field_error(
            "device[0].tcpip_header_bytes",
            format!("expected less than mtu = {mtu} (MSS = MTU - TCP/IP headers), got {headers}"),
        ));
    }
    let direct = NicDirect {
        mtu,
        mss: mtu - headers,
        dma_ns_per_4k: dev.real(
            "dma_ns_per_4k",
            s.dma_ns_per_4k
                .unwrap_or(preset.map_or(d::NIC_DMA_NS_PER_4K.0, |p| p.dma_ns_per_4k.0)),
            0.0..=1e6,
        )?,
        rx_fifo_bytes: dev.int(
            "rx_fifo_bytes",
            s.rx_fifo_bytes.unwrap_or(d::NIC_RX_FIFO_BYTES.0),
            4096..=1 << 30,
            "bytes",
        )?,
        dma_link: super::dma_link(&dev, s.dma_outstanding_pages, s.relaxed_ordering)?,
        pause_frames: s.pause_frames.unwrap_or(d::NIC_PAUSE_FRAMES.0),
        page_cache_pages: dev.int(
            "rx_page_cache_pages",
            s.rx_page_cache_pages
                .unwrap_or(d::NIC_RX_PAGE_CACHE_PAGES.0),
            0..=1 << 16,
            "slots (0: every used page is unmapped)",
        )?,
        recycle_given: s.rx_recycle_pct.is_some(),
        adaptive: match s.rx_adaptive {
            Some(true) if s.rx_coalesce_usecs.is_some() || s.rx_coalesce_frames.is_some() => {
                return Err(doc.field_error(
                    "device[0].rx_adaptive",
                    "DIM chooses the receive moderation: give rx_coalesce_usecs / rx_coalesce_frames with rx_adaptive = false, or neither",
                ))
            }
            Some(adaptive) => adaptive,
            // mlx5's default, unless the file states a fixed moderation.
            None => {
                d::NIC_RX_ADAPTIVE.0
                    && s.rx_coalesce_usecs.is_none()
                    && s.rx_coalesce_frames.is_none()
            }
        },
        given: if s.dma_ns_per_4k.is_some() {
            Some("dma_ns_per_4k")
        } else if s.rx_fifo_bytes.is_some() {
            Some("rx_fifo_bytes")
        } else if s.dma_outstanding_pages.is_some() {
            Some("dma_outstanding_pages")
        } else if s.relaxed_ordering.is_some() {
            Some("relaxed_ordering")
        } else if s.pause_frames.is_some() {
            Some("pause_frames")
        } else if s.rx_page_cache_pages.is_some() {
            Some("rx_page_cache_pages")
        } else if s.rx_adaptive.is_some() {
            Some("rx_adaptive")
        } else {
            None
        },
    };
    Ok((
        LinkConfig::from_mtu(gbps, mtu, headers, framing),
        stream,
        direct,
    ))
}

#[cfg(test)]
mod tests {
    use crate::lab::defaults as d;
    use crate::lab::spec::testing::*;
    use crate::lab::spec::Workload;

    fn stream_of(text: &str) -> crate::workloads::netperf::StreamConfig {
        variant!(ok(text).workload, Workload::Netperf).stream
    }

    #[test]
    fn nic_fields_set_the_rings_and_moderation_with_defaults() {
        let s = stream_of(NETPERF_NIC);
        assert_eq!(s.queues, 16);
        assert_eq!(s.tx_ring_entries, d::NIC_TX_RING_ENTRIES.0);
        assert_eq!(s.rx_coalescing.frames, d::NIC_RX_COALESCE_FRAMES.0);
        assert_eq!(s.rx_stride_bytes, d::NIC_RX_STRIDE_BYTES.0);
        let s = stream_of(&with(
            NETPERF_NIC,
            "device",
            "tx_ring_entries = 256\ntx_coalesce_frames = 8\ntx_coalesce_usecs = 3\nrx_recycle_pct = 0",
        ));
        assert_eq!(s.tx_ring_entries, 256);
        assert_eq!((s.tx_coalescing.frames, s.tx_coalescing.usecs), (8, 3));
        assert_eq!(s.rx_recycle_pct, 0);
    }

    #[test]
    fn nic_fields_out_of_range_of_the_wrong_type_or_unknown_are_refused() {
        refused(
            &with(NETPERF_NIC, "device", "mtu = 100"),
            "device[0].mtu",
            "expected 576..=65535 bytes, got 100",
        );
        refused(
            &with(NETPERF_NIC, "device", "rx_recycle_pct = 101"),
            "device[0].rx_recycle_pct",
            "expected 0..=100 percent, got 101",
        );
        refused(
            &with(NETPERF_NIC, "device", "rx_stride_bytes = 32"),
            "device[0].rx_stride_bytes",
            "bytes (at most workload.page_bytes), got 32",
        );
        refused(
            &with(NETPERF_NIC, "device", "link_gbps = \"fast\""),
            "device[0].link_gbps",
            "invalid type: string \"fast\", expected a number",
        );
        refused(
            &with(NETPERF_NIC, "device", "disks = 1"),
            "device[0].disks",
            "unknown field `disks`, expected one of `kind`, `model`, `link_gbps`",
        );
    }
}
