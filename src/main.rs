//! The `fairgate` binary: see `fairgate --help`.
fn main() {}
