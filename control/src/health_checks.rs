//! Active health checks: one control-plane task that, for every backend the running snapshot
//! gives a [`HealthCheckPlan`], opens a real connection through that backend to the plan's
//! target every `interval` — through the data plane's command queue, exactly like
//! `POST /api/v1/backends/{name}/test` — and feeds the results to the backend's shared health
//! cell ([`switchyard_dataplane::backend_health`]), where they meet passive detection.
//!
//! The task only `try_send`s to the data plane and awaits the reply, so a data-plane core never
//! waits on it; a check the data plane cannot take (queue full, no answer) is skipped, not
//! counted against the backend. Every change of a backend's healthiness becomes a
//! `backend.health` event (through the data plane's event queue, so it stays in order with the
//! passive ones), and every check's duration lands in
//! `switchyard_backend_health_check_duration_seconds`.

use crate::server::ServerState;
use prometheus::{HistogramOpts, HistogramVec};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use switchyard_config::health_check::HealthCheckPlan;
use switchyard_dataplane::backend_health::{CheckStreak, Signal, Thresholds};
use switchyard_dataplane::commands::{Command, TestPurpose};
use switchyard_dataplane::events::Event;
use switchyard_dataplane::snapshot::Backend;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long the task sleeps at most, so configuration changes are picked up promptly.
const RECONCILE_EVERY: Duration = Duration::from_secs(1);
/// Extra time the data plane gets beyond a check's own timeout to answer before the check is
/// given up as not run.
const ANSWER_GRACE: Duration = Duration::from_secs(2);

/// `host:port` (IPv6 in brackets) as (host, port).
pub fn split_target(target: &str) -> Option<(String, u16)> {
    let (host, port) = target.rsplit_once(':')?;
    let host = host.trim_matches(['[', ']']);
    if host.is_empty() {
        return None;
    }
    Some((host.to_owned(), port.parse().ok()?))
}

/// The long-lived metric of the checks, joined into every scrape.
pub struct CheckMetrics {
    pub durations: HistogramVec,
}

impl CheckMetrics {
    pub fn new() -> Self {
        let durations = HistogramVec::new(
            HistogramOpts::new(
                "switchyard_backend_health_check_duration_seconds",
                "duration of active health checks (a connection through the backend to its check target)",
            ),
            &["backend", "result"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}"));
        Self { durations }
    }

    fn forget(&self, backend: &str) {
        for result in ["pass", "fail"] {
            let _ = self.durations.remove_label_values(&[backend, result]);
        }
    }
}

/// What became of one check.
enum Outcome {
    Passed,
    Failed(String),
    /// The data plane could not take or answer it: says nothing about the backend.
    NotRun(&'static str),
}

struct Finished {
    name: String,
    /// The [`Checked::epoch`] the check was started for.
    epoch: u64,
    took: Duration,
    outcome: Outcome,
}

/// One checked backend.
struct Checked {
    /// Distinguishes this streak from earlier ones of the same name (settings changed, backend
    /// replaced), so that a late result of those counts for nobody.
    epoch: u64,
    backend: Arc<Backend>,
    plan: HealthCheckPlan,
    streak: CheckStreak,
    next_due: Instant,
    in_flight: bool,
}

/// Runs the checks of the running configuration until the process ends.
pub async fn run(state: Arc<ServerState>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Finished>();
    let mut checked: HashMap<String, Checked> = HashMap::new();
    let mut generation = 0;
    let mut epochs = 0;
    loop {
        let snapshot = state.snapshot.load_full();
        if snapshot.generation != generation {
            generation = snapshot.generation;
            reconcile(&state, &snapshot.backends, &mut checked, &mut epochs);
        }
        let now = Instant::now();
        for (name, c) in checked.iter_mut() {
            if !c.in_flight && c.next_due <= now {
                c.in_flight = true;
                c.next_due = now + c.plan.interval;
                tokio::spawn(check(
                    state.clone(),
                    name.clone(),
                    c.epoch,
                    c.backend.clone(),
                    c.plan.clone(),
                    tx.clone(),
                ));
            }
        }
        let wake = checked
            .values()
            .filter(|c| !c.in_flight)
            .map(|c| c.next_due)
            .min()
            .unwrap_or(now + RECONCILE_EVERY)
            .min(now + RECONCILE_EVERY);
        tokio::select! {
            Some(done) = rx.recv() => finish(&state, &mut checked, done),
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Follows the snapshot: new or changed plans start a fresh streak (their first result
/// decides), plans that ended release the verdict their checks held.
fn reconcile(
    state: &ServerState,
    backends: &[Arc<Backend>],
    checked: &mut HashMap<String, Checked>,
    epochs: &mut u64,
) {
    let now = Instant::now();
    checked.retain(|name, c| {
        let current = backends.iter().find(|b| &b.name == name);
        let same_cell = current.is_some_and(|b| Arc::ptr_eq(&b.health, &c.backend.health));
        match current {
            Some(b) if same_cell && b.health_check.as_ref() == Some(&c.plan) => {
                c.backend = b.clone();
                true
            }
            _ => {
                if same_cell {
                    // Still there, no longer checked (or checked differently): a verdict
                    // of the old checks must not outlive them.
                    if let Some(healthy) = c.backend.health.apply(Signal::ChecksStopped) {
                        announce(state, name, healthy, "health checks stopped");
                    }
                }
                state.health_checks.forget(name);
                false
            }
        }
    });
    for b in backends {
        let Some(plan) = &b.health_check else {
            continue;
        };
        if checked.contains_key(&b.name) {
            continue;
        }
        tracing::info!(
            backend = %b.name,
            target = %plan.target,
            interval = %switchyard_config::Duration(plan.interval),
            timeout = %switchyard_config::Duration(plan.timeout),
            "health checks start"
        );
        *epochs += 1;
        checked.insert(
            b.name.clone(),
            Checked {
                epoch: *epochs,
                backend: b.clone(),
                plan: plan.clone(),
                streak: CheckStreak::default(),
                next_due: now,
                in_flight: false,
            },
        );
    }
}

/// Runs one check through the data plane and reports it.
async fn check(
    state: Arc<ServerState>,
    name: String,
    epoch: u64,
    backend: Arc<Backend>,
    plan: HealthCheckPlan,
    done: mpsc::UnboundedSender<Finished>,
) {
    let started = Instant::now();
    let outcome = match split_target(&plan.target) {
        // Validation refuses such targets; kept as a failure rather than a panic.
        None => Outcome::Failed(format!("target {:?} is not host:port", plan.target)),
        Some((host, port)) => {
            let (reply, answer) = futures::channel::oneshot::channel();
            let sent = state.commands.try_send(Command::TestBackend {
                backend,
                purpose: TestPurpose::HealthCheck,
                host,
                port,
                timeout: plan.timeout,
                reply,
            });
            match sent {
                Err(_) => Outcome::NotRun("the data plane's command queue is full"),
                Ok(()) => match tokio::time::timeout(plan.timeout + ANSWER_GRACE, answer).await {
                    Err(_) => Outcome::NotRun("the data plane did not answer"),
                    Ok(Err(_)) => Outcome::NotRun("the data plane dropped the check"),
                    Ok(Ok((_, Ok(())))) => Outcome::Passed,
                    Ok(Ok((_, Err(e)))) => Outcome::Failed(e),
                },
            }
        }
    };
    let _ = done.send(Finished {
        name,
        epoch,
        took: started.elapsed(),
        outcome,
    });
}

fn finish(state: &ServerState, checked: &mut HashMap<String, Checked>, done: Finished) {
    let Some(c) = checked.get_mut(&done.name) else {
        return;
    };
    if c.epoch != done.epoch {
        return;
    }
    c.in_flight = false;
    let (passed, error) = match &done.outcome {
        Outcome::Passed => (true, None),
        Outcome::Failed(e) => (false, Some(e.as_str())),
        Outcome::NotRun(why) => {
            tracing::warn!(backend = %done.name, reason = why, "health check not run");
            return;
        }
    };
    state
        .health_checks
        .durations
        .with_label_values(&[done.name.as_str(), if passed { "pass" } else { "fail" }])
        .observe(done.took.as_secs_f64());
    tracing::debug!(backend = %done.name, passed, error, took = ?done.took, "health check");
    let thresholds = Thresholds {
        unhealthy_after: c.plan.unhealthy_after,
        healthy_after: c.plan.healthy_after,
    };
    let health = &c.backend.health;
    let Some(signal) = c.streak.record(passed, health.is_healthy(), thresholds) else {
        return;
    };
    if let Some(healthy) = health.apply(signal) {
        let why = match error {
            Some(e) => format!("health checks fail: {e}"),
            None => "health checks pass".to_owned(),
        };
        announce(state, &done.name, healthy, &why);
    }
}

fn announce(state: &ServerState, name: &str, healthy: bool, why: &str) {
    if healthy {
        tracing::info!(backend = %name, healthy, reason = why, "backend health changed");
    } else {
        tracing::warn!(backend = %name, healthy, reason = why, "backend health changed");
    }
    state.events.push(Event::BackendHealth {
        name: name.to_owned(),
        healthy,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_split_like_the_test_endpoint_reads_them() {
        assert_eq!(
            split_target("a.example:443"),
            Some(("a.example".into(), 443))
        );
        assert_eq!(split_target("[::1]:80"), Some(("::1".into(), 80)));
        assert_eq!(split_target(":80"), None);
        assert_eq!(split_target("host"), None);
        assert_eq!(split_target("host:99999"), None);
    }
}
