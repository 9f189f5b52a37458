//! snug's own answers: the probes (`/health`, `/ready`) and the adapter administration
//! (`/v1/adapters`).

use schemars::JsonSchema;
use serde::Serialize;

/// `GET /health` while the scheduler runs (`status: "ok"`).
#[derive(Debug, Serialize, JsonSchema)]
pub struct Health {
    pub status: &'static str,
    pub model: String,
    pub uptime_seconds: u64,
}

/// `GET /health` while the model loads (`status: "loading"`; before `/openapi.json` is served).
#[derive(Debug, Serialize, JsonSchema)]
pub struct Loading {
    pub status: &'static str,
}

/// `GET /ready` once the scheduler serves (`status: "ready"`).
#[derive(Debug, Serialize, JsonSchema)]
pub struct Ready {
    pub status: &'static str,
    pub model: String,
}

/// Where an adapter's weights are: hot (f32 rows), warm (int8 rows), cold (registered only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "AdapterTier")]
pub enum Tier {
    Hot,
    Warm,
    Cold,
}

/// A registered adapter (`model`: the name a request gives to use it).
#[derive(Debug, Serialize, JsonSchema)]
pub struct Adapter {
    pub name: String,
    pub model: String,
    pub file: String,
    pub rank: usize,
    pub alpha: f64,
    pub bytes_hot: usize,
    pub tier: Tier,
    pub leases: usize,
    pub default_scale: f64,
}

/// `GET /v1/adapters`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct AdapterList {
    pub object: &'static str,
    pub data: Vec<Adapter>,
}
