//! Admission: what may enter the fair queue at all, and how fast the pool may dispatch.
//!
//! `aimd` is the pure, clock-free limiter that learns a pool's effective concurrency from the
//! upstream's 429/503 answers; the proxy and the simulator both drive it.

pub mod aimd;
