//! `fairgate demo`: FIFO against DRR on the bundled mock upstream, over real HTTP.

pub mod chart;
