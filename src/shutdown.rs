//! Graceful shutdown: one token handed to every long-running task. Cancelled
//! by SIGINT/SIGTERM in the binary, or by a test when it is done.

use tokio_util::sync::CancellationToken;

/// A cloneable shutdown signal. `cancelled()` resolves once shutdown begins.
#[derive(Clone, Default)]
pub struct Shutdown {
    token: CancellationToken,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Begin shutdown; every clone observes it.
    pub fn trigger(&self) {
        self.token.cancel();
    }

    pub fn is_triggered(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves when shutdown begins.
    pub async fn cancelled(&self) {
        self.token.cancelled().await
    }

    /// A child signal: cancelled with its parent, or on its own.
    pub fn child(&self) -> Shutdown {
        Shutdown {
            token: self.token.child_token(),
        }
    }

    /// Triggers this signal on SIGINT or SIGTERM.
    pub fn trigger_on_signals(&self) {
        let this = self.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown signal received");
            this.trigger();
        });
    }
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
