//! keel-webhooks against a real PostgreSQL and a real HTTP receiver in the test process.
