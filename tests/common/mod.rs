//! Shared test support.
#![allow(dead_code, unused_imports, unused_macros)]

pub mod harness;

pub use crate::backend_tests;
