//! One folder per API that condenser compacts, the one home of its wire format: its
//! request's stages (`stages::Dialect`), its path and route label, its replies' usage, its
//! error shape, how it takes a key and how a summary is asked in it. `registry!` below lists
//! them: a new API is one folder and one line there (and its name in `config::Api`). The
//! server routes each `Dialect::PATH` and the metrics know each `Dialect::ROUTE` from it.

pub mod chat;
pub mod messages;
pub mod recall;
pub mod request;
pub mod responses;
pub mod stages;

use std::future::Future;

use hyper::Response;
use serde_json::Value;

use crate::compaction::summary_api::{SummaryApi, SummaryEndpoint};
use crate::config::Api;
use crate::error::ProxyError;
use crate::observe::metrics::Route;
use crate::transport::body::ProxyBody;
use crate::transport::upstream::KeyStyle;
use stages::Dialect;

/// What the rest of condenser needs of an API beyond its request's stages, as a value.
#[derive(Clone, Copy)]
pub struct Wire {
    pub api: Api,
    /// The path it serves; the paths under it are its too.
    pub path: &'static str,
    /// Its `route` label in metrics and in the log.
    pub route: Route,
    pub key_style: KeyStyle,
    pub summary: &'static dyn SummaryApi,
    pub written_for: fn(&Value) -> bool,
    pub error_response: fn(&ProxyError) -> Response<ProxyBody>,
}

impl Wire {
    const fn of<D: Dialect>() -> Wire {
        Wire {
            api: D::API,
            path: D::PATH,
            route: D::ROUTE,
            key_style: D::KEY_STYLE,
            summary: D::SUMMARY,
            written_for: D::written_for,
            error_response: D::error_response,
        }
    }

    /// Whether `path` is this API's: its own, or one under it.
    fn serves(&self, path: &str) -> bool {
        path.strip_prefix(self.path)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }
}

/// Something done with a dialect's type, whichever it is: its stages are generic.
pub trait WithDialect {
    type Output;
    fn with<D: Dialect + 'static>(self) -> impl Future<Output = Self::Output>;
}

macro_rules! registry {
    ($($api:ident => $dialect:ty),* $(,)?) => {
        /// Every dialect, in the order a body is tried against them (`detect_api`).
        pub const DIALECTS: &[Wire] = &[$(Wire::of::<$dialect>()),*];

        /// Does `work` with the dialect of `api`.
        pub async fn with_dialect<W: WithDialect>(api: Api, work: W) -> W::Output {
            match api {
                $(Api::$api => work.with::<$dialect>().await,)*
            }
        }

        /// The dialect of `api`.
        pub fn wire(api: Api) -> Wire {
            match api {
                $(Api::$api => Wire::of::<$dialect>(),)*
            }
        }
    };
}

registry! {
    Responses => responses::Responses,
    Messages => messages::Messages,
    Chat => chat::Chat,
}

/// Where and how a summary is asked in `api`: what the compactor is built with.
pub fn summary_api(api: Api) -> SummaryEndpoint {
    let wire = wire(api);
    SummaryEndpoint {
        path: wire.path,
        key_style: wire.key_style,
        api: wire.summary,
    }
}

/// The API of a path: the dialect that serves it or a path above it.
pub fn for_path(path: &str) -> Option<Wire> {
    DIALECTS.iter().find(|wire| wire.serves(path)).copied()
}

/// The dialect that compacts a `POST` to `path`: the one whose own path it is (the paths
/// under it, `/v1/responses/compact` or `/v1/messages/count_tokens`, pass through).
pub fn compacting(path: &str) -> Option<Wire> {
    DIALECTS.iter().find(|wire| wire.path == path).copied()
}

/// How a configured key goes to `path`: as its API takes it, else as a bearer token.
pub fn key_style_for(path: &str) -> KeyStyle {
    for_path(path).map_or(KeyStyle::Bearer, |wire| wire.key_style)
}

/// The API a request body is written for: the first dialect whose `written_for` holds
/// (chat, tried last, takes any).
pub fn detect_api(body: &Value) -> Api {
    DIALECTS
        .iter()
        .find(|wire| (wire.written_for)(body))
        .map_or(Api::Chat, |wire| wire.api)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_its_dialects_and_so_is_every_path_under_it() {
        for (path, style) in [
            ("/v1/messages", KeyStyle::XApiKey),
            ("/v1/messages/count_tokens", KeyStyle::XApiKey),
            ("/v1/messagesx", KeyStyle::Bearer),
            ("/v1/chat/completions", KeyStyle::Bearer),
            ("/v1/responses/compact", KeyStyle::Bearer),
            ("/v1/models", KeyStyle::Bearer),
        ] {
            assert_eq!(key_style_for(path), style, "{path}");
        }
        assert_eq!(
            for_path("/v1/responses/compact").map(|w| w.api),
            Some(Api::Responses)
        );
        assert!(for_path("/v1/models").is_none());
    }

    #[test]
    fn every_api_has_one_dialect_and_its_own_path_and_route() {
        for api in [Api::Chat, Api::Responses, Api::Messages] {
            assert_eq!(wire(api).api, api);
            assert_eq!(DIALECTS.iter().filter(|w| w.api == api).count(), 1);
            assert_eq!(compacting(wire(api).path).map(|w| w.api), Some(api));
            let route = wire(api).route;
            assert_eq!(DIALECTS.iter().filter(|w| w.route == route).count(), 1);
        }
        assert!(compacting("/v1/responses/compact").is_none());
    }
}
