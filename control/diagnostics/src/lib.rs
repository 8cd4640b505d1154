//! Diagnostics endpoints of the client API, as a crate any command can mount: the captured log
//! (`GET /api/v1/logs`, and `GET /api/v1/logs/stream` as server-sent events), memory statistics
//! (`GET /api/v1/debug/memory`) and Go-style profiling under `/debug/pprof/`. It runs on the
//! tokio control plane; the only part that touches other threads is the tracing layer, which
//! never blocks and never logs, so data-plane cores may emit events through it. It does not
//! authenticate: mount it behind the API's token check.
//!
//! # Wiring (public API)
//!
//! ```no_run
//! use switchyard_diagnostics::{DiagnosticsApiDoc, DiagnosticsState, LogStore};
//! use utoipa::OpenApi as _;
//! # fn cfg() -> switchyard_config::LoggingConfig { unimplemented!() }
//!
//! // 1. Before anything logs: capture events into a store of the newest 1000 entries.
//! let logs = LogStore::new(1000);
//! switchyard_service::logging::init_with_layer(&cfg(), "", Some(Box::new(logs.layer())))?;
//!
//! // 2. Mount the routes (the state is applied inside, so this merges into any Router<S>).
//! let diagnostics: axum::Router<()> = switchyard_diagnostics::routes(DiagnosticsState::new(logs));
//! // e.g. `protected_router.merge(diagnostics)`; the served (method, path) pairs are in
//! // `switchyard_diagnostics::ROUTES`.
//!
//! // 3. OpenAPI: merge the paths and schemas into the client's document.
//! let mut doc = DiagnosticsApiDoc::openapi(); // e.g. `client_doc.merge(doc)`
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - [`LogStore::new`]`(capacity)` / [`LogStore::with_limits`] — the captured log; clone freely.
//!   [`LogStore::layer`] gives the `tracing_subscriber::Layer` that feeds it;
//!   [`LogStore::record`] adds an entry by hand (e.g. one a data-plane core sent over a queue).
//! - [`DiagnosticsState::new`]`(logs)` — what the handlers share (the store and the one CPU
//!   profiler slot).
//! - [`routes`]`(state) -> axum::Router<S>` — every endpoint below; [`ROUTES`] lists them.
//! - [`DiagnosticsApiDoc`] — their OpenAPI paths and schemas (`utoipa::OpenApi`).
//! - Wire types: `switchyard_api::diagnostics::{LogEntry, LogLevel, LogPage, MemoryStats,
//!   LogStreamConnected}`.
//!
//! # Endpoints and decisions
//!
//! - `GET /api/v1/logs?limit&offset&level` → `{entries, total, limit, offset}`, **newest first**.
//!   `limit` defaults to 100 and is capped at the store's capacity; `offset` defaults to 0.
//!   `level` is a **minimum**: `warn` returns `warn` and `error` entries (`warning` and any case
//!   accepted); anything else is 400 `INVALID_LEVEL`. `total` counts the retained entries that
//!   pass the level filter. tracing's `TRACE` is reported as `debug`. `fields` holds the event's
//!   fields other than `message` plus those of the spans it happens in (the innermost wins,
//!   the event's own win over all), numbers and booleans typed, strings cut at 4096 bytes. Only
//!   events that pass the process's log filter (`logging.level` / `RUST_LOG`) are captured.
//! - `GET /api/v1/logs/stream` → `text/event-stream`; the first message is
//!   `data: {"type":"connected"}`, then `data: <LogEntry JSON>` per entry; `:` keep-alive
//!   comments every 15 s. At most 100 subscribers: the 101st gets **503** with
//!   `{"error":"unavailable","code":"LOG_STREAM_FULL",...}`. Each subscriber has a 100-message
//!   buffer; one that falls behind is dropped at once (its response ends after what was
//!   buffered) and a warning names it, logged from a separate task — publishing never waits and
//!   the layer never logs.
//! - `GET /api/v1/debug/memory` → `MemoryStats`, mapped as follows (glibc's allocator, which
//!   this binary uses; no allocator swap is needed for any figure):
//!
//!   | field | source |
//!   |---|---|
//!   | `heap_alloc` | `mallinfo2()`: `uordblks + hblkhd` (bytes in allocated chunks, arenas and mmapped) |
//!   | `heap_sys` | `mallinfo2()`: `arena + hblkhd` (bytes obtained from the system) |
//!   | `heap_idle` | `mallinfo2()`: `fordblks` (free bytes held in the arenas) |
//!   | `heap_inuse` | `heap_sys - heap_idle` (with glibc equal to `heap_alloc`) |
//!   | `heap_released` | 0: glibc keeps no count of pages returned to the system |
//!   | `heap_objects` | 0: glibc keeps no count of live allocations |
//!   | `stack_inuse` / `stack_sys` | `Rss` / `Size` in `/proc/self/smaps` of the mappings holding each thread's saved stack pointer (`/proc/self/task/*/syscall`); a thread on a CPU at that instant has no saved pointer and is missed |
//!   | `num_gc`, `last_gc_pause_ns`, `total_gc_pause_ns`, `gc_cpu_fraction` | 0: no garbage collector |
//!   | `num_goroutines` | threads of the process (`/proc/self/task`) |
//!   | `log_subscribers` | connected `logs/stream` subscribers |
//!
//!   On a non-glibc target the heap figures are 0.
//! - `GET /debug/pprof/` (and `/debug/pprof`) — an HTML index.
//! - `GET /debug/pprof/cmdline` — the arguments joined by NUL bytes, as Go serves them.
//! - `GET /debug/pprof/profile?seconds=N` — a real CPU profile of the whole process (the `pprof`
//!   crate: `SIGPROF` at 100 Hz over CPU time, every thread), pprof protobuf, gzip-compressed,
//!   `application/octet-stream`; `seconds` defaults to 30 and must be 1..=300 (else 400); one
//!   profile at a time (**409** `PROFILE_IN_PROGRESS` while one runs). Dropping the request
//!   stops the sampler. Memory cost, measured: pprof-rs keeps a sample table (~64 MiB with its
//!   128-frame stacks) in a process-wide static from the first profile on, for the life of the
//!   process; symbolising also parses the binary's debug information (~130 MiB for a debug
//!   build), which is released after each profile (`backtrace::clear_symbol_cache` and glibc
//!   `malloc_trim`). An idle client that is never profiled pays nothing. Wiring notes: a
//!   request timeout on the API must spare this path (up to 300 s); `SIGPROF` reaches every
//!   thread, data-plane cores included (the handler is installed with `SA_RESTART`; an
//!   io_uring wait may still see `EINTR`, which the end-to-end test against the real binary
//!   should cover).
//! - `GET /debug/pprof/heap` — text: the allocator's `mallinfo2` figures and the memory lines of
//!   `/proc/self/status`, headed by the statement that no allocation-site profile exists.
//! - `GET /debug/pprof/goroutine` — text: the threads (id, state, user/system CPU seconds, name).
//! - `GET /debug/pprof/{allocs,block,mutex,threadcreate}` — **501** `PROFILE_NOT_AVAILABLE`
//!   with the reason: nothing in a Rust process records those events.

pub mod capture;
pub mod cpu_profile;
mod error;
pub mod log_ring;
pub mod log_stream;
mod logs_api;
pub mod memory;
mod memory_api;
mod pprof_api;
mod sys;
pub mod threads;

pub use capture::{CaptureLayer, LogLimits, LogStore};
pub use cpu_profile::CpuProfiler;
pub use log_ring::PageQuery;
pub use log_stream::StreamLimits;

use axum::routing::get;
use axum::Router;

/// What the handlers share. Cheap to clone.
#[derive(Clone)]
pub struct DiagnosticsState {
    pub logs: LogStore,
    pub profiler: CpuProfiler,
}

impl DiagnosticsState {
    pub fn new(logs: LogStore) -> Self {
        Self {
            logs,
            profiler: CpuProfiler::new(),
        }
    }
}

/// Every (method, path) that [`routes`] serves.
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/api/v1/logs"),
    ("get", "/api/v1/logs/stream"),
    ("get", "/api/v1/debug/memory"),
    ("get", "/debug/pprof"),
    ("get", "/debug/pprof/"),
    ("get", "/debug/pprof/cmdline"),
    ("get", "/debug/pprof/profile"),
    ("get", "/debug/pprof/heap"),
    ("get", "/debug/pprof/goroutine"),
    ("get", "/debug/pprof/allocs"),
    ("get", "/debug/pprof/block"),
    ("get", "/debug/pprof/mutex"),
    ("get", "/debug/pprof/threadcreate"),
];

/// The diagnostics endpoints with their state applied, ready to merge into any router.
pub fn routes<S: Clone + Send + Sync + 'static>(state: DiagnosticsState) -> Router<S> {
    Router::new()
        .route("/api/v1/logs", get(logs_api::list))
        .route("/api/v1/logs/stream", get(logs_api::stream))
        .route("/api/v1/debug/memory", get(memory_api::memory))
        .route("/debug/pprof", get(pprof_api::index_without_slash))
        .route("/debug/pprof/", get(pprof_api::index))
        .route("/debug/pprof/cmdline", get(pprof_api::cmdline))
        .route("/debug/pprof/profile", get(pprof_api::profile))
        .route("/debug/pprof/heap", get(pprof_api::heap))
        .route("/debug/pprof/goroutine", get(pprof_api::goroutine))
        .route("/debug/pprof/allocs", get(pprof_api::allocs))
        .route("/debug/pprof/block", get(pprof_api::block))
        .route("/debug/pprof/mutex", get(pprof_api::mutex))
        .route("/debug/pprof/threadcreate", get(pprof_api::threadcreate))
        .with_state(state)
}

/// OpenAPI paths (and, through them, schemas) of [`routes`].
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    logs_api::list,
    logs_api::stream,
    memory_api::memory,
    pprof_api::index_without_slash,
    pprof_api::index,
    pprof_api::cmdline,
    pprof_api::profile,
    pprof_api::heap,
    pprof_api::goroutine,
    pprof_api::allocs,
    pprof_api::block,
    pprof_api::mutex,
    pprof_api::threadcreate,
))]
pub struct DiagnosticsApiDoc;
