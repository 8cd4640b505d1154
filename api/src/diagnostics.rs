//! Client diagnostics API (`switchyard client`): the captured log (page and server-sent-events
//! stream) and the memory statistics of `GET /api/v1/debug/memory`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Severity of a log entry. tracing's `TRACE` is reported as `debug`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    /// The wire name (`debug`, `info`, `warn`, `error`).
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }

    /// Parses a wire name; `warning` and upper case are accepted as people write them.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "debug" | "trace" => Some(LogLevel::Debug),
            "info" => Some(LogLevel::Info),
            "warn" | "warning" => Some(LogLevel::Warn),
            "error" => Some(LogLevel::Error),
            _ => None,
        }
    }
}

/// One captured log record: a tracing event of the client process.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct LogEntry {
    pub timestamp: DateTime<Utc>,
    pub level: LogLevel,
    pub message: String,
    /// The event's fields other than the message (e.g. `method`, `url`, `status_code`,
    /// `duration_ms`, `action`, `error`, `host`); numbers and booleans keep their JSON type.
    #[schema(value_type = Object)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// `GET /api/v1/logs`: one page of the retained log, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct LogPage {
    pub entries: Vec<LogEntry>,
    /// Retained entries that match the `level` filter (all pages together).
    pub total: u64,
    pub limit: u64,
    pub offset: u64,
}

/// The first message of `GET /api/v1/logs/stream`: `{"type":"connected"}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct LogStreamConnected {
    /// Always `connected`.
    #[serde(rename = "type")]
    pub kind: String,
}

impl LogStreamConnected {
    pub fn new() -> Self {
        Self {
            kind: "connected".into(),
        }
    }
}

impl Default for LogStreamConnected {
    fn default() -> Self {
        Self::new()
    }
}

/// `GET /api/v1/debug/memory`. The field names are the specification's (Go's `runtime.MemStats`);
/// what each one holds in this Rust process is documented in the `switchyard-diagnostics` crate.
/// Fields with no meaning in a garbage-collector-free process are 0.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct MemoryStats {
    /// Bytes in allocated heap blocks (malloc: in-use arena bytes plus mmapped blocks).
    pub heap_alloc: u64,
    /// Bytes of heap obtained from the system (arena bytes plus mmapped blocks).
    pub heap_sys: u64,
    /// Bytes of free blocks held in the allocator's arenas.
    pub heap_idle: u64,
    /// Bytes in blocks in use (`heap_sys - heap_idle`).
    pub heap_inuse: u64,
    /// Bytes returned to the system; the allocator keeps no such count, so 0.
    pub heap_released: u64,
    /// Live allocations; the allocator keeps no such count, so 0.
    pub heap_objects: u64,
    /// Resident bytes of the threads' stacks.
    pub stack_inuse: u64,
    /// Reserved bytes of the threads' stacks.
    pub stack_sys: u64,
    /// No garbage collector: 0.
    pub num_gc: u64,
    /// No garbage collector: 0.
    pub last_gc_pause_ns: u64,
    /// No garbage collector: 0.
    pub total_gc_pause_ns: u64,
    /// No garbage collector: 0.
    pub gc_cpu_fraction: f64,
    /// Operating-system threads of the process.
    pub num_goroutines: u64,
    /// Connected `GET /api/v1/logs/stream` subscribers.
    pub log_subscribers: u64,
}
