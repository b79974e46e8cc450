//! What a request asks of condenser itself, in its headers: a mode (`x-condenser-mode`)
//! and a profile of `[context]` settings (`x-condenser-profile`).

use std::borrow::Cow;

use hyper::header::{HeaderMap, HeaderName, HeaderValue};

use crate::compaction::plan::Mode;
use crate::config::{Config, ContextConfig, RecallConfig};
use crate::error::ProxyError;

pub const MODE_HEADER: HeaderName = HeaderName::from_static("x-condenser-mode");
pub const PROFILE_HEADER: HeaderName = HeaderName::from_static("x-condenser-profile");

/// The request headers addressed to condenser, found in one pass over the few headers a
/// client sends: a hashed lookup of each of these long names costs more than the pass.
#[derive(Default)]
pub struct Directives<'a> {
    mode: Option<&'a HeaderValue>,
    profile: Option<&'a HeaderValue>,
}

impl<'a> Directives<'a> {
    /// The first value of each, as `HeaderMap::get` would find.
    pub fn of(headers: &'a HeaderMap) -> Directives<'a> {
        let mut found = Directives::default();
        for (name, value) in headers {
            if *name == MODE_HEADER {
                found.mode.get_or_insert(value);
            } else if *name == PROFILE_HEADER {
                found.profile.get_or_insert(value);
            }
        }
        found
    }
}

/// The `[context]` settings for this request, after `x-condenser-profile`: the config's own
/// unless a profile is named, since most requests name none.
pub fn settings_for<'a>(
    config: &'a Config,
    directives: &Directives,
) -> Result<Cow<'a, ContextConfig>, ProxyError> {
    match directives.profile.map(|v| v.to_str()) {
        None => Ok(Cow::Borrowed(&config.context)),
        Some(Ok(name)) => config
            .context_for(Some(name))
            .map(Cow::Owned)
            .ok_or_else(|| {
                ProxyError::invalid(format!("{PROFILE_HEADER}: no profile named {name:?}"), None)
            }),
        Some(Err(_)) => Err(ProxyError::invalid(
            format!("{PROFILE_HEADER} is not valid text"),
            None,
        )),
    }
}

/// The `[recall]` settings with the request's profile applied; the profile is known to
/// exist once `settings_for` accepted it.
pub fn recall_for(config: &Config, directives: &Directives) -> RecallConfig {
    let profile = directives.profile.and_then(|v| v.to_str().ok());
    config.recall_for(profile).unwrap_or(config.recall)
}

/// The request's mode: its header's, else its settings' (`[context] mode`, or its profile's).
pub fn mode_for(directives: &Directives, settings: &ContextConfig) -> Result<Mode, ProxyError> {
    match directives.mode {
        None => Ok(settings.mode),
        Some(value) => value.to_str().ok().and_then(Mode::parse).ok_or_else(|| {
            ProxyError::invalid(format!("{MODE_HEADER} must be {}", Mode::NAMES), None)
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_and_mode_follow_the_headers_and_name_their_problems() {
        let mut config = Config::default();
        config.profiles.insert(
            "lean".into(),
            crate::config::Profile {
                max_messages: Some(7),
                ..Default::default()
            },
        );
        let mut headers = HeaderMap::new();
        let settings = settings_for(&config, &Directives::of(&headers)).unwrap();
        assert!(matches!(settings, Cow::Borrowed(s) if std::ptr::eq(s, &config.context)));
        assert_eq!(
            mode_for(&Directives::of(&headers), &settings).unwrap(),
            Mode::Auto
        );
        let observing = ContextConfig {
            mode: Mode::Observe,
            ..ContextConfig::default()
        };
        assert_eq!(
            mode_for(&Directives::of(&headers), &observing).unwrap(),
            Mode::Observe
        );
        headers.insert("x-condenser-profile", HeaderValue::from_static("lean"));
        headers.insert("x-condenser-mode", HeaderValue::from_static("Force"));
        assert_eq!(
            settings_for(&config, &Directives::of(&headers))
                .unwrap()
                .max_messages,
            7
        );
        assert_eq!(
            mode_for(&Directives::of(&headers), &observing).unwrap(),
            Mode::Force
        );
        let message = |error: ProxyError| error.to_string();
        headers.insert("x-condenser-profile", HeaderValue::from_static("nope"));
        headers.insert("x-condenser-mode", HeaderValue::from_static("sometimes"));
        assert_eq!(
            message(settings_for(&config, &Directives::of(&headers)).unwrap_err()),
            message(ProxyError::invalid(
                "x-condenser-profile: no profile named \"nope\"",
                None
            ))
        );
        assert_eq!(
            message(mode_for(&Directives::of(&headers), &observing).unwrap_err()),
            message(ProxyError::invalid(
                "x-condenser-mode must be auto, off, force or observe",
                None
            ))
        );
        headers.insert(
            "x-condenser-profile",
            HeaderValue::from_bytes(b"caf\xe9").unwrap(),
        );
        assert_eq!(
            message(settings_for(&config, &Directives::of(&headers)).unwrap_err()),
            message(ProxyError::invalid(
                "x-condenser-profile is not valid text",
                None
            ))
        );
    }
}
