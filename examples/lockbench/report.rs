//! The JSON line, fields in a fixed order.

use serde_json::Value;

use super::args::Workload;

pub(crate) struct Report(Vec<(&'static str, Value)>);

impl Report {
    pub(crate) fn new(backend: &str, workload: Workload) -> Self {
        let mut r = Report(Vec::new());
        r.put("peer", "tower-lock");
        r.put("backend", backend);
        r.put("workload", workload.name());
        r
    }

    pub(crate) fn put(&mut self, key: &'static str, value: impl Into<Value>) {
        let value = value.into();
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key, value)),
        }
    }

    /// A field already put.
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    pub(crate) fn line(&self) -> String {
        let fields: Vec<String> = self
            .0
            .iter()
            .map(|(k, v)| format!("{}:{}", Value::from(*k), v))
            .collect();
        format!("{{{}}}", fields.join(","))
    }
}

/// Microseconds, rounded to 0.01.
pub(crate) fn us(ns: f64) -> f64 {
    (ns / 10.0).round() / 100.0
}

pub(crate) fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}
