//! The tracing layer that captures events for the API: each event becomes a [`LogEntry`]
//! (level, message, its fields and those of the spans it happens in) pushed into the [`LogRing`] and offered to the stream subscribers.
//! It never blocks and never logs, so it is safe on every thread, data-plane cores included.

use crate::log_ring::{LogRing, PageQuery};
use crate::log_stream::{LogSubscribers, Message, StreamLimits, SubscribeError, Subscription};
use chrono::Utc;
use serde_json::{Map, Value};
use std::fmt;
use std::sync::Arc;
use switchyard_api::diagnostics::{LogEntry, LogLevel, LogPage};
use tracing::field::{Field, Visit};
use tracing::{span, Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Longest message or string field kept, in bytes; longer ones are cut (at a character
/// boundary) and end in `…`, so one huge event cannot hold a large part of memory.
pub const MAX_TEXT: usize = 4096;

/// Bounds of the captured log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLimits {
    /// Entries retained for `GET /api/v1/logs`.
    pub capacity: usize,
    pub stream: StreamLimits,
}

impl Default for LogLimits {
    fn default() -> Self {
        Self {
            capacity: 1000,
            stream: StreamLimits::default(),
        }
    }
}

struct Shared {
    ring: LogRing,
    subscribers: LogSubscribers,
}

/// The captured log: what the layer writes and the API reads. Cheap to clone (shared).
#[derive(Clone)]
pub struct LogStore {
    shared: Arc<Shared>,
}

impl LogStore {
    /// A store retaining `capacity` entries, with the specification's stream limits.
    pub fn new(capacity: usize) -> Self {
        Self::with_limits(LogLimits {
            capacity,
            ..LogLimits::default()
        })
    }

    pub fn with_limits(limits: LogLimits) -> Self {
        Self {
            shared: Arc::new(Shared {
                ring: LogRing::new(limits.capacity),
                subscribers: LogSubscribers::new(limits.stream),
            }),
        }
    }

    /// The layer to install in the tracing subscriber; it feeds this store.
    pub fn layer(&self) -> CaptureLayer {
        CaptureLayer {
            store: self.clone(),
        }
    }

    /// Adds an entry as the layer does (also for entries that do not come from tracing).
    pub fn record(&self, entry: LogEntry) {
        let s = &self.shared;
        if !s.subscribers.is_empty() {
            if let Ok(json) = serde_json::to_string(&entry) {
                s.subscribers.publish(&Message::from(json));
            }
        }
        s.ring.push(Arc::new(entry));
    }

    pub fn page(&self, q: &PageQuery) -> LogPage {
        self.shared.ring.page(q)
    }

    pub fn capacity(&self) -> usize {
        self.shared.ring.capacity()
    }

    pub fn subscribe(&self) -> Result<Subscription, SubscribeError> {
        self.shared.subscribers.subscribe()
    }

    /// Connected stream subscribers.
    pub fn subscriber_count(&self) -> usize {
        self.shared.subscribers.count()
    }

    pub fn stream_limits(&self) -> StreamLimits {
        self.shared.subscribers.limits()
    }
}

/// `tracing_subscriber::Layer` feeding a [`LogStore`]; make one with [`LogStore::layer`].
pub struct CaptureLayer {
    store: LogStore,
}

/// Fields of a span, kept in its extensions so events inside it can carry them.
struct SpanFields(Map<String, Value>);

impl<S> Layer<S> for CaptureLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        if attrs.fields().is_empty() {
            return;
        }
        let mut visitor = FieldVisitor::default();
        attrs.record(&mut visitor);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(visitor.fields));
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut visitor = FieldVisitor::default();
        values.record(&mut visitor);
        let mut extensions = span.extensions_mut();
        match extensions.get_mut::<SpanFields>() {
            Some(SpanFields(fields)) => fields.extend(visitor.fields),
            None => extensions.insert(SpanFields(visitor.fields)),
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut visitor = FieldVisitor::default();
        // The enclosing spans' fields first (outermost first), so the event's own win.
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(SpanFields(fields)) = span.extensions().get::<SpanFields>() {
                    visitor
                        .fields
                        .extend(fields.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
            }
        }
        event.record(&mut visitor);
        self.store.record(LogEntry {
            timestamp: Utc::now(),
            level: level_of(event.metadata().level()),
            message: visitor.message,
            fields: visitor.fields,
        });
    }
}

/// tracing's five levels onto the API's four: TRACE is reported as debug.
pub fn level_of(level: &Level) -> LogLevel {
    match *level {
        Level::ERROR => LogLevel::Error,
        Level::WARN => LogLevel::Warn,
        Level::INFO => LogLevel::Info,
        Level::DEBUG | Level::TRACE => LogLevel::Debug,
    }
}

/// Collects `message` apart and every other field as JSON, keeping numbers and booleans typed.
/// Fields that `tracing-log` adds to bridged `log` records (`log.target`, `log.file`...) are
/// skipped: they describe the call site, not the event.
#[derive(Default)]
struct FieldVisitor {
    message: String,
    fields: Map<String, Value>,
}

impl FieldVisitor {
    fn put(&mut self, field: &Field, value: Value) {
        let name = field.name();
        if name.starts_with("log.") {
            return;
        }
        if name == "message" {
            self.message = match value {
                Value::String(s) => s,
                other => other.to_string(),
            };
        } else {
            self.fields.insert(name.to_owned(), value);
        }
    }
}

impl Visit for FieldVisitor {
    fn record_f64(&mut self, field: &Field, value: f64) {
        let v = serde_json::Number::from_f64(value)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(value.to_string()));
        self.put(field, v);
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(bounded(value.to_owned())));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::String(bounded(value.to_string())));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::String(bounded(format!("{value:?}"))));
    }
}

/// Cuts `s` to at most [`MAX_TEXT`] bytes at a character boundary, marking the cut.
fn bounded(mut s: String) -> String {
    if s.len() > MAX_TEXT {
        let mut end = MAX_TEXT - '…'.len_utf8();
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt as _;

    fn capture(store: &LogStore, f: impl FnOnce()) {
        let subscriber = tracing_subscriber::registry().with(store.layer());
        tracing::subscriber::with_default(subscriber, f);
    }

    #[test]
    fn events_become_entries_with_typed_fields() {
        let store = LogStore::new(10);
        capture(&store, || {
            tracing::info!(
                method = "GET",
                url = "http://example.test/",
                status_code = 200u16,
                duration_ms = 12u64,
                cached = false,
                "request done"
            );
            tracing::trace!(action = "direct", "routed");
            tracing::error!(error = %std::io::Error::other("boom"), host = "a.test", "dial failed");
        });
        let page = store.page(&PageQuery::default());
        assert_eq!(page.total, 3);
        let [err, trace, info] = &page.entries[..] else {
            panic!("three entries expected: {page:?}");
        };
        assert_eq!(info.level, LogLevel::Info);
        assert_eq!(info.message, "request done");
        assert_eq!(info.fields["method"], "GET");
        assert_eq!(info.fields["url"], "http://example.test/");
        assert_eq!(info.fields["status_code"], 200);
        assert_eq!(info.fields["duration_ms"], 12);
        assert_eq!(info.fields["cached"], false);
        assert!(!info.fields.contains_key("message"));
        assert_eq!(trace.level, LogLevel::Debug, "TRACE maps to debug");
        assert_eq!(trace.fields["action"], "direct");
        assert_eq!(err.level, LogLevel::Error);
        assert_eq!(err.fields["error"], "boom");
        assert_eq!(err.fields["host"], "a.test");
    }

    #[test]
    fn events_carry_the_fields_of_their_spans() {
        let store = LogStore::new(10);
        capture(&store, || {
            let request = tracing::info_span!(
                "request",
                method = "CONNECT",
                host = "a.test",
                status_code = tracing::field::Empty
            );
            let _in = request.enter();
            request.record("status_code", 200);
            let dial = tracing::debug_span!("dial", host = "b.test");
            let _dial = dial.enter();
            tracing::info!(action = "server", "forwarded");
        });
        tracing::subscriber::with_default(
            tracing_subscriber::registry().with(store.layer()),
            || tracing::info!("outside any span"),
        );
        let page = store.page(&PageQuery::default());
        let [outside, inside] = &page.entries[..] else {
            panic!("two entries expected: {page:?}");
        };
        assert_eq!(inside.fields["method"], "CONNECT");
        assert_eq!(inside.fields["status_code"], 200);
        assert_eq!(inside.fields["host"], "b.test", "the inner span wins");
        assert_eq!(inside.fields["action"], "server");
        assert!(outside.fields.is_empty());
    }

    #[test]
    fn events_reach_stream_subscribers_as_json() {
        let store = LogStore::new(10);
        let mut sub = store.subscribe().expect("subscribe");
        capture(&store, || tracing::warn!(host = "b.test", "slow backend"));
        let msg = sub.try_recv().expect("one message");
        let entry: LogEntry = serde_json::from_str(&msg).expect("a log entry");
        assert_eq!(entry.level, LogLevel::Warn);
        assert_eq!(entry.message, "slow backend");
        assert_eq!(entry.fields["host"], "b.test");
        assert!(sub.try_recv().is_none());
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary() {
        let s = bounded("é".repeat(MAX_TEXT));
        assert!(s.len() <= MAX_TEXT);
        assert!(s.ends_with('…'));
        assert_eq!(bounded("short".into()), "short");
    }
}
