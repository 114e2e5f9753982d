//! `[[device]]` of kind `usb`: a USB mass-storage device behind an xHCI, its link, and the
//! swiotlb pool dma-direct bounces through (`kernel.swiotlb_*`).

use serde::Deserialize;

use crate::lab::defaults as d;
use crate::lab::spec::fields::Fields;
use crate::lab::spec::iommu::IommuMode;
use crate::lab::spec::kernel::KernelSpec;
use crate::lab::spec::Common;
use crate::tomlfile::{InputError, TomlDoc};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::lab::spec) struct UsbSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    speed: Option<String>,
    #[serde(default)]
    command_overhead_ns: Option<u64>,
    #[serde(default)]
    per_segment_ns: Option<u64>,
    #[serde(default)]
    media_read_latency_us: Option<f64>,
    #[serde(default)]
    media_flush_us: Option<f64>,
    #[serde(default)]
    completion_ns: Option<u64>,
    #[serde(default)]
    storage_cpu: Option<usize>,
    #[serde(default)]
    irq_cpu: Option<usize>,
    #[serde(default)]
    dma_mask_bits: Option<u32>,
    #[serde(default)]
    signal_bits_per_s: Option<f64>,
    #[serde(default)]
    encoding: Option<f64>,
    #[serde(default)]
    protocol_efficiency: Option<f64>,
    #[serde(default)]
    phase_latency_ns: Option<u64>,
    #[serde(default)]
    max_sectors: Option<u64>,
    #[serde(default)]
    walk_reads_per_miss: Option<u64>,
    #[serde(default)]
    max_segments: Option<usize>,
    #[serde(default)]
    max_segment_kib: Option<u64>,
}

/// A validated USB mass-storage device.
#[derive(Clone, Debug, PartialEq)]
pub struct UsbSetup {
    /// Device, link and host-controller parameters.
    pub config: crate::devices::usb::UsbStorageConfig,
    /// The DMA layer's maximum segment size, bytes.
    pub max_segment_size: u64,
    /// The block layer's maximum segments per request.
    pub max_segments: usize,
    /// The xHCI's DMA mask, bits (`device[0].dma_mask_bits`).
    pub dma_mask_bits: u32,
    /// The swiotlb pool dma-direct bounces through (used without an IOMMU).
    pub swiotlb: SwiotlbSetup,
}

/// A validated swiotlb pool (`devices::usb::Swiotlb`): where it lies and its geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwiotlbSetup {
    /// Physical address of the pool.
    pub base: u64,
    /// Pool size, bytes.
    pub bytes: u64,
    /// Slot size, bytes.
    pub slot_bytes: u64,
    /// Slots per segment (a bounce mapping stays inside one).
    pub segment_slots: usize,
}

impl SwiotlbSetup {
    /// The pool, empty.
    pub fn build(&self) -> Result<crate::devices::usb::Swiotlb, crate::devices::usb::SwiotlbError> {
        crate::devices::usb::Swiotlb::new(
            self.base,
            self.bytes,
            self.slot_bytes,
            self.segment_slots,
        )
    }
}

/// One USB link speed, its defaults overridden by the device table's link fields.
fn usb_link(
    dev: &Fields<'_, '_>,
    s: &UsbSpec,
    l: &d::UsbLinkDefaults,
) -> Result<crate::devices::usb::LinkSpeed, InputError> {
    let max_sectors = dev.int(
        "max_sectors",
        s.max_sectors.unwrap_or(l.max_sectors.0),
        8..=65536,
        "512-byte sectors per command",
    )?;
    #[rustfmt::skip]
    let [signal_bits_per_s, encoding, protocol_efficiency] = dev.reals([
        ("signal_bits_per_s", s.signal_bits_per_s, l.signal_bits_per_s, 1e6..=1e11),
        ("encoding", s.encoding, l.encoding, 0.1..=1.0),
        ("protocol_efficiency", s.protocol_efficiency, l.protocol_efficiency, 0.01..=1.0),
    ])?;
    Ok(crate::devices::usb::LinkSpeed {
        name: l.name.to_owned(),
        signal_bits_per_s,
        encoding,
        protocol_efficiency,
        phase_latency_ns: dev.int(
            "phase_latency_ns",
            s.phase_latency_ns.unwrap_or(l.phase_latency_ns.0),
            0..=10_000_000,
            "ns",
        )?,
        max_transfer: max_sectors * 512,
    })
}

pub(in crate::lab::spec) fn usb(
    doc: &TomlDoc<'_>,
    s: &UsbSpec,
    k: &KernelSpec,
    c: &Common,
) -> Result<UsbSetup, InputError> {
    let dev = Fields::new(doc, "device[0]");
    let link = match s.speed.as_deref().unwrap_or("superspeed") {
        "superspeed" => usb_link(&dev, s, &d::USB_SUPERSPEED)?,
        "highspeed" => usb_link(&dev, s, &d::USB_HIGHSPEED)?,
        other => {
            return Err(doc.field_error(
                "device[0].speed",
                format!("unknown speed \"{other}\": expected \"superspeed\" or \"highspeed\""),
            ))
        }
    };
    let config = crate::devices::usb::UsbStorageConfig {
        link,
        command_overhead_ns: dev.int(
            "command_overhead_ns",
            s.command_overhead_ns
                .unwrap_or(d::USB_COMMAND_OVERHEAD_NS.0),
            0..=100_000_000,
            "ns",
        )?,
        per_segment_ns: dev.int(
            "per_segment_ns",
            s.per_segment_ns.unwrap_or(d::USB_PER_SEGMENT_NS.0),
            0..=1_000_000,
            "ns",
        )?,
        media_read_latency_ns: dev.us_as_ns(
            "media_read_latency_us",
            s.media_read_latency_us
                .unwrap_or(d::USB_MEDIA_READ_LATENCY_US.0),
            0.0..=1e6,
        )?,
        media_flush_ns: dev.us_as_ns(
            "media_flush_us",
            s.media_flush_us.unwrap_or(d::USB_MEDIA_FLUSH_US.0),
            0.0..=1e6,
        )?,
        walk_reads_per_miss: dev.int(
            "walk_reads_per_miss",
            s.walk_reads_per_miss
                .unwrap_or(d::USB_WALK_READS_PER_MISS.0),
            0..=4,
            "table reads (an LPAE walk has at most 4 levels)",
        )?,
        completion_ns: dev.int(
            "completion_ns",
            s.completion_ns.unwrap_or(d::USB_COMPLETION_NS.0),
            0..=1_000_000,
            "ns",
        )?,
        storage_cpu: dev.cpu("storage_cpu", s.storage_cpu, d::USB_STORAGE_CPU.0, c.cpus)?,
        irq_cpu: dev.cpu("irq_cpu", s.irq_cpu, d::USB_IRQ_CPU.0, c.cpus)?,
    };
    let max_segments = dev.int(
        "max_segments",
        s.max_segments.unwrap_or(d::USB_MAX_SEGMENTS.0),
        1..=65535,
        "segments per request",
    )?;
    let max_segment_size = dev.int(
        "max_segment_kib",
        s.max_segment_kib.unwrap_or(d::USB_MAX_SEGMENT_KIB.0),
        4..=4096,
        "KiB",
    )? << 10;
    let dma_mask_bits = dev.int(
        "dma_mask_bits",
        s.dma_mask_bits.unwrap_or(d::USB_DMA_MASK_BITS.0),
        24..=64,
        "bits",
    )?;
    let swiotlb = swiotlb(doc, k, c, dma_mask_bits)?;
    Ok(UsbSetup {
        config,
        max_segment_size,
        max_segments,
        dma_mask_bits,
        swiotlb,
    })
}

/// The swiotlb pool of a usb scenario: `kernel.swiotlb_*`, at the start of the first memory
/// bank (`machine.memory_banks`), else ending at [`d::SWIOTLB_END_WITHOUT_BANKS`]. Without an
/// IOMMU dma-direct bounces through it, so it must lie below the device's DMA mask.
fn swiotlb(
    doc: &TomlDoc<'_>,
    k: &KernelSpec,
    c: &Common,
    dma_mask_bits: u32,
) -> Result<SwiotlbSetup, InputError> {
    let kernel = Fields::new(doc, "kernel");
    let bytes = kernel.int(
        "swiotlb_mib",
        k.swiotlb_mib.unwrap_or(d::SWIOTLB_MIB.0),
        1..=4096,
        "MiB",
    )? << 20;
    let slot_bytes = kernel.int(
        "swiotlb_slot_bytes",
        k.swiotlb_slot_bytes.unwrap_or(d::SWIOTLB_SLOT_BYTES.0),
        512..=65536,
        "bytes (a power of two)",
    )?;
    let segment_slots = kernel.int(
        "swiotlb_segment_slots",
        k.swiotlb_segment_slots
            .unwrap_or(d::SWIOTLB_SEGMENT_SLOTS.0),
        1..=4096,
        "slots",
    )?;
    let base = match &c.memory_banks {
        Some(banks) => {
            if bytes >= banks[0].1 {
                return Err(doc.field_error(
                    "kernel.swiotlb_mib",
                    format!(
                        "the pool ({} MiB) must fit in the first of machine.memory_banks ({} MiB), where it is allocated at boot",
                        bytes >> 20,
                        banks[0].1 >> 20
                    ),
                ));
            }
            banks[0].0
        }
        None => d::SWIOTLB_END_WITHOUT_BANKS.0 - bytes,
    };
    let mask = u64::MAX >> (64 - dma_mask_bits);
    if c.iommu.mode == IommuMode::Off && base + bytes - 1 > mask {
        return Err(doc.field_error(
            "device[0].dma_mask_bits",
            format!(
                "dma-direct bounces through the swiotlb pool at {base:#x}..{:#x}, beyond a {dma_mask_bits}-bit mask: declare machine.memory_banks with a first bank below the mask",
                base + bytes
            ),
        ));
    }
    let setup = SwiotlbSetup {
        base,
        bytes,
        slot_bytes,
        segment_slots,
    };
    setup.build().map_err(|e| {
        doc.field_error(
            if slot_bytes.is_power_of_two() {
                "kernel.swiotlb_segment_slots"
            } else {
                "kernel.swiotlb_slot_bytes"
            },
            e.to_string(),
        )
    })?;
    Ok(setup)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::spec::testing::*;
    use crate::lab::spec::Devices;

    fn usb_of(text: &str) -> UsbSetup {
        *variant!(ok(text).devices, Devices::Usb)
    }

    #[test]
    fn usb_fields_set_the_link_the_device_and_the_swiotlb_pool() {
        let u = usb_of(BONNIE_USB);
        assert_eq!(u.config.link.name, d::USB_SUPERSPEED.name);
        assert_eq!(u.config.link.encoding, d::USB_SUPERSPEED.encoding.0);
        assert_eq!(u.max_segment_size, d::USB_MAX_SEGMENT_KIB.0 << 10);
        let pool = d::SWIOTLB_MIB.0 << 20;
        assert_eq!(
            (u.swiotlb.base, u.swiotlb.bytes),
            (d::SWIOTLB_END_WITHOUT_BANKS.0 - pool, pool)
        );
        let u = usb_of(&with(
            BONNIE_USB,
            "device",
            "speed = \"highspeed\"\nencoding = 0.5\nmedia_flush_us = 1.5\nmax_segment_kib = 64\nirq_cpu = 3",
        ));
        assert_eq!(u.config.link.name, d::USB_HIGHSPEED.name);
        assert_eq!(u.config.link.encoding, 0.5);
        assert_eq!(u.config.media_flush_ns, 1500);
        assert_eq!((u.max_segment_size, u.config.irq_cpu), (64 << 10, 3));
        let u = usb_of(&with(
            BONNIE_USB,
            "kernel",
            "swiotlb_mib = 8\nswiotlb_slot_bytes = 4096",
        ));
        assert_eq!((u.swiotlb.bytes, u.swiotlb.slot_bytes), (8 << 20, 4096));
    }

    #[test]
    fn usb_fields_out_of_range_of_the_wrong_type_or_unknown_are_refused() {
        refused(
            &with(BONNIE_USB, "device", "encoding = 2.0"),
            "device[0].encoding",
            "expected a number in 0.1..=1, got 2",
        );
        refused(
            &with(BONNIE_USB, "device", "walk_reads_per_miss = 5"),
            "device[0].walk_reads_per_miss",
            "expected 0..=4 table reads (an LPAE walk has at most 4 levels), got 5",
        );
        refused(
            &with(BONNIE_USB, "device", "storage_cpu = 4"),
            "device[0].storage_cpu",
            "expected a CPU in 0..4 (machine.cpus = 4), got 4",
        );
        refused(
            &with(BONNIE_USB, "device", "speed = \"warp\""),
            "device[0].speed",
            "unknown speed \"warp\": expected \"superspeed\" or \"highspeed\"",
        );
        refused(
            &with(BONNIE_USB, "device", "speed = 3"),
            "device[0].speed",
            "invalid type: integer `3`, expected a string",
        );
        refused(
            &with(BONNIE_USB, "device", "io_queues = 2"),
            "device[0].io_queues",
            "unknown field `io_queues`, expected one of `kind`, `speed`",
        );
        refused(
            &with(BONNIE_USB, "kernel", "swiotlb_slot_bytes = 3000"),
            "kernel.swiotlb_slot_bytes",
            "swiotlb: slot size 3000 is not a power of two",
        );
    }

    #[test]
    fn usb_runs_behind_the_ipmmu_or_none_and_bounces_below_its_mask() {
        let none = BONNIE_USB.replace("model = \"ipmmu\"\nmode = \"strict\"", "model = \"none\"");
        let s = ok(&none);
        assert_eq!(s.iommu.mode, IommuMode::Off);
        refused(
            &with(&none, "kernel", "block_virt_merge = true"),
            "kernel.block_virt_merge",
            "true needs an IOMMU that merges page-aligned pieces",
        );
        refused(
            &with(&none, "device", "dma_mask_bits = 24"),
            "device[0].dma_mask_bits",
            "beyond a 24-bit mask: declare machine.memory_banks",
        );
        refused(
            &BONNIE_USB.replace(
                "model = \"ipmmu\"\nmode = \"strict\"",
                "model = \"sba\"\nmode = \"translated\"",
            ),
            "iommu.model",
            "bonnie on usb is modelled behind the R-Car xHCI: expected \"none\" or \"ipmmu\"",
        );
    }
}
