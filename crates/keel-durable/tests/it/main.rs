//! keel-durable against a real PostgreSQL (a fresh database per test).

mod common;

mod actor;
mod bounds;
mod census;
mod crash;
mod dead_letters;
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
mod wake;
