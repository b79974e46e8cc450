//! What every dialect checks of a request body first (a JSON object that names its model),
//! and how the ones whose conversation is one array of the body write a compaction into it.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::compaction::rewrite::Rewrite;
use crate::compaction::shorten::{cut_item_texts, cut_sent_item, CutItem};
use crate::error::ProxyError;
use crate::tokens::encoding::Encoding;

/// The body as a JSON object with a string `model`; `missing_model` is the dialect's words
/// for a body without one.
pub fn object_with_model(
    bytes: &[u8],
    missing_model: &str,
) -> Result<Map<String, Value>, ProxyError> {
    let value: Value = match as_text(bytes) {
        Some(text) => serde_json::from_str(text),
        // Not UTF-8, so not JSON: serde's reading says where.
        None => serde_json::from_slice(bytes),
    }
    .map_err(ProxyError::InvalidJson)?;
    let Value::Object(body) = value else {
        return Err(ProxyError::invalid(
            "request body must be a JSON object",
            None,
        ));
    };
    match body.get("model") {
        Some(Value::String(_)) => Ok(body),
        None => Err(ProxyError::invalid(missing_model, Some("model"))),
        Some(_) => Err(ProxyError::invalid("model must be a string", Some("model"))),
    }
}

/// The body's `field`, which must be an array; `missing` is the dialect's words for a body
/// without it.
pub fn array<'a>(
    body: &'a Map<String, Value>,
    field: &'static str,
    missing: &str,
) -> Result<&'a Vec<Value>, ProxyError> {
    match body.get(field) {
        Some(Value::Array(items)) => Ok(items),
        None => Err(ProxyError::invalid(missing, Some(field))),
        Some(_) => Err(ProxyError::invalid(
            format!("{field} must be an array"),
            Some(field),
        )),
    }
}

/// Writes `compact`'s conversation in place of the array at `field`. The sent items are
/// taken out of the body first, so that the kept ones are moved, not copied, and `compact`
/// may write the body's other fields (a summary that goes into the head).
pub fn rewrite_conversation(
    body: &mut Map<String, Value>,
    field: &str,
    compact: impl FnOnce(&mut Map<String, Value>, Vec<Value>) -> Vec<Value>,
) {
    let sent = match body.get_mut(field) {
        Some(Value::Array(items)) => std::mem::take(items),
        _ => Vec::new(),
    };
    let compacted = compact(body, sent);
    body.insert(field.into(), Value::Array(compacted));
}

/// Where a raw stage found what it read in the body: the conversation's items, and the
/// top-level fields it read besides them (`RawFields::parts`), by name. What a rewritten
/// request copies its unchanged parts from (`spliced`).
#[derive(Default)]
pub struct SentRanges {
    pub items: Vec<Range<usize>>,
    pub fields: Vec<(&'static str, Range<usize>)>,
    /// Each item's identity by its bytes as sent (`Prepared::identities`), when the raw stage
    /// counted them; else empty.
    pub identities: Vec<u128>,
}

impl SentRanges {
    /// `items` and `parts` as `read_fields` read them from `bytes` by `fields`.
    pub fn of(
        bytes: &[u8],
        (items, parts): (&[&RawValue], &[Option<&RawValue>]),
        fields: &RawFields,
    ) -> SentRanges {
        SentRanges {
            items: items.iter().map(|item| range_in(bytes, item)).collect(),
            fields: fields
                .parts
                .iter()
                .zip(parts)
                .filter_map(|(name, part)| Some((*name, range_in(bytes, (*part)?))))
                .collect(),
            identities: Vec::new(),
        }
    }
}

/// Where `value`, read from `bytes`, stands in them.
fn range_in(bytes: &[u8], value: &RawValue) -> Range<usize> {
    let at = (value.get().as_ptr() as usize).wrapping_sub(bytes.as_ptr() as usize);
    at..at + value.get().len()
}

/// A rewritten conversation's items, each the sent item it is unchanged from (`Some(index)`)
/// or one the rewrite made or changed (`None`), with where the sent items stand in the body,
/// and the top-level fields still as sent.
pub struct Splice<'a> {
    pub field: &'a str,
    pub origins: &'a [Option<usize>],
    pub ranges: &'a [Range<usize>],
    pub fields: &'a [SentField],
    /// The sent items cut from their bytes, by index, written as their cut.
    pub cut: &'a [(usize, Arc<CutItem>)],
}

/// A top-level field as sent that no rewrite has changed, save for elements appended to its
/// array (the recall tool, `RecallWire::offer`): where it stands in the body, and when an
/// array, how many elements it had.
pub struct SentField {
    name: &'static str,
    range: Range<usize>,
    elements: Option<usize>,
}

/// What a request keeps for its rewrite to be spliced: where the raw stage found the sent
/// items and fields in the body (none when it did not), and once rewritten, each item's origin.
#[derive(Default)]
pub struct Origins {
    pub ranges: Vec<Range<usize>>,
    /// Each sent item's identity (`SentRanges::identities`), when known.
    identities: Vec<u128>,
    fields: Vec<SentField>,
    pub of_items: Option<Vec<Option<usize>>>,
    /// For a request parsed with its items left out of the tree (`Origins::planned`): the
    /// bytes sent, and each item parsed the first time it is read.
    unparsed: Option<(Bytes, Box<[OnceLock<Value>]>)>,
    /// The sent items cut from their bytes (`cut_outputs`), by index, each with the bytes it
    /// is written as while its origin says it goes as it came.
    cut: Vec<(usize, Arc<CutItem>)>,
}

impl Origins {
    /// The sent ranges of `body`, read before any rewrite.
    pub fn sent(body: &Map<String, Value>, sent: SentRanges) -> Origins {
        let fields = sent
            .fields
            .into_iter()
            .map(|(name, range)| SentField {
                name,
                range,
                elements: body.get(name).and_then(Value::as_array).map(Vec::len),
            })
            .collect();
        Origins {
            ranges: sent.items,
            identities: sent.identities,
            fields,
            of_items: None,
            unparsed: None,
            cut: Vec::new(),
        }
    }

    /// The sent ranges of `body`, parsed from `bytes` with its items left out of the tree
    /// (`with_items_left_out`): each is parsed when first read (`item`), or put into the tree
    /// for a rewrite to change (`parse_into`).
    pub fn planned(body: &Map<String, Value>, sent: SentRanges, bytes: Bytes) -> Origins {
        let parsed = sent.items.iter().map(|_| OnceLock::new()).collect();
        Origins {
            unparsed: Some((bytes, parsed)),
            ..Origins::sent(body, sent)
        }
    }

    /// Sent item `index`'s identity by its bytes, when the raw stage counted it.
    pub fn identity(&self, index: usize) -> Option<u128> {
        self.identities.get(index).copied()
    }

    /// Item `index` of the conversation `items` (the tree's): itself, or the sent item whose
    /// place it holds when that was left out of the tree.
    pub fn item<'a>(&'a self, items: &'a [Value], index: usize) -> Option<&'a Value> {
        let item = items.get(index)?;
        let Some((bytes, parsed)) = self.unparsed.as_ref().filter(|_| item.is_null()) else {
            return Some(item);
        };
        let sent = match &self.of_items {
            Some(origins) => match origins.get(index).copied().flatten() {
                Some(sent) => sent,
                None => return Some(item),
            },
            None => index,
        };
        let range = self.ranges.get(sent)?.clone();
        Some(parsed.get(sent)?.get_or_init(|| parse_sent(bytes, range)))
    }

    /// Puts into `items` (the tree's, before any rewrite) the sent items at `indices` left
    /// out of it: those a rewrite reads or changes.
    pub fn parse_into(&self, items: &mut [Value], indices: impl IntoIterator<Item = usize>) {
        let Some((bytes, parsed)) = &self.unparsed else {
            return;
        };
        for index in indices {
            let (Some(item), Some(range), Some(cell)) = (
                items.get_mut(index),
                self.ranges.get(index),
                parsed.get(index),
            ) else {
                continue;
            };
            if item.is_null() {
                *item = match cell.get() {
                    Some(value) => value.clone(),
                    None => parse_sent(bytes, range.clone()),
                };
            }
        }
    }

    /// Cuts the outputs `rewrite` cuts among `items` (the tree's, before the rewrite), those
    /// it keeps (from `rewrite.kept_from` on), each one's texts found by `texts` in a dialect
    /// told apart by `seed`. An item left out of the tree is cut from its bytes as sent
    /// (`cut_sent_item`): found already cut, and written out, when it was cut before, and
    /// spliced as those bytes while its origin says it goes as it came. Returns the indices of
    /// the others it cut, which the rewrite's origins mark changed (`changed_items`).
    pub fn cut_outputs(
        &mut self,
        items: &mut [Value],
        rewrite: &Rewrite,
        (encoding, seed): (Encoding, u64),
        texts: fn(&mut Value) -> Vec<&mut String>,
    ) -> Vec<usize> {
        let mut changed = Vec::new();
        for cut in rewrite
            .cuts
            .iter()
            .filter(|cut| cut.index >= rewrite.kept_from)
        {
            let Some(item) = items.get_mut(cut.index) else {
                continue;
            };
            let reference = rewrite.cleared_reference(cut.index);
            let left_out = self.unparsed.as_ref().filter(|_| item.is_null());
            let sent = left_out.and_then(|(bytes, parsed)| {
                Some((bytes, parsed.get(cut.index)?, self.ranges.get(cut.index)?))
            });
            match sent {
                Some((bytes, parsed, range)) => {
                    let whole = || match parsed.get() {
                        Some(item) => item.clone(),
                        None => parse_sent(bytes, range.clone()),
                    };
                    let shorten = (cut, reference.as_deref());
                    let identity = self.identity(cut.index);
                    let made = cut_sent_item((encoding, seed), identity, shorten, whole, texts);
                    *item = made.item.clone();
                    self.cut.push((cut.index, made));
                }
                None => {
                    let texts = texts(item);
                    if texts.is_empty() {
                        continue;
                    }
                    cut_item_texts(encoding, texts, cut, reference.as_deref());
                    changed.push(cut.index);
                }
            }
        }
        self.cut.sort_by_key(|(index, _)| *index);
        changed
    }

    /// Puts every sent item left out of the rewritten tree `body` (its conversation at
    /// `field`) into it: before the tree is written out whole.
    pub fn parse_all_into(&self, body: &mut Map<String, Value>, field: &str) {
        let Some(Value::Array(items)) = body.get_mut(field) else {
            return;
        };
        if self.unparsed.is_none() {
            return;
        }
        for index in 0..items.len() {
            if items[index].is_null() {
                if let Some(item) = self.item(items, index).cloned() {
                    items[index] = item;
                }
            }
        }
    }

    /// A rewrite changed the top-level field `name` (not only appended to it): it is written
    /// out again.
    pub fn changed(&mut self, name: &str) {
        self.fields.retain(|field| field.name != name);
    }

    /// The splice of the conversation at `field`, once rewritten, when the raw stage found
    /// the sent items.
    pub fn splice<'a>(&'a self, field: &'a str) -> Option<Splice<'a>> {
        let origins = self.of_items.as_deref()?;
        (!self.ranges.is_empty()).then_some(Splice {
            field,
            origins,
            ranges: &self.ranges,
            fields: &self.fields,
            cut: &self.cut,
        })
    }
}

/// A request its raw stage planned (its items and fields at `sent`): its body as `read`
/// reads it, with its items left out of the tree (`with_items_left_out`) unless they cannot
/// be, and where each stands (`Origins`).
pub fn planned_body(
    bytes: &Bytes,
    sent: SentRanges,
    read: impl Fn(&[u8]) -> Result<Map<String, Value>, ProxyError>,
) -> Result<(Map<String, Value>, Origins), ProxyError> {
    match with_items_left_out(bytes, &sent.items) {
        Some(left_out) => {
            let body = read(&left_out)?;
            let origins = Origins::planned(&body, sent, bytes.clone());
            Ok((body, origins))
        }
        None => {
            let body = read(bytes)?;
            let origins = Origins::sent(&body, sent);
            Ok((body, origins))
        }
    }
}

/// Marks changed, in a rewrite's `origins`, the sent items at `cut` (`Origins::cut_outputs`):
/// written out, not copied as sent.
pub fn changed_items(origins: &mut [Option<usize>], cut: &[usize]) {
    for origin in origins {
        if origin.is_some_and(|sent| cut.contains(&sent)) {
            *origin = None;
        }
    }
}

/// A sent item parsed from its bytes, which the raw stage read as JSON.
fn parse_sent(bytes: &[u8], range: Range<usize>) -> Value {
    bytes
        .get(range)
        .and_then(|item| serde_json::from_slice(item).ok())
        .unwrap_or(Value::Null)
}

/// `bytes` with each item at `items` (in order, apart) written as `null`: the body a request
/// planned by its raw stage is parsed from, its items left as sent. Their tree took 8.6M of
/// a compacted agent request's 20.4M instructions (`bench/instruction_budget.sh`), and a
/// rewrite reads only a few: the first kept, the pinned task and the outputs it cuts.
fn with_items_left_out(bytes: &[u8], items: &[Range<usize>]) -> Option<Vec<u8>> {
    let left: usize = items.iter().map(|item| item.len()).sum();
    let mut out = Vec::with_capacity(bytes.len() - left.min(bytes.len()) + 4 * items.len());
    let mut at = 0;
    for item in items {
        out.extend_from_slice(bytes.get(at..item.start)?);
        out.extend_from_slice(b"null");
        at = item.end;
    }
    out.extend_from_slice(bytes.get(at..)?);
    Some(out)
}

/// Where a spliced body's top-level values, and its conversation's items, stand in it: what
/// its count reads instead of a second pass over the whole body (`laid_out`).
pub struct Layout {
    pub fields: Vec<(String, Range<usize>)>,
    pub items: Vec<Range<usize>>,
}

/// The rewritten `body` written out with each unchanged item of its conversation (`splice`)
/// copied from the bytes it was sent as, and so is each top-level field still as sent (an
/// array's appended elements written after its sent ones); only the rest is serialized: the
/// summary, cut outputs, the recall tool, fields the stage did not read. Serializing a whole
/// compacted agent request's tree took 18.6M of its 42.6M instructions
/// (`bench/instruction_budget.sh`, callgrind), nearly all of it the kept items; its `system`
/// and `tools` (61 KB) took 0.45M more of 27.1M. Also where it wrote each field and item. None
/// when the splice does not fit the body (the caller writes the tree).
pub fn spliced(
    body: &Map<String, Value>,
    original: &[u8],
    splice: &Splice,
) -> Option<(Vec<u8>, Layout)> {
    let Some(Value::Array(items)) = body.get(splice.field) else {
        return None;
    };
    if items.len() != splice.origins.len() {
        return None;
    }
    let mut out = Vec::with_capacity(original.len());
    let mut layout = Layout {
        fields: Vec::with_capacity(body.len()),
        items: Vec::with_capacity(items.len()),
    };
    out.push(b'{');
    for (at, (key, value)) in body.iter().enumerate() {
        if at > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, key).ok()?;
        out.push(b':');
        let start = out.len();
        if key != splice.field {
            let sent = splice.fields.iter().find(|field| field.name == key);
            if !sent.is_some_and(|sent| write_as_sent(&mut out, original, sent, value)) {
                serde_json::to_writer(&mut out, value).ok()?;
            }
            layout.fields.push((key.clone(), start..out.len()));
            continue;
        }
        out.push(b'[');
        for (index, (item, origin)) in items.iter().zip(splice.origins).enumerate() {
            if index > 0 {
                out.push(b',');
            }
            let item_start = out.len();
            match origin {
                Some(sent) => match splice.cut.binary_search_by_key(sent, |(index, _)| *index) {
                    Ok(at) => out.extend_from_slice(&splice.cut[at].1.written),
                    Err(_) => {
                        out.extend_from_slice(original.get(splice.ranges.get(*sent)?.clone())?)
                    }
                },
                None => serde_json::to_writer(&mut out, item).ok()?,
            }
            layout.items.push(item_start..out.len());
        }
        out.push(b']');
        layout.fields.push((key.clone(), start..out.len()));
    }
    out.push(b'}');
    Some((out, layout))
}

/// Writes `value`, the field `sent` now, from the bytes it was sent as: whole when it was not
/// an array, else its sent elements, then those appended since written out. False, having
/// written nothing, when it is an array no longer as long.
fn write_as_sent(out: &mut Vec<u8>, original: &[u8], sent: &SentField, value: &Value) -> bool {
    let Some(bytes) = original.get(sent.range.clone()) else {
        return false;
    };
    let appended = match (sent.elements, value) {
        (None, _) => &[][..],
        (Some(elements), Value::Array(now)) if now.len() >= elements => &now[elements..],
        _ => return false,
    };
    if appended.is_empty() {
        out.extend_from_slice(bytes);
        return true;
    }
    // A raw array ends with its bracket, whitespace being trimmed from raw values.
    let Some((b']', open)) = bytes.split_last() else {
        return false;
    };
    let mark = out.len();
    out.extend_from_slice(open);
    for (at, element) in appended.iter().enumerate() {
        if at > 0 || sent.elements != Some(0) {
            out.push(b',');
        }
        if serde_json::to_writer(&mut *out, element).is_err() {
            out.truncate(mark);
            return false;
        }
    }
    out.push(b']');
    true
}

/// What a raw stage counts of a body: its model, and its items' and parts' bytes.
pub struct Counted<'a> {
    pub model: Cow<'a, str>,
    pub items: Vec<&'a [u8]>,
    /// One per `RawFields::parts`, present even as `null`.
    pub parts: Vec<Option<&'a str>>,
}

/// What `read_fields` would read of a body `spliced` wrote, by where it wrote each field rather
/// than a second pass over the bytes (3.0M of a compacted agent request's 34.2M instructions):
/// None wherever `read_fields` would fail, so a count from it is the count from the bytes.
/// A written body has no field twice, nothing after it, and only JSON in its values.
pub fn laid_out<'a>(bytes: &'a [u8], layout: &Layout, fields: &RawFields) -> Option<Counted<'a>> {
    let mut model = None;
    let mut items = false;
    let mut parts = vec![None; fields.parts.len()];
    for (key, range) in &layout.fields {
        let value = bytes.get(range.clone())?;
        if key == "model" {
            model = Some(serde_json::from_slice::<Text>(value).ok()?.0);
        } else if key == fields.items {
            items = true;
        } else if key == fields.max_tokens {
            serde_json::from_slice::<Option<u64>>(value).ok()?;
        } else if fields.extra == Some(key.as_str()) {
            // Read raw, which any JSON is.
        } else if let Some(index) = fields.parts.iter().position(|part| part == key) {
            parts[index] = Some(std::str::from_utf8(value).ok()?);
        } else if fields.full_path.contains(&key.as_str()) {
            return None;
        }
    }
    let items = items.then(|| {
        layout
            .items
            .iter()
            .map(|range| bytes.get(range.clone()))
            .collect::<Option<Vec<_>>>()
    })??;
    Some(Counted {
        model: model?,
        items,
        parts,
    })
}

/// For a raw stage's optional field: present, even as `null`, which a plain `Option` would
/// read as absent.
pub fn present<'de, D: serde::Deserializer<'de>>(
    value: D,
) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(value).map(Some)
}

/// The top-level fields a raw first stage reads of a request, by name: the data each
/// dialect's stage declares, read by the one reader `read_fields`.
pub struct RawFields {
    /// The conversation's array, its items left raw.
    pub items: &'static str,
    /// The fields besides the items that cost tokens, in the order the stage counts them.
    pub parts: &'static [&'static str],
    /// The reply's reserve, a whole number (or `null`).
    pub max_tokens: &'static str,
    /// One more field read raw, for the dialect (Messages' `thinking`, whose budget the
    /// reserve reads).
    pub extra: Option<&'static str>,
    /// Fields whose presence, even as `null`, sends the request to the full path (Responses'
    /// history held upstream).
    pub full_path: &'static [&'static str],
}

/// A request's top-level fields as `RawFields` names them, borrowed from its bytes.
pub struct ReadFields<'a> {
    pub model: Cow<'a, str>,
    pub items: Vec<&'a RawValue>,
    /// One per `RawFields::parts`, present even as `null`.
    pub parts: Vec<Option<&'a RawValue>>,
    pub max_tokens: Option<u64>,
    pub extra: Option<&'a RawValue>,
}

/// Reads `bytes` as one JSON object, in one pass without a tree, taking the fields `fields`
/// names: a string `model` and the items' array are required, a field named twice or any
/// field of `full_path` present fails it, as does anything that is not JSON; other fields are
/// skipped. What a derived struct per dialect read before, with its field list as data.
pub fn read_fields<'a>(bytes: &'a [u8], fields: &RawFields) -> Option<ReadFields<'a>> {
    let mut deserializer = serde_json::Deserializer::from_str(as_text(bytes)?);
    let read = FieldsSeed(fields).deserialize(&mut deserializer).ok()?;
    deserializer.end().ok()?;
    Some(read)
}

struct FieldsSeed<'f>(&'f RawFields);

/// Which of `RawFields` a key names.
#[derive(Clone, Copy)]
enum Slot {
    Model,
    Items,
    MaxTokens,
    Extra,
    Part(usize),
    FullPath,
    Other,
}

impl Slot {
    /// Its bit among the fields seen: each may be named once.
    fn bit(self) -> u64 {
        match self {
            Slot::Model => 1,
            Slot::Items => 1 << 1,
            Slot::MaxTokens => 1 << 2,
            Slot::Extra => 1 << 3,
            Slot::Part(index) => 1 << (4 + index.min(59)),
            Slot::FullPath | Slot::Other => 0,
        }
    }
}

/// A key, matched against the field names without being copied.
struct KeySeed<'f>(&'f RawFields);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Slot;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Slot, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Slot;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Slot, E> {
        let fields = self.0;
        Ok(if key == "model" {
            Slot::Model
        } else if key == fields.items {
            Slot::Items
        } else if key == fields.max_tokens {
            Slot::MaxTokens
        } else if fields.extra == Some(key) {
            Slot::Extra
        } else if let Some(index) = fields.parts.iter().position(|part| *part == key) {
            Slot::Part(index)
        } else if fields.full_path.contains(&key) {
            Slot::FullPath
        } else {
            Slot::Other
        })
    }
}

/// A string borrowed from the body where it has no escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(text)))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(text.to_owned())))
            }
        }
        deserializer.deserialize_str(TextVisitor)
    }
}

impl<'de> DeserializeSeed<'de> for FieldsSeed<'_> {
    type Value = ReadFields<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FieldsSeed<'_> {
    type Value = ReadFields<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a request object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let fields = self.0;
        let mut seen = 0u64;
        let mut model = None;
        let mut items = None;
        let mut max_tokens = None;
        let mut extra = None;
        let mut parts = vec![None; fields.parts.len()];
        while let Some(slot) = map.next_key_seed(KeySeed(fields))? {
            let bit = slot.bit();
            if seen & bit != 0 {
                return Err(de::Error::custom("duplicate field"));
            }
            seen |= bit;
            match slot {
                Slot::Model => model = Some(map.next_value::<Text>()?.0),
                Slot::Items => items = Some(map.next_value::<Vec<&'de RawValue>>()?),
                Slot::MaxTokens => max_tokens = map.next_value::<Option<u64>>()?,
                Slot::Extra => extra = Some(map.next_value::<&'de RawValue>()?),
                Slot::Part(index) => parts[index] = Some(map.next_value::<&'de RawValue>()?),
                Slot::FullPath => return Err(de::Error::custom("read on the full path")),
                Slot::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(ReadFields {
            model: model.ok_or_else(|| de::Error::missing_field("model"))?,
            items: items.ok_or_else(|| de::Error::missing_field("items"))?,
            parts,
            max_tokens,
            extra,
        })
    }
}

/// A body's bytes as text, when they are UTF-8, which JSON must be. Checked once here, the
/// body is read from text: reading it from bytes checks each string again as it goes, 1.7M of
/// the compacted agent request's 27.1M instructions and 0.4M of its raw stage's, against 0.2M
/// for this check of all 826 KB (`bench/instruction_budget.sh`, callgrind).
pub fn as_text(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok()
}

/// Where the body's opening brace is, when it opens a JSON object (after any whitespace):
/// serde's derived readers would take an array for a struct too.
pub fn object_start(bytes: &[u8]) -> Option<usize> {
    bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .filter(|&at| bytes[at] == b'{')
}

/// The text of the content parts of type `kind`, joined.
pub fn text_of(parts: &[Value], kind: &str) -> String {
    parts
        .iter()
        .filter(|part| part.get("type").and_then(Value::as_str) == Some(kind))
        .filter_map(|part| part.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FIELDS: RawFields = RawFields {
        items: "messages",
        parts: &["system", "tools"],
        max_tokens: "max_tokens",
        extra: Some("thinking"),
        full_path: &["stored"],
    };

    fn read(body: &str) -> Option<ReadFields<'_>> {
        read_fields(body.as_bytes(), &FIELDS)
    }

    #[test]
    fn reads_the_named_fields_raw_and_skips_the_rest() {
        let body = r#"{"model":"m","other":[1,{"a":2}],"tools":null,"messages":[{"x":1}, 2],
            "max_tokens":9,"thinking":{"budget_tokens":3}}"#;
        let fields = read(body).unwrap();
        assert!(matches!(fields.model, Cow::Borrowed("m")));
        let items: Vec<&str> = fields.items.iter().map(|item| item.get()).collect();
        assert_eq!(items, [r#"{"x":1}"#, "2"]);
        // A part given as `null` is present; one not given is absent.
        assert!(fields.parts[0].is_none());
        assert_eq!(fields.parts[1].map(RawValue::get), Some("null"));
        assert_eq!(fields.max_tokens, Some(9));
        assert_eq!(
            fields.extra.map(RawValue::get),
            Some(r#"{"budget_tokens":3}"#)
        );
        let escaped = read(r#"{"model":"a\u0062","messages":[],"max_tokens":null}"#).unwrap();
        assert_eq!(escaped.model, "ab");
        assert_eq!(escaped.max_tokens, None);
    }

    #[test]
    fn a_field_as_sent_is_copied_its_appended_elements_written_after() {
        let sent = br#"{"tools": [ {"a": 1} ,  2 ], "none": [ ], "system": "x  y"}"#;
        let field = |name: &'static str, text: &str, elements: Option<usize>| {
            let at = sent
                .windows(text.len())
                .position(|w| w == text.as_bytes())
                .unwrap();
            SentField {
                name,
                range: at..at + text.len(),
                elements,
            }
        };
        let tools = field("tools", r#"[ {"a": 1} ,  2 ]"#, Some(2));
        let written = |field: &SentField, value: Value| {
            let mut out = b"-".to_vec();
            let copied = write_as_sent(&mut out, sent, field, &value);
            (copied, String::from_utf8(out).unwrap())
        };
        assert_eq!(
            written(&tools, json!([{"a": 1}, 2])),
            (true, r#"-[ {"a": 1} ,  2 ]"#.into())
        );
        assert_eq!(
            written(&tools, json!([{"a": 1}, 2, {"b": [3]}, 4])),
            (true, r#"-[ {"a": 1} ,  2 ,{"b":[3]},4]"#.into())
        );
        let none = field("none", "[ ]", Some(0));
        assert_eq!(written(&none, json!([5, 6])), (true, "-[ 5,6]".into()));
        // Shorter, or no longer an array: written out again by the caller.
        assert_eq!(written(&tools, json!([2])), (false, "-".into()));
        assert_eq!(written(&tools, json!("x")), (false, "-".into()));
        let system = field("system", r#""x  y""#, None);
        assert_eq!(written(&system, json!("x  y")), (true, r#"-"x  y""#.into()));
    }

    #[test]
    fn what_the_full_path_reads_instead() {
        for body in [
            r#"{"messages":[]}"#,
            r#"{"model":"m"}"#,
            r#"{"model":null,"messages":[]}"#,
            r#"{"model":"m","messages":{}}"#,
            r#"{"model":"m","messages":[],"model":"n"}"#,
            r#"{"model":"m","messages":[],"system":"a","system":"b"}"#,
            r#"{"model":"m","messages":[],"max_tokens":-1}"#,
            r#"{"model":"m","messages":[],"max_tokens":1.5}"#,
            r#"{"model":"m","messages":[],"stored":null}"#,
            r#"{"model":"m","messages":[]} x"#,
            r#"{"model":"m","messages":[],"other":[}"#,
            r#"["m",[]]"#,
        ] {
            assert!(read(body).is_none(), "{body}");
        }
        // A field the stage does not read may come twice.
        assert!(read(r#"{"model":"m","messages":[],"n":1,"n":2}"#).is_some());
    }
}
