//! Integration tests of keel-store against real PostgreSQL, one binary.

mod store;
