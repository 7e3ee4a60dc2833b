//! keel-durable against a real PostgreSQL (a fresh database per test).

mod common;

mod actor;
mod bounds;
mod census;
mod crash;
mod executors;
mod history;
mod hook;
mod lifecycle;
mod replay;
mod seams;
mod signals;
mod start;
mod terminal;
mod versioning;
