//! Integration tests of keel-units, one binary (one module per area).

mod parse_format;
mod values_serde;
