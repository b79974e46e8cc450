//! The layout's promise: data flows one way. The folders are layers, and no module of `src/`
//! imports one of a higher layer, nor, directly or through others, a module that imports it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every module file under `src/`, by its path (`compaction::plan`), with its source up to
/// its unit tests (which may import anything).
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
                let code = source.split("#[cfg(test)]").next().unwrap().to_string();
                out.insert(name, code);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

/// The module files each module names: `crate::a::b::item` and `crate::a::{b, c}`.
fn imports(modules: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let is_file = |name: &str| modules.contains_key(name);
    modules
        .iter()
        .map(|(name, code)| {
            let mut found = BTreeSet::new();
            for (at, _) in code.match_indices("crate::") {
                let rest = &code[at + "crate::".len()..];
                let path: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                let path = path.trim_end_matches(':');
                let parts: Vec<&str> = path.split("::").collect();
                // The longest prefix that is a module file is what is imported.
                if let Some(module) = (1..=parts.len())
                    .rev()
                    .map(|i| parts[..i].join("::"))
                    .find(|candidate| is_file(candidate))
                {
                    found.insert(module.clone());
                    // `crate::a::{b, c}`: siblings named inside the braces.
                    let after = &rest[path.len()..];
                    if let Some(group) = after.strip_prefix("::{") {
                        let group = &group[..group.find('}').unwrap_or(0)];
                        for item in group.split(',') {
                            let item = item.trim().split("::").next().unwrap_or("");
                            let sibling = format!("{module}::{item}");
                            if is_file(&sibling) {
                                found.insert(sibling);
                            }
                        }
                    }
                }
            }
            found.remove(name);
            // A folder's `mod.rs` only declares its files; naming the folder is not a cycle.
            found.retain(|m| !is_folder(m, modules));
            (name.clone(), found)
        })
        .collect()
}

fn is_folder(name: &str, modules: &BTreeMap<String, String>) -> bool {
    let prefix = format!("{name}::");
    modules.keys().any(|m| m.starts_with(&prefix))
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
        graph["dialect::chat"].contains("compaction::compactor"),
        "the import reader misses imports: {:?}",
        graph["dialect::chat"]
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
