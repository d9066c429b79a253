//! Shared test support.
#![allow(dead_code, unused_imports, unused_macros)]

pub mod pg_server;
pub mod redis_server;
