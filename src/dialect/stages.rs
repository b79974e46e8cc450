//! The stages each dialect supplies to the one pipeline (`Dialect`), and what they hand on:
//! a request counted and ready to plan (`Prepared`), planned by a raw first stage
//! (`Planned`), or ready to go as it came (`Ready`).

use std::borrow::Cow;
use std::future::Future;

use bytes::Bytes;
use hyper::Response;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::compaction::limits::{Limits, PlanInput};
use crate::compaction::plan::{self, Decision, Mode, Split};
use crate::compaction::rewrite::{Action, Rewrite};
use crate::compaction::summary_api::{SummaryApi, SummaryEndpoint};
use crate::config::{tool_cut, Config, ContextConfig, RecallConfig, ToolPolicy};
use crate::conversation::{answered_tools, Item, Kind, ToolCut, Views};
use crate::dialect::recall::RecallWire;
use crate::dialect::request::{
    laid_out, object_start, read_fields, spliced, Counted, Layout, RawFields, SentRanges, Splice,
};
use crate::error::ProxyError;
use crate::observe::metrics::Route;
use crate::tokens::catalog::{ModelCatalog, ModelInfo};
use crate::tokens::counter::{scaled_tokens, PromptCount, RawCount, RawItems, TokenCounter};
use crate::tokens::encoding::Encoding;
use crate::tokens::rules::REPLY_PRIMING;
use crate::transport::body::ProxyBody;
use crate::transport::upstream::KeyStyle;
use crate::transport::usage::UsageReader;

/// What the pipeline needs of one API. Each stage is the dialect's; their order, the plan,
/// the compaction and the relay are the pipeline's, the same for every dialect.
pub trait Dialect {
    /// Its API's name in `summarizer.api` and `condenser count --api`.
    const NAME: &'static str;
    /// The path it serves, as its log line names it; the paths under it (passed through) are
    /// its API's too, unless `compacts` and `serves` say otherwise.
    const PATH: &'static str;
    /// What its log line calls a relayed reply.
    const SERVED: &'static str;
    /// How its replies carry usage.
    const USAGE: &'static dyn UsageReader;
    /// How it takes a configured key.
    const KEY_STYLE: KeyStyle;
    /// How a summary is asked in it.
    const SUMMARY: &'static dyn SummaryApi;
    /// Where and how a summary is asked in it: what its requests' summaries are asked in
    /// unless `summarizer.api` says otherwise.
    const SUMMARY_ENDPOINT: SummaryEndpoint = SummaryEndpoint {
        path: Self::path_for,
        key_style: Self::KEY_STYLE,
        api: Self::SUMMARY,
        usage: Self::USAGE,
    };
    /// The request field that holds the conversation, named by errors about it.
    const CONVERSATION_FIELD: &'static str;
    /// The request's fields that make its prompt besides the conversation, in the order its
    /// provider caches a prompt, which then goes on with the conversation's items.
    const CACHED_BEFORE: &'static [&'static str];
    /// Its `route` label in metrics.
    const ROUTE: Route;
    /// How it writes the recall tool.
    const RECALL: Option<&'static dyn RecallWire> = None;
    /// Its raw first stage, for a dialect whose requests' fields it reads without a JSON
    /// tree: what the default `scan` runs (`scan_raw`).
    const RAW_STAGE: Option<&'static RawStage> = None;
    /// A request parsed for counting, planning and rewriting.
    type Request: Send + Sync;

    /// Stage one, for a dialect that can: a request under every trigger, counted, planned
    /// and made ready from its raw bytes without a JSON tree. `Err` hands the request on to
    /// the full stages, with the count and the plan when this made them. Unless a dialect
    /// says otherwise, its `RAW_STAGE`, if it has one.
    fn scan(
        counting: Counting<'_>,
        bytes: &Bytes,
        settings: Settings<'_>,
        mode: Mode,
    ) -> impl Future<Output = Result<Ready, Option<Planned>>> + Send {
        scan_raw(counting, bytes, Self::RAW_STAGE, settings, mode)
    }

    /// Whether a `POST` to `path` is one it compacts: its own path (the paths under it,
    /// `/v1/responses/compact` or `/v1/messages/count_tokens`, pass through).
    fn compacts(path: &str) -> bool {
        path == Self::PATH
    }

    /// Whether `path` is its API's: its own, or one under it. Its errors there take its shape,
    /// and a configured key goes as it takes one.
    fn serves(path: &str) -> bool {
        path.strip_prefix(Self::PATH)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }

    /// The model a path of its API names, for an API that names it there rather than in the
    /// body: what routes a request passed through.
    fn model_in_path(_path: &str) -> Option<&str> {
        None
    }

    /// Where a request for `model` is sent: its own path, unless its API names the model
    /// there.
    fn path_for(_model: &str) -> Cow<'static, str> {
        Cow::Borrowed(Self::PATH)
    }

    /// Whether a request body looks written for it (`condenser count` without `--api`); one
    /// that no dialect claims is read as chat.
    fn written_for(_body: &Value) -> bool {
        false
    }

    /// An error condenser writes on its paths, in its shape.
    fn error_response(error: &ProxyError) -> Response<ProxyBody>;

    /// The request to `path`, checked for what condenser relies on, with errors that name
    /// the problem.
    fn parse(bytes: &[u8], path: &str) -> Result<Self::Request, ProxyError>;

    fn model(request: &Self::Request) -> &str;

    /// The request's JSON object, for the recall tool to be offered in once rewritten.
    fn body_mut(request: &mut Self::Request) -> &mut Map<String, Value>;

    fn count(
        request: &Self::Request,
        catalog: &ModelCatalog,
        counter: &TokenCounter,
    ) -> impl Future<Output = Prepared> + Send;

    /// The conversation as chat messages, one per counted item: what compaction hashes into
    /// cache keys and what the summarizer reads.
    fn conversation(request: &Self::Request) -> Views<'_>;

    /// Writes a compaction into the request: the head, the pinned task, the summary, the
    /// kept items, tool outputs cut as planned (in the request model's `encoding`).
    fn rewrite(
        request: &mut Self::Request,
        split: &Split,
        rewrite: &Rewrite,
        settings: &ContextConfig,
        encoding: Encoding,
    );

    /// Why a request with this query is refused (400), when it is: a query condenser and
    /// upstream could read differently.
    fn refused_query(_query: Option<&str>) -> Option<String> {
        None
    }

    /// Whether the reply to a request at `path`?`query` comes in a framing recall can read
    /// (each dialect's whole JSON body or SSE stream): where not, recall is not offered.
    fn recall_reads_reply(_path: &str, _query: Option<&str>) -> bool {
        true
    }

    /// A reason to send this request as it came, whatever its size: what the plan cannot
    /// see from the counted items alone.
    fn forward_as_sent(_request: &Self::Request) -> Option<plan::ForwardReason> {
        None
    }

    /// The request its raw first stage planned, which found the conversation's items and the
    /// fields it read at `sent` (`Planned`). A dialect that splices its rewrites keeps them,
    /// for a rewrite to copy what it left unchanged from (`splice`), and may leave the items
    /// out of its tree until read. Unless a dialect says otherwise, parsed in full.
    fn parse_planned(
        bytes: &Bytes,
        path: &str,
        _sent: SentRanges,
    ) -> Result<Self::Request, ProxyError> {
        Self::parse(bytes, path)
    }

    /// Puts into the request's tree every item `parse_planned` left out of it: before the
    /// tree is written out whole. Unless a dialect says otherwise, none was left out.
    fn made_whole(_request: &mut Self::Request) {}

    /// A rewritten request's JSON object and, when its raw items were kept, which of its
    /// conversation's items are sent ones unchanged: what `outgoing_body` copies from the
    /// bytes sent rather than writes out again. Unless a dialect says otherwise, none.
    fn splice(_request: &Self::Request) -> Option<(&Map<String, Value>, Splice<'_>)> {
        None
    }

    /// The body to send: `original` unless the request was rewritten or must ask upstream
    /// for usage; whether usage was asked for on the client's behalf; and, for a spliced body,
    /// where it wrote each field and item (for `count_as_sent`). Unless a dialect says
    /// otherwise, its replies carry usage unasked, and a rewritten request is its JSON object
    /// written out, its unchanged items copied from `original` where it keeps them (`splice`).
    fn outgoing_body(
        mut request: Self::Request,
        original: Bytes,
        rewritten: bool,
    ) -> Result<(Bytes, bool, Option<Layout>), ProxyError> {
        if !rewritten {
            return Ok((original, false, None));
        }
        if let Some((body, layout)) =
            Self::splice(&request).and_then(|(body, splice)| spliced(body, &original, &splice))
        {
            return Ok((Bytes::from(body), false, Some(layout)));
        }
        Self::made_whole(&mut request);
        let body = serde_json::to_vec(Self::body_mut(&mut request)).map_err(ProxyError::Rewrite)?;
        Ok((Bytes::from(body), false, None))
    }
}

/// The request's settings: `[context]` and `[recall]`, with its profile's overrides.
#[derive(Clone, Copy)]
pub struct Settings<'a> {
    pub context: &'a ContextConfig,
    pub recall: RecallConfig,
}

/// A request counted and ready to plan, whatever its dialect; shared by the proxy and
/// `condenser plan`.
pub struct Prepared {
    pub info: ModelInfo,
    pub count: PromptCount,
    /// The conversation's items after counting, one per entry of `count.per_message`.
    pub metas: Vec<Item>,
    /// What the request reserves for the reply, when it says.
    pub requested_completion_tokens: Option<u64>,
    pub choices: u64,
    /// Each item's identity by its bytes as sent (`RawCount::identities`), when the raw stage
    /// counted them; else empty.
    pub identities: Vec<u128>,
}

impl Prepared {
    pub fn plan_input<'a>(
        &'a self,
        config: &Config,
        settings: Settings<'a>,
        mode: Mode,
    ) -> PlanInput<'a> {
        let mut input = PlanInput {
            messages: &self.metas,
            fixed_tokens: self.count.fixed,
            context_window: self.info.context_window,
            requested_completion_tokens: self.requested_completion_tokens,
            settings: settings.context,
            mode,
            summary_tokens: 0,
            scale: self.count.scale,
            recall: false,
        };
        // The summary's room is a share of the limits, which the rest of the input sets;
        // recall's tool and line take room beside it when the request's profile offers recall.
        let room = crate::compaction::limits::summary_room(
            &Limits::new(&input),
            config.summarizer.max_summary_tokens,
            settings.recall.enabled,
        );
        input.summary_tokens = room.reserved();
        input.recall = room.recall;
        input
    }

    /// Marks each tool output with its tool's policy (`[[context.tools]]`), the tools it
    /// answers read off the conversation `view`; says whether any output took one, so that a
    /// plan made without them is made again.
    pub fn apply_tool_policies(&mut self, view: &Views<'_>, policies: &[ToolPolicy]) -> bool {
        if policies.is_empty() {
            return false;
        }
        let answered = answered_tools(view, &self.metas);
        let mut applied = false;
        for (item, names) in self.metas.iter_mut().zip(answered) {
            if item.kind == Kind::ToolResult {
                item.cut = tool_cut(policies, &names);
                applied |= item.cut != ToolCut::Normal;
            }
        }
        applied
    }

    /// The planner's decision, except that requests asking for several choices go as sent.
    pub fn decide(&self, input: &PlanInput) -> Decision {
        if self.choices > 1 {
            return Decision::Forward(plan::ForwardReason::SeveralChoices);
        }
        plan::plan(input)
    }

    /// What `auto` would do with this request, as its plan says before anything is made.
    pub fn would(&self, config: &Config, settings: Settings<'_>) -> Would {
        let decision = self.decide(&self.plan_input(config, settings, Mode::Auto));
        Would::of(&decision, &self.count)
    }
}

/// What `auto` would do with an observed request by its plan alone, before any summary is
/// looked up or made: what the reply's `x-condenser-would` headers tell. A summary made ahead
/// (`Precompute`) leaves the request as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Would {
    pub action: Action,
    /// The plan's estimate for a compaction; else the request's own count.
    pub forwarded_tokens: u64,
}

impl Would {
    /// From the plan's `decision` for a request of `count`: the plan's estimate is the
    /// encoding's, told as the provider counts (`count.scale`).
    pub fn of(decision: &Decision, count: &PromptCount) -> Would {
        match decision {
            Decision::Compact { split, .. } => Would {
                action: if split.summarized() > 0 {
                    Action::Summarized
                } else {
                    Action::Trimmed
                },
                forwarded_tokens: scaled_tokens(split.estimated_tokens, count.scale),
            },
            // A rejection is upstream's to make as well, on the request as sent.
            Decision::Forward(_) | Decision::Precompute(_) | Decision::Reject { .. } => Would {
                action: Action::Forwarded,
                forwarded_tokens: count.total,
            },
        }
    }
}

/// A request the raw path counted and planned, for the full path to finish without
/// counting or planning it again.
pub struct Planned {
    pub prepared: Prepared,
    pub decision: Decision,
    /// Where each conversation item and each field read stands in the body
    /// (`Dialect::raw_items`).
    pub sent: SentRanges,
}

/// A request the first stage sends as it came (or with usage asked for on the client's
/// behalf): all the pipeline needs to send it.
pub struct Ready {
    pub model: String,
    pub prepared: Prepared,
    pub body: Bytes,
    /// Usage was asked of upstream on the client's behalf, and is kept from it.
    pub inject_usage: bool,
    /// The request's limits, as planned: its usable window (what upstream should have
    /// accepted), trigger and target.
    pub limits: Limits,
}

/// What counting and planning read of the gateway: the config, the model catalog and the
/// token counter.
#[derive(Clone, Copy)]
pub struct Counting<'a> {
    pub config: &'a Config,
    pub catalog: &'a ModelCatalog,
    pub counter: &'a TokenCounter,
}

/// Whether this request may offer recall: on in its settings, and a continuation of it
/// would be taken (`RecallWire::serves`).
pub fn offers_recall<D: Dialect>(request: &mut D::Request, enabled: bool) -> bool {
    enabled && D::RECALL.is_some_and(|wire| wire.serves(D::body_mut(request)))
}

/// Writes a compaction into the request, and offers the recall tool when the rewrite names
/// an archive (its summary and cut outputs name references only then); returns the tool's
/// wire when offered. The proxy and `condenser plan` both write a request through it.
pub fn write_compaction<D: Dialect>(
    request: &mut D::Request,
    split: &Split,
    rewrite: &Rewrite,
    settings: &ContextConfig,
    encoding: Encoding,
) -> Option<&'static dyn RecallWire> {
    D::rewrite(request, split, rewrite, settings, encoding);
    let wire = D::RECALL.filter(|_| rewrite.archive.is_some())?;
    wire.offer(D::body_mut(request));
    Some(wire)
}

/// The prompt of a body this dialect forwards, counted as its raw first stage counts any
/// request (each item found by its bytes, counted once ever), else parsed and counted in full:
/// a rewritten request is counted on the bytes it forwards, as `condenser count` counts them.
/// Counting the rewritten tree again walked every kept item and the tool schemas (1.9 ms of
/// an agent-sized Messages request, `bench/agent_replay.sh`); by their bytes, 0.5 ms.
pub async fn count_as_sent<D: Dialect>(
    counting: Counting<'_>,
    (body, layout): (&Bytes, Option<&Layout>),
    path: &str,
    settings: Settings<'_>,
) -> Result<PromptCount, ProxyError> {
    // A spliced body is read where it was written, as its raw stage would read it.
    let read = D::RAW_STAGE.zip(layout).and_then(|(stage, layout)| {
        let fields = laid_out(body, layout, &stage.fields)?;
        Some((stage, fields))
    });
    if let Some((stage, fields)) = read {
        if let Some((_, raw)) = count_read(counting, stage, &fields).await {
            return Ok(raw.count);
        }
    }
    match D::scan(counting, body, settings, Mode::Off).await {
        Ok(Ready { prepared, .. }) | Err(Some(Planned { prepared, .. })) => {
            return Ok(prepared.count)
        }
        Err(None) => {}
    }
    let request = D::parse(body, path)?;
    Ok(D::count(&request, counting.catalog, counting.counter)
        .await
        .count)
}

/// How a dialect's raw first stage reads and counts: `fields` names the request's fields it
/// reads (one reader for every dialect, `read_fields`), its items left raw; its items are
/// counted as `items` says, and the parts besides them that cost tokens, kept under
/// `parts_seed`, each counted alone by `part` once parsed (given its index in
/// `RawFields::parts`): a request's fixed tokens are reply priming and its parts'. `reserve`
/// makes the reply's reserve of `max_tokens` and the `extra` field.
pub struct RawStage {
    pub fields: RawFields,
    pub items: RawItems,
    pub parts_seed: u64,
    pub part: fn(Encoding, usize, Value) -> u32,
    /// The part `part` counts as the sum of its elements when it is an array, counted so
    /// (`TokenCounter::count_raw_parts`).
    pub summed: Option<usize>,
    pub reserve: fn(Option<u64>, Option<&RawValue>) -> Option<u64>,
}

/// A raw first stage, the same for every dialect that has one: the request read (a JSON
/// object, whose fields `stage` reads), counted from its bytes (each item, and the parts
/// besides them, counted once ever) and planned; sent as it came when the plan forwards it,
/// else handed on to the full path with its count and plan. `Err(None)`: no stage, or a body,
/// item or part the stage cannot read.
pub async fn scan_raw(
    counting: Counting<'_>,
    bytes: &Bytes,
    stage: Option<&RawStage>,
    settings: Settings<'_>,
    mode: Mode,
) -> Result<Ready, Option<Planned>> {
    // The derived readers would take a JSON array for a struct too.
    let Some(stage) = stage.filter(|_| object_start(bytes).is_some()) else {
        return Err(None);
    };
    let request = read_fields(bytes, &stage.fields).ok_or(None)?;
    let counted = Counted {
        model: request.model,
        items: request
            .items
            .iter()
            .map(|item| item.get().as_bytes())
            .collect(),
        parts: request
            .parts
            .iter()
            .map(|part| part.map(RawValue::get))
            .collect(),
    };
    let (info, raw) = count_read(counting, stage, &counted).await.ok_or(None)?;
    let prepared = Prepared {
        info,
        count: raw.count,
        metas: raw.metas,
        requested_completion_tokens: (stage.reserve)(request.max_tokens, request.extra),
        choices: 1,
        identities: raw.identities,
    };
    let input = prepared.plan_input(counting.config, settings, mode);
    let decision = prepared.decide(&input);
    if !matches!(decision, Decision::Forward(_)) {
        let sent = SentRanges {
            identities: prepared.identities.clone(),
            ..SentRanges::of(bytes, (&request.items, &request.parts), &stage.fields)
        };
        return Err(Some(Planned {
            prepared,
            decision,
            sent,
        }));
    }
    Ok(Ready {
        model: counted.model.into_owned(),
        limits: Limits::new(&input),
        prepared,
        body: bytes.clone(),
        inject_usage: false,
    })
}

/// A raw stage's count of what it read: the parts besides the items and reply priming (the
/// request's fixed tokens), and each item, found by its bytes. None when an item or a part
/// cannot be read.
async fn count_read(
    counting: Counting<'_>,
    stage: &RawStage,
    read: &Counted<'_>,
) -> Option<(ModelInfo, RawCount)> {
    let info = counting.catalog.resolve(&read.model);
    let encoding = info.encoding;
    let fixed = REPLY_PRIMING
        + counting.counter.count_raw_parts(
            encoding,
            (stage.parts_seed, stage.summed),
            &read.parts,
            |index, part| (stage.part)(encoding, index, part),
        )?;
    let counted = counting
        .counter
        .count_raw_items(&read.items, &stage.items, fixed, &read.model, &info)
        .await?;
    Some((info, counted))
}

/// The split `force` plans for `request` in a context of `window` tokens under `settings`
/// (a summary of 200 tokens), or `None` when it plans no compaction: what the dialects'
/// property tests write their compactions from.
#[cfg(test)]
pub(crate) fn forced_split<D: Dialect>(
    request: &D::Request,
    window: u64,
    settings: &ContextConfig,
) -> Option<Split> {
    let overrides = [(
        D::model(request).to_string(),
        crate::tokens::catalog::ModelOverride {
            context_window: Some(window),
            encoding: None,
            price: None,
        },
    )];
    let catalog = ModelCatalog::new(overrides.into_iter().collect(), Default::default());
    let counter = TokenCounter::new(0.1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime to count in");
    let prepared = runtime.block_on(D::count(request, &catalog, &counter));
    let input = PlanInput {
        messages: &prepared.metas,
        fixed_tokens: prepared.count.fixed,
        context_window: prepared.info.context_window,
        requested_completion_tokens: prepared.requested_completion_tokens,
        settings,
        mode: Mode::Force,
        summary_tokens: 200,
        scale: prepared.count.scale,
        recall: false,
    };
    match plan::plan(&input) {
        Decision::Compact { split, .. } => Some(split),
        Decision::Forward(_) | Decision::Reject { .. } | Decision::Precompute(_) => None,
    }
}
