//! Commands from the control plane to the data plane through a bounded queue. The control plane
//! only ever `try_send`s (never waits on a full queue) and awaits the reply; core 0 serves them.

use crate::engine::CoreContext;
use crate::snapshot::Backend;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub enum Command {
    /// Open a real connection to `host:port` through `backend`, then close it.
    TestBackend {
        backend: Arc<Backend>,
        host: String,
        port: u16,
        timeout: Duration,
        /// How long the attempt took, and why it failed.
        reply: futures::channel::oneshot::Sender<(Duration, Result<(), String>)>,
    },
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
            host,
            port,
            timeout,
            reply,
        } => {
            let started = Instant::now();
            let outcome = crate::proxied::dial_within(ctx, &backend, &host, port, timeout).await;
            let took = started.elapsed();
            let result = outcome.map(|_| ()).map_err(|e| e.to_string());
            let _ = reply.send((took, result));
        }
    }
}
