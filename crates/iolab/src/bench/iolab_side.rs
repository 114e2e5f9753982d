//! The iolab side of each benchmark (wired to the stack's concrete types).

use super::harness::Sampling;

/// `(implementation, ns/op, exact work per op)`.
pub type Figure = (&'static str, f64, Vec<(String, f64)>);

/// Allocator churn for each iolab allocator.
pub fn iova_alloc_free(_live: usize, _sampling: &Sampling) -> Vec<Figure> {
    Vec::new()
}

/// Map+unmap of `size` bytes for each page-table format.
pub fn pgtable_map_unmap(_size: u64, _sampling: &Sampling) -> Vec<Figure> {
    Vec::new()
}

/// Translation of a mapped address on each path.
pub fn translate(_sampling: &Sampling) -> Vec<Figure> {
    Vec::new()
}
