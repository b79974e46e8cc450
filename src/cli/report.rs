//! A session drawn as one self-contained HTML page: `condenser replay --html` and the admin
//! listener's `GET /sessions`. It draws the records it is given (`pipeline::sessions::Record`,
//! one per request) and decides nothing: where replay put a step, the page marks one.
//!
//! Written with `write!` into a `String` and one escaping function, no template engine: the
//! page is a few fixed elements (a chart, a bill, a list), and a template crate would add a
//! dependency and a second language for them, its mistakes found at run time rather than by
//! the compiler. Every text that comes from a request goes through `escape`.
//!
//! Nothing is loaded from elsewhere: the chart is inline SVG, the style inline, and there is
//! no script; hover text is SVG `<title>`, and what each request sent is in `<details>`.

use std::fmt::Write as _;

use crate::observe::metrics::BilledTokens;
use crate::pipeline::sent::{Part, PartKind, SentItem};
use crate::pipeline::sessions::Record;
use crate::tokens::catalog::Price;

/// One session to draw: its requests, oldest first, each with its number as the caller
/// knows it (its line in a replayed file).
pub struct SessionView<'a> {
    pub records: Vec<(usize, &'a Record)>,
    /// Requests of the session before the first drawn (let go by the admin listener).
    pub dropped: usize,
}

/// A kind of step the chart marks, by the name of the cache break replay gives it.
#[derive(Clone, Copy)]
struct Step {
    name: &'static str,
    label: &'static str,
    colour: &'static str,
    /// What caused it, said on hover.
    cause: &'static str,
}

/// The steps a page marks, one line each.
const STEPS: &[Step] = &[
    Step {
        name: "summary_step",
        label: "summary step",
        colour: "#7c3aed",
        cause: "a new summary replaced the older part",
    },
    Step {
        name: "cut_step",
        label: "cut step",
        colour: "#ea580c",
        cause: "more tool outputs were cut",
    },
    Step {
        name: "stand_in",
        label: "stand-in",
        colour: "#0891b2",
        cause: "the oldest rounds were folded into a stand-in summary written without a model",
    },
    Step {
        name: "client_change",
        label: "client change",
        colour: "#dc2626",
        cause: "the client changed what it had sent before",
    },
];

/// A step of a kind the table does not know yet, drawn by its name.
fn step_named(name: &'static str) -> Step {
    STEPS.iter().find(|step| step.name == name).map_or(
        Step {
            name,
            label: name,
            colour: "#475569",
            cause: "",
        },
        |step| *step,
    )
}

/// A line of the chart: its class, its name, and its value in a request.
type Series = (&'static str, &'static str, fn(&Record) -> u64);

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 300.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 28.0;

/// How many items of a long part are listed, the first few and the last few, by its kind:
/// the recent part's whole; the middle's (kept items and cut outputs) the ends.
fn listed(kind: PartKind) -> (usize, usize) {
    match kind {
        PartKind::Recent => (2, 10),
        PartKind::Cut | PartKind::Kept => (1, 1),
        _ => (2, 4),
    }
}

/// The page: `title`, then each session's chart, bill and requests.
pub fn page(title: &str, sessions: &[SessionView<'_>]) -> String {
    let mut out = String::with_capacity(64 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n<h1>{}</h1>\n",
        escape(title),
        escape(title)
    );
    if sessions.is_empty() {
        out.push_str("<p class=\"empty\">No session seen yet.</p>\n");
    }
    for (n, session) in sessions.iter().enumerate() {
        write_session(&mut out, n + 1, session);
    }
    out.push_str("</body></html>\n");
    out
}

fn write_session(out: &mut String, number: usize, session: &SessionView<'_>) {
    let Some((_, first)) = session.records.first() else {
        return;
    };
    let steps = session
        .records
        .iter()
        .filter(|(_, r)| r.cache_break.is_some())
        .count();
    let _ = write!(
        out,
        "<section class=\"session\" id=\"session-{number}\" data-requests=\"{}\">\n\
         <h2>Session {number}: {} · {} requests · {steps} cache breaks</h2>\n",
        session.records.len(),
        escape(&first.model),
        session.records.len(),
    );
    if session.dropped > 0 {
        let _ = writeln!(
            out,
            "<p class=\"note\">{} earlier requests of this session are no longer kept.</p>",
            session.dropped
        );
    }
    write_chart(out, session);
    write_bill(out, session);
    write_requests(out, session);
    out.push_str("</section>\n");
}

/// The chart: tokens as sent and as forwarded, the cached part, the three lines, one point
/// per request, and a mark at each step.
fn write_chart(out: &mut String, session: &SessionView<'_>) {
    let records = &session.records;
    let top = records
        .iter()
        .map(|(_, r)| r.received_tokens.max(r.lines.hard))
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.05;
    let count = records.len();
    let x = |i: usize| {
        let span = WIDTH - LEFT - RIGHT;
        if count <= 1 {
            LEFT + span / 2.0
        } else {
            LEFT + span * i as f64 / (count - 1) as f64
        }
    };
    let y = |tokens: u64| TOP + (HEIGHT - TOP - BOTTOM) * (1.0 - tokens as f64 / top);
    let _ = write!(
        out,
        "<svg class=\"chart\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         role=\"img\" xmlns=\"http://www.w3.org/2000/svg\">\
         <title>Prompt tokens per request</title>"
    );
    // Axis: a few round figures of tokens, and the first and last request.
    let tick = round_step(top / 4.0);
    let mut value = 0u64;
    while (value as f64) < top {
        let _ = write!(
            out,
            "<line class=\"grid\" x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\"/>\
             <text class=\"axis\" x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            WIDTH - RIGHT,
            LEFT - 6.0,
            y(value) + 4.0,
            thousands(value),
            y = y(value),
        );
        value += tick;
    }
    for (i, (line, _)) in [records.first(), records.last()]
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = if i == 0 { 0 } else { count - 1 };
        let _ = write!(
            out,
            "<text class=\"axis\" x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">#{line}</text>",
            x(at),
            HEIGHT - 8.0
        );
    }
    // The cached part, as an area under the forwarded line.
    let mut cached = format!("{:.1},{:.1}", x(0), y(0));
    for (i, (_, r)) in records.iter().enumerate() {
        let _ = write!(cached, " {:.1},{:.1}", x(i), y(r.cached_tokens));
    }
    let _ = write!(cached, " {:.1},{:.1}", x(count - 1), y(0));
    let _ = write!(
        out,
        "<polygon class=\"cached\" points=\"{cached}\"><title>read from the provider's cache</title></polygon>"
    );
    let series: [Series; 5] = [
        ("hard", "hard limit", |r| r.lines.hard),
        ("trigger", "trigger", |r| r.lines.trigger),
        ("target", "target", |r| r.lines.target),
        ("sent", "as sent", |r| r.received_tokens),
        ("forwarded", "forwarded", |r| r.forwarded_tokens),
    ];
    for (class, label, value) in series {
        let points: Vec<String> = records
            .iter()
            .enumerate()
            .map(|(i, (_, r))| format!("{:.1},{:.1}", x(i), y(value(r))))
            .collect();
        let _ = write!(
            out,
            "<polyline class=\"series {class}\" points=\"{}\"><title>{label}</title></polyline>",
            points.join(" ")
        );
    }
    // The steps, each a line across the chart at its request.
    for (i, (line, r)) in records.iter().enumerate() {
        let Some(cache_break) = r.cache_break else {
            continue;
        };
        let step = step_named(cache_break.name());
        let _ = write!(
            out,
            "<g class=\"step\" data-step=\"{}\" data-request=\"{line}\">\
             <line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{TOP}\" y2=\"{:.1}\" stroke=\"{}\"/>\
             <rect x=\"{:.1}\" y=\"{TOP}\" width=\"8\" height=\"8\" fill=\"{}\"/>\
             <title>request #{line}: {}. {}{}; {} of {} tokens read from the cache.</title></g>",
            step.name,
            HEIGHT - BOTTOM,
            step.colour,
            x(i) - 4.0,
            step.colour,
            step.label,
            capitalized(step.cause),
            summarized(r),
            thousands(r.cached_tokens),
            thousands(r.forwarded_tokens),
            x = x(i),
        );
    }
    // One point per request.
    for (i, (line, r)) in records.iter().enumerate() {
        let _ = write!(
            out,
            "<circle class=\"point\" data-request=\"{line}\" data-sent=\"{}\" data-forwarded=\"{}\" \
             data-cached=\"{}\" data-action=\"{}\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\">\
             <title>request #{line}: {} · sent {} · forwarded {} · cached {}</title></circle>",
            r.received_tokens,
            r.forwarded_tokens,
            r.cached_tokens,
            r.action.name(),
            x(i),
            y(r.forwarded_tokens),
            r.action.name(),
            thousands(r.received_tokens),
            thousands(r.forwarded_tokens),
            thousands(r.cached_tokens),
        );
    }
    out.push_str("</svg>\n<p class=\"legend\">");
    for (class, label) in [
        ("sent", "as sent"),
        ("forwarded", "forwarded"),
        ("cached", "cached"),
        ("trigger", "trigger"),
        ("target", "target"),
        ("hard", "hard limit"),
    ] {
        let _ = write!(out, "<span class=\"key {class}\"></span>{label} ");
    }
    for step in STEPS {
        let _ = write!(
            out,
            "<span class=\"key\" style=\"background:{}\"></span>{} ",
            step.colour, step.label
        );
    }
    out.push_str("</p>\n");
}

fn summarized(record: &Record) -> String {
    match record.summarized {
        0 => String::new(),
        n => format!(" (the summary replaces {n} items)"),
    }
}

/// A session's bill by tier, as sent and with condenser.
struct Bill {
    as_sent: BilledTokens,
    with_condenser: BilledTokens,
    /// In money, when every request's model has a price.
    cost: Option<(f64, f64)>,
}

/// The prompt of each request by the tier its provider bills it at: the part that repeats
/// the request before it is read from the cache; of the rest, what the next request reads
/// again was worth writing to the cache (written), and the remainder was not (uncached).
/// `cached` and `tokens` read a request as sent or as forwarded.
fn tiers(
    records: &[(usize, &Record)],
    cached: fn(&Record) -> u64,
    tokens: fn(&Record) -> u64,
) -> Vec<BilledTokens> {
    records
        .iter()
        .enumerate()
        .map(|(i, (_, r))| {
            let read = cached(r).min(tokens(r));
            let fresh = tokens(r) - read;
            let next_reads = records.get(i + 1).map_or(0, |(_, next)| cached(next));
            let written = next_reads.saturating_sub(read).min(fresh);
            BilledTokens {
                uncached: fresh - written,
                cache_read: read,
                cache_write: written,
                output: 0,
            }
        })
        .collect()
}

fn sum(tiers: &[BilledTokens]) -> BilledTokens {
    tiers
        .iter()
        .fold(BilledTokens::default(), |a, t| BilledTokens {
            uncached: a.uncached + t.uncached,
            cache_read: a.cache_read + t.cache_read,
            cache_write: a.cache_write + t.cache_write,
            output: a.output + t.output,
        })
}

fn bill(records: &[(usize, &Record)]) -> Bill {
    let as_sent = tiers(records, |r| r.client_cached_tokens, |r| r.received_tokens);
    let with_condenser = tiers(records, |r| r.cached_tokens, |r| r.forwarded_tokens);
    let prices: Option<Vec<Price>> = records.iter().map(|(_, r)| r.price).collect();
    let cost = prices.map(|prices| {
        let spent = |tiers: &[BilledTokens]| -> f64 {
            tiers.iter().zip(&prices).map(|(t, p)| t.cost(p)).sum()
        };
        (spent(&as_sent), spent(&with_condenser))
    });
    Bill {
        as_sent: sum(&as_sent),
        with_condenser: sum(&with_condenser),
        cost,
    }
}

/// A provider's price of a cached prompt token, against an uncached one, where no price is
/// configured: the same weighting as replay's table.
const CACHED_WEIGHT: f64 = 0.1;

fn weighted(tokens: &BilledTokens) -> f64 {
    (tokens.uncached + tokens.cache_write) as f64 + CACHED_WEIGHT * tokens.cache_read as f64
}

fn write_bill(out: &mut String, session: &SessionView<'_>) {
    let bill = bill(&session.records);
    out.push_str(
        "<div class=\"bill\"><h3>The bill</h3><table class=\"tiers\">\
         <tr><th>tier</th><th>as sent</th><th>with condenser</th></tr>",
    );
    let rows = [
        (
            "cached",
            bill.as_sent.cache_read,
            bill.with_condenser.cache_read,
        ),
        (
            "written",
            bill.as_sent.cache_write,
            bill.with_condenser.cache_write,
        ),
        (
            "uncached",
            bill.as_sent.uncached,
            bill.with_condenser.uncached,
        ),
    ];
    for (tier, sent, condensed) in rows {
        let _ = write!(
            out,
            "<tr data-tier=\"{tier}\"><td>{tier}</td><td>{}</td><td>{}</td></tr>",
            thousands(sent),
            thousands(condensed)
        );
    }
    out.push_str(
        "<tr data-tier=\"output\"><td>output</td><td colspan=\"2\">the same either way; \
         not in the records of requests</td></tr></table>",
    );
    let (sent, condensed, unit) = match bill.cost {
        Some((sent, condensed)) => (sent, condensed, "in money, at [models] price"),
        None => (
            weighted(&bill.as_sent),
            weighted(&bill.with_condenser),
            "in prompt tokens, a cached one at 0.1 ([models] price sets no price here)",
        ),
    };
    let share = condensed / sent.max(f64::MIN_POSITIVE);
    let money = |v: f64| match bill.cost {
        Some(_) => format!("{v:.2}"),
        None => thousands(v.round() as u64),
    };
    let _ = write!(
        out,
        "<p class=\"figures\">As sent <b class=\"billed-as-sent\">{}</b>, with condenser \
         <b class=\"billed-with\">{}</b>: <b>{share:.2}</b> of as sent ({unit}).</p>\
         <svg class=\"bar\" viewBox=\"0 0 {WIDTH} 44\" width=\"{WIDTH}\" height=\"44\" xmlns=\"http://www.w3.org/2000/svg\">\
         <rect class=\"as-sent\" x=\"0\" y=\"2\" width=\"{WIDTH}\" height=\"18\"><title>as sent: {}</title></rect>\
         <rect class=\"with\" x=\"0\" y=\"24\" width=\"{:.1}\" height=\"18\"><title>with condenser: {}</title></rect>\
         <text x=\"6\" y=\"15\">as sent</text><text x=\"6\" y=\"37\">with condenser</text>\
         </svg></div>",
        money(sent),
        money(condensed),
        money(sent),
        WIDTH * share.min(1.0),
        money(condensed),
    );
    out.push('\n');
}

/// Each request: what the model was sent, collapsed.
fn write_requests(out: &mut String, session: &SessionView<'_>) {
    out.push_str("<h3>What the model was sent</h3>\n<div class=\"requests\">\n");
    let mut last_summary: Option<(usize, &str)> = None;
    for (line, r) in &session.records {
        let step = r
            .cache_break
            .map(|b| format!(" · {}", step_named(b.name()).label))
            .unwrap_or_default();
        let _ = write!(
            out,
            "<details class=\"request\" id=\"request-{line}\"><summary>#{line} · {} · sent {} → forwarded {} · cached {}{step}</summary>",
            r.action.name(),
            thousands(r.received_tokens),
            thousands(r.forwarded_tokens),
            thousands(r.cached_tokens),
        );
        match &r.sent {
            None => out.push_str("<p class=\"note\">Not kept: the admin page shows prompt text only with admin.prompt_text = true.</p>"),
            Some(sent) => {
                for part in &sent.parts {
                    write_part(out, part, *line, &mut last_summary);
                }
            }
        }
        out.push_str("</details>\n");
    }
    out.push_str("</div>\n");
}

fn write_part<'r>(
    out: &mut String,
    part: &'r Part,
    line: usize,
    last_summary: &mut Option<(usize, &'r str)>,
) {
    let _ = write!(
        out,
        "<div class=\"part\" data-part=\"{}\"><b>{}</b> · {} item{}",
        part.kind.name(),
        part.kind.name(),
        part.items.len(),
        if part.items.len() == 1 { "" } else { "s" }
    );
    match part.kind {
        PartKind::Summary => {
            for item in &part.items {
                let stand_in = item.excerpt.to_lowercase().contains("stand-in");
                if stand_in {
                    out.push_str(" (a stand-in, written without a model)");
                }
                match *last_summary {
                    Some((since, text)) if text == item.excerpt => {
                        let _ = write!(
                            out,
                            ": as in <a href=\"#request-{since}\">request #{since}</a>"
                        );
                    }
                    _ => {
                        let _ = write!(out, "<pre>{}</pre>", escape(&item.excerpt));
                        *last_summary = Some((line, &item.excerpt));
                    }
                }
            }
        }
        PartKind::Cut => {
            let refs: Vec<&str> = part
                .items
                .iter()
                .flat_map(|item| item.refs.iter().map(String::as_str))
                .collect();
            if !refs.is_empty() {
                let _ = write!(out, ", recallable as {}", escape(&compact_refs(&refs)));
            }
            write_items(out, part);
        }
        _ => write_items(out, part),
    }
    out.push_str("</div>");
}

/// References of one conversation written once with its prefix: `ctx:ab12.3, 5, 7`.
fn compact_refs(refs: &[&str]) -> String {
    let mut out = String::new();
    let mut conversation = "";
    for reference in refs {
        let (prefix, index) = reference.rsplit_once('.').unwrap_or((reference, ""));
        if !out.is_empty() {
            out.push_str(", ");
        }
        if prefix == conversation {
            out.push_str(index);
        } else {
            out.push_str(reference);
            conversation = prefix;
        }
    }
    out
}

/// A part's items, a long part's middle left out.
fn write_items(out: &mut String, part: &Part) {
    let items: &[SentItem] = &part.items;
    let (first, last) = listed(part.kind);
    out.push_str("<ol>");
    let long = items.len() > first + last + 1;
    for (i, item) in items.iter().enumerate() {
        if long && i == first {
            let _ = write!(
                out,
                "<li class=\"more\">… {} more …</li>",
                items.len() - first - last
            );
        }
        if long && i >= first && i < items.len() - last {
            continue;
        }
        let _ = write!(
            out,
            "<li><code>{}</code> {} · {} chars · {}{}</li>",
            escape(&item.at),
            escape(&item.role),
            thousands(item.chars as u64),
            escape(&item.excerpt),
            if item.chars > item.excerpt.chars().count() {
                "…"
            } else {
                ""
            }
        );
    }
    out.push_str("</ol>");
}

/// `text` safe in HTML text and in a quoted attribute.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// `value` with a comma between each three digits.
fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A round step (1, 2 or 5 times a power of ten) near `rough`.
fn round_step(rough: f64) -> u64 {
    let power = 10f64.powf(rough.max(1.0).log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|step| *step >= rough)
        .unwrap_or(10.0 * power);
    (step as u64).max(1)
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#0f172a;max-width:1000px}\
h1{font-size:20px}h2{font-size:16px;margin-top:32px}h3{font-size:14px;margin:16px 0 4px}\
.chart{display:block;max-width:100%;height:auto;background:#fff;border:1px solid #e2e8f0}\
.grid{stroke:#e2e8f0}.axis{font-size:11px;fill:#64748b}\
.series{fill:none;stroke-width:2}.sent{stroke:#94a3b8;background:#94a3b8}\
.forwarded{stroke:#2563eb;background:#2563eb}\
.hard{stroke:#dc2626;stroke-dasharray:6 3;stroke-width:1.5;background:#dc2626}\
.trigger{stroke:#f59e0b;stroke-dasharray:4 3;stroke-width:1.5;background:#f59e0b}\
.target{stroke:#16a34a;stroke-dasharray:2 3;stroke-width:1.5;background:#16a34a}\
polygon.cached{fill:#bfdbfe;stroke:none}span.cached{background:#bfdbfe}\
.point{fill:#2563eb}.step line{stroke-width:1.5;stroke-dasharray:3 2}\
.legend{font-size:12px;color:#334155}.key{display:inline-block;width:12px;height:4px;margin:0 4px 2px 10px;vertical-align:middle}\
.tiers{border-collapse:collapse;font-size:13px}.tiers td,.tiers th{padding:2px 12px;text-align:right;border-bottom:1px solid #e2e8f0}\
.tiers td:first-child,.tiers th:first-child{text-align:left}\
.bar{display:block;max-width:100%;height:auto}.bar .as-sent{fill:#94a3b8}.bar .with{fill:#2563eb}.bar text{fill:#fff;font-size:12px}\
.request{border-bottom:1px solid #e2e8f0;padding:2px 0}.request summary{cursor:pointer;font-size:13px}\
.part{margin:4px 0 4px 16px;font-size:12px}.part ol{margin:2px 0;padding-left:20px}\
.part pre{white-space:pre-wrap;background:#f8fafc;padding:6px;margin:4px 0}\
.note,.empty{color:#64748b}";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::rewrite::Action;
    use crate::pipeline::observer::CacheBreak;
    use crate::pipeline::sessions::Lines;

    fn record(forwarded: u64, cached: u64, cache_break: Option<CacheBreak>) -> Record {
        Record {
            session: 1,
            model: "m<1>".into(),
            received_tokens: forwarded + 100,
            forwarded_tokens: forwarded,
            cached_tokens: cached,
            client_cached_tokens: cached,
            action: Action::Summarized,
            summarized: 4,
            cache_break,
            lines: Lines {
                trigger: 800,
                target: 500,
                hard: 1000,
            },
            price: None,
            sent: None,
        }
    }

    #[test]
    fn a_page_has_a_point_per_request_and_a_mark_per_step() {
        let records = [
            record(100, 0, None),
            record(200, 100, None),
            record(150, 20, Some(CacheBreak::SummaryStep)),
            record(250, 150, None),
        ];
        let view = SessionView {
            records: records
                .iter()
                .enumerate()
                .map(|(i, r)| (i + 1, r))
                .collect(),
            dropped: 0,
        };
        let html = page("a <session>", &[view]);
        assert_eq!(html.matches("<circle class=\"point\"").count(), 4);
        assert_eq!(
            html.matches("data-step=\"summary_step\" data-request=\"3\"")
                .count(),
            1
        );
        assert_eq!(html.matches("class=\"step\"").count(), 1);
        assert!(html.contains("a &lt;session&gt;") && html.contains("m&lt;1&gt;"));
        // Nothing loaded from elsewhere: no script, no address but SVG's namespace.
        assert!(!html.contains("<script"));
        assert!(!html
            .replace("http://www.w3.org/2000/svg", "")
            .contains("http"));
    }

    #[test]
    fn the_bill_reads_cached_written_and_uncached_from_the_records() {
        let records = [
            record(100, 0, None),
            record(200, 100, None),
            record(150, 20, Some(CacheBreak::SummaryStep)),
            record(250, 150, None),
        ];
        let view: Vec<(usize, &Record)> = records
            .iter()
            .enumerate()
            .map(|(i, r)| (i + 1, r))
            .collect();
        let tiers = tiers(&view, |r| r.cached_tokens, |r| r.forwarded_tokens);
        // The first request's 100 are all read again by the second: written.
        assert_eq!(
            (tiers[0].cache_read, tiers[0].cache_write, tiers[0].uncached),
            (0, 100, 0)
        );
        // The second's new 100 are not read again after the step: uncached.
        assert_eq!(
            (tiers[1].cache_read, tiers[1].cache_write, tiers[1].uncached),
            (100, 0, 100)
        );
        assert_eq!(
            (tiers[2].cache_read, tiers[2].cache_write, tiers[2].uncached),
            (20, 130, 0)
        );
        // The last: nothing reads it again.
        assert_eq!(
            (tiers[3].cache_read, tiers[3].cache_write, tiers[3].uncached),
            (150, 0, 100)
        );
        let total = sum(&tiers);
        assert_eq!(total.prompt(), 700);
    }

    #[test]
    fn references_of_one_conversation_name_it_once() {
        assert_eq!(
            compact_refs(&["ctx:ab12.3", "ctx:ab12.5", "ctx:cd34.7"]),
            "ctx:ab12.3, 5, ctx:cd34.7"
        );
    }

    #[test]
    fn figures_read_as_people_write_them() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(round_step(23_000.0), 50_000);
        assert_eq!(round_step(9.0), 10);
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
