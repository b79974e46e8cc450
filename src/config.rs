//! `config.toml`: every key optional, unknown keys rejected by name.

mod context;
mod error;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::tokens::catalog::{ModelOverride, TokensConfig};
pub use context::{
    tool_cut, ContextConfig, Mode, OnFailure, Profile, RecallConfig, RecallOverride, SummaryRole,
    ToolPolicy,
};
pub use error::ConfigError;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub admin: AdminConfig,
    pub upstream: UpstreamConfig,
    pub routes: Vec<RouteConfig>,
    pub context: ContextConfig,
    pub summarizer: SummarizerConfig,
    pub cache: CacheConfig,
    pub recall: RecallConfig,
    pub tokens: TokensConfig,
    pub metrics: MetricsConfig,
    pub models: BTreeMap<String, ModelOverride>,
    pub profiles: BTreeMap<String, Profile>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub listen: String,
    pub max_body_bytes: usize,
    pub shutdown_grace_secs: u64,
    /// Event-loop threads, each accepting on the shared listener, with its own upstream
    /// pools; 0 = one per CPU.
    pub workers: usize,
    /// A client connection that has not sent a request's head this long after it opened (or
    /// after its last response) is closed.
    pub header_read_timeout_secs: u64,
    /// A request body not received whole this long after its head (plus a second for each
    /// 64 KiB received: a large body must keep up that rate) gets 408, and its connection is
    /// closed.
    pub body_read_timeout_secs: u64,
    /// The most one event of a stream is held to be read (for usage, recall and keys); a
    /// larger one is relayed uninspected, and counted.
    pub max_event_bytes: usize,
}

impl ServerConfig {
    pub fn worker_count(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            max_body_bytes: 32 * 1024 * 1024,
            shutdown_grace_secs: 30,
            workers: 0,
            header_read_timeout_secs: 30,
            body_read_timeout_secs: 60,
            max_event_bytes: 64 * 1024 * 1024,
        }
    }
}

/// The optional second listener: `GET /sessions`, the recent sessions drawn as `condenser
/// replay --html` draws one. Never on the proxy's port: its page is the operator's.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Its address; empty: no second listener, and nothing recorded for it.
    pub listen: String,
    /// The sessions it keeps, the least recently seen let go first.
    pub sessions: usize,
    /// The requests it keeps of each session, its oldest let go first.
    pub requests: usize,
    /// Whether its page shows what the model was sent (prompt text); off, only counts.
    pub prompt_text: bool,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: String::new(),
            sessions: 20,
            requests: 500,
            prompt_text: false,
        }
    }
}

impl AdminConfig {
    /// Its address parses, and is not the proxy's port: the page would otherwise answer
    /// on the port clients are given.
    fn validate(&self, server: &ServerConfig) -> Result<(), ConfigError> {
        if self.listen.is_empty() {
            return Ok(());
        }
        let admin = self
            .listen
            .parse::<SocketAddr>()
            .map_err(|e| ConfigError::Invalid(format!("admin.listen {:?}: {e}", self.listen)))?;
        let proxy = server.listen.parse::<SocketAddr>().ok();
        if proxy.is_some_and(|proxy| proxy.port() == admin.port() && admin.port() != 0) {
            return Err(ConfigError::Invalid(format!(
                "admin.listen {:?} is the proxy's port (server.listen {:?}): give the admin listener a port of its own",
                self.listen, server.listen
            )));
        }
        if self.sessions == 0 || self.requests == 0 {
            return Err(ConfigError::Invalid(
                "admin.sessions and admin.requests must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    pub base_url: String,
    pub api_key_env: String,
    pub timeout_secs: u64,
    /// How long an idle upstream connection is kept for reuse; 0 keeps none.
    pub idle_timeout_secs: u64,
    /// The APIs it speaks (`routes[].apis`).
    pub apis: Vec<String>,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com".into(),
            api_key_env: String::new(),
            timeout_secs: 600,
            idle_timeout_secs: 60,
            apis: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RouteConfig {
    pub models: Vec<String>,
    pub base_url: String,
    pub api_key_env: String,
    /// The APIs its upstream speaks, by dialect name (checked when the state is built:
    /// `dialect::check_apis`); empty: those of the provider at its host (`speaks`), else any.
    pub apis: Vec<String>,
}

/// The APIs an upstream speaks: the ones listed, else those of the provider whose host its
/// base URL names (at no path but an API version), else `None`, any. The well-known hosts are
/// named so that a key for one provider never goes to another's host by default; a host is
/// compared as DNS reads it, in lower case and without a trailing dot (`API.OpenAI.com.` is
/// OpenAI's).
pub fn speaks(base_url: &str, apis: &[String]) -> Option<Vec<String>> {
    if !apis.is_empty() {
        return Some(apis.to_vec());
    }
    let uri = base_url.parse::<hyper::Uri>().ok()?;
    let path = uri.path().trim_end_matches('/');
    if !matches!(path, "" | "/v1" | "/v1beta") {
        return None;
    }
    let host = uri.host()?.trim_end_matches('.').to_ascii_lowercase();
    let provider: &[&str] = match host.as_str() {
        "api.openai.com" => &["chat", "responses"],
        "api.anthropic.com" => &["messages"],
        "generativelanguage.googleapis.com" => &["gemini"],
        _ => return None,
    };
    Some(provider.iter().map(|api| api.to_string()).collect())
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SummarizerConfig {
    pub model: String,
    pub base_url: String,
    pub api_key_env: String,
    pub max_summary_tokens: u32,
    /// Budget for the identifiers carried verbatim from the messages a summary replaces.
    pub max_artifact_tokens: u32,
    /// The name of the API the summarizer is called in (a registered dialect's, checked
    /// when the state is built: `dialect::summary_api_named`); `""` for the dialect of the
    /// request's route.
    pub api: String,
    pub timeout_secs: u64,
    /// Consecutive failures against one upstream that open the circuit breaker.
    pub breaker_failures: u32,
    /// How long an open breaker skips the summarizer.
    pub breaker_cooldown_secs: u64,
    /// How a summary is asked: through the session's own cached prefix, or as a prompt of
    /// its own.
    pub via: Via,
    /// How long the provider keeps a prompt's prefix cached: past it, `auto` asks apart.
    pub prompt_cache_secs: u64,
    /// The summarizer model's own window, in tokens; 0 for the catalog's. A span larger than
    /// it is folded in pieces that each fit.
    pub context_window: u64,
}

/// How a summary is asked (`summarizer.via`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// Through the session while its cache is warm and the summarizer is the session's own
    /// model, API, upstream and key; apart otherwise.
    Auto,
    /// Through the session whenever its last request can carry the question.
    Session,
    /// Always as a prompt of its own.
    Separate,
}

impl Default for SummarizerConfig {
    fn default() -> Self {
        Self {
            model: String::new(),
            base_url: String::new(),
            api_key_env: String::new(),
            max_summary_tokens: 1024,
            max_artifact_tokens: 512,
            api: String::new(),
            timeout_secs: 60,
            breaker_failures: 5,
            breaker_cooldown_secs: 30,
            via: Via::Auto,
            prompt_cache_secs: 300,
            context_window: 0,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    pub max_bytes: u64,
    pub ttl_secs: u64,
    pub redis_url: String,
    pub redis_key_prefix: String,
    pub redis_timeout_ms: u64,
    /// The request headers that name the caller: summaries and breakers never cross them.
    /// Left out, every header an API takes a key in (the dialects say which).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope_headers: Option<Vec<String>>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            max_bytes: 256 * 1024 * 1024,
            ttl_secs: 86400,
            redis_url: String::new(),
            redis_key_prefix: "condenser:".into(),
            redis_timeout_ms: 250,
            scope_headers: None,
        }
    }
}

impl CacheConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let invalid =
            |why: String| Err(ConfigError::Invalid(format!("cache.scope_headers: {why}")));
        let Some(names) = &self.scope_headers else {
            return Ok(());
        };
        if names.is_empty() {
            // An empty list would let every caller read every other caller's summaries.
            return invalid(
                "name at least one header, or leave it out for every header a key comes in".into(),
            );
        }
        for (i, name) in names.iter().enumerate() {
            if hyper::header::HeaderName::from_lowercase(name.as_bytes()).is_err() {
                return invalid(format!(
                    "{name:?} is not a header name written in lower case"
                ));
            }
            if names[..i].contains(name) {
                return invalid(format!("{name:?} is listed twice"));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Model names reported as their own `model` label, besides the built-in families.
    pub models: Vec<String>,
}

/// Command-line and environment overrides, applied over the file in that order.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    pub upstream: Option<String>,
}

impl Config {
    pub fn from_toml(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_toml(&text, &path.display().to_string())
    }

    /// The file named on the command line, else `CONDENSER_CONFIG`, else `./config.toml`
    /// when present, else the built-in defaults; then the overrides.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        let env_path = std::env::var_os("CONDENSER_CONFIG").map(PathBuf::from);
        let mut config = match path.map(Path::to_path_buf).or(env_path) {
            Some(path) => Config::from_file(&path)?,
            None if Path::new("config.toml").exists() => {
                Config::from_file(Path::new("config.toml"))?
            }
            None => Config::default(),
        };
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        if let Some(listen) = overrides.listen.clone().or_else(|| env("CONDENSER_LISTEN")) {
            config.server.listen = listen;
        }
        if let Some(upstream) = overrides
            .upstream
            .clone()
            .or_else(|| env("CONDENSER_UPSTREAM"))
        {
            config.upstream.base_url = upstream;
        }
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.server.listen.parse::<SocketAddr>().map_err(|e| {
            ConfigError::Invalid(format!("server.listen {:?}: {e}", self.server.listen))
        })?;
        self.admin.validate(&self.server)?;
        if self.server.body_read_timeout_secs == 0 {
            return Err(ConfigError::Invalid(
                "server.body_read_timeout_secs must be at least 1".into(),
            ));
        }
        validate_url("upstream.base_url", &self.upstream.base_url)?;
        for (i, route) in self.routes.iter().enumerate() {
            validate_url(&format!("routes[{i}].base_url"), &route.base_url)?;
            if route.models.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "routes[{i}].models must list at least one model glob"
                )));
            }
        }
        if !self.summarizer.base_url.is_empty() {
            validate_url("summarizer.base_url", &self.summarizer.base_url)?;
        }
        self.context.validate("context")?;
        self.cache.validate()?;
        self.recall.validate("recall")?;
        for (name, profile) in &self.profiles {
            self.context
                .with_profile(profile)
                .validate(&format!("profiles.{name}"))?;
            self.recall
                .with_override(profile.recall)
                .validate(&format!("profiles.{name}.recall"))?;
        }
        for (name, model) in &self.models {
            if let Some(encoding) = &model.encoding {
                if crate::tokens::encoding::Encoding::from_name(encoding).is_none() {
                    return Err(ConfigError::Invalid(format!(
                        "models.\"{name}\".encoding {encoding:?} is not one of cl100k_base, o200k_base, o200k_harmony"
                    )));
                }
            }
        }
        if !(0.0..=1.0).contains(&self.tokens.unknown_model_margin) {
            return Err(ConfigError::Invalid(
                "tokens.unknown_model_margin must be in [0, 1]".into(),
            ));
        }
        Ok(())
    }

    /// The `[context]` settings, with the named profile applied; `None` for an unknown name.
    pub fn context_for(&self, profile: Option<&str>) -> Option<ContextConfig> {
        match profile {
            None => Some(self.context.clone()),
            Some(name) => self
                .profiles
                .get(name)
                .map(|p| self.context.with_profile(p)),
        }
    }

    /// The `[recall]` settings, with the named profile's overrides; `None` for an unknown name.
    pub fn recall_for(&self, profile: Option<&str>) -> Option<RecallConfig> {
        match profile {
            None => Some(self.recall),
            Some(name) => self
                .profiles
                .get(name)
                .map(|p| self.recall.with_override(p.recall)),
        }
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }
}

fn validate_url(key: &str, value: &str) -> Result<(), ConfigError> {
    let uri = value
        .parse::<hyper::Uri>()
        .map_err(|e| ConfigError::Invalid(format!("{key}: not a URL: {e}")))?;
    // The URL would be shown in logs and check-config; a key belongs in `api_key_env`. The
    // value is not repeated, since it holds the password.
    if uri
        .authority()
        .is_some_and(|authority| authority.as_str().contains('@'))
    {
        return Err(ConfigError::Invalid(format!(
            "{key}: credentials in the URL (user:password@) are refused; give a key with api_key_env"
        )));
    }
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(host)) if !host.is_empty() => Ok(()),
        (Some("http" | "https"), _) => {
            Err(ConfigError::Invalid(format!("{key} {value:?}: no host")))
        }
        (scheme, _) => Err(ConfigError::Invalid(format!(
            "{key} {value:?}: scheme {} is not http or https",
            scheme.unwrap_or("(none)")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_a_configured_url_are_refused_without_repeating_them() {
        for (toml, key) in [
            (
                "[upstream]\nbase_url = \"http://user:hunter2@up:8000\"\n",
                "upstream.base_url",
            ),
            (
                "[[routes]]\nmodels = [\"x\"]\nbase_url = \"https://k:hunter2@up\"\n",
                "routes[0].base_url",
            ),
            (
                "[summarizer]\nbase_url = \"http://hunter2@up\"\n",
                "summarizer.base_url",
            ),
        ] {
            let error = Config::from_toml(toml, "t").unwrap_err().to_string();
            assert!(
                error.contains(key) && error.contains("credentials"),
                "{error}"
            );
            assert!(!error.contains("hunter2"), "{error}");
        }
    }

    #[test]
    fn recall_is_on_by_default_and_a_profile_overrides_only_what_it_names() {
        let config = Config::from_toml(
            "[recall]\nmax_tokens = 4000\n[profiles.quiet.recall]\nenabled = false\n[profiles.plain]\nmax_messages = 9\n",
            "t.toml",
        )
        .unwrap();
        let base = config.recall_for(None).unwrap();
        assert!(base.enabled);
        assert_eq!((base.max_rounds, base.max_tokens), (3, 4000));
        let quiet = config.recall_for(Some("quiet")).unwrap();
        assert!(!quiet.enabled);
        assert_eq!(quiet.max_tokens, 4000);
        assert_eq!(config.recall_for(Some("plain")), Some(base));
        assert_eq!(config.recall_for(Some("nobody")), None);
        let again = Config::from_toml(&config.to_toml(), "t").unwrap();
        assert_eq!(again.recall_for(Some("quiet")), Some(quiet));
    }

    #[test]
    fn recall_limits_that_cannot_work_are_refused_by_name() {
        for (toml, names) in [
            ("[recall]\nmax_rounds = 0\n", "recall.max_rounds"),
            (
                "[profiles.p.recall]\nmax_tokens = 10\n",
                "profiles.p.recall.max_tokens",
            ),
        ] {
            let error = Config::from_toml(toml, "t").unwrap_err().to_string();
            assert!(error.contains(names), "{error}");
        }
    }

    #[test]
    fn the_admin_listener_never_takes_the_proxys_port() {
        let admin = |toml: &str| Config::from_toml(toml, "t").map_err(|e| e.to_string());
        let same =
            admin("[server]\nlisten = \"127.0.0.1:8080\"\n[admin]\nlisten = \"0.0.0.0:8080\"\n");
        assert!(
            same.as_ref()
                .is_err_and(|e| e.contains("admin.listen") && e.contains("proxy's port")),
            "{same:?}"
        );
        assert!(admin("[admin]\nlisten = \"127.0.0.1:9090\"\n").is_ok());
        assert!(admin("[admin]\nlisten = \"here\"\n").is_err_and(|e| e.contains("admin.listen")));
        assert!(Config::default().admin.listen.is_empty());
        // --listen overrides the file before it is checked.
        let mut config = admin("[admin]\nlisten = \"127.0.0.1:9090\"\n").unwrap();
        config.server.listen = "127.0.0.1:9090".into();
        assert!(config.validate().is_err());
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::from_toml("[context]\ntriger_ratio = 0.5\n", "t.toml")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("triger_ratio"), "{err}");
    }

    #[test]
    fn profile_overrides_only_what_it_names() {
        let config = Config::from_toml(
            "[context]\nkeep_recent_messages = 4\n[profiles.research]\nmax_messages = 50\n",
            "t.toml",
        )
        .unwrap_or_default();
        let merged = config.context.with_profile(&config.profiles["research"]);
        assert_eq!(merged.max_messages, 50);
        assert_eq!(merged.keep_recent_messages, 4);
    }

    #[test]
    fn bad_ratio_is_rejected() {
        assert!(Config::from_toml("[context]\ntarget_ratio = 0.9\n", "t").is_err());
        assert!(Config::from_toml("[upstream]\nbase_url = \"ftp://x\"\n", "t").is_err());
    }

    #[test]
    fn an_upstream_speaks_its_listed_apis_else_its_providers_else_any() {
        let speaks = |url: &str, apis: &[&str]| {
            let apis: Vec<String> = apis.iter().map(|api| api.to_string()).collect();
            speaks(url, &apis)
        };
        assert_eq!(
            speaks("https://api.openai.com", &[]).unwrap(),
            ["chat", "responses"]
        );
        assert_eq!(
            speaks("https://api.anthropic.com/v1", &[]).unwrap(),
            ["messages"]
        );
        assert_eq!(
            speaks("https://generativelanguage.googleapis.com/v1beta/", &[]).unwrap(),
            ["gemini"]
        );
        // Google's OpenAI-compatible endpoint is not its own API's: said, or any.
        assert_eq!(
            speaks(
                "https://generativelanguage.googleapis.com/v1beta/openai",
                &[]
            ),
            None
        );
        assert_eq!(speaks("http://127.0.0.1:4000", &[]), None);
        // A host as DNS reads it: any case, a trailing dot or none.
        for url in [
            "https://API.OPENAI.COM",
            "https://api.openai.com.",
            "https://Api.OpenAI.com./v1",
        ] {
            assert_eq!(speaks(url, &[]).unwrap(), ["chat", "responses"], "{url}");
        }
        assert_eq!(
            speaks("https://API.Anthropic.COM.", &[]).unwrap(),
            ["messages"]
        );
        assert_eq!(
            speaks("https://api.openai.com", &["responses"]).unwrap(),
            ["responses"]
        );
    }

    #[test]
    fn scope_headers_are_lower_case_header_names_listed_once() {
        let scope =
            |list: &str| Config::from_toml(&format!("[cache]\nscope_headers = {list}\n"), "t");
        let config = scope(r#"["authorization", "x-user-id"]"#).unwrap();
        assert_eq!(
            config.cache.scope_headers.as_deref(),
            Some(&["authorization".to_string(), "x-user-id".to_string()][..])
        );
        // Left out, it is the dialects' key headers (`dialect::key_headers`).
        assert_eq!(Config::default().cache.scope_headers, None);
        assert!(Config::from_toml(&Config::default().to_toml(), "t").is_ok());
        for bad in [
            r#"[]"#,
            r#"["X-User-Id"]"#,
            r#"["x user"]"#,
            r#"["api-key", "api-key"]"#,
        ] {
            let err = scope(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("cache.scope_headers"), "{bad}: {err}");
        }
        let empty = scope("[]").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(empty.contains("leave it out"), "{empty}");
    }
}
