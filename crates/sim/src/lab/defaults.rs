//! Defaults of every optional scenario field, each with its source (a citation, or an
//! assumption with its reasoning), copied here from the experiments where they are argued
//! (scenarios/experiments/*.toml and docs/model/*.md): the lab reads no experiment file.
//! docs/SCENARIOS.md lists them all.
//!
//! Each constant is `(value, source)`.

/// A default value and where it comes from.
pub type Sourced<T> = (T, &'static str);

/// `machine.memory_gib`.
pub const MEMORY_GIB: Sourced<u64> = (
    64,
    "assumption: a server of the modelled platforms' class; memory only bounds where buffers live (memory is sparse)",
);

/// `kernel.version`: the Linux release whose DMA-path algorithms the lab runs.
pub const KERNEL_VERSION: Sourced<&str> = (
    "6.12",
    "the newest long-term release (December 2024); docs/model/kernel-versions.md lists what each release changes",
);

/// `iommu.cmdq` when the kernel release does not decide it: the release's own producer
/// (`iolab_iommu::linux::DmaPathVariants::cmdq`) is the default.
pub const CMDQ: Sourced<&str> = (
    "lockfree",
    "Linux 5.4 onwards uses the lock-free batched command queue (commit 587e6c10a7ce, docs/model/kernel-versions.md); earlier releases the spinlock one",
);
/// `iommu.cmdq_log2size`.
pub const CMDQ_LOG2SIZE: Sourced<u32> = (
    8,
    "RESEARCH.md [src]: the pre-2019 Linux driver's queue of 256 entries; the functional ring uses the same size (as scenarios/experiments/smmuv3-cmdq.toml)",
);
/// `iommu.cmdq_batch_max`.
pub const CMDQ_BATCH_MAX: Sourced<u32> = (
    64,
    "RESEARCH.md [mail]: the 2019 design submits commands in batches of up to 64 with one CMD_SYNC",
);
/// `iommu.flush_queue_size`.
pub const FLUSH_QUEUE_SIZE: Sourced<usize> = (
    256,
    "Linux drivers/iommu/dma-iommu.c IOVA_FQ_SIZE = 256 slots per CPU",
);
/// `iommu.evtq_log2size` (SMMUv3): the event queue's size.
pub const EVTQ_LOG2SIZE: Sourced<u32> = (
    7,
    "assumption: a 128-record event queue (the SMMUv3 model's default; the SMMU's IDR1.EVTQS bounds what Linux can ask for)",
);
/// `iommu.evtq_drain_interval_us` (SMMUv3): how often the driver's event thread drains it.
pub const EVTQ_DRAIN_INTERVAL_US: Sourced<f64> = (
    100.0,
    "assumption: the driver's event-queue thread (arm_smmu_evtq_thread) reads the queue about every 100 us while faults arrive; its CPU time is not charged",
);
/// `iommu.flush_timeout_ms`.
pub const FLUSH_TIMEOUT_MS: Sourced<u64> = (
    10,
    "Linux drivers/iommu/dma-iommu.c IOVA_FQ_TIMEOUT = 10 ms",
);

/// NVMe `device.io_queues`.
pub const NVME_IO_QUEUES: Sourced<usize> = (
    64,
    "assumption (as scenarios/experiments/smmuv3-cmdq.toml): an enterprise NVMe controller offers at least 64 I/O queue pairs",
);
/// NVMe `device.max_iops`.
pub const NVME_MAX_IOPS: Sourced<f64> = (
    770_000.0,
    "Huawei ES3000 V2 PCIe SSD spec sheet (slideplayer.com/slide/10360121): 770K stable 4 KiB random-read IOPS (as scenarios/experiments/smmuv3-cmdq.toml)",
);
/// NVMe `device.bandwidth_gb_per_s`.
pub const NVME_BANDWIDTH_GB_PER_S: Sourced<f64> =
    (3.2, "assumption: PCIe 3.0 x4 less protocol overhead");
/// NVMe `device.read_latency_us`.
pub const NVME_READ_LATENCY_US: Sourced<f64> = (
    85.0,
    "assumption: TLC/MLC NAND page read (tR ~60-80 us) plus controller overhead (as scenarios/experiments/smmuv3-cmdq.toml)",
);
/// NVMe `device.latency_distribution = "uniform"` (the default): each command's media
/// latency is drawn uniformly from the mean +- this percent.
pub const NVME_MEDIA_SPREAD_PCT: Sourced<u32> = (
    24,
    "Micron 9200 NVMe SSD product brief (2017): latency to media, typical (QD1), READ 92-150 us, \
     i.e. +-24% about its 121 us midpoint; assumption: that range's relative width as the \
     per-command spread, uniform, about the lab's own mean (docs/MODEL.md, NVMe service-time \
     distribution)",
);
/// NVMe `device.write_latency_us`.
pub const NVME_WRITE_LATENCY_US: Sourced<f64> = (
    20.0,
    "assumption: writes complete from the controller's protected DRAM cache",
);
/// NVMe and NIC `device.dma_outstanding_pages`: pages of read requests a device keeps in
/// flight at the IOMMU's DMA port.
pub const DMA_OUTSTANDING_PAGES: Sourced<u32> = (
    32,
    "assumption: 256 PCIe tags (Extended Tag, which Linux enables on capable devices; RESEARCH.md 'PCIe tags') of 512-byte read requests (a common MRRS): 128 KiB, 32 pages, of reads in flight",
);
/// NVMe and NIC `device.relaxed_ordering`.
pub const DMA_RELAXED_ORDERING: Sourced<bool> = (
    false,
    "assumption: the device's writes to memory carry no Relaxed Ordering, so a write whose page misses the IOTLB holds the writes behind it for its walk (PCIe ordering: a posted write may not pass a posted write); F&S's serial model T = p / (l_0 + M * l_m) fits their ConnectX-5 receive runs on Cascade Lake (SOSP'24 §2.2)",
);
/// NVMe `device.dma_mask_bits`.
pub const NVME_DMA_MASK_BITS: Sourced<u32> = (
    64,
    "Linux nvme-pci: dma_set_mask_and_coherent(DMA_BIT_MASK(64)) in nvme_pci_enable",
);

/// NVMe `device.coalesce_threshold` and `device.coalesce_time_100us`: Interrupt
/// Coalescing (Set Features, Feature ID 08h) off.
pub const NVME_COALESCING: Sourced<(u8, u8)> = (
    (0, 0),
    "NVMe 1.4 section 5.21.1.8: Interrupt Coalescing (feature 08h) resets to THR 0 and TIME 0, no coalescing; Linux nvme-pci never sets the feature",
);

/// `device.hostile.probe_bytes`: bytes per probe of a just-unmapped buffer.
pub const HOSTILE_PROBE_BYTES: Sourced<u64> = (
    64,
    "assumption: the device tries one cache line at each just-unmapped address",
);
/// `device.hostile.neighbour_window_bytes`: bytes after a live buffer the device tries.
pub const HOSTILE_NEIGHBOUR_WINDOW_BYTES: Sourced<u64> = (
    65536,
    "assumption: the device tries the 64 KiB after a live buffer (one 64 KiB TCE page)",
);
/// `device.hostile.neighbour_every`: the device probes around every n-th buffer mapped.
pub const HOSTILE_NEIGHBOUR_EVERY: Sourced<u64> = (
    16,
    "assumption: the device probes the neighbours of every 16th buffer (keeps the probe count proportionate)",
);

/// SAS `device.disks`.
pub const SAS_DISKS: Sourced<usize> = (8, "SEEDS.md #2: 8 SAS disks on D05");
/// SAS `device.completion_queues`.
pub const SAS_COMPLETION_QUEUES: Sourced<usize> = (
    16,
    "hisi_sas v2 hw: 16 delivery/completion queue pairs, one interrupt each",
);
/// SAS `device.hba_command_ns`.
pub const SAS_HBA_COMMAND_NS: Sourced<f64> = (
    400.0,
    "assumption: hisi_sas v2 per-command processing ~0.4 us (the smmuv3-cmdq experiment fits its D05 array's instead: 1075 ns, scenarios/experiments/smmuv3-cmdq.fit.toml)",
);
/// SAS `device.disk_read_latency_us`.
pub const SAS_DISK_READ_LATENCY_US: Sourced<f64> = (
    100.0,
    "assumption: 12 Gb/s SAS SSD 4 KiB random-read latency at depth",
);
/// SAS `device.disk_write_latency_us`.
pub const SAS_DISK_WRITE_LATENCY_US: Sourced<f64> =
    (30.0, "assumption: SAS SSD write into its protected cache");
/// SAS `device.disk_max_iops`.
pub const SAS_DISK_MAX_IOPS: Sourced<f64> = (
    200_000.0,
    "assumption: 12 Gb/s SAS SSD rated ~200K 4 KiB random-read IOPS",
);
/// SAS `device.link_gb_per_s`.
pub const SAS_LINK_GB_PER_S: Sourced<f64> = (1.2, "SAS-3: 12 Gb/s per phy with 8b/10b coding");
/// SAS `device.submit_ns`.
pub const SAS_SUBMIT_NS: Sourced<u64> = (
    2000,
    "assumption (as scenarios/experiments/smmuv3-cmdq.toml): SCSI dispatch, libsas and hisi_sas slot set-up (~4800 cycles)",
);
/// SAS `device.complete_ns`.
pub const SAS_COMPLETE_NS: Sourced<u64> = (
    1500,
    "assumption (as scenarios/experiments/smmuv3-cmdq.toml): hisi_sas slot completion and SCSI mid-layer completion (~3600 cycles)",
);

/// fio `workload.bs`.
pub const FIO_BS: Sourced<u64> = (4096, "fio's default block size (bs=4k)");
/// fio `workload.iodepth`.
pub const FIO_IODEPTH: Sourced<u32> = (1, "fio's default iodepth=1");
/// fio `workload.size_gib`.
pub const FIO_SIZE_GIB: Sourced<u64> = (
    100,
    "assumption: a target much larger than any cache, so random offsets do not repeat",
);
/// fio `workload.ramp_ms`.
pub const FIO_RAMP_MS: Sourced<u64> = (
    5,
    "assumption: long enough for every job to fill its queue before measuring",
);
/// How far past `workload.ramp_ms` the lab looks for a steady window, in windows
/// (`runtime_ms`), unless `workload.exact_window` is set.
pub const FIO_RAMP_EXTENSION_WINDOWS: Sourced<u64> = (
    8,
    "assumption: the transients the lab models (IOVA magazines and depot, lazy flush queues, device queues filling) settle within a few tens of ms at 128 CPUs (docs/model/scale.md: the 128-CPU lazy case needs about 30 ms), which 8 windows of 10 ms cover; a run still unsteady there says so",
);

/// fio `workload.ss_interval_ms`: the steady-state sampling period.
pub const FIO_SS_INTERVAL_MS: Sourced<u64> = (
    1,
    "fio's ss_interval is 1 s against runs of minutes; assumption: the lab's runs are ms of virtual time, so 1 ms keeps several samples per window",
);

/// fio `workload.ioengine`.
pub const FIO_IOENGINE: Sourced<&str> = (
    "psync",
    "fio's default ioengine on Linux (fio HOWTO, ioengine: psync is the default on all supported systems but Windows)",
);

/// SBA `iommu.delayed_frees`.
pub const SBA_DELAYED_FREES: Sourced<usize> = (
    64,
    "sba_iommu.c DELAYED_RESOURCE_CNT = 64 (RESEARCH.md [src]; docs/model/sba-vmerge.md)",
);
/// SBA `iommu.page_size`.
pub const SBA_PAGE_SIZE: Sourced<u64> = (
    16384,
    "ia64 uses 16 KiB pages by default and sba_iommu.c's iovp_size is min(PAGE_SIZE, 64 KiB) (docs/model/sba-vmerge.md)",
);
/// SBA IOV window: (base, size) in bytes (`iommu.window_base_mib`, `iommu.window_mib`).
pub const SBA_WINDOW: Sourced<(u64, u64)> = (
    (1 << 30, 1 << 30),
    "assumption (docs/model/sba-vmerge.md): zx1 firmware places the IOC's IOV window at 1 GiB, below the first 4 GiB where the lab's buffers live; sba_iommu.c sizes it to a fraction of RAM, at most 1 GiB on zx1",
);
/// `kernel.sba_coalesce`: whether the SBA driver's `sba_map_sg` coalesces the pieces of a
/// scatter-gather list into virtually contiguous DMA streams (`sba_coalesce_chunks`).
pub const SBA_COALESCE: Sourced<bool> = (
    true,
    "Linux sba_iommu.c: sba_map_sg calls sba_coalesce_chunks for every list of more than one entry (2.6.0 and later; RESEARCH.md [src])",
);
/// `kernel.virt_merge`: whether the block layer counts pieces that meet at an IOMMU page
/// boundary as one segment (`BIO_VMERGE_BOUNDARY`).
pub const VIRT_MERGE: Sourced<bool> = (
    false,
    "assumption: the block layer counts physically contiguous pieces only (BIO_VMERGE_BOUNDARY 0, the baseline kernel of the sba-vmerge runs; Linux later dropped the block layer's virtual-merge accounting)",
);
/// POWER `iommu.default_window_mib`.
pub const DEFAULT_WINDOW_MIB: Sourced<u64> = (
    2048,
    "RESEARCH.md: a 2 GB default window per host bridge on PowerVM (1-2 GiB in SEEDS.md #4)",
);
/// POWER `iommu.ddw_page_kib`.
pub const DDW_PAGE_KIB: Sourced<u64> = (
    64,
    "SEEDS.md #4: PowerVM offers at most 64 KiB TCEs to SR-IOV VFs' DDWs",
);
/// POWER `iommu.ddw_policy` in mode `default-window`: no DDW is created.
pub const DDW_POLICY_DEFAULT_WINDOW: Sourced<&str> = (
    "disabled",
    "assumption: a default-window scenario asks for the default window only (Linux `disable_ddw`); \"direct-only\" is the pre-2020 kernel, whose default window comes from a DDW too small to map all memory",
);
/// POWER `iommu.ddw_policy` in modes `ddw-dynamic` and `ddw-direct`.
pub const DDW_POLICY_DDW: Sourced<&str> = (
    "direct-or-dynamic",
    "Linux since the 2020 series \"powerpc/pseries/iommu: Make use of DDW for indirect mapping\" (SEEDS.md #4): a direct DDW when it maps all memory, else a dynamic one",
);
/// POWER `iommu.serialise_tce_updates`.
pub const SERIALISE_TCE_UPDATES: Sourced<bool> = (
    true,
    "assumption (docs/model/pseries-ddw.md): PowerVM updates one PE's TCE table (validate, store, kill the host bridge's cached TCEs) under one per-table lock, so concurrent H_PUT_TCE* / H_STUFF_TCE on the same table serialise; not published",
);

// ---------------------------------------------------------------------------------------
// The NIC of netperf scenarios (devices::nic): an mlx5 (ConnectX-4) SR-IOV VF in a PowerVM
// partition, as docs/model/pseries-ddw.md argues each value. None is fitted to a published
// result.
// ---------------------------------------------------------------------------------------

/// nic `device.link_gbps`.
pub const NIC_LINK_GBPS: Sourced<f64> = (
    100.0,
    "assumption: PowerVM SR-IOV ConnectX-4 adapters of 2020 (IBM EC3L/EC3M, PCIe3 2-port 100 GbE) run at 100 Gb/s; VF capacity share assumed 100%",
);
/// nic `device.mtu`.
pub const NIC_MTU: Sourced<u64> = (1500, "assumption: the default Ethernet MTU");
/// nic `device.tcpip_header_bytes`.
pub const NIC_TCPIP_HEADER_BYTES: Sourced<u64> = (
    52,
    "IPv4 (20) + TCP (20) + timestamp option (12), Linux default",
);
/// nic `device.ethernet_overhead_bytes`.
pub const NIC_ETHERNET_OVERHEAD_BYTES: Sourced<u64> = (
    38,
    "Ethernet header 14 + FCS 4 + preamble/SFD 8 + inter-frame gap 12",
);
/// nic `device.queues`.
pub const NIC_QUEUES: Sourced<usize> = (
    64,
    "assumption: mlx5 opens one channel per online CPU (64 on the power-lpar profile); every channel's receive pages are mapped whether or not a thread uses it",
);
/// nic `device.tx_ring_entries`.
pub const NIC_TX_RING_ENTRIES: Sourced<usize> = (
    1024,
    "mlx5 default send-queue size (MLX5E_PARAMS_DEFAULT_LOG_SQ_SIZE = 10)",
);
/// nic `device.tx_coalesce_frames`.
pub const NIC_TX_COALESCE_FRAMES: Sourced<u64> = (
    32,
    "mlx5 default TX CQ moderation: 32 packets (MLX5E_PARAMS_DEFAULT_TX_CQ_MODERATION_PKTS)",
);
/// nic `device.tx_coalesce_usecs`.
pub const NIC_TX_COALESCE_USECS: Sourced<u64> = (
    16,
    "mlx5 default TX CQ moderation: 16 us (MLX5E_PARAMS_DEFAULT_TX_CQ_MODERATION_USEC)",
);
/// nic `device.rx_coalesce_frames`.
pub const NIC_RX_COALESCE_FRAMES: Sourced<u64> = (
    32,
    "mlx5 default RX CQ moderation: 32 packets (MLX5E_PARAMS_DEFAULT_RX_CQ_MODERATION_PKTS)",
);
/// nic `device.rx_coalesce_usecs`.
pub const NIC_RX_COALESCE_USECS: Sourced<u64> = (
    8,
    "assumption: mlx5 default RX CQ moderation of ~8 us (MLX5E_PARAMS_DEFAULT_RX_CQ_MODERATION_USEC); on the POWER TCE path's NIC, which does not model DIM; the direct-DMA receive test runs DIM (rx_adaptive) unless a scenario gives these",
);
/// nic `device.rx_stride_bytes`.
pub const NIC_RX_STRIDE_BYTES: Sourced<u64> = (
    2048,
    "assumption: mlx5 striding RQ with 2 KiB strides for a 1500-byte MTU (one packet per stride)",
);
/// nic `device.rx_ring_pages`.
pub const NIC_RX_RING_PAGES: Sourced<usize> = (
    48,
    "mlx5 striding RQ with 64 KiB pages: 8 multi-packet WQEs (MLX5E_PARAMS_DEFAULT_LOG_RQ_SIZE_MPW = 3) of 256 KiB = 32 pages, plus the RX page cache (assumption: 16 pages in steady state); all stay mapped",
);
/// nic `device.rx_recycle_pct`.
pub const NIC_RX_RECYCLE_PCT: Sourced<u32> = (
    90,
    "assumption (the POWER TCE path's NIC; the direct-DMA path models the cache itself, rx_page_cache_pages): mlx5e's RX page cache (mlx5e_rx_cache) gets most pages back once the copy to user has dropped their last reference; 10% are released and replaced by freshly mapped pages",
);

/// nic `device.dma_ns_per_4k` (the direct-DMA receive path: x86 IOMMUs or none).
pub const NIC_DMA_NS_PER_4K: Sourced<f64> = (
    256.0,
    "assumption: PCIe 3.0 x16 (128 Gb/s, the F&S server's slot, X86.md §6) moves 4 KiB in 4096 x 8 / 128 = 256 ns; TLP headers and the DMA engine's own parallelism are not modelled (Rubin et al., SOSP'24 §2.2, fit 65 ns per 4 KiB for their whole pipeline: an experiment declares that as a calibration)",
);
/// nic `device.rx_fifo_bytes` (the direct-DMA receive path).
pub const NIC_RX_FIFO_BYTES: Sourced<u64> = (
    256 << 10,
    "Mellanox's 'HowTo Tune Receive Buffers on Mellanox Adapter Cards' (MLNX_OFED 4.2+) reads a port buffer of 262,016 bytes from /sys/class/net/IF/qos/buffer_size; assumption: a ConnectX-5's is the same and the whole of it holds the received packets (its split among priority buffers is not modelled)",
);

// ---------------------------------------------------------------------------------------
// netperf workload: the TCP stream and the network stack's CPU costs on POWER9
// ---------------------------------------------------------------------------------------

/// netperf `workload.sender_burst_packets` (the direct-DMA receive path).
pub const NETPERF_SENDER_BURST_PACKETS: Sourced<u64> = (
    1,
    "assumption: the sending host's NIC interleaves its send queues (one per flow) packet by packet, so the receiver sees the flows' packets in turn; ConnectX's transmit arbitration granularity is not published",
);
/// NIC `rx_page_cache_pages` (the direct-DMA receive path).
pub const NIC_RX_PAGE_CACHE_PAGES: Sourced<usize> = (
    256,
    "Linux 6.0 mlx5e: MLX5E_CACHE_SIZE = 4 x roundup_pow_of_two(max(MLX5_MPWRQ_PAGES_PER_WQE, NAPI_POLL_WEIGHT)) = 4 x 64 slots per receive queue (en.h); a used page goes in still mapped unless the ring is full (mlx5e_rx_cache_put), and the ring is refilled from its head only once the stack has let go of that page (mlx5e_rx_cache_get: page_ref_count == 1)",
);
/// NIC `rx_adaptive` (the direct-DMA receive path).
pub const NIC_RX_ADAPTIVE: Sourced<bool> = (
    true,
    "mlx5 enables adaptive receive moderation (DIM) by default (mlx5e_build_nic_params: rx_dim_enabled = MLX5_CAP_GEN(mdev, cq_moderation)), in CQE period mode on devices that start the period from a completion, as ConnectX-5 and later do; a scenario that gives rx_coalesce_usecs or rx_coalesce_frames runs that fixed moderation instead",
);
/// NIC `pause_frames` (the direct-DMA receive path).
pub const NIC_PAUSE_FRAMES: Sourced<bool> = (
    true,
    "Linux mlx5 and most NIC drivers enable global pause (ethtool -a: RX/TX on) by default; with it on the sender waits while the receiver's FIFO is full and nothing is dropped",
);
/// netperf `workload.tcp_ack_delay_us` (the direct-DMA receive path, pause frames off).
pub const NETPERF_TCP_ACK_DELAY_US: Sourced<f64> = (
    10.0,
    "assumption: from the receiving NIC sending an ACK to the sender's TCP acting on it ~10 us: a switch hop and two wire times (~1-2 us), the sender NIC's DMA and its receive interrupt moderation and softirq (DIM at low packet rates: a few us to tens of us)",
);
/// netperf `workload.tcp_init_cwnd` (pause frames off).
pub const NETPERF_TCP_INIT_CWND: Sourced<u64> = (10, "Linux TCP_INIT_CWND (RFC 6928): 10 segments");
/// netperf `workload.tcp_rwnd_bytes` (pause frames off).
pub const NETPERF_TCP_RWND_BYTES: Sourced<u64> = (
    3 << 20,
    "Linux tcp_rmem[2] = 6 MiB (the autotuned receive buffer's ceiling) with tcp_adv_win_scale = 1: half of it is advertised as window, 3 MiB",
);
/// What the tail-loss probe timeout adds to twice the smoothed RTT, ns (pause frames off).
pub const NETPERF_TCP_PTO_FLOOR_NS: Sourced<u64> = (
    2_000_000,
    "Linux tcp_schedule_loss_probe: 2 * srtt + TCP_TIMEOUT_MIN (2 jiffies; 2 ms at HZ = 1000)",
);
/// netperf `workload.ack_ns` (the direct-DMA receive path).
pub const NETPERF_ACK_NS: Sourced<f64> = (
    500.0,
    "assumption: building and posting one TCP ACK (skb allocation, TCP/IP output, driver WQE and doorbell) ~0.5 us on a 3 GHz x86 core; its DMA mapping is priced separately",
);
/// netperf `workload.message_bytes`.
pub const NETPERF_MESSAGE_BYTES: Sourced<u64> = (
    65536,
    "assumption: 64 KiB per write/read, as netperf/iperf-like bulk streams use 64-128 KiB",
);
/// netperf `workload.warmup_ms`.
pub const NETPERF_WARMUP_MS: Sourced<u64> = (
    10,
    "assumption: 10 ms warm-up excluded from the measured window (steady state is reached within it)",
);
/// netperf `workload.tso_max_bytes`.
pub const NETPERF_TSO_MAX_BYTES: Sourced<u64> = (
    65160,
    "Linux tcp_xmit_size_goal(): (GSO_MAX_SIZE 65536 - 1 - MAX_TCP_HEADER) rounded down to a multiple of the MSS, 45 x 1448 = 65160 bytes at MTU 1500",
);
/// netperf `workload.page_bytes`.
pub const NETPERF_PAGE_BYTES: Sourced<u64> = (
    65536,
    "ppc64le distributions use 64 KiB kernel pages: page fragments and receive pages are 64 KiB",
);
/// netperf `workload.page_bytes` on the direct-DMA path (x86 IOMMUs or none).
pub const NETPERF_DIRECT_PAGE_BYTES: Sourced<u64> = (
    4096,
    "x86-64 kernels use 4 KiB pages (PAGE_SIZE): receive pages and send fragments are 4 KiB",
);
/// netperf `workload.linear_bytes`.
pub const NETPERF_LINEAR_BYTES: Sourced<u64> = (
    0,
    "mlx5e_sq_xmit inlines the headers of a TSO skb into the WQE: only page fragments are mapped",
);
/// netperf `workload.tx_inflight_bytes`.
pub const NETPERF_TX_INFLIGHT_BYTES: Sourced<u64> = (
    1 << 20,
    "TCP small queues: net.ipv4.tcp_limit_output_bytes default of 1 MiB (2019 onward)",
);
/// netperf `workload.rx_window_messages`.
pub const NETPERF_RX_WINDOW_MESSAGES: Sourced<usize> = (
    16,
    "assumption: the remote sender keeps 1 MiB (16 x 64 KiB) in flight per connection, enough not to starve a reader",
);
/// netperf `workload.tx_per_skb_ns`.
pub const NETPERF_TX_PER_SKB_NS: Sourced<f64> = (
    4000.0,
    "assumption: tcp_sendmsg bookkeeping, tcp_write_xmit, IP, qdisc and mlx5e_xmit per 64 KiB TSO skb on a POWER9 thread: ~4 us",
);
/// netperf `workload.tx_completion_ns`.
pub const NETPERF_TX_COMPLETION_NS: Sourced<f64> = (
    1000.0,
    "assumption: TX CQE, skb free and the share of incoming ACK processing per 64 KiB skb: ~1 us",
);
/// netperf `workload.irq_ns`.
pub const NETPERF_IRQ_NS: Sourced<f64> = (
    2000.0,
    "assumption: an LPAR interrupt goes through the hypervisor (H_XIRR / H_EOI hypercalls) plus NAPI scheduling: ~2 us",
);
/// netperf `workload.rx_per_packet_ns`.
pub const NETPERF_RX_PER_PACKET_NS: Sourced<f64> = (
    250.0,
    "assumption: mlx5 RX CQE, stride handling and GRO merge per 1500-byte packet on POWER9: ~250 ns",
);
/// netperf `workload.rx_per_skb_ns`.
pub const NETPERF_RX_PER_SKB_NS: Sourced<f64> = (
    2000.0,
    "assumption: TCP receive (tcp_v4_rcv, queueing, ACK generation) per 64 KiB GRO skb: ~2 us",
);
/// netperf `workload.jitter_pct`.
pub const NETPERF_JITTER_PCT: Sourced<u32> = (
    5,
    "assumption: +-5% run-to-run spread of stack costs, so repeated runs differ",
);

/// bonnie `workload.file_mib`.
pub const BONNIE_FILE_MIB: Sourced<u64> = (
    16,
    "assumption: a 16 MiB file runs in well under a second of host time; steady-state rates do not depend on it (the bundled ipmmu-usb scenario uses 64 MiB)",
);

// ---------------------------------------------------------------------------------------
// bonnie++ and its page cache (workloads::bonnie). The values are those the ipmmu-usb
// experiment argued in its own scenario schema, since deleted (copied here with their
// sources; its data file scenarios/experiments/ipmmu-usb.toml relies on them). Those
// marked "calibrated" are the experiment's declared
// calibration against its superspeed.no_iommu row (docs/model/ipmmu-usb.md, Calibration):
// the lab uses them on every platform as its best estimate of bonnie's own CPU costs.
// ---------------------------------------------------------------------------------------

/// bonnie `workload.logical_file_mib`.
pub const BONNIE_LOGICAL_FILE_MIB: Sourced<u64> =
    (8192, "SEEDS.md #1: bonnie++ -s 8192 (the seek range)");
/// bonnie `workload.ram_mib`: the page cache's RAM.
pub const BONNIE_RAM_MIB: Sourced<u64> = (
    3904,
    "the page cache of the ipmmu-usb experiment's machine: the Salvator-X H3 board's two banks (1,920 + 2,048 MiB, Linux's device tree) less the 64 MiB swiotlb pool; SEEDS.md #1 runs bonnie++ -r 4096",
);
/// bonnie `workload.chunk_bytes`.
pub const BONNIE_CHUNK_BYTES: Sourced<u64> = (
    8192,
    "bonnie++ 1.03: default chunk size 8 KiB for block reads and writes",
);
/// bonnie `workload.stdio_buffer_bytes`.
pub const BONNIE_STDIO_BUFFER_BYTES: Sourced<u64> =
    (4096, "glibc: a FILE's buffer is st_blksize, 4 KiB on ext4");
/// bonnie `workload.seeks`.
pub const BONNIE_SEEKS: Sourced<u64> = (8000, "bonnie++ 1.03: 8000 seeks in total");
/// bonnie `workload.seek_update_every`.
pub const BONNIE_SEEK_UPDATE_EVERY: Sourced<u64> = (
    10,
    "bonnie++ 1.03 (bon_io.cpp, seeker() and CFileOp::doseek): a seeker's first seek and every tenth after it (lseek_count++ % UpdateSeek == 0, UpdateSeek 10) changes a byte of the chunk, lseek()s back and write()s it, then, with -b (m_sync), fsync()s the file",
);
/// bonnie `workload.seeker_cpus` (taken modulo the machine's CPUs).
pub const BONNIE_SEEKER_CPUS: Sourced<[usize; 3]> = (
    [0, 2, 3],
    "bonnie++ 1.03: 3 seeker processes (README-2.00: 'now 5 instead of 3'); assumption: spread over CPUs 0, 2 and 3",
);
/// bonnie `workload.bonnie_cpu`.
pub const BONNIE_CPU: Sourced<usize> = (
    0,
    "assumption: bonnie on CPU 0, which also takes the xHCI interrupt (the GIC routes SPIs to CPU 0 by default)",
);
/// bonnie `workload.flusher_cpu`.
pub const BONNIE_FLUSHER_CPU: Sourced<usize> = (2, "assumption: the flusher thread on CPU 2");
/// bonnie `workload.putc_ns_per_byte`.
pub const BONNIE_PUTC_NS_PER_BYTE: Sourced<f64> = (
    9.243,
    "calibrated (ipmmu-usb, a declared unknown the tool fits: scenarios/experiments/ipmmu-usb.fit.toml): superspeed.no_iommu out_char (82598 K/s at 99% CPU) after the write() costs",
);
/// bonnie `workload.getc_ns_per_byte`.
pub const BONNIE_GETC_NS_PER_BYTE: Sourced<f64> = (
    11.82,
    "calibrated (ipmmu-usb, a declared unknown the tool fits: scenarios/experiments/ipmmu-usb.fit.toml): superspeed.no_iommu in_char (73719 K/s at 98% CPU) after the read() costs",
);
/// bonnie `workload.write_page_ns`.
pub const BONNIE_WRITE_PAGE_NS: Sourced<u64> = (
    8474,
    "calibrated (ipmmu-usb, a declared unknown the tool fits: scenarios/experiments/ipmmu-usb.fit.toml): superspeed.no_iommu out_block %CPU (58%): ext4 write_begin/write_end with delayed allocation, page allocation under reclaim, dirty accounting",
);
/// bonnie `workload.read_page_ns`.
pub const BONNIE_READ_PAGE_NS: Sourced<u64> = (
    4163,
    "calibrated (ipmmu-usb, a declared unknown the tool fits: scenarios/experiments/ipmmu-usb.fit.toml): superspeed.no_iommu in_block %CPU (32%): readahead page allocation, LRU insertion, page lookup",
);
/// bonnie `workload.overwrite_page_ns`: derived, `write_page_ns - read_page_ns` (of the
/// values in effect), so this is only the rule's statement.
pub const BONNIE_OVERWRITE_PAGE_RULE: &str = "derived: write_page_ns - read_page_ns (4.3 us by default): a write() into a page already in the page cache (bonnie's rewrite writes back the chunk its read() just brought in; a seek update likewise) skips the page allocation and LRU insertion a new page pays, taken to be what read_page_ns charges a readahead page";
/// bonnie `workload.writeback_page_ns`.
pub const BONNIE_WRITEBACK_PAGE_NS: Sourced<u64> = (
    300,
    "assumption: ext4 writepages per page (mapping the block, setting up the bio vector) ~300 ns on the flusher's CPU",
);
/// bonnie `workload.cpu_slice_ns`.
pub const BONNIE_CPU_SLICE_NS: Sourced<u64> = (
    20_000,
    "assumption: a process pays interrupt time stolen from it at least every 20 us (interrupts preempt at once in reality; 20 us bounds the modelling delay)",
);
/// bonnie `workload.files`: bonnie++'s `-n`, x 1024 files.
pub const BONNIE_FILES_K: Sourced<u64> = (
    16,
    "bonnie++ 1.03: -n defaults to 16 (x 1024 files, size 0, one directory); SEEDS.md #1: 'File tests (16 files)'",
);
/// bonnie `workload.files_run`.
pub const BONNIE_FILES_RUN: Sourced<u64> = (
    1024,
    "assumption: the lab creates, stats and deletes 1,024 of bonnie's files in each order (rates are per file and every file costs the same in the model); a test's elapsed time is scaled up to the full count for bonnie++'s 0.5 s too-fast rule",
);
/// bonnie `workload.create_ns`.
pub const BONNIE_CREATE_NS: Sourced<u64> = (
    15_000,
    "assumption: open(O_CREAT | O_EXCL) and close() of a new empty ext4 file besides the system calls (path lookup, inode bitmap search, htree entry insertion, five journal get_write_access and dirty_metadata calls): ~22,500 cycles on a 1.5 GHz Cortex-A57",
);
/// bonnie `workload.unlink_ns`.
pub const BONNIE_UNLINK_NS: Sourced<u64> = (
    12_000,
    "assumption: unlink() of an empty ext4 file besides the system call (entry removal, orphan add and delete, inode and bitmap freeing): ~18,000 cycles at 1.5 GHz",
);
/// bonnie `workload.stat_ns`.
pub const BONNIE_STAT_NS: Sourced<u64> = (
    1500,
    "assumption: stat() of a file whose dentry and inode are cached, besides the system call (path walk, getattr, copy-out): ~2,250 cycles at 1.5 GHz",
);
/// bonnie `workload.readdir_entry_ns`.
pub const BONNIE_READDIR_ENTRY_NS: Sourced<u64> = (
    200,
    "assumption: getdents() per entry of a cached directory (many entries per call): ~300 cycles at 1.5 GHz",
);

/// The file size the dirty thresholds below are stated for, MiB (they scale with
/// `workload.file_mib`).
pub const DIRTY_REFERENCE_FILE_MIB: Sourced<u64> = (
    64,
    "the ipmmu-usb experiment's scaled file: the 8 GiB file scaled down to 64 MiB, dirty thresholds scaled with it",
);
/// `kernel.dirty_background_mib` for a [`DIRTY_REFERENCE_FILE_MIB`] file.
pub const DIRTY_BACKGROUND_MIB: Sourced<f64> = (
    4.0,
    "Linux dirty_background_ratio 10% of ~4 GiB against an 8 GiB file (~5%), scaled to the file (4 MiB of 64 MiB)",
);
/// `kernel.dirty_limit_mib` for a [`DIRTY_REFERENCE_FILE_MIB`] file.
pub const DIRTY_LIMIT_MIB: Sourced<f64> = (
    8.0,
    "Linux dirty_ratio 20% of ~4 GiB against an 8 GiB file (~10%), scaled to the file (8 MiB of 64 MiB)",
);
/// `kernel.writeback_chunk_kib`.
pub const WRITEBACK_CHUNK_KIB: Sourced<u64> = (
    4096,
    "Linux MAX_WRITEBACK_PAGES: 1024 pages per writeback pass",
);
/// `kernel.readahead_kib`.
pub const READAHEAD_KIB: Sourced<u64> = (
    128,
    "Linux VM_READAHEAD_PAGES: 128 KiB default read_ahead_kb",
);
/// `kernel.block_queue_depth`.
pub const BLOCK_QUEUE_DEPTH: Sourced<usize> = (
    64,
    "assumption: block requests the flusher may have queued (blk-mq nr_requests is larger; usb-storage runs one command at a time anyway)",
);
/// `kernel.fsync_journal_blocks`.
pub const FSYNC_JOURNAL_BLOCKS: Sourced<u64> = (
    2,
    "ext4 with a jbd2 journal (data=ordered): write() of a chunk in place changes the inode's mtime, so the seek's fsync() commits a transaction holding the inode's table block: a descriptor block plus that block, then a commit block (Linux fs/jbd2/commit.c, jbd2_journal_commit_transaction)",
);
/// `kernel.fsync_commit_flushes`.
pub const FSYNC_COMMIT_FLUSHES: Sourced<u64> = (
    2,
    "jbd2 writes the commit block with REQ_PREFLUSH | REQ_FUA when barriers are on (ext4's default); assumption: the USB-SATA bridge reports the SSD's volatile write cache without FUA support, so block/blk-flush.c sends SYNCHRONIZE CACHE before the commit block and again after it",
);
/// `kernel.create_journal_blocks`.
pub const CREATE_JOURNAL_BLOCKS: Sourced<u64> = (
    6,
    "ext4/jbd2 (data=ordered): creating an empty file changes the inode bitmap, the group descriptor, the new inode's table block, the directory block and the directory inode's table block; the commit logs those 5 blocks behind one descriptor block",
);
/// `kernel.delete_journal_blocks`.
pub const DELETE_JOURNAL_BLOCKS: Sourced<u64> = (
    7,
    "ext4/jbd2: unlink() of an empty file changes the directory block, the directory inode's and the victim's table blocks, the inode bitmap, the group descriptor and (orphan add and delete) the superblock: 6 blocks behind one descriptor block",
);
/// `kernel.block_virt_merge`: whether the block layer counts IOMMU-mergeable pieces
/// (4 KiB-aligned pages) as one segment.
pub const BLOCK_VIRT_MERGE: Sourced<bool> = (
    false,
    "Linux: the block layer counts only physically contiguous pieces as one segment; dma_get_merge_boundary() (v5.4) lets a queue count IOMMU-mergeable ones, and only the MMC queue uses it (usb-storage's never; v5.1 has no such switch). dma-iommu still merges below the block layer, in map_sg",
);
/// `kernel.swiotlb_mib`.
pub const SWIOTLB_MIB: Sourced<u64> = (
    64,
    "Linux swiotlb: IO_TLB_DEFAULT_SIZE 64 MiB, set up at boot on arm64 when RAM extends beyond the 32-bit DMA zone",
);
/// `kernel.swiotlb_slot_bytes`.
pub const SWIOTLB_SLOT_BYTES: Sourced<u64> = (2048, "Linux swiotlb: IO_TLB_SHIFT 11 (2 KiB slots)");
/// `kernel.swiotlb_segment_slots`.
pub const SWIOTLB_SEGMENT_SLOTS: Sourced<usize> = (
    128,
    "Linux swiotlb: IO_TLB_SEGSIZE 128 (a bounce mapping stays inside one 256 KiB segment)",
);
/// Where the swiotlb pool lies when `machine.memory_banks` is not given: its end at 4 GiB.
pub const SWIOTLB_END_WITHOUT_BANKS: Sourced<u64> = (
    4 << 30,
    "Linux swiotlb_init allocates the pool with memblock_alloc_low, top-down below the 32-bit limit; the lab's default page cache lies above 4 GiB, so the pool ends at 4 GiB. With memory banks it lies at the start of the first bank, as the ipmmu-usb experiment places it (low memory)",
);

// ---------------------------------------------------------------------------------------
// The USB mass-storage device (devices::usb): an SSD behind a USB-SATA bridge on the
// R-Car H3 xHCI, as the ipmmu-usb experiment argued each value.
// ---------------------------------------------------------------------------------------

/// usb `device.command_overhead_ns`.
pub const USB_COMMAND_OVERHEAD_NS: Sourced<u64> = (
    5004,
    "calibrated (ipmmu-usb, a declared unknown the tool fits: scenarios/experiments/ipmmu-usb.fit.toml): BOT command handling in host, bridge and SSD besides the link phases; the fit sits at its range's low end (5 us): superspeed.no_iommu's block write asks less per command than any plausible value (docs/model/ipmmu-usb.md, Calibration)",
);
/// usb `device.per_segment_ns`.
pub const USB_PER_SEGMENT_NS: Sourced<u64> = (
    500,
    "assumption: the xHCI fetches one 16-byte TRB per DMA segment (an uncached memory read, ~0.2-0.3 us on the H3 interconnect) and closes a burst at its end: ~0.5 us per segment (not calibrated)",
);
/// usb `device.media_read_latency_us`.
pub const USB_MEDIA_READ_LATENCY_US: Sourced<f64> = (
    200.0,
    "assumption: a SATA SSD's QD1 random read (~100 us) plus the USB-SATA bridge's command translation and buffering (~100 us)",
);
/// usb `device.media_flush_us`.
pub const USB_MEDIA_FLUSH_US: Sourced<f64> = (
    1000.0,
    "assumption: a consumer SATA SSD without power-loss protection needs ~1 ms to write its volatile cache out on SYNCHRONIZE CACHE: such drives sustain ~500-1,000 4 KiB write+flush pairs per second at queue depth 1 (igene.tw 2023, 'Choosing Ceph SSD'; S. Han 2014)",
);
/// usb `device.walk_reads_per_miss`.
pub const USB_WALK_READS_PER_MISS: Sourced<u64> = (
    1,
    "assumption: IOVAs of one USB device sit in one 2 MiB-table region, so the walk cache holds the upper levels and a miss reads only the leaf PTE",
);
/// usb `device.completion_ns`.
pub const USB_COMPLETION_NS: Sourced<u64> = (
    3000,
    "assumption: xHCI interrupt, event-ring processing, URB give-back and SCSI/block completion per command, ~3 us on a Cortex-A57",
);
/// usb `device.storage_cpu`.
pub const USB_STORAGE_CPU: Sourced<usize> = (1, "assumption: the usb-storage thread on CPU 1");
/// usb `device.irq_cpu`.
pub const USB_IRQ_CPU: Sourced<usize> = (
    0,
    "assumption: the GIC routes the xHCI's SPI to CPU 0 by default",
);
/// usb `device.dma_mask_bits`.
pub const USB_DMA_MASK_BITS: Sourced<u32> = (
    32,
    "Linux drivers/usb/host/xhci-rcar.h: R-Car Gen2/Gen3 xHCIs report AC64 but cannot use 64-bit addresses; XHCI_NO_64BIT_SUPPORT makes xhci_gen_setup() set a 32-bit DMA mask",
);
/// usb `device.max_segments`.
pub const USB_MAX_SEGMENTS: Sourced<usize> = (
    2048,
    "Linux v5.1: usb-storage sets sg_tablesize to the bus's, which xhci_gen_setup() sets to ~0; the SCSI midlayer clamps it to SG_MAX_SEGMENTS (2048). Shimoda (linux-usb, 13 Jun 2019) reports max_hw_sectors_kb 1024 and max_segment_size 65536 for a SuperSpeed usb-storage disk on R-Car with v5.1",
);
/// usb `device.max_segment_kib`.
pub const USB_MAX_SEGMENT_KIB: Sourced<u64> = (
    64,
    "Linux BLK_MAX_SEGMENT_SIZE and the DMA layer's default max_segment_size: 64 KiB",
);

/// One USB link speed's defaults: signalling rate (bit/s), line-code efficiency, protocol
/// efficiency, CBW/CSW phase latency (ns), usb-storage `max_sectors`; each with its source.
pub struct UsbLinkDefaults {
    /// The speed's scenario name.
    pub name: &'static str,
    /// `device.signal_bits_per_s`.
    pub signal_bits_per_s: Sourced<f64>,
    /// `device.encoding`.
    pub encoding: Sourced<f64>,
    /// `device.protocol_efficiency`.
    pub protocol_efficiency: Sourced<f64>,
    /// `device.phase_latency_ns`.
    pub phase_latency_ns: Sourced<u64>,
    /// `device.max_sectors`.
    pub max_sectors: Sourced<u64>,
}

/// USB 3.0 SuperSpeed (`speed = "superspeed"`).
pub const USB_SUPERSPEED: UsbLinkDefaults = UsbLinkDefaults {
    name: "superspeed",
    signal_bits_per_s: (5e9, "USB 3.0 SuperSpeed: 5 Gb/s signalling"),
    encoding: (0.8, "USB 3.0: 8b/10b line code"),
    protocol_efficiency: (
        0.56,
        "calibrated (ipmmu-usb, a declared unknown the tool fits: scenarios/experiments/ipmmu-usb.fit.toml): superspeed.no_iommu in_block K/s, fitted with command_overhead_ns, per_segment_ns (0.5 us) held; it stands for the data phase (packet framing, link commands, burst flow control) and any per-byte device time the model has no mechanism for. The sourced practical bulk ceiling is ~400 MB/s = 0.80 (J. Axelson, USB Complete 4th ed., p. 437); docs/model/ipmmu-usb.md, Calibration",
    ),
    phase_latency_ns: (
        2000,
        "assumption: a short CBW or CSW transaction at SuperSpeed (doorbell, TRB fetch, packet and ACK, event) ~2 us",
    ),
    max_sectors: (
        2048,
        "Linux usb-storage scsiglue.c: max_sectors 2048 for SuperSpeed devices",
    ),
};

/// USB 2.0 High-Speed (`speed = "highspeed"`).
pub const USB_HIGHSPEED: UsbLinkDefaults = UsbLinkDefaults {
    name: "highspeed",
    signal_bits_per_s: (480e6, "USB 2.0 High-Speed: 480 Mb/s"),
    encoding: (
        1.0,
        "USB 2.0: NRZI, bit stuffing folded into the protocol efficiency",
    ),
    protocol_efficiency: (
        0.75,
        "USB 2.0 spec: at most 13 bulk packets of 512 B per 125 us microframe (53.2 MB/s, 0.887 of 60 MB/s); assumption: hub transaction scheduling and bit stuffing leave ~0.75 (45 MB/s), in line with common USB 2.0 mass-storage ceilings",
    ),
    phase_latency_ns: (
        3300,
        "derived: the SuperSpeed phase's 2 us of host-side work plus one High-Speed bulk transaction on the wire, (31 + 55) x 8 / 480e6 = 1.43 us for a CBW and 1.13 us for a CSW (USB 2.0 spec table 5-3's per-transaction overhead); bulk transfers sit on the asynchronous schedule, not aligned to 125 us microframes (USB 2.0 spec 5.8)",
    ),
    max_sectors: (240, "Linux usb-storage: default max_sectors 240 (120 KiB)"),
};

/// `machine.memory_banks`: absent, bonnie's page cache is one bank of `workload.ram_mib`
/// at [`PAGE_CACHE_BASE`].
pub const PAGE_CACHE_BASE: Sourced<u64> = (
    4 << 30,
    "assumption: the workload scenario's buffers lie above the first 4 GiB, so a 64-bit device reaches them and a 32-bit one (the R-Car xHCI without its IPMMU) bounces them; machine.memory_banks places them like a real board",
);

// ---------------------------------------------------------------------------------------
// The SCSI/SAS disk of re-aim scenarios (devices::scsi): the zx1 set-up's LSI 53c1030 HBA
// and Seagate Cheetah 15K.3 of docs/model/sba-vmerge.md, whose values are datasheet and
// driver facts or stated assumptions there (none is fitted to a published result).
// ---------------------------------------------------------------------------------------

/// scsi `device.bus_mb_per_s`.
pub const SCSI_BUS_MB_PER_S: Sourced<f64> = (
    160.0,
    "Ultra160 data phase, 160 MB/s (docs/model/sba-vmerge.md); a SAS-2 link is 600 MB/s (6 Gb/s, 8b/10b)",
);
/// scsi `device.hba_command_us`.
pub const SCSI_HBA_COMMAND_US: Sourced<f64> = (
    25.0,
    "assumption (docs/model/sba-vmerge.md): LSI Fusion-MPT firmware handles ~40K commands/s",
);
/// scsi `device.hba_per_sge_ns`.
pub const SCSI_HBA_PER_SGE_NS: Sourced<f64> = (
    150.0,
    "assumption (docs/model/sba-vmerge.md): the IOC reads one SG element and programs its DMA engine",
);
/// scsi `device.sg_tablesize`.
pub const SCSI_SG_TABLESIZE: Sourced<usize> = (
    40,
    "drivers/message/fusion/mptbase.h MPT_SCSI_SG_DEPTH = 40 (docs/model/sba-vmerge.md)",
);
/// scsi `device.max_sectors`.
pub const SCSI_MAX_SECTORS: Sourced<u64> =
    (8192, "mptscsih host template .max_sectors = 8192 (4 MiB)");
/// scsi `device.max_segment_kib`.
pub const SCSI_MAX_SEGMENT_KIB: Sourced<u64> = (64, "Linux block layer MAX_SEGMENT_SIZE = 65536");
/// scsi `device.submit_kcycles`.
pub const SCSI_SUBMIT_KCYCLES: Sourced<f64> = (
    15.0,
    "assumption (docs/model/sba-vmerge.md): make_request, elevator, SCSI mid-layer and the driver's queuecommand, ~15,000 cycles at the profile's clock",
);
/// scsi `device.per_sge_cycles`.
pub const SCSI_PER_SGE_CYCLES: Sourced<f64> = (
    60.0,
    "assumption (docs/model/sba-vmerge.md): the driver writes one 64-bit SG element into the frame, ~60 cycles",
);
/// scsi `device.complete_kcycles`.
pub const SCSI_COMPLETE_KCYCLES: Sourced<f64> = (
    20.0,
    "assumption (docs/model/sba-vmerge.md): interrupt, reply handling, scsi_done and bio end_io, ~20,000 cycles",
);
/// scsi `device.capacity_gb`.
pub const SCSI_CAPACITY_GB: Sourced<f64> =
    (73.4, "Seagate Cheetah 15K.3 ST373453LC data sheet: 73.4 GB");
/// scsi `device.rpm`.
pub const SCSI_RPM: Sourced<f64> = (15000.0, "Seagate Cheetah 15K.3 data sheet: 15,000 rpm");
/// scsi `device.seek_read_ms`.
pub const SCSI_SEEK_READ_MS: Sourced<f64> = (
    3.6,
    "Seagate Cheetah 15K.3 data sheet: average read seek 3.6 ms",
);
/// scsi `device.seek_write_ms`.
pub const SCSI_SEEK_WRITE_MS: Sourced<f64> = (
    4.0,
    "Seagate Cheetah 15K.3 data sheet: average write seek 4.0 ms",
);
/// scsi `device.media_mb_per_s`.
pub const SCSI_MEDIA_MB_PER_S: Sourced<f64> = (
    58.0,
    "Seagate Cheetah 15K.3 data sheet: sustained 49-75 MB/s; assumption: ~58 MB/s over random offsets",
);
/// scsi `device.dma_mask_bits`.
pub const SCSI_DMA_MASK_BITS: Sourced<u32> = (
    64,
    "mptbase sets a 64-bit DMA mask on the 53c1030, a 64-bit PCI-X device (docs/model/sba-vmerge.md)",
);

// ---------------------------------------------------------------------------------------
// re-aim workload
// ---------------------------------------------------------------------------------------

/// reaim `workload.timeslice_ms`.
pub const REAIM_TIMESLICE_MS: Sourced<f64> = (
    10.0,
    "assumption: a CFS slice with a few runnable tasks per CPU (sched_latency 6 ms x (1 + log2 CPUs), divided among them) is of the order of 10 ms",
);
/// reaim `workload.jitter_pct`.
pub const REAIM_JITTER_PCT: Sourced<f64> = (
    20.0,
    "assumption (docs/model/sba-vmerge.md): a task's CPU cost varies +-20% from run to run (cache and TLB state)",
);
/// reaim `workload.fs_block`.
pub const REAIM_FS_BLOCK: Sourced<u64> = (4096, "assumption: mke2fs's default 4 KiB blocks");
/// reaim `workload.journal_blocks`.
pub const REAIM_JOURNAL_BLOCKS: Sourced<u64> = (
    3,
    "assumption (docs/model/sba-vmerge.md): an ext3 fsync of a small file journals the inode, a bitmap and a descriptor block, then a commit block",
);
/// `kernel.page_size`: the kernel's page size for re-aim's page cache, bytes.
pub const REAIM_PAGE: Sourced<u64> = (4096, "assumption: 4 KiB kernel pages");
/// reaim `workload.user_scale` and `workload.sys_scale`: factors on every task's user and
/// system CPU cost.
pub const REAIM_TASK_SCALE: Sourced<f64> = (
    1.0,
    "no scaling: the workfile's task costs are taken as they are written; a declared calibration (scenarios/experiments/sba-vmerge/) records fitted factors here",
);

/// One task of the default re-aim workfile: name, class, weight, user and system CPU per run
/// in thousands of cycles (converted at the profile's `cpu.clock_ghz`), bytes written and
/// fsynced per run, source.
pub type DefaultTask = (&'static str, u32, f64, f64, u64, &'static str);

/// The default workfile `lab_mix`: AIM7 task classes (CPU, IPC, fork/exec, page-cache and
/// synchronous disk) with absolute costs, each an assumption stated with its reasoning. No
/// published result is an input (the sba-vmerge experiment instead scales its workfile's
/// relative costs to one published row).
pub const REAIM_TASKS: &[DefaultTask] = &[
    ("add_int", 6, 2000.0, 5.0, 0, "assumption (CPU): AIM's integer loop, ~10^6 iterations of ~2 cycles"),
    ("sort_rtns_1", 6, 4000.0, 10.0, 0, "assumption (CPU): in-memory sort of ~10^5 keys, n log n ~ 1.7M compares at ~2.5 cycles"),
    ("string_rtns", 6, 3000.0, 10.0, 0, "assumption (CPU): string routines over ~1 MB, ~3 cycles a byte"),
    ("shared_memory", 10, 1000.0, 400.0, 0, "assumption (IPC): ~1000 semaphore and shared-memory operations, ~400 cycles of syscall each"),
    ("tcp_test", 6, 200.0, 1500.0, 0, "assumption (IPC): ~100 loopback TCP round trips, ~15,000 cycles of stack each"),
    ("fork_test", 4, 50.0, 300.0, 0, "assumption (fork/exec): fork, exit and wait of a small process, ~300,000 cycles (lmbench's fork latency is of the order of 100 us on a 2-3 GHz core)"),
    ("exec_test", 3, 100.0, 800.0, 0, "assumption (fork/exec): fork, execve of a small binary, exit and wait, ~3x a fork"),
    ("disk_rr", 6, 300.0, 600.0, 0, "assumption (page cache): random reads of a cached file, ~600,000 cycles of copy and lookup"),
    ("sync_disk_update", 3, 200.0, 300.0, 80 << 10, "assumption (disk): update an 80 KiB file and fsync it (FILESIZE 80k of the OSDL STP re-aim configuration, docs/model/sba-vmerge.md)"),
    ("sync_disk_wrt", 3, 200.0, 300.0, 80 << 10, "assumption (disk): write an 80 KiB file sequentially and fsync it"),
];

/// The workfile `new_dbase` of the sba-vmerge experiment (docs/model/sba-vmerge.md), an
/// approximation: the workfile itself was not found in a public source, so the mix is AIM7's
/// documented tasks with weights summing to 103 (every published row of SEEDS.md #3 satisfies
/// `JPM * Parent Time / (60 * users) = 103.0`). The costs are *relative*: written as the
/// experiment's microseconds per run at the hp-zx1 profile's 1.0 GHz (so thousands of cycles
/// here), they are meant to be scaled by a declared calibration (`workload.user_scale`,
/// `workload.sys_scale`); alone they are about a tenth of the published child times. The
/// synchronous writes are 80 KiB files (FILESIZE 80k of the OSDL STP re-aim configuration,
/// Cliff White, LKML 2003-05-21).
#[rustfmt::skip]
pub const REAIM_NEW_DBASE: &[DefaultTask] = &[
    ("shared_memory", 20, 2500.0, 150.0, 0, "assumption: a database mix is dominated by shared-memory and semaphore work"),
    ("disk_rr", 10, 1500.0, 200.0, 0, "assumption: random reads of a page-cache resident file"),
    ("disk_rw", 10, 1500.0, 250.0, 0, "assumption: random writes into the page cache (files are deleted before writeback)"),
    ("sync_disk_update", 6, 800.0, 150.0, 80 << 10, "assumption: update a file and fsync it"),
    ("sync_disk_rw", 5, 800.0, 150.0, 80 << 10, "assumption: write a file and fsync it"),
    ("sync_disk_wrt", 5, 800.0, 150.0, 80 << 10, "assumption: sequential write and fsync"),
    ("tcp_test", 8, 500.0, 400.0, 0, "assumption: loopback TCP messages, mostly kernel time"),
    ("fork_test", 4, 200.0, 400.0, 0, "assumption: fork and wait"),
    ("exec_test", 3, 300.0, 600.0, 0, "assumption: fork, exec and wait"),
    ("sort_rtns_1", 8, 4000.0, 10.0, 0, "assumption: in-memory sort, user time only"),
    ("string_rtns", 8, 3000.0, 10.0, 0, "assumption: string routines, user time only"),
    ("add_int", 6, 2000.0, 5.0, 0, "assumption: integer arithmetic loop"),
    ("mem_rtns_1", 6, 2500.0, 50.0, 0, "assumption: memory allocation and copy routines"),
    ("creat-clo", 4, 100.0, 300.0, 0, "assumption: create, write, close and unlink small files"),
];

/// The bundled workfiles a scenario may name in `workload.workfile` without listing its
/// tasks: `lab_mix` (the default) and `new_dbase`.
pub const REAIM_WORKFILES: [(&str, &[DefaultTask]); 2] =
    [("lab_mix", REAIM_TASKS), ("new_dbase", REAIM_NEW_DBASE)];

#[cfg(test)]
mod tests {
    //! The USB and bonnie defaults are those the ipmmu-usb experiment argued (its data file,
    //! scenarios/experiments/ipmmu-usb.toml, states only what differs from them);
    //! crates/sim/tests/lab_ipmmu_usb_cells.rs and exp_ipmmu_usb.rs check the cells.

    use crate::lab::spec::{validate, Workload};

    /// Without banks the page cache is one bank of `BONNIE_RAM_MIB` above 4 GiB; with the
    /// H3's two banks it is those banks less the swiotlb pool at the start of the first:
    /// the same number of pages, at other addresses.
    #[test]
    fn the_default_page_cache_holds_as_many_pages_as_the_h3_banks() {
        let cell = |machine: &str| {
            format!(
                "[machine]\nplatform = \"rcar-h3\"\n{machine}\n[iommu]\nmodel = \"none\"\n\
                 [[device]]\nkind = \"usb\"\n[workload]\nkind = \"bonnie\"\n"
            )
        };
        let banks = |text: &str| {
            let s = validate(text, "cell", None).expect("valid");
            let Workload::Bonnie(b) = &s.workload else {
                panic!("bonnie")
            };
            b.config.ram_banks.clone()
        };
        let total = |banks: &[(u64, u64)]| banks.iter().map(|&(_, n)| n).sum::<u64>();
        let h3 = banks(&cell(
            "memory_gib = 4\nmemory_banks = [ { base = 0x48000000, mib = 1920 }, \
             { base = 0x500000000, mib = 2048 } ]",
        ));
        let default = banks(&cell("memory_gib = 8"));
        assert_eq!(
            default,
            vec![(super::PAGE_CACHE_BASE.0, super::BONNIE_RAM_MIB.0 << 20)]
        );
        assert_eq!(h3.len(), 2);
        assert_eq!(total(&h3), total(&default));
        assert_eq!(total(&h3) >> 20, 1920 + 2048 - super::SWIOTLB_MIB.0);
    }
}
