//! Redis backend (being written).
