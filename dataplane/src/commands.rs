//! Commands from the control plane to the data plane through a bounded queue. The control plane
//! only ever `try_send`s (never waits on a full queue) and awaits the reply; core 0 serves them.

use crate::engine::CoreContext;
use crate::snapshot::Backend;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a backend is tested, which decides what the attempt counts towards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestPurpose {
    /// `POST /api/v1/backends/{name}/test`: counted like a proxied connect (latency, errors,
    /// passive health).
    Manual,
    /// A scheduled active health check: judged by the control plane's checker only, so a
    /// failure is not counted twice and checks do not show up as traffic.
    HealthCheck,
}

pub enum Command {
    /// Open a real connection to `host:port` through `backend`, then close it.
    TestBackend {
        backend: Arc<Backend>,
        purpose: TestPurpose,
        host: String,
        port: u16,
        timeout: Duration,
        /// How long the attempt took, and why it failed.
        reply: futures::channel::oneshot::Sender<(Duration, Result<(), String>)>,
    },
    /// Run the mesh peer on this core (core 0 is the mesh's owner) until its stop flag.
    StartMesh(Box<crate::mesh::MeshStart>),
}

pub type CommandSender = async_channel::Sender<Command>;
pub type CommandReceiver = async_channel::Receiver<Command>;

pub fn channel() -> (CommandSender, CommandReceiver) {
    async_channel::bounded(64)
}

pub(crate) async fn serve(rx: CommandReceiver, ctx: Rc<CoreContext>) {
    while let Ok(cmd) = rx.recv().await {
        let ctx = ctx.clone();
        glommio::spawn_local(async move { handle(cmd, &ctx).await }).detach();
    }
}

async fn handle(cmd: Command, ctx: &CoreContext) {
    match cmd {
        Command::TestBackend {
            backend,
            purpose,
            host,
            port,
            timeout,
            reply,
        } => {
            let started = Instant::now();
            let outcome = match purpose {
                TestPurpose::Manual => {
                    crate::proxied::dial_within(ctx, &backend, &host, port, timeout).await
                }
                TestPurpose::HealthCheck => {
                    crate::proxied::probe(ctx, &backend, &host, port, timeout).await
                }
            };
            let took = started.elapsed();
            let result = outcome.map(|_| ()).map_err(|e| e.to_string());
            let _ = reply.send((took, result));
        }
        Command::StartMesh(start) => crate::mesh::run(*start).await,
    }
}
