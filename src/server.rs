//! The accept loop: HTTP/1.1 and h2c on one port, and a shutdown that drains in-flight
//! requests (streams included) for up to `shutdown_grace_secs`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::app::{AppState, StartError};
use crate::config::Config;
use crate::routes;

const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
const H2_KEEP_ALIVE: Duration = Duration::from_secs(30);

pub struct Server {
    listener: TcpListener,
    state: Arc<AppState>,
}

impl Server {
    pub async fn bind(config: Config) -> Result<Server, StartError> {
        let addr = config.server.listen.clone();
        let state = Arc::new(AppState::new(config)?);
        let listener = TcpListener::bind(&addr)
            .await
            .map_err(|source| StartError::Bind { addr, source })?;
        Ok(Server { listener, state })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn state(&self) -> Arc<AppState> {
        self.state.clone()
    }

    /// Serves until `shutdown` resolves, then stops accepting and drains.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let Server { listener, state } = self;
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(H2_KEEP_ALIVE);
        let graceful = GracefulShutdown::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        Err(error) => {
                            // Out of file descriptors and the like: back off instead of spinning.
                            tracing::warn!(%error, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    let state = state.clone();
                    let service = service_fn(move |request| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(routes::handle(state, request).await) }
                    });
                    let connection = builder
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .into_owned();
                    let connection = graceful.watch(connection);
                    tokio::spawn(async move {
                        if let Err(error) = connection.await {
                            tracing::debug!(%error, "connection ended with an error");
                        }
                    });
                }
                () = &mut shutdown => break,
            }
        }
        drop(listener);
        state.ready.store(false, Ordering::Relaxed);
        let grace = Duration::from_secs(state.config.server.shutdown_grace_secs);
        tracing::info!(
            grace_secs = grace.as_secs(),
            "shutting down: draining in-flight requests"
        );
        tokio::select! {
            () = graceful.shutdown() => tracing::info!("drained"),
            () = tokio::time::sleep(grace) => tracing::warn!("grace period over; closing remaining connections"),
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
