//! The module graph stays layered, as ARCHITECTURE.md's "What may import what" table says.
//!
//! Every `crate::NAME` path in `src/` (in `use` lines, groups such as `use crate::{a, b}`, and
//! inline paths) is an edge from the top-level module of the file it is written in (`src/X.rs`
//! or `src/X/…`) to module `NAME`. Each edge must be one the table allows for its module, every
//! module of `src/` must have a row, and the graph must have no cycle. The table is read from
//! ARCHITECTURE.md itself, so the document and the check cannot drift apart.

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

/// What each module may import: `None` for `anything`.
type Allowed = BTreeMap<String, Option<BTreeSet<String>>>;

/// The leaves that `vocabulary` stands for in the table.
const VOCABULARY: [&str; 8] = [
    "context", "domain", "error", "response", "config", "log", "worker", "stage",
];

/// The backticked names in `cell`.
fn ticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The rows of the "What may import what" table of `doc` (`| layer | module | may import |`).
fn allowed_in(doc: &str) -> Allowed {
    let section = doc
        .split("## What may import what")
        .nth(1)
        .expect("ARCHITECTURE.md has a \"What may import what\" section");
    let section = section.split("\n## ").next().unwrap_or_default();
    let mut allowed = Allowed::new();
    for line in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [_, module, imports] = cells[..] else {
            continue;
        };
        let Some(module) = ticked(module).into_iter().next() else {
            continue; // the header and the separator
        };
        let may = if imports == "anything" {
            None
        } else {
            let mut set: BTreeSet<String> = ticked(imports).into_iter().collect();
            if imports.contains("vocabulary") {
                set.extend(VOCABULARY.map(String::from));
            }
            Some(set)
        };
        assert!(
            allowed.insert(module.clone(), may).is_none(),
            "ARCHITECTURE.md lists `{module}` twice"
        );
    }
    allowed
}

/// Every edge of `graph` that `allowed` does not allow, and every module it has no row for.
fn violations(graph: &Graph, allowed: &Allowed) -> Vec<String> {
    let mut out = Vec::new();
    for (module, deps) in graph {
        match allowed.get(module) {
            None => out.push(format!(
                "`{module}` has no row in ARCHITECTURE.md's import table"
            )),
            Some(None) => {}
            Some(Some(may)) => {
                for dep in deps.iter().filter(|d| !may.contains(*d)) {
                    out.push(format!(
                        "{module} -> {dep}: not allowed by ARCHITECTURE.md (`{module}` may import: {})",
                        may.iter().cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
            }
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

#[test]
fn the_import_table_is_read_with_vocabulary_anything_and_nothing() {
    let doc = "# x\n## What may import what\n\n| layer | module | may import |\n|---|---|---|\n\
               | a | `server` | anything |\n| b | `queue` | `scheduler`, vocabulary |\n\
               | c | `domain` | nothing |\n\n## Next\n| x | `zz` | nothing |\n";
    let allowed = allowed_in(doc);
    assert_eq!(allowed.len(), 3, "{allowed:?}");
    assert_eq!(allowed["server"], None);
    let queue = allowed["queue"].as_ref().unwrap();
    assert!(queue.contains("scheduler") && queue.contains("context") && !queue.contains("body"));
    assert_eq!(allowed["domain"], Some(BTreeSet::new()));
}

#[test]
fn a_forbidden_import_and_a_module_without_a_row_are_named() {
    let doc = "## What may import what\n| l | m | i |\n|---|---|---|\n\
               | s | `queue` | `scheduler`, vocabulary |\n| c | `scheduler` | `domain` |\n";
    let allowed = allowed_in(doc);
    let mut g = Graph::new();
    g.entry("queue".into())
        .or_default()
        .insert("scheduler".into());
    g.entry("queue".into())
        .or_default()
        .insert("context".into());
    assert!(violations(&g, &allowed).is_empty());
    // The pure core reaching up into a stage: refused.
    g.entry("scheduler".into())
        .or_default()
        .insert("queue".into());
    g.entry("newstage".into()).or_default();
    let found = violations(&g, &allowed);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("`newstage` has no row"), "{found:?}");
    assert!(
        found[1].starts_with("scheduler -> queue: not allowed"),
        "{found:?}"
    );
}

/// Every import in `src/` is one ARCHITECTURE.md's table allows, and every module has a row.
#[test]
fn every_import_is_allowed_by_the_architecture_table() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md"))
            .expect("read ARCHITECTURE.md");
    let allowed = allowed_in(&doc);
    assert!(allowed.len() > 20, "the table was not found: {allowed:?}");
    let g = graph();
    assert!(g.len() > 10, "the source tree was not found: {g:?}");
    let found = violations(&g, &allowed);
    assert!(
        found.is_empty(),
        "imports that ARCHITECTURE.md's \"What may import what\" does not allow (change the \
         code, or the table with a reason):\n{}",
        found.join("\n")
    );
    // A row for a module that no longer exists is stale too.
    let stale: Vec<&String> = allowed.keys().filter(|m| !g.contains_key(*m)).collect();
    assert!(
        stale.is_empty(),
        "rows for modules that are gone: {stale:?}"
    );
}
