//! Everything a request's pipeline needs, built once from the config, and each server
//! worker's handle on it.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::compaction::compactor::Compactor;
use crate::compaction::rewrite::COUNTED_OUTCOMES;
use crate::config::{Config, ConfigError};
use crate::dialect::{self, check_apis, summary_api_named, DIALECTS};
use crate::observe::metrics::{Metrics, MetricsError};
use crate::pipeline::observer::Observer;
use crate::pipeline::sessions::RecentSessions;
use crate::tokens::catalog::ModelCatalog;
use crate::tokens::counter::TokenCounter;
use crate::transport::events::EventBound;
use crate::transport::upstream::{Connections, Upstreams};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

pub struct AppState {
    pub config: Config,
    pub upstreams: Upstreams,
    pub catalog: Arc<ModelCatalog>,
    pub counter: TokenCounter,
    pub metrics: Metrics,
    pub compactor: Arc<Compactor>,
    /// How much of a stream event its readers hold.
    pub events: EventBound,
    /// Observe mode's compactor and sessions.
    pub observer: Observer,
    /// The recent sessions the admin listener shows; none unless `[admin] listen` is set.
    pub recent: Option<RecentSessions>,
    /// False once shutdown begins, so load balancers stop sending new work.
    pub ready: AtomicBool,
}

impl AppState {
    pub fn new(config: Config) -> Result<AppState, StartError> {
        let catalog = Arc::new(ModelCatalog::new(
            config.models.clone(),
            config.tokens.clone(),
        ));
        let counter = TokenCounter::new(config.tokens.unknown_model_margin);
        let metrics = Metrics::new(
            &config.metrics.models,
            catalog.families(),
            DIALECTS.iter().map(|wire| wire.route),
        )?;
        for (name, model) in &config.models {
            if model.price.is_some() {
                metrics.show_spend(metrics.for_model(name, &catalog.resolve(name)));
            }
        }
        for (action, cache) in COUNTED_OUTCOMES {
            metrics
                .compactions
                .with_label_values(&[action.name(), cache.name()]);
        }
        check_apis(&config)?;
        let mut connections = Connections::new(
            &config,
            metrics.upstream_failures.clone(),
            dialect::key_headers(),
        );
        connections.events.uninspected = Some(metrics.uninspected_events.clone());
        let upstreams = Upstreams::from_config(&config, &connections)?;
        let compactor = Arc::new(Compactor::new(
            &config,
            catalog.clone(),
            metrics.cache_errors.clone(),
            metrics.summarize_seconds.clone(),
            (metrics.summarizer_health.clone(), &metrics.forms),
            &connections,
            summary_api_named(&config.summarizer.api)?,
        )?);
        let observer = Observer::new(&config, catalog.clone(), &metrics, &connections)?;
        let recent = (!config.admin.listen.is_empty())
            .then(|| RecentSessions::new(config.admin.sessions, config.admin.requests));
        Ok(AppState {
            observer,
            recent,
            config,
            upstreams,
            catalog,
            counter,
            metrics,
            compactor,
            events: connections.events,
            ready: AtomicBool::new(true),
        })
    }
}

/// One server worker's handle on the shared state, cloned for each request it serves. Every
/// clone of the state's own `Arc` writes its reference count, and with every worker doing so
/// for every request, that cache line kept moving between the cores; each worker's handle
/// has lines of its own.
#[repr(align(128))]
pub struct Worker {
    pub state: Arc<AppState>,
}
