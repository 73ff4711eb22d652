//! The layers of `tracer-user/src` point one way: a module may use only the
//! layers below it (see lib.rs). This test reads every source file and fails
//! on a `crate::…` path that reaches up. Needs no root.
use std::path::{Path, PathBuf};

/// Top-level modules, lowest layer first.
const LAYERS: &[&str] = &[
    "model", "loadgen", "probe", "trace", "analysis", "naming", "render", "compare", "record",
    "live", "serve", "top", "cli",
];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| *layer == module)
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
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
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

#[test]
fn no_module_uses_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    let mut checked = 0;
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let top = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
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
        for used in crate_references(&text) {
            match rank(&used) {
                Some(layer) if layer > own => violations.push(format!(
                    "{} ({top}) uses crate::{used}, a layer above it",
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

#[test]
fn the_reference_reader_sees_groups() {
    assert_eq!(
        crate_references(
            "use crate::{model::{A, B}, probe::target::Target};\nlet x = crate::render::f();"
        ),
        ["model", "probe", "render"]
    );
}
