//! Fuzzes the SMMUv3 command decoder: any two 64-bit words decode to a command or an
//! error, never a panic; every accepted command encodes back to the same words.
#![no_main]

use iolab_iommu::smmuv3::Command;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // One command per 16 bytes (little-endian words, as the queue stores them).
    for chunk in data.chunks_exact(16) {
        let mut w = [0u64; 2];
        for (i, word) in w.iter_mut().enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(&chunk[i * 8..i * 8 + 8]);
            *word = u64::from_le_bytes(b);
        }
        if let Ok(cmd) = Command::decode(w) {
            let again = cmd.encode().expect("a decoded command must encode");
            assert_eq!(again, w, "decode/encode round trip changed {cmd:?}");
        }
    }
});
