//! A cache prefetch hint for the dispatch path.
//!
//! With 100k backlogged tenants every DRR turn meets a tenant whose records are not in cache;
//! the calendar already knows the next turns, so their records are requested a few turns early
//! and the misses overlap instead of adding up.
//!
//! Invariant: a hint only — it changes no state the program can observe, and is a no-op off
//! x86_64. This is the crate's only `unsafe`, one intrinsic call.

/// Asks the CPU to bring the cache line holding `r` into L1.
#[inline(always)]
pub(crate) fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: `_mm_prefetch` reads nothing the program sees and cannot fault, whatever the
    // address (here one from a live reference); SSE is part of the x86_64 baseline.
    unsafe {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(r).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}
