//! The layout's promise: data flows one way. The folders are layers, and no module of `src/`
//! imports one of a higher layer, nor, directly or through others, a module that imports it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every module file under `src/`, by its path (`compaction::plan`), with its source less its
/// unit test modules (which may import anything): every production line is read.
fn modules() -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(root).unwrap().with_extension("");
                let name = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("::");
                let name = name.strip_suffix("::mod").unwrap_or(&name).to_string();
                if name == "lib" || name == "main" {
                    continue;
                }
                let source = std::fs::read_to_string(&path).unwrap();
                out.insert(name, without_test_modules(&source));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

/// `source` less each `#[cfg(test)] mod NAME { … }` block, its braces matched past strings,
/// characters and comments. Any other item marked `#[cfg(test)]` is kept, and read.
fn without_test_modules(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("#[cfg(test)]") {
        let after = &rest[at + "#[cfg(test)]".len()..];
        let item = after.trim_start();
        let is_module = item
            .strip_prefix("mod ")
            .map(str::trim_start)
            .map(|name| name.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_'))
            .is_some_and(|tail| tail.trim_start().starts_with('{'));
        out.push_str(&rest[..at]);
        if !is_module {
            out.push_str("#[cfg(test)]");
            rest = after;
            continue;
        }
        let open = after.find('{').unwrap();
        let end = block_end(&after[open..]);
        rest = &after[open + end..];
    }
    out.push_str(rest);
    out
}

/// The length of the brace block `code` opens with, up to and with its closing brace.
fn block_end(code: &str) -> usize {
    let bytes = code.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                i += code[i..].find('\n').unwrap_or(code.len() - i);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += code[i..].find("*/").map_or(code.len() - i, |end| end + 1);
            }
            b'r' if matches!(bytes.get(i + 1), Some(b'"' | b'#'))
                && !bytes[i.saturating_sub(1)].is_ascii_alphanumeric() =>
            {
                let hashes = code[i + 1..].chars().take_while(|&c| c == '#').count();
                let close = format!("\"{}", "#".repeat(hashes));
                let from = i + 2 + hashes;
                i = from + code[from..].find(&close).unwrap_or(code.len() - from) + close.len() - 1;
            }
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            // A character literal ('{', '\''), not a lifetime ('a).
            b'\'' if bytes.get(i + 1) == Some(&b'\\') => {
                i += 2 + code[i + 2..].find('\'').unwrap_or(0);
            }
            b'\'' if bytes.get(i + 2) == Some(&b'\'') => i += 2,
            _ => {}
        }
        i += 1;
    }
    code.len()
}

#[test]
fn test_modules_are_skipped_and_everything_else_is_read() {
    let source = "use a::b;\n#[cfg(test)]\nmod tests {\n    let s = \"}\"; let c = '{'; // }\n    fn f<'a>() { r#\"}\"# }\n}\n#[cfg(test)]\npub fn helper() {}\nuse crate::c;\n";
    let read = without_test_modules(source);
    assert_eq!(
        read,
        "use a::b;\n\n#[cfg(test)]\npub fn helper() {}\nuse crate::c;\n"
    );
}

/// The module files each module names. A path starts at `crate::`, at `self::` or `super::`
/// (as many as it has), or at a module the file declares (`mod view;` then `view::item`),
/// and branches through `use` groups to any depth (`super::{a, b::{self, C}}`). What it
/// names is the longest of its prefixes that is a module file; a folder's `mod.rs` is one
/// like any other. Declaring a module (`mod view;`) is not importing it.
fn imports(modules: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    modules
        .iter()
        .map(|(name, code)| (name.clone(), imports_of(name, code, modules)))
        .collect()
}

fn imports_of(name: &str, code: &str, modules: &BTreeMap<String, String>) -> BTreeSet<String> {
    let own: Vec<String> = name.split("::").map(String::from).collect();
    let declared = |word: &str| modules.contains_key(&format!("{name}::{word}"));
    let mut paths = Vec::new();
    let mut at = 0;
    while let Some(next) = code[at..].chars().next() {
        let word = identifier(&code[at..]);
        if word.is_empty() {
            at += next.len_utf8();
            continue;
        }
        // A word after `::` continues a path read already, or one that is not the crate's.
        let starts_path = code[at + word.len()..].starts_with("::")
            && !code[..at].ends_with("::")
            && (["crate", "self", "super"].contains(&word) || declared(word));
        at += if starts_path {
            use_tree(&code[at..], &own, &mut paths)
        } else {
            word.len()
        };
    }
    paths
        .iter()
        .filter_map(|path| {
            (1..=path.len())
                .rev()
                .map(|i| path[..i].join("::"))
                .find(|prefix| modules.contains_key(prefix))
        })
        .filter(|module| module != name)
        .collect()
}

/// Reads the use tree (or plain path) at the start of `text`, starting from module `from`:
/// each path it ends in goes to `paths`, from the crate's root. Returns the bytes it spans.
fn use_tree(text: &str, from: &[String], paths: &mut Vec<Vec<String>>) -> usize {
    let mut path = from.to_vec();
    let mut at = 0;
    loop {
        at += text[at..].len() - text[at..].trim_start().len();
        if text[at..].starts_with('{') {
            at += 1;
            loop {
                at += text[at..].len() - text[at..].trim_start().len();
                match text[at..].chars().next() {
                    None => return at,
                    Some('}') => return at + 1,
                    Some(',') => at += 1,
                    Some(_) => {
                        at += use_tree(&text[at..], &path, paths);
                        // What follows a branch up to the next `,` or `}` (`as name`, `*`)
                        // names nothing more.
                        at += text[at..].find([',', '}']).unwrap_or(text.len() - at);
                    }
                }
            }
        }
        let word = identifier(&text[at..]);
        at += word.len();
        match word {
            "crate" => path.clear(),
            "super" => {
                path.pop();
            }
            "self" | "" => {}
            _ => path.push(word.to_string()),
        }
        if !text[at..].starts_with("::") {
            paths.push(path);
            return at;
        }
        at += "::".len();
    }
}

fn identifier(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// A path from `from` back to itself, if there is one.
fn cycle_through(from: &str, graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    let mut stack = vec![(from.to_string(), vec![from.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((at, path)) = stack.pop() {
        for next in &graph[&at] {
            if next == from {
                return Some(path);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

/// The layers, from the bottom up, by a module's first path segment: each may import its own
/// layer and those below, never one above.
const LAYERS: &[&[&str]] = &[
    &["conversation", "canonical", "error"],
    &["tokens"],
    &["config", "observe"],
    &["transport"],
    &["compaction"],
    &["dialect"],
    &["pipeline"],
    &["server", "cli"],
];

fn layer_of(module: &str) -> Option<usize> {
    let top = module.split("::").next().unwrap_or(module);
    LAYERS.iter().position(|layer| layer.contains(&top))
}

/// Every import that goes up a layer, as (importer, imported); a module in no layer is
/// reported as importing itself from nowhere, so that a new folder gets a place.
fn upward_imports(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (module, imported) in graph {
        let Some(own) = layer_of(module) else {
            found.push((module.clone(), "(in no layer)".to_string()));
            continue;
        };
        for other in imported {
            if layer_of(other).is_none_or(|layer| layer > own) {
                found.push((module.clone(), other.clone()));
            }
        }
    }
    found
}

#[test]
fn no_module_imports_a_higher_layer() {
    let graph = imports(&modules());
    let upward = upward_imports(&graph);
    assert!(upward.is_empty(), "imports that go up a layer: {upward:#?}");
}

#[test]
fn the_layer_check_finds_an_import_that_goes_up() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("transport::body", vec!["error"]),
        (
            "compaction::cache",
            vec!["dialect::chat", "tokens::counter"],
        ),
        ("dialect::chat", vec![]),
        ("error", vec![]),
        ("tokens::counter", vec![]),
        ("gadgets::x", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        upward_imports(&graph),
        vec![
            ("compaction::cache".to_string(), "dialect::chat".to_string()),
            ("gadgets::x".to_string(), "(in no layer)".to_string()),
        ]
    );
}

#[test]
fn no_module_imports_one_that_imports_it() {
    let modules = modules();
    assert!(
        modules.contains_key("compaction::plan"),
        "found {modules:?}"
    );
    let graph = imports(&modules);
    assert!(
        graph["dialect::chat"].contains("compaction::rewrite"),
        "the import reader misses imports: {:?}",
        graph["dialect::chat"]
    );
    assert!(
        graph["server::routes"].contains("pipeline"),
        "the import reader misses a folder's own module: {:?}",
        graph["server::routes"]
    );
    let cycles: Vec<Vec<String>> = graph
        .keys()
        .filter_map(|module| cycle_through(module, &graph))
        .collect();
    assert!(cycles.is_empty(), "import circles: {cycles:#?}");
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        cycle_through("a", &graph),
        Some(vec!["a".into(), "b".into(), "c".into()])
    );
    assert_eq!(cycle_through("d", &graph), None);
}

/// Module sources by name, for the reader's own tests.
fn sources(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(name, code)| (name.to_string(), code.to_string()))
        .collect()
}

#[test]
fn the_import_reader_follows_relative_paths_and_groups() {
    let modules = sources(&[
        (
            "shop",
            "pub mod stock;\nmod till;\nuse till::Till;\npub struct Receipt;\n",
        ),
        (
            "shop::till",
            "use super::{\n    stock::{self, Shelf as Rack},\n    Receipt,\n};\npub struct Till;\n",
        ),
        (
            "shop::stock",
            "pub struct Shelf;\nfn pay() { super::super::bank::pay(self::Shelf) }\n",
        ),
        (
            "bank",
            "pub fn pay() {}\nfn f() { serde_json::Value::Null; }\n",
        ),
    ]);
    let graph = imports(&modules);
    let named = |module: &str| graph[module].iter().cloned().collect::<Vec<_>>();
    // `pub mod stock;` declares a module; `till::Till` names one.
    assert_eq!(named("shop"), vec!["shop::till"]);
    assert_eq!(named("shop::till"), vec!["shop", "shop::stock"]);
    assert_eq!(named("shop::stock"), vec!["bank"]);
    assert_eq!(named("bank"), Vec::<String>::new());
}

#[test]
fn the_cycle_finder_finds_a_cycle_through_super() {
    let modules = sources(&[
        (
            "pipeline",
            "mod send;\npub struct Outcome;\nfn go() { send::send() }\n",
        ),
        ("pipeline::send", "use super::Outcome;\npub fn send() {}\n"),
    ]);
    let graph = imports(&modules);
    assert_eq!(
        cycle_through("pipeline::send", &graph),
        Some(vec!["pipeline::send".to_string(), "pipeline".to_string()])
    );
}
