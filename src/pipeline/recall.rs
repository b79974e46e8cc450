//! Recall served by condenser: when upstream's reply to a request that offered
//! `condenser_recall` calls it, condenser answers from the archive and continues the request
//! upstream, up to `recall.max_rounds` rounds, and the client gets one ordinary reply. A
//! streamed reply is relayed as it comes; only a recall call's events are held back, and
//! each continuation's events are stitched into the same stream (`Stitched`). All of a
//! request's answers share one budget: the window's room left after what was forwarded and
//! what each round carried, so no continuation goes past the window.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::stream::{self, StreamExt};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Response};
use prometheus::IntCounter;
use serde_json::{Map, Value};
use tokio::sync::OnceCell;

use crate::compaction::compactor::Compactor;
use crate::compaction::recall::{self, Archived, RecallAnswer, RecallLimits};
use crate::compaction::rewrite::ArchiveScope;
use crate::compaction::summary::Key;
use crate::config::RecallConfig;
use crate::dialect::recall::{
    continuation_failed, Answered, RecallPolicy, RecallWire, Round, RoundCalls, Stitched,
};
use crate::dialect::stages::Dialect;
use crate::error::ProxyError;
use crate::pipeline::state::AppState;
use crate::tokens::encoding::Encoding;
use crate::tokens::rules::count_text;
use crate::transport::body::{full, read_body, BoxError, Gathered, ProxyBody};
use crate::transport::events::{EventBound, EventReader, Piece};
use crate::transport::headers::{content_coded, media_type_is};
use crate::transport::upstream::{KeyStyle, Upstream};

/// A whole reply is read to find its recall calls; a larger one is no completion.
const MAX_REPLY_BYTES: usize = 32 * 1024 * 1024;

/// What a tool result's message costs beside its text (its role, its call's id and the
/// framing around them), counted against the request's budget.
const ANSWER_FRAMING_TOKENS: u64 = 16;

/// Less room than this left in the window, and a call is answered that the budget is spent:
/// a few dozen tokens recall nothing useful.
const LEAST_ANSWER_TOKENS: u64 = 64;

pub const RECALLS_HEADER: HeaderName = HeaderName::from_static("x-condenser-recalls");

/// What a compacted request offered recall over: where its items are archived, and which
/// of the conversation's items its summary replaced or its stubs cut (what a query searches).
pub struct Recallable {
    pub archive: ArchiveScope,
    pub archived: Vec<usize>,
    pub wire: &'static dyn RecallWire,
}

/// Everything serving one request's recall calls needs, owned, so a streamed reply's rounds
/// can go on after the handler has returned its response.
pub(super) struct Recall {
    wire: &'static dyn RecallWire,
    compactor: Arc<Compactor>,
    upstream: Arc<Upstream>,
    path_and_query: String,
    key_style: KeyStyle,
    headers: HeaderMap,
    /// The request as forwarded, which each continuation extends.
    request: Bytes,
    /// The request as the client sent it, which still holds every item its summary and
    /// cuts took out, and how its dialect reads the conversation from it.
    sent: (Bytes, ConversationOf),
    archive: ArchiveScope,
    /// Which of the conversation's items were taken out: all that may be recalled.
    taken_out: Vec<usize>,
    /// Those items under their references, read at the first call.
    archived: OnceCell<Vec<Archived>>,
    limits: RecallLimits,
    /// The window's room left for this request's answers: usable less what was forwarded,
    /// less what each round's continuation carried and each answer took.
    room: AtomicU64,
    /// How the request's count scales a text's tokens (an estimated tokenizer's ratio):
    /// answers and carried rounds are counted as the request was.
    scale: f64,
    max_rounds: u32,
    outcomes: RecallCounters,
    /// How much of a stream event is held to read it.
    event_bound: EventBound,
    /// Recall calls answered so far, which the relay reads once the reply ends.
    pub served: Arc<AtomicU32>,
}

/// `condenser_recalls_total{route,outcome}` for one route, resolved once: calls answered
/// with archived items, answered with a tool error, not served because the reply also
/// called the client's tools, and continuations upstream did not take.
struct RecallCounters {
    served: IntCounter,
    error: IntCounter,
    skipped: IntCounter,
    failed: IntCounter,
}

/// What sending a request needs besides its body: where, and with which headers.
pub(super) struct Destination<'a> {
    pub upstream: &'a Arc<Upstream>,
    pub path_and_query: &'a str,
    pub headers: HeaderMap,
}

impl Recall {
    pub(super) fn new<D: Dialect>(
        state: &AppState,
        offered: Recallable,
        destination: Destination,
        (request, sent): (Bytes, Bytes),
        (config, encoding): (RecallConfig, Encoding),
        (room, scale): (u64, f64),
    ) -> Recall {
        let counters = |outcome| {
            state
                .metrics
                .recalls
                .with_label_values(&[D::ROUTE.name(), outcome])
        };
        Recall {
            wire: offered.wire,
            compactor: state.compactor.clone(),
            event_bound: state.events.clone(),
            upstream: destination.upstream.clone(),
            path_and_query: destination.path_and_query.to_string(),
            key_style: D::KEY_STYLE,
            headers: destination.headers,
            request,
            sent: (sent, conversation_of::<D>),
            archive: offered.archive,
            taken_out: offered.archived,
            archived: OnceCell::new(),
            limits: RecallLimits {
                max_tokens: config.max_tokens,
                encoding,
            },
            room: AtomicU64::new(room),
            scale,
            max_rounds: config.max_rounds,
            outcomes: RecallCounters {
                served: counters("served"),
                error: counters("error"),
                skipped: counters("skipped"),
                failed: counters("failed"),
            },
            served: Arc::new(AtomicU32::new(0)),
        }
    }

    /// Upstream's reply with every recall call in it served: a whole reply read, served and
    /// written out again; a streamed one relayed as it comes. An error is relayed as it came.
    /// A success condenser cannot read for recall calls (in a content coding, of another
    /// media type, not a JSON object, or a stream event over the bound) is an error in the
    /// dialect's shape, never relayed: the client would see the call of a tool it never
    /// offered.
    pub(super) async fn serve(
        self,
        response: Response<ProxyBody>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        if !response.status().is_success() {
            return Ok(response);
        }
        let headers = response.headers();
        if content_coded(headers) {
            return Err(unreadable(
                "it came in a content coding it was not asked for",
            ));
        }
        if media_type_is(headers, "text/event-stream") {
            Ok(self.streamed(response))
        } else if media_type_is(headers, "application/json") {
            self.whole(response).await
        } else {
            Err(unreadable("it is neither JSON nor an event stream"))
        }
    }

    /// The items the request's summary and cuts took out, under their references: read from
    /// the client's own request, so a reference always names this conversation's item
    /// (another history that opened alike has items at the same places). The archive gives
    /// what the request no longer holds, at all or whole: an item taken out before and masked
    /// by the client since (`masked_by_the_client`) is recalled as it was archived, whether
    /// or not this request took it out.
    async fn archived(&self) -> &[Archived] {
        self.archived
            .get_or_init(|| async {
                let (bytes, conversation_of) = &self.sent;
                let items: Vec<String> = conversation_of(bytes)
                    .unwrap_or_default()
                    .iter()
                    .map(Value::to_string)
                    .collect();
                let taken_out: HashSet<usize> = self.taken_out.iter().copied().collect();
                let masked_since = (0..items.len())
                    .filter(|i| !taken_out.contains(i) && masked_by_the_client(&items[*i]));
                let indices: Vec<usize> =
                    self.taken_out.iter().copied().chain(masked_since).collect();
                let references: Vec<String> = indices
                    .iter()
                    .map(|&i| recall::reference(&self.archive.conversation, i))
                    .collect();
                let mut texts: Vec<Option<Arc<str>>> = indices
                    .iter()
                    .map(|&i| items.get(i).map(|item| Arc::from(item.as_str())))
                    .collect();
                let lacking: Vec<usize> = (0..texts.len())
                    .filter(|&i| texts[i].as_deref().is_none_or(masked_by_the_client))
                    .collect();
                let mut from_archive = vec![false; texts.len()];
                // Each looked up where this history's own requests archived it: bound to
                // what was written before it, so another history's item at the same place,
                // with or without a key, is not found (`ArchiveScope::slot`).
                let lacking: Vec<(usize, Key)> = lacking
                    .into_iter()
                    .filter_map(|i| Some((i, self.archive.slot(indices[i])?)))
                    .collect();
                if !lacking.is_empty() {
                    let slots: Vec<Key> = lacking.iter().map(|&(_, slot)| slot).collect();
                    let found = self.compactor.cache().archive_get(&slots).await;
                    for ((i, _), text) in lacking.into_iter().zip(found) {
                        if text.is_some() {
                            texts[i] = text;
                            from_archive[i] = true;
                        }
                    }
                }
                // A masked item this request did not take out, and that no earlier one
                // archived, reads here as the request already shows it: nothing to recall.
                let recallable = |i: usize| i < self.taken_out.len() || from_archive[i];
                references
                    .into_iter()
                    .zip(texts)
                    .enumerate()
                    .filter(|(i, _)| recallable(*i))
                    .filter_map(|(_, (reference, text))| Some((reference, text?)))
                    .collect()
            })
            .await
    }

    /// What carrying `round` into a continuation adds to the prompt: what upstream says it
    /// wrote, or the round as text when that says less (an estimate over, never under).
    fn carried(&self, round: &Value) -> u64 {
        let written = round
            .pointer(self.wire.fields().output_tokens)
            .and_then(Value::as_u64)
            .unwrap_or(0);
        written.max(self.tokens(&round.to_string()))
    }

    /// A text's tokens as the request's count has them.
    fn tokens(&self, text: &str) -> u64 {
        (f64::from(count_text(self.limits.encoding, text)) * self.scale).ceil() as u64
    }

    /// What another round would need beside this one's: its own reply carried (guessed as
    /// large as this one's) and an answer that says no more fits.
    fn another_round(carried: u64) -> u64 {
        carried + LEAST_ANSWER_TOKENS + ANSWER_FRAMING_TOKENS
    }

    /// condenser's answers to one round's recall calls, within the room the request has
    /// left once the round, the reply that made them, is carried into the continuation; and
    /// whether the continuation is the last (no room for another round, or the round limit).
    async fn answer(&self, round: &Round, number: u32) -> (Vec<RecallAnswer>, bool) {
        let archived = self.archived().await;
        let carried = self.carried(&round.reply);
        self.take_room(carried);
        let mut last = number == self.max_rounds;
        let mut answers = Vec::with_capacity(round.calls.recall.len());
        for call in &round.calls.recall {
            let left = self.room.load(Ordering::Relaxed);
            // Room for another round is kept while one may follow, unless that leaves too
            // little to answer: then this round is the last.
            let kept = if last {
                0
            } else {
                Self::another_round(carried)
            };
            if left.saturating_sub(kept + ANSWER_FRAMING_TOKENS) < LEAST_ANSWER_TOKENS {
                last = true;
            }
            let kept = if last { 0 } else { kept };
            let room = left.saturating_sub(kept + ANSWER_FRAMING_TOKENS);
            let answer = if room < LEAST_ANSWER_TOKENS {
                RecallAnswer {
                    text: format!(
                        "not recalled: this request's window has {room} tokens left, too few \
                         for more recall; answer from what you have"
                    ),
                    is_error: true,
                }
            } else {
                // The answer's own count is unscaled.
                let unscaled = (room as f64 / self.scale) as u64;
                let limits = RecallLimits {
                    max_tokens: self
                        .limits
                        .max_tokens
                        .min(u32::try_from(unscaled).unwrap_or(u32::MAX)),
                    ..self.limits
                };
                recall::answer(archived, &call.arguments, &limits)
            };
            self.take_room(self.tokens(&answer.text) + ANSWER_FRAMING_TOKENS);
            let counter = if answer.is_error {
                &self.outcomes.error
            } else {
                &self.outcomes.served
            };
            counter.inc();
            answers.push(answer);
        }
        self.served
            .fetch_add(round.calls.recall.len() as u32, Ordering::Relaxed);
        let room_for_another = self.room.load(Ordering::Relaxed) >= Self::another_round(carried);
        (answers, last || !room_for_another)
    }

    fn take_room(&self, tokens: u64) {
        // One task serves a request's rounds in turn: a load then a store loses nothing.
        let left = self.room.load(Ordering::Relaxed).saturating_sub(tokens);
        self.room.store(left, Ordering::Relaxed);
    }

    /// The request continued with this round's reply and its calls answered, sent upstream.
    async fn continue_round(
        &self,
        request: &mut Map<String, Value>,
        round: &Round,
        number: u32,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let (answers, last) = self.answer(round, number).await;
        let answered: Vec<Answered> = round
            .calls
            .recall
            .iter()
            .zip(&answers)
            .map(|(call, answer)| Answered {
                call,
                text: &answer.text,
                is_error: answer.is_error,
            })
            .collect();
        self.wire
            .continue_with(request, &round.reply, &answered, last);
        let body = serde_json::to_vec(request).map_err(ProxyError::Rewrite)?;
        let response = self
            .upstream
            .send(
                Method::POST,
                &self.path_and_query,
                self.key_style,
                self.headers.clone(),
                full(body),
            )
            .await;
        if !response.as_ref().is_ok_and(|r| r.status().is_success()) {
            self.outcomes.failed.inc();
        }
        response
    }

    fn request_tree(&self) -> Result<Map<String, Value>, ProxyError> {
        serde_json::from_slice(&self.request).map_err(ProxyError::Rewrite)
    }

    /// Whether a round's calls are served: recall calls only, within the round limit, and
    /// the round itself fits in the room the request has left (a model that called again
    /// when told not to gets no continuation past the window).
    fn serves(&self, round: &Round, rounds: u32) -> bool {
        let calls = &round.calls;
        if calls.client_calls && !calls.recall.is_empty() {
            self.outcomes.skipped.inc_by(calls.recall.len() as u64);
        }
        !calls.recall.is_empty()
            && !calls.client_calls
            && rounds < self.max_rounds
            && self.carried(&round.reply) + ANSWER_FRAMING_TOKENS
                <= self.room.load(Ordering::Relaxed)
    }

    async fn whole(self, response: Response<ProxyBody>) -> Result<Response<ProxyBody>, ProxyError> {
        let (mut head, body) = response.into_parts();
        let mut bytes = read_reply(body, &head.headers).await?;
        let Some(reply) = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .filter(Value::is_object)
        else {
            return Err(unreadable("it is not a JSON object"));
        };
        let mut round = Round {
            calls: RoundCalls::of(self.wire.parts(&reply)),
            reply,
        };
        if round.calls.recall.is_empty() {
            // No call of the tool: relayed as upstream wrote it, but for an echo of the tool.
            if self.wire.scrub(&mut round.reply) {
                let scrubbed = serde_json::to_vec(&round.reply).map_err(ProxyError::Rewrite)?;
                head.headers.remove(header::CONTENT_LENGTH);
                return Ok(Response::from_parts(head, full(scrubbed)));
            }
            return Ok(Response::from_parts(head, full(bytes)));
        }
        let mut request = self.request_tree()?;
        let mut earlier = None;
        let mut rounds = 0;
        while self.serves(&round, rounds) {
            rounds += 1;
            let response = self.continue_round(&mut request, &round, rounds).await?;
            if !response.status().is_success() {
                return Ok(response);
            }
            earlier = Some(self.wire.merge(earlier, round.reply));
            let (next_head, body) = response.into_parts();
            head = next_head;
            bytes = read_reply(body, &head.headers).await?;
            let reply: Value = serde_json::from_slice(&bytes)
                .map_err(|e| ProxyError::UpstreamBroken(format!("continuation unreadable: {e}")))?;
            round = Round {
                calls: RoundCalls::of(self.wire.parts(&reply)),
                reply,
            };
        }
        let merged = serde_json::to_vec(&self.wire.merge(earlier, round.reply))
            .map_err(ProxyError::Rewrite)?;
        head.headers.remove(header::CONTENT_LENGTH);
        let served = self.served.load(Ordering::Relaxed);
        if served > 0 {
            head.headers
                .insert(RECALLS_HEADER, HeaderValue::from(served));
        }
        Ok(Response::from_parts(head, full(merged)))
    }

    fn streamed(self, response: Response<ProxyBody>) -> Response<ProxyBody> {
        let (mut head, body) = response.into_parts();
        head.headers.remove(header::CONTENT_LENGTH);
        let relay = Streamed {
            events: Stitched::new(self.wire),
            reader: EventReader::new(self.event_bound.clone()),
            recall: self,
            body,
            carry: BytesMut::new(),
            request: None,
            rounds: 0,
            ended: false,
        };
        let frames = stream::unfold(relay, Streamed::next).map(|data| data.map(Frame::data));
        Response::from_parts(head, StreamBody::new(frames).boxed_unsync())
    }
}

/// A reply to a request that offered recall that condenser cannot read for recall calls.
fn unreadable(why: &str) -> ProxyError {
    tracing::warn!(
        why,
        "upstream's reply to a request that offered recall is unreadable"
    );
    ProxyError::UpstreamBroken(format!(
        "upstream's reply could not be read for condenser's recall calls, as {why}; withheld"
    ))
}

/// Why a streamed reply stops at an event over the bound.
const EVENT_OVER_THE_BOUND: &str =
    "a stream event over server.max_event_bytes could not be read for condenser's recall calls";

/// What a client writes in place of an older tool output it masks itself (Gemini CLI saves
/// the whole output to a file and sends a stub in this tag).
const CLIENT_MASK: &str = "<tool_output_masked>";

/// Whether the client replaced an item's output with its own stub since condenser took the
/// item out: the archive's copy, taken while the item was whole, is what the model asks for.
/// Any other item is read from the client's request, which names this conversation's item
/// even where another history that opened alike archived its own at the same place.
fn masked_by_the_client(item: &str) -> bool {
    item.contains(CLIENT_MASK)
}

/// How a dialect reads a request's conversation.
type ConversationOf = fn(&Bytes) -> Option<Vec<Value>>;

/// The conversation of a request in dialect `D`, as compaction read it.
fn conversation_of<D: Dialect>(bytes: &Bytes) -> Option<Vec<Value>> {
    let request = D::parse(bytes, D::PATH).ok()?;
    let conversation = D::conversation(&request).to_vec();
    Some(conversation)
}

async fn read_reply(body: ProxyBody, headers: &HeaderMap) -> Result<Bytes, ProxyError> {
    read_body(body, headers, MAX_REPLY_BYTES)
        .await
        .map_err(|e| ProxyError::UpstreamBroken(e.to_string()))
}

/// A streamed reply across its rounds.
struct Streamed {
    recall: Recall,
    events: Stitched,
    body: ProxyBody,
    /// The events of the round's stream, as they come whole.
    reader: EventReader,
    /// What the client gets next, ahead of the next events.
    carry: BytesMut,
    /// The request as continued so far, once a round was served.
    request: Option<Map<String, Value>>,
    rounds: u32,
    ended: bool,
}

impl Streamed {
    async fn next(mut self) -> Option<(Result<Bytes, BoxError>, Streamed)> {
        while !self.ended {
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    self.reader.push(data);
                    let out = self.whole_events();
                    if !out.is_empty() {
                        return Some((Ok(out), self));
                    }
                }
                Some(Err(error)) => {
                    self.ended = true;
                    return Some((Err(error), self));
                }
                None => {
                    // An unterminated last event is still an event.
                    if let Some(rest) = self.reader.rest() {
                        let passed = self.stitched(rest);
                        self.carry.extend_from_slice(&passed);
                        if self.ended {
                            return Some((Ok(self.carry.split().freeze()), self));
                        }
                    }
                    let round = self.events.round_end();
                    let end = if self.recall.serves(&round, self.rounds) {
                        match self.next_round(round).await {
                            Ok(()) => continue,
                            Err(reason) => self.events.failed(&continuation_failed(&reason)),
                        }
                    } else {
                        self.events.close()
                    };
                    self.ended = true;
                    let mut close = self.carry.split();
                    close.extend_from_slice(&end);
                    return Some((Ok(close.freeze()), self));
                }
            }
        }
        None
    }

    /// The whole events received so far, as the client gets them: gathered, not copied,
    /// while one goes (a stream holds one copy of an event).
    fn whole_events(&mut self) -> Bytes {
        let mut out = Gathered::Empty;
        out.push(&self.carry.split().freeze());
        while !self.ended {
            let Some(piece) = self.reader.next_piece() else {
                break;
            };
            out.push(&self.stitched(piece));
        }
        out.into_bytes()
    }

    /// What the client gets of a piece: a whole event as the stitching passes it on. An
    /// event over the bound cannot be read for a recall call: the stream ends there, with
    /// an error in the dialect's shape in place of it.
    fn stitched(&mut self, piece: Piece) -> Bytes {
        match piece {
            Piece::Event(event) => self.events.event(event).unwrap_or_default(),
            Piece::Uninspected(_) => {
                self.ended = true;
                tracing::warn!("{EVENT_OVER_THE_BOUND}; the stream ends with an error");
                self.events.failed(EVENT_OVER_THE_BOUND)
            }
        }
    }

    /// The next round's stream in place of the ended one; why not, when it could not be
    /// had and the client's stream ends with an error after what it got.
    async fn next_round(&mut self, round: Round) -> Result<(), String> {
        let mut request = match self.request.take() {
            Some(request) => request,
            None => self.recall.request_tree().map_err(|e| e.to_string())?,
        };
        self.rounds += 1;
        let response = self
            .recall
            .continue_round(&mut request, &round, self.rounds)
            .await;
        self.request = Some(request);
        match response {
            Ok(response)
                if response.status().is_success()
                    && (!media_type_is(response.headers(), "text/event-stream")
                        || content_coded(response.headers())) =>
            {
                Err("it answered with no event stream condenser can read".to_string())
            }
            Ok(response) if response.status().is_success() => {
                tracing::debug!(round = self.rounds, "recall served; stream continued");
                self.body = response.into_body();
                self.reader = EventReader::new(self.recall.event_bound.clone());
                let unsent = self.events.next_round();
                self.carry.extend_from_slice(&unsent);
                Ok(())
            }
            Ok(response) => {
                tracing::warn!(status = %response.status(), "recall continuation refused");
                Err(format!("it answered {}", response.status()))
            }
            Err(error) => {
                tracing::warn!(%error, "recall continuation failed");
                Err(error.to_string())
            }
        }
    }
}
