//! The module graph stays layered: no import circle crosses the crate's top-level modules.
//!
//! Every `crate::NAME` path in `src/` (in `use` lines, groups such as `use crate::{a, b}`, and
//! inline paths) is an edge from the top-level module of the file it is written in (`src/X.rs`
//! or `src/X/…`) to module `NAME`. The graph of those edges must have no cycle: a stage may use
//! the stages below it and the shared vocabulary (`context`, `domain`, `error`, `response`,
//! `config`), never one above it. ARCHITECTURE.md says which module may import which.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the top-level modules it names.
type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The identifiers named right after each `crate::` in `code` (comments removed).
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or_default();
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // `crate::{a, b::c, d}`: the first segment of each member at depth 0.
                let mut depth = 0;
                let mut member = String::new();
                for ch in group.chars() {
                    match ch {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            out.push(std::mem::take(&mut member));
                            continue;
                        }
                        _ => {}
                    }
                    if depth == 0 {
                        member.push(ch);
                    }
                }
                out.push(member);
            } else {
                out.push(rest.to_owned());
            }
        }
    }
    out.into_iter()
        .map(|s| {
            s.trim()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|s| !s.is_empty() && s != "self")
        // `crate::Error` is `error::Error`, re-exported at the root.
        .map(|s| if s == "Error" { "error".to_owned() } else { s })
        .collect()
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph = Graph::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src");
        let first = rel.components().next().expect("a component");
        let module = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let code = std::fs::read_to_string(&file).expect("read file");
        let deps = graph.entry(module.clone()).or_default();
        for name in crate_paths(&code) {
            if name != module {
                deps.insert(name);
            }
        }
    }
    graph
}

/// Every cycle's members, one strongly connected component of more than one module each.
fn cycles(graph: &Graph) -> Vec<BTreeSet<String>> {
    // Reachability by repeated search: the graph has a few dozen nodes.
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_owned()];
        while let Some(n) = stack.pop() {
            for d in graph.get(&n).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    stack.push(d.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|k| (k, reach(k))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for (a, ra) in &reaches {
        let scc: BTreeSet<String> = ra
            .iter()
            .filter(|b| reaches.get(b).is_some_and(|rb| rb.contains(*a)))
            .cloned()
            .collect();
        if !scc.is_empty() && !out.iter().any(|s| s.contains(*a)) {
            out.push(scc);
        }
    }
    out
}

#[test]
fn paths_are_parsed_from_use_lines_groups_and_inline_paths() {
    let code = "use crate::a::B;\nuse crate::{b, c::{D, E}, self};\nlet x = crate::d::f(); // crate::zz\nfn f() -> crate::Error {}\n";
    assert_eq!(crate_paths(code), ["a", "b", "c", "d", "error"]);
}

#[test]
fn a_cycle_is_found() {
    let mut g = Graph::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    g.entry("c".into()).or_default().insert("a".into());
    g.entry("d".into()).or_default().insert("a".into());
    let found = cycles(&g);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0], ["a", "b", "c"].map(String::from).into());
}

#[test]
fn no_import_circle_crosses_top_level_modules() {
    let g = graph();
    assert!(g.len() > 10, "the source tree was not found: {g:?}");
    let found = cycles(&g);
    let report: Vec<String> = found
        .iter()
        .map(|scc| {
            let edges: Vec<String> = scc
                .iter()
                .flat_map(|a| {
                    g[a].iter()
                        .filter(|b| scc.contains(*b))
                        .map(move |b| format!("{a} -> {b}"))
                })
                .collect();
            edges.join(", ")
        })
        .collect();
    assert!(
        found.is_empty(),
        "import circles between top-level modules:\n{}",
        report.join("\n")
    );
}

/// The mock upstream is its own crate (`crates/mock`): the proxy names it only where a user
/// asks for it (`fairgate mock-upstream` in `main.rs`, `fairgate demo` in `demo`), and it
/// names nothing of the proxy (it is the provider the proxy is tested against).
#[test]
fn the_mock_crate_is_named_only_by_main_and_demo_and_names_no_proxy_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let users: Vec<String> = files
        .iter()
        .filter(|f| {
            std::fs::read_to_string(f)
                .expect("read file")
                .lines()
                .any(|l| {
                    l.split("//")
                        .next()
                        .unwrap_or_default()
                        .contains("fairgate_mock")
                })
        })
        .map(|f| f.strip_prefix(root).unwrap().display().to_string())
        .collect();
    assert!(!users.is_empty(), "the source tree was not found");
    for user in &users {
        assert!(
            user == "src/main.rs" || user.starts_with("src/demo/"),
            "{user} imports fairgate_mock: only `fairgate mock-upstream` (main.rs) and `demo` may"
        );
    }
    let mut mock = Vec::new();
    rust_files(&root.join("crates/mock/src"), &mut mock);
    assert!(mock.len() > 5, "the mock crate was not found");
    for file in &mock {
        let code = std::fs::read_to_string(file).expect("read file");
        assert!(
            !code.contains("fairgate::"),
            "{} names the proxy (`fairgate::`): the mock imports nothing of it",
            file.display()
        );
    }
}
