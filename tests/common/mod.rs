//! Shared test support.
#![allow(dead_code, unused_imports, unused_macros)]

pub mod proxy;
pub mod redis_server;
