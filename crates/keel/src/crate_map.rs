//! The crate map of `docs/architecture.md` against the workspace: the "uses" column of
//! each crate's row must equal the Keel crates it depends on (normal dependencies, from
//! `cargo metadata`), so the page cannot drift from the manifests.

use std::collections::{BTreeMap, BTreeSet};

/// `keel-x` → `x`; `keel` stays `keel`.
fn short(name: &str) -> &str {
    name.strip_prefix("keel-").unwrap_or(name)
}

/// The Keel crates each workspace crate depends on (normal and build dependencies, not
/// dev-dependencies), by short name.
fn manifest_edges() -> BTreeMap<String, BTreeSet<String>> {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata failed");
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let members: BTreeSet<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str())
        .filter(|n| n.starts_with("keel"))
        .map(str::to_owned)
        .collect();
    let mut edges = BTreeMap::new();
    for p in packages {
        let name = p["name"].as_str().unwrap_or_default();
        if !members.contains(name) {
            continue;
        }
        let uses: BTreeSet<String> = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["kind"].as_str() != Some("dev"))
            .filter_map(|d| d["name"].as_str())
            .filter(|d| members.contains(*d))
            .map(|d| short(d).to_owned())
            .collect();
        edges.insert(short(name).to_owned(), uses);
    }
    edges
}

/// The rows of the crate table: crate short name → the "uses" column's crates (the
/// words outside parentheses; `—` is none).
fn documented_edges(page: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges = BTreeMap::new();
    for line in page.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | `keel-x` | owns | uses |  → ["", "`keel-x`", owns, uses, ""]
        if cells.len() < 5 || !cells[1].starts_with("`keel") {
            continue;
        }
        let name = cells[1].trim_matches('`');
        let uses_cell = cells[cells.len() - 2];
        let mut depth = 0usize;
        let mut plain = String::new();
        for c in uses_cell.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                _ if depth == 0 => plain.push(c),
                _ => {}
            }
        }
        let uses = plain
            .split([',', ' '])
            .map(|w| w.trim_matches(|c: char| c == '`' || c == '.'))
            .filter(|w| !w.is_empty() && *w != "—")
            .map(|w| short(w).to_owned())
            .collect();
        edges.insert(short(name).to_owned(), uses);
    }
    edges
}

#[test]
fn the_crate_map_equals_the_manifests() {
    let page_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/architecture.md");
    let page = std::fs::read_to_string(page_path).expect("docs/architecture.md");
    let documented = documented_edges(&page);
    let actual = manifest_edges();
    let mut wrong = Vec::new();
    for (name, uses) in &actual {
        match documented.get(name) {
            None => wrong.push(format!("{name}: no row in the crate table")),
            Some(d) if d != uses => wrong.push(format!(
                "{name}: the page says {d:?}, the manifest has {uses:?}"
            )),
            Some(_) => {}
        }
    }
    for name in documented.keys() {
        if !actual.contains_key(name) {
            wrong.push(format!(
                "{name}: a row for a crate the workspace does not have"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/architecture.md's crate map is stale:\n{}",
        wrong.join("\n")
    );
}

/// Every repository path the docs cite (`crates/...`, `migrations/...`, in backticks or
/// parentheses) exists, so a moved or split file cannot leave a page pointing nowhere.
#[test]
fn every_path_the_docs_cite_exists() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let mut pages = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut missing = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).expect("page");
        for (n, line) in text.lines().enumerate() {
            for start in ["crates/", "migrations/"] {
                let mut rest = line;
                while let Some(i) = rest.find(start) {
                    // Only whole paths: preceded by a delimiter, not inside a longer word.
                    let before = rest[..i].chars().last();
                    let tail = &rest[i..];
                    let end = tail
                        .find(|c: char| !(c.is_ascii_alphanumeric() || "/_-.".contains(c)))
                        .unwrap_or(tail.len());
                    let path = tail[..end].trim_end_matches(['.', '/']);
                    rest = &tail[end..];
                    if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '/' || c == '-') {
                        continue;
                    }
                    // Globs and templates (`crates/*/src`, `<crate>`) are not paths.
                    if path.contains('*')
                        || tail[..end].contains('<')
                        || path == start.trim_end_matches('/')
                    {
                        continue;
                    }
                    if !root.join(path).exists() {
                        missing.push(format!("{}:{}: {path}", page.display(), n + 1));
                    }
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the docs cite paths that do not exist:\n{}",
        missing.join("\n")
    );
}
