//! Shared test support.
#![allow(dead_code, unused_imports, unused_macros)]

pub mod bank;
pub mod etcd_cluster;
pub mod logs;
pub mod pg_server;
pub mod proxy;
pub mod redis_cluster;
pub mod redis_server;
