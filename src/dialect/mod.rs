//! One folder per API that condenser compacts, the one home of its wire format: its
//! request's stages (`stages::Dialect`), its name, path and route label, its replies' usage,
//! its error shape, how it takes a key and how a summary is asked in it (OpenAI's two APIs
//! share theirs: `openai.rs`). `registry!` below
//! lists them: a new API is one folder and one line there. Everything else that tells the
//! APIs apart reads the registry: `summarizer.api` and `--api` take `Dialect::NAME`s, the
//! server routes what each `Dialect::compacts` and passes through what each `serves`, and the
//! metrics know each `Dialect::ROUTE`.

pub mod chat;
pub mod gemini;
pub mod messages;
pub mod openai;
pub mod recall;
pub mod request;
pub mod responses;
pub mod stages;

use std::future::Future;
use std::sync::LazyLock;

use hyper::header::{HeaderMap, HeaderName};
use hyper::Response;
use serde_json::Value;

use crate::compaction::summary_api::SummaryEndpoint;
use crate::config::{Config, ConfigError};
use crate::error::ProxyError;
use crate::observe::metrics::Route;
use crate::transport::body::ProxyBody;
use crate::transport::upstream::KeyStyle;
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
    /// Why a query is refused in its API (`Dialect::refused_query`).
    pub refused_query: fn(Option<&str>) -> Option<String>,
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
            refused_query: D::refused_query,
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

/// Every request header a key may come in, each dialect's (`KeyStyle::headers`) once, in the
/// registry's order. The layers below take it as data: what says a caller sent its own key,
/// what a reply must not echo, what a summary paid by the caller carries, and who a caller
/// is when `cache.scope_headers` is left out.
pub fn key_headers() -> &'static [HeaderName] {
    static KEY_HEADERS: LazyLock<Vec<HeaderName>> = LazyLock::new(|| {
        let mut names: Vec<HeaderName> = Vec::new();
        for name in DIALECTS.iter().flat_map(|wire| wire.key_style.headers()) {
            let name = HeaderName::from_static(name);
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    });
    &KEY_HEADERS
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
/// which Anthropic's and Google's APIs share with OpenAI's), the API of the caller's key: the
/// first dialect whose own key header or query parameter the caller sent (Anthropic's for
/// `x-api-key`, Google's for `x-goog-api-key` or `?key=`), Anthropic's for
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
        let by_key = DIALECTS
            .iter()
            .map(|wire| wire.key_style)
            .find(|style| style.sent_by(headers, query));
        let key_style = by_key.unwrap_or(if headers.contains_key(messages::VERSION_HEADER) {
            messages::Messages::KEY_STYLE
        } else {
            openai::KEY_STYLE
        });
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

    /// Why a request with this query is refused in the path's API, when it is.
    pub fn refused_query(&self, query: Option<&str>) -> Option<String> {
        self.path_of.and_then(|wire| (wire.refused_query)(query))
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

/// What every dialect's error-shape test is made of.
#[cfg(test)]
pub mod error_cases {
    use http_body_util::BodyExt;
    use hyper::Response;
    use serde_json::Value;

    use crate::error::ProxyError;
    use crate::transport::body::ProxyBody;

    /// Errors condenser answers with, one of each kind of status, and the status each takes.
    pub fn samples() -> [(ProxyError, u16); 6] {
        [
            (
                ProxyError::InvalidJson(serde_json::from_str::<Value>("").unwrap_err()),
                400,
            ),
            (ProxyError::BodyTooLarge { limit: 9 }, 413),
            (ProxyError::NotFound("/x".into()), 404),
            (ProxyError::UpstreamUnreachable("refused".into()), 502),
            (ProxyError::UpstreamTimeout(5), 504),
            (ProxyError::ClientLeft, 499),
        ]
    }

    /// Checks that `error_response` answers each of the `samples` with its status and the
    /// body `shape` writes of that status, the error's message and the sample's `name` (the
    /// dialect's word for its kind).
    pub async fn check_shape(
        error_response: fn(&ProxyError) -> Response<ProxyBody>,
        names: [&str; 6],
        shape: impl Fn(u16, String, &str) -> Value,
    ) {
        for ((error, status), name) in samples().into_iter().zip(names) {
            let response = error_response(&error);
            assert_eq!(response.status().as_u16(), status, "{error}");
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let body: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body, shape(status, error.to_string(), name));
        }
    }
}

/// What the dialects' splice tests share: an agent's request compacted with a summary, a cut
/// output and the recall tool, written out by splice and by the tree.
#[cfg(test)]
pub mod splice_cases {
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;
    use serde_json::Value;

    use crate::compaction::plan::Split;
    use crate::compaction::rewrite::{Action, ArchiveScope, CacheOutcome, Rewrite};
    use crate::compaction::shorten::Shorten;
    use crate::compaction::summary::Summary;
    use crate::config::ContextConfig;
    use crate::config::{Config, RecallConfig};
    use crate::dialect::request::{laid_out, read_fields, Layout, SentRanges};
    use crate::dialect::stages::{count_as_sent, write_compaction, Counting, Dialect, Settings};
    use crate::tokens::catalog::ModelCatalog;
    use crate::tokens::counter::TokenCounter;
    use crate::tokens::encoding::Encoding;

    /// `body` (pretty-printed, so that copied items differ in text from written ones)
    /// compacted from `kept_from` on with a summary, the output at `cut` cut and recall
    /// offered; the body spliced and the rewritten tree, each as a JSON value, and whether
    /// anything was copied.
    pub fn spliced_and_tree<D: Dialect>(
        body: &Value,
        kept_from: usize,
        cut: usize,
    ) -> (Value, Value, bool) {
        let sent = Bytes::from(serde_json::to_vec_pretty(body).unwrap());
        // Parsed whole, as the full path parses it, for the tree; and as its raw stage planned
        // it, its items left as sent, for the splice.
        let mut whole = D::parse(&sent, D::PATH).unwrap();
        let stage = D::RAW_STAGE.unwrap();
        let raw = read_fields(&sent, &stage.fields).unwrap();
        let ranges = SentRanges::of(&sent, (&raw.items, &raw.parts), &stage.fields);
        let mut request = D::parse_planned(&sent, D::PATH, ranges).unwrap();
        let split = Split {
            head: 0,
            tail_start: kept_from,
            task: None,
            ahead: kept_from,
            summary_ends: vec![kept_from],
            shorten: Vec::new(),
            recent_start: raw.items.len() - 1,
            estimated_tokens: 0,
        };
        let rewrite = Rewrite {
            summary: Some(Arc::new(Summary::story_so_far(kept_from))),
            kept_from,
            pinned: None,
            cuts: vec![Shorten {
                index: cut,
                tokens: 2000,
                keep_tokens: 50,
            }],
            action: Action::Summarized,
            cache: CacheOutcome::Hit,
            summarized: kept_from,
            waited: Duration::ZERO,
            archive: Some(ArchiveScope {
                caller: [0; 32],
                conversation: "c0ffee".into(),
                bindings: Default::default(),
            }),
        };
        let settings = ContextConfig::default();
        let wire =
            write_compaction::<D>(&mut request, &split, &rewrite, &settings, Encoding::O200k);
        assert!(wire.is_some(), "recall offered");
        write_compaction::<D>(&mut whole, &split, &rewrite, &settings, Encoding::O200k);
        let tree = Value::Object(D::body_mut(&mut whole).clone());
        assert!(D::splice(&request).is_some(), "spliced");
        let (out, _, layout) = D::outgoing_body(request, sent, true).unwrap();
        // Read where it was written, the body counts as it does read afresh.
        let layout = layout.expect("laid out");
        assert!(
            laid_out(&out, &layout, &stage.fields).is_some(),
            "read as written"
        );
        let counted = |layout: Option<&Layout>| {
            let config = Config::default();
            let catalog = ModelCatalog::new(Default::default(), Default::default());
            let counter = TokenCounter::new(0.1);
            let counting = Counting {
                config: &config,
                catalog: &catalog,
                counter: &counter,
            };
            let settings = Settings {
                context: &settings,
                recall: RecallConfig::default(),
            };
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let sent = (&out, layout);
            let count = runtime
                .block_on(count_as_sent::<D>(counting, sent, D::PATH, settings))
                .unwrap();
            (count.per_message, count.fixed, count.total, count.raw_total)
        };
        assert_eq!(counted(Some(&layout)), counted(None));
        let copied = out.windows(7).any(|w| w == b"\n      ");
        (serde_json::from_slice(&out).unwrap(), tree, copied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENAI: KeyStyle = openai::KEY_STYLE;
    const ANTHROPIC: KeyStyle = messages::Messages::KEY_STYLE;
    const GOOGLE: KeyStyle = gemini::Gemini::KEY_STYLE;

    #[test]
    fn the_key_headers_are_every_dialects_each_once() {
        let names: Vec<&str> = key_headers().iter().map(HeaderName::as_str).collect();
        assert_eq!(
            names,
            ["authorization", "api-key", "x-api-key", "x-goog-api-key"]
        );
    }

    #[test]
    fn a_path_is_its_dialects_and_so_is_every_path_under_it() {
        for (path, style) in [
            ("/v1/messages", ANTHROPIC),
            ("/v1/messages/count_tokens", ANTHROPIC),
            ("/v1/messagesx", OPENAI),
            ("/v1/chat/completions", OPENAI),
            ("/v1/responses/compact", OPENAI),
            ("/v1/models", OPENAI),
            ("/v1beta/models/gemini-2.5-pro:countTokens", GOOGLE),
            ("/v1/models/gemini-2.5-pro:generateContent", GOOGLE),
            ("/v1/models/gpt-4o", OPENAI),
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
        assert_eq!(api(None, None), (OPENAI, vec!["chat", "responses"]));
        assert_eq!(api(Some("x-api-key"), None), (ANTHROPIC, vec!["messages"]));
        assert_eq!(
            api(Some("anthropic-version"), None),
            (ANTHROPIC, vec!["messages"])
        );
        assert_eq!(api(Some("x-goog-api-key"), None), (GOOGLE, vec!["gemini"]));
        assert_eq!(api(None, Some("key=k")), (GOOGLE, vec!["gemini"]));
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
