//! The layers of `tracer-user/src` point one way: a module may use only the
//! layers below it (see lib.rs). This test reads every source file and fails
//! on a path that reaches up: `crate::…` (in `use` groups and full paths
//! alike, re-exports included) and `super::super::…` climbing out of a
//! layer into another. Needs no root.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// Top-level modules, lowest layer first.
const LAYERS: &[&str] = &[
    "model", "loadgen", "probe", "trace", "analysis", "naming", "render", "session", "compare",
    "record", "live", "serve", "agent", "top", "cli",
];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| *layer == module)
}

/// The top-level module a file under src/ belongs to (`naming` for naming/elf.rs).
fn top_module(relative: &Path) -> String {
    let first = relative.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_string()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules a file names after `crate::`, including inside
/// `use crate::{a::…, b::{…}}` groups.
fn crate_references(text: &str) -> Vec<String> {
    references_after(text, "crate::")
}

/// The first names after each `prefix` in a file (`prefix` then a name, or
/// a `{…}` group of items).
fn references_after(text: &str, prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let before = text.len() - rest.len() + at;
        rest = &rest[at + prefix.len()..];
        // `super::` inside `super::super::` is not a path of its own.
        if before >= 2 && &text[before - 2..before] == "::" {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item = String::new();
            let mut at_item_start = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                if depth == 1 && c == ',' {
                    at_item_start = true;
                    item.clear();
                    continue;
                }
                if at_item_start {
                    if c.is_alphanumeric() || c == '_' {
                        item.push(c);
                    } else if !item.is_empty() {
                        found.push(std::mem::take(&mut item));
                        at_item_start = false;
                    }
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.push(name);
        }
    }
    found
}

/// The module path of a file below `src`: `a/b.rs` is `[a, b]`, `a/mod.rs` is `[a]`.
fn module_path(relative: &Path) -> Vec<String> {
    let mut path: Vec<String> = relative
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    if path.last().is_some_and(|last| last == "mod") {
        path.pop();
    }
    path
}

/// The top-level modules that `super::` paths in a file at `module` reach
/// once they climb to the crate root (`super::super::render` from
/// `model/report.rs`), inline `mod x { … }` blocks counted.
fn super_references(text: &str, module: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    // Inline modules open at these brace depths.
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    let bytes = text.as_bytes();
    let mut at = 0;
    while at < text.len() {
        let rest = &text[at..];
        if rest.starts_with("mod ") && (at == 0 || !is_ident(bytes[at - 1])) {
            let after: String = rest[4..]
                .chars()
                .skip_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if after.trim_start().starts_with('{') {
                inline.push(depth + 1);
            }
        }
        if rest.starts_with("super::")
            && (at == 0 || !(is_ident(bytes[at - 1]) || bytes[at - 1] == b':'))
        {
            let mut climbs = 0;
            let mut tail = rest;
            while let Some(next) = tail.strip_prefix("super::") {
                climbs += 1;
                tail = next;
            }
            let name: String = tail
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let depth_here = module.len() + inline.len();
            if climbs == depth_here && !name.is_empty() {
                found.push(name);
            }
            at += "super::".len() * climbs;
            continue;
        }
        match bytes[at] {
            b'{' => depth += 1,
            b'}' => {
                if inline.last() == Some(&depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        at += rest.chars().next().map_or(1, char::len_utf8);
    }
    found
}

fn is_ident(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

#[test]
fn no_module_uses_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    let mut checked = 0;
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let top = top_module(relative);
        let Some(own) = rank(&top) else {
            // lib.rs and main.rs sit above everything.
            assert!(
                top == "lib" || top == "main",
                "{} is in no layer: add it to LAYERS here and to lib.rs",
                relative.display()
            );
            continue;
        };
        checked += 1;
        let text = std::fs::read_to_string(file).unwrap();
        let mut used_modules = crate_references(&text);
        used_modules.extend(super_references(&text, &module_path(relative)));
        for used in used_modules {
            match rank(&used) {
                Some(layer) if layer > own => violations.push(format!(
                    "{} ({top}) uses {used}, a layer above it",
                    relative.display()
                )),
                Some(_) => {}
                None => violations.push(format!(
                    "{} uses crate::{used}, which is in no layer",
                    relative.display()
                )),
            }
        }
    }
    assert!(checked > 20, "only {checked} files checked");
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// Naming only names (issue 48): recounting, regrouping and per-request
/// figures are analysis passes the pipeline runs after it, so nothing under
/// naming reaches into analysis, though analysis is the layer below.
#[test]
fn naming_imports_nothing_from_analysis() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src.join("naming"), &mut files);
    let reaching: Vec<String> = files
        .iter()
        .filter(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            crate_references(&text)
                .iter()
                .any(|used| used == "analysis")
        })
        .map(|file| file.strip_prefix(&src).unwrap().display().to_string())
        .collect();
    assert!(files.len() > 10, "only {} naming files read", files.len());
    assert!(reaching.is_empty(), "naming uses analysis in {reaching:?}");
}

/// A session's probes are decided in one place: `attach::LoadPlan` is
/// built only in session (issue 48), never by a command or the benches.
#[test]
fn only_session_builds_a_load_plan() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&manifest.join("src"), &mut files);
    rust_files(&manifest.join("../xtask/src"), &mut files);
    let session = manifest.join("src/session");
    let builders: Vec<_> = files
        .iter()
        .filter(|file| !file.starts_with(&session))
        .filter(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            text.contains("LoadPlan {") && !text.contains("pub struct LoadPlan")
        })
        .collect();
    assert!(files.len() > 40, "only {} files read", files.len());
    assert!(
        builders.is_empty(),
        "built outside session (use session::load_plan): {builders:?}"
    );
}

/// The command line's words belong to cli: every layer under it (the
/// commands included) takes typed options and never derives clap's traits.
#[test]
fn only_cli_knows_clap() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let cli = rank("cli").unwrap();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let offenders: Vec<String> = files
        .iter()
        .filter(|file| {
            rank(&top_module(file.strip_prefix(&src).unwrap())).is_some_and(|layer| layer < cli)
        })
        .filter(|file| std::fs::read_to_string(file).unwrap().contains("clap"))
        .map(|file| file.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "clap outside cli: {offenders:?}");
}

/// Each layer's modules and the siblings in the same layer they use
/// (`super::x` from a file right under the layer, `crate::layer::x` from any
/// depth), keyed by module.
fn sibling_uses(src: &Path) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut uses: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let path = module_path(file.strip_prefix(src).unwrap());
        let [layer, module, deeper @ ..] = path.as_slice() else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        // A file's unit tests may use any sibling: only its code counts.
        let code = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or_default();
        let climb = "super::".repeat(deeper.len() + 1);
        let mut names = references_after(code, &format!("crate::{layer}::"));
        names.extend(references_after(code, &climb));
        let entry = uses.entry((layer.clone(), module.clone())).or_default();
        entry.extend(names.into_iter().filter(|name| {
            name != module && name != "super" && name != "self" && !name.is_empty()
        }));
    }
    uses
}

/// Within a layer the modules use each other one way too: no circle such
/// as `analysis::per_request` ↔ `analysis::waits`.
#[test]
fn no_import_circle_inside_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let uses = sibling_uses(&src);
    let mut circles = Vec::new();
    for (layer, start) in uses.keys() {
        // Depth-first from `start`: a path back to it is a circle.
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((module, path)) = stack.pop() {
            for next in uses.get(&(layer.clone(), module)).into_iter().flatten() {
                if next == start {
                    circles.push(format!("{layer}: {} -> {start}", path.join(" -> ")));
                } else if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    assert!(uses.len() > 50, "only {} modules read", uses.len());
    assert!(circles.is_empty(), "{}", circles.join("\n"));
}

/// Every diagnostic goes through `model::diagnostics::note`, which escapes
/// the target's control characters: no `eprintln!` in the code.
#[test]
fn diagnostics_go_through_one_channel() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let offenders: Vec<String> = files
        .iter()
        .filter(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            code.contains("eprintln!") || code.contains("eprint!(")
        })
        .map(|file| file.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "eprintln! instead of diagnostics::note: {offenders:?}"
    );
}

#[test]
fn the_reference_reader_sees_groups() {
    assert_eq!(
        crate_references(
            "use crate::{model::{A, B}, probe::target::Target};\nlet x = crate::render::f();"
        ),
        ["model", "probe", "render"]
    );
}

#[test]
fn the_reference_reader_climbs_super_paths() {
    let model = [String::from("model"), String::from("report")];
    // From model/report.rs two supers reach the crate root: render is named.
    assert_eq!(
        super_references("use super::super::render::table;", &model),
        ["render"]
    );
    // One super stays inside model.
    assert!(super_references("use super::Lock;", &model).is_empty());
    // Inside an inline test module one more climb is needed.
    let text = "mod tests {\n use super::*;\n use super::super::super::cli::x;\n}\nuse super::super::probe::y;";
    assert_eq!(super_references(text, &model), ["cli", "probe"]);
    assert_eq!(module_path(Path::new("naming/mod.rs")), ["naming"]);
    assert_eq!(
        module_path(Path::new("naming/chain.rs")),
        ["naming", "chain"]
    );
}

#[test]
fn the_checker_rejects_an_upward_path() {
    // What the main test does with each reference, on a made-up lower file.
    let own = rank("model").unwrap();
    let text = "use crate::{render::fit::Width};\npub use crate::cli::Cli;\nfn f() { super::super::top::run(); }";
    let mut used = crate_references(text);
    used.extend(super_references(
        text,
        &[String::from("model"), String::from("x")],
    ));
    let upward: Vec<&String> = used
        .iter()
        .filter(|u| rank(u).is_some_and(|r| r > own))
        .collect();
    assert_eq!(upward, ["render", "cli", "top"]);
}

/// The test files that run without root (no BPF, no tracing): every other
/// file in `tests/` must be a `[[test]]` with `required-features =
/// ["root-tests"]` in Cargo.toml, so that a new real-BPF test cannot be
/// left out of the root list (two were, once, and ran without their gate).
const RUN_WITHOUT_ROOT: &[&str] = &[
    "cli",
    "fuzz",
    "how_to_run_root_tests",
    "layers",
    "prometheus_rules",
    "table_widths",
];

/// The `[[test]]` targets of Cargo.toml gated on `root-tests`.
fn root_gated_tests(manifest: &str) -> BTreeSet<String> {
    let mut gated = BTreeSet::new();
    for block in manifest.split("[[test]]").skip(1) {
        // The block ends at the next table header.
        let block = block.split("\n[").next().unwrap_or(block);
        let name = block
            .lines()
            .find_map(|line| line.trim().strip_prefix("name = "))
            .map(|name| name.trim_matches('"').to_string());
        let gated_on_root = block
            .lines()
            .any(|line| line.trim() == r#"required-features = ["root-tests"]"#);
        if let (Some(name), true) = (name, gated_on_root) {
            gated.insert(name);
        }
    }
    gated
}

#[test]
fn every_test_file_is_root_gated_or_listed_as_needing_no_root() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let gated = root_gated_tests(&manifest);
    let mut ungated = Vec::new();
    let mut both = Vec::new();
    for entry in std::fs::read_dir(root.join("tests")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|ext| ext != "rs") {
            continue;
        }
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        match (
            gated.contains(&name),
            RUN_WITHOUT_ROOT.contains(&name.as_str()),
        ) {
            (false, false) => ungated.push(name),
            (true, true) => both.push(name),
            _ => {}
        }
    }
    assert!(
        ungated.is_empty(),
        "tests/ files neither gated on root-tests in Cargo.toml nor in RUN_WITHOUT_ROOT: {ungated:?}"
    );
    assert!(
        both.is_empty(),
        "gated on root-tests and listed as needing no root: {both:?}"
    );
    for name in RUN_WITHOUT_ROOT {
        assert!(
            root.join("tests").join(format!("{name}.rs")).exists(),
            "{name}"
        );
    }
}

/// Every file under `tests/suite/` and `tests/serial/` is a module of the
/// integration binary (a file not declared there would compile and run
/// nowhere), and the binary declares no module without its file.
#[test]
fn every_suite_file_is_a_module_of_the_integration_binary() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let binary = std::fs::read_to_string(tests.join("integration.rs")).unwrap();
    let mut declared = BTreeSet::new();
    let mut files = BTreeSet::new();
    for group in ["suite", "serial"] {
        // The group's inline module: `mod suite {` up to its closing brace.
        let block = binary
            .split(&format!("\nmod {group} {{\n"))
            .nth(1)
            .and_then(|rest| rest.split("\n}").next())
            .unwrap_or_else(|| panic!("no `mod {group} {{` in tests/integration.rs"));
        for line in block.lines() {
            if let Some(name) = line.trim().strip_prefix("mod ") {
                declared.insert(format!("{group}/{}", name.trim_end_matches(';')));
            }
        }
        for entry in std::fs::read_dir(tests.join(group)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|ext| ext == "rs") {
                let name = path.file_stem().unwrap().to_string_lossy().to_string();
                files.insert(format!("{group}/{name}"));
            }
        }
    }
    assert!(
        files.len() > 30,
        "only {} files in tests/suite and tests/serial",
        files.len()
    );
    assert_eq!(
        declared, files,
        "tests/integration.rs against tests/suite/ and tests/serial/"
    );
}

#[test]
fn the_manifest_reader_finds_gated_tests_only() {
    let manifest = "[[test]]\nname = \"a\"\nrequired-features = [\"root-tests\"]\n\n[[test]]\nname = \"b\"\nharness = false\n\n[dependencies]\nx = \"1\"\n";
    assert_eq!(
        root_gated_tests(manifest),
        BTreeSet::from(["a".to_string()])
    );
}
