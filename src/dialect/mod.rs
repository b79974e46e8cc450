//! One folder per API that condenser compacts, the one home of its wire format: its
//! request's stages (`stages::Dialect`), its name, path and route label, its replies' usage,
//! its error shape, how it takes a key and how a summary is asked in it. `registry!` below
//! lists them: a new API is one folder and one line there. Everything else that tells the
//! APIs apart reads the registry: `summarizer.api` and `--api` take `Dialect::NAME`s, the
//! server routes what each `Dialect::compacts` and passes through what each `serves`, and the
//! metrics know each `Dialect::ROUTE`.

pub mod chat;
pub mod gemini;
pub mod messages;
pub mod recall;
pub mod request;
pub mod responses;
pub mod stages;

use std::future::Future;

use hyper::header::HeaderMap;
use hyper::Response;
use serde_json::Value;

use crate::compaction::summary_api::SummaryEndpoint;
use crate::config::{Config, ConfigError};
use crate::error::ProxyError;
use crate::observe::metrics::Route;
use crate::transport::body::ProxyBody;
use crate::transport::headers::query_key;
use crate::transport::upstream::{KeyStyle, X_API_KEY, X_GOOG_API_KEY};
use stages::Dialect;

/// What the rest of condenser needs of an API beyond its request's stages, as a value.
#[derive(Clone, Copy)]
pub struct Wire {
    pub api: Api,
    /// Its name in `summarizer.api` and `--api`.
    pub name: &'static str,
    /// The path its log line names.
    pub path: &'static str,
    /// Whether a `POST` to a path is one it compacts.
    pub compacts: fn(&str) -> bool,
    /// Whether a path is its API's.
    pub serves: fn(&str) -> bool,
    /// The model a path of its API names, if it names one there.
    pub model_in_path: fn(&str) -> Option<&str>,
    /// Its `route` label in metrics and in the log.
    pub route: Route,
    pub key_style: KeyStyle,
    /// Where and how a summary is asked in it.
    pub summary: SummaryEndpoint,
    pub written_for: fn(&Value) -> bool,
    pub error_response: fn(&ProxyError) -> Response<ProxyBody>,
}

impl Wire {
    const fn of<D: Dialect>(api: Api) -> Wire {
        Wire {
            api,
            name: D::NAME,
            path: D::PATH,
            compacts: D::compacts,
            serves: D::serves,
            model_in_path: D::model_in_path,
            route: D::ROUTE,
            key_style: D::KEY_STYLE,
            summary: D::SUMMARY_ENDPOINT,
            written_for: D::written_for,
            error_response: D::error_response,
        }
    }
}

/// Something done with a dialect's type, whichever it is: its stages are generic.
pub trait WithDialect {
    type Output;
    fn with<D: Dialect + 'static>(self) -> impl Future<Output = Self::Output>;
}

macro_rules! registry {
    ($($api:ident => $dialect:ty),* $(,)?) => {
        /// The APIs condenser speaks, one per dialect.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Api {
            $($api,)*
        }

        /// Every dialect, in the order their names are listed and a body is tried against
        /// them (`detect_api`).
        pub const DIALECTS: &[Wire] = &[$(Wire::of::<$dialect>(Api::$api)),*];

        /// Does `work` with the dialect of `api`.
        pub async fn with_dialect<W: WithDialect>(api: Api, work: W) -> W::Output {
            match api {
                $(Api::$api => work.with::<$dialect>().await,)*
            }
        }
    };
}

// A dialect a line: its `Api` variant and its type. `--api` and `summarizer.api`'s error list
// the names in this order.
registry! {
    Chat => chat::Chat,
    Responses => responses::Responses,
    Messages => messages::Messages,
    Gemini => gemini::Gemini,
}

/// The dialect named `name` (`Dialect::NAME`).
pub fn named(name: &str) -> Option<Wire> {
    DIALECTS.iter().find(|wire| wire.name == name).copied()
}

/// The API `summarizer.api` names, as the summarizer asks it: none for `""` (each request's
/// own), refused when no dialect has that name.
pub fn summary_api_named(name: &str) -> Result<Option<SummaryEndpoint>, ConfigError> {
    if name.is_empty() {
        return Ok(None);
    }
    named(name).map(|wire| Some(wire.summary)).ok_or_else(|| {
        let names: Vec<&str> = DIALECTS.iter().map(|wire| wire.name).collect();
        ConfigError::Invalid(format!(
            "summarizer.api {name:?} is not one of {} (or \"\" for the route's own)",
            names.join(", ")
        ))
    })
}

/// The API of a path: the dialect that serves it or a path above it.
pub fn for_path(path: &str) -> Option<Wire> {
    DIALECTS.iter().find(|wire| (wire.serves)(path)).copied()
}

/// The dialect that compacts a `POST` to `path` (`Dialect::compacts`).
pub fn compacting(path: &str) -> Option<Wire> {
    DIALECTS.iter().find(|wire| (wire.compacts)(path)).copied()
}

/// The API a request passed through is in, which picks its upstream and how a configured key
/// goes with it: the API of its path; for a path no dialect claims (`/v1/models`, `/v1/files`,
/// which Anthropic's and Google's APIs share with OpenAI's), the API of the caller's key:
/// Google's for `x-goog-api-key` or `?key=`, Anthropic's for `x-api-key` or
/// `anthropic-version`, else OpenAI's.
#[derive(Clone, Copy)]
pub struct PassThroughApi {
    /// The dialect whose path it is.
    path_of: Option<&'static Wire>,
    /// Its provider's key style: the path's dialect's, or the caller's.
    key_style: KeyStyle,
}

impl PassThroughApi {
    pub fn of(path: &str, headers: &HeaderMap, query: Option<&str>) -> PassThroughApi {
        if let Some(wire) = DIALECTS.iter().find(|wire| (wire.serves)(path)) {
            return PassThroughApi {
                path_of: Some(wire),
                key_style: wire.key_style,
            };
        }
        let key_style = if headers.contains_key(X_GOOG_API_KEY)
            || query_key(KeyStyle::XGoogApiKey, query).is_some()
        {
            KeyStyle::XGoogApiKey
        } else if headers.contains_key(X_API_KEY) || headers.contains_key("anthropic-version") {
            KeyStyle::XApiKey
        } else {
            KeyStyle::Bearer
        };
        PassThroughApi {
            path_of: None,
            key_style,
        }
    }

    /// Whether the dialect named `name` speaks it: the path's dialect, or on a shared path
    /// any of its provider's.
    pub fn spoken_by(&self, name: &str) -> bool {
        match self.path_of {
            Some(wire) => wire.name == name,
            None => named(name).is_some_and(|wire| wire.key_style == self.key_style),
        }
    }

    /// How a configured key goes with it.
    pub fn key_style(&self) -> KeyStyle {
        self.key_style
    }

    /// The model its path names, where its API names one there: Gemini's
    /// `models/{model}:{method}`, and on a shared path `/v1/models/{model}` (an OpenAI
    /// fine-tune's `ft:gpt-4o-mini:org::id` whole).
    pub fn model_in_path(self, path: &str) -> Option<&str> {
        match self.path_of {
            Some(wire) => (wire.model_in_path)(path),
            None => path
                .strip_prefix("/v1/models/")
                .filter(|model| !model.is_empty() && !model.contains('/')),
        }
    }

    /// The dialect whose name, listed in `apis`, would make an upstream speak it.
    fn dialect(&self) -> &'static Wire {
        self.path_of
            .or_else(|| {
                DIALECTS
                    .iter()
                    .find(|wire| wire.key_style == self.key_style)
            })
            .unwrap_or(&DIALECTS[0])
    }

    /// The 404 when no upstream speaks it, in its own error shape.
    pub fn unspoken(&self) -> Response<ProxyBody> {
        let dialect = self.dialect();
        (dialect.error_response)(&ProxyError::NoUpstreamSpeaks(dialect.name))
    }
}

/// Every API named by `[upstream] apis` and `[[routes]] apis` is a dialect's.
pub fn check_apis(config: &Config) -> Result<(), ConfigError> {
    let listed = std::iter::once(("upstream.apis".to_string(), &config.upstream.apis)).chain(
        config
            .routes
            .iter()
            .enumerate()
            .map(|(i, route)| (format!("routes[{i}].apis"), &route.apis)),
    );
    for (key, apis) in listed {
        if let Some(unknown) = apis.iter().find(|api| named(api).is_none()) {
            let names: Vec<&str> = DIALECTS.iter().map(|wire| wire.name).collect();
            return Err(ConfigError::Invalid(format!(
                "{key}: {unknown:?} is not one of {}",
                names.join(", ")
            )));
        }
    }
    Ok(())
}

/// The API a request body is written for: the first dialect whose `written_for` holds, else
/// chat.
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
            (
                "/v1beta/models/gemini-2.5-pro:countTokens",
                KeyStyle::XGoogApiKey,
            ),
            (
                "/v1/models/gemini-2.5-pro:generateContent",
                KeyStyle::XGoogApiKey,
            ),
            ("/v1/models/gpt-4o", KeyStyle::Bearer),
        ] {
            assert_eq!(
                PassThroughApi::of(path, &HeaderMap::new(), None).key_style(),
                style,
                "{path}"
            );
        }
        assert_eq!(
            for_path("/v1/responses/compact").map(|w| w.api),
            Some(Api::Responses)
        );
        assert!(for_path("/v1/models").is_none());
    }

    #[test]
    fn every_api_has_one_dialect_and_its_own_name_path_and_route() {
        for wire in DIALECTS {
            assert_eq!(named(wire.name).map(|w| w.api), Some(wire.api));
            // A summary is asked where the dialect compacts.
            let path = (wire.summary.path)("some-model");
            assert_eq!(compacting(&path).map(|w| w.api), Some(wire.api));
            assert_eq!(DIALECTS.iter().filter(|w| w.route == wire.route).count(), 1);
        }
        assert!(compacting("/v1/responses/compact").is_none());
    }

    #[test]
    fn apis_are_dialect_names() {
        let mut config = Config::default();
        config.upstream.apis = vec!["chat".into(), "gemini".into()];
        assert!(check_apis(&config).is_ok());
        config.routes.push(crate::config::RouteConfig {
            apis: vec!["anthropic".into()],
            ..Default::default()
        });
        let error = check_apis(&config).unwrap_err().to_string();
        assert!(
            error.contains(
                "routes[0].apis: \"anthropic\" is not one of chat, responses, messages, gemini"
            ),
            "{error}"
        );
    }

    #[test]
    fn a_shared_path_is_the_api_of_the_callers_key() {
        let api = |header: Option<&str>, query: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(name) = header {
                headers.insert(
                    hyper::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    hyper::header::HeaderValue::from_static("k"),
                );
            }
            let api = PassThroughApi::of("/v1/models", &headers, query);
            let speakers: Vec<&str> = DIALECTS
                .iter()
                .map(|wire| wire.name)
                .filter(|name| api.spoken_by(name))
                .collect();
            (api.key_style(), speakers)
        };
        assert_eq!(
            api(None, None),
            (KeyStyle::Bearer, vec!["chat", "responses"])
        );
        assert_eq!(
            api(Some("x-api-key"), None),
            (KeyStyle::XApiKey, vec!["messages"])
        );
        assert_eq!(
            api(Some("anthropic-version"), None),
            (KeyStyle::XApiKey, vec!["messages"])
        );
        assert_eq!(
            api(Some("x-goog-api-key"), None),
            (KeyStyle::XGoogApiKey, vec!["gemini"])
        );
        assert_eq!(
            api(None, Some("key=k")),
            (KeyStyle::XGoogApiKey, vec!["gemini"])
        );
    }

    #[test]
    fn the_summarizer_api_is_the_routes_own_or_a_named_one() {
        let api = |name: &str| {
            summary_api_named(name).map(|api| api.map(|api| (api.path)("gemini-2.5-pro")))
        };
        assert_eq!(api("").unwrap(), None);
        assert_eq!(api("messages").unwrap().as_deref(), Some("/v1/messages"));
        assert_eq!(api("responses").unwrap().as_deref(), Some("/v1/responses"));
        assert_eq!(
            api("gemini").unwrap().as_deref(),
            Some("/v1beta/models/gemini-2.5-pro:generateContent")
        );
        let error = api("grpc").unwrap_err().to_string();
        assert!(
            error.contains(
                "summarizer.api \"grpc\" is not one of chat, responses, messages, gemini"
            ),
            "{error}"
        );
    }
}
