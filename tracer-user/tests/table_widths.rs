//! Golden output of the text tables at 80, 120 and 160 columns and with
//! `--wide`, on a FrankenPHP-shaped report with long names
//! (`tests/data/long_names.json`): the name is cut last, the lesser columns
//! go first, and a note says `--wide` shows them. Needs no root.
//!
//! After an intended change of the layout, rewrite the golden files with
//! `UPDATE_GOLDEN=1 cargo test -p tracer-user --test table_widths` and
//! review the diff.
use std::path::{Path, PathBuf};

use locktrace::{
    compare,
    model::Report,
    render::{fit::Width, table},
};

const WIDTHS: [Width; 4] = [
    Width::Columns(80),
    Width::Columns(120),
    Width::Columns(160),
    Width::Unlimited,
];

fn data(file: &str) -> PathBuf {
    Path::new("tests/data").join(file)
}

fn golden_name(what: &str, width: Width) -> String {
    match width {
        Width::Columns(columns) => format!("{what}-{columns}.txt"),
        Width::Unlimited => format!("{what}-wide.txt"),
    }
}

/// Compares `text` with the golden file exactly, or rewrites it with UPDATE_GOLDEN=1.
fn check_golden(file: &str, text: &str) {
    let path = data("golden").join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert!(
        text == expected,
        "{} differs (UPDATE_GOLDEN=1 rewrites it):\n--- expected\n{expected}\n--- got\n{text}",
        path.display()
    );
}

#[test]
fn report_table_fits_each_width_and_leads_with_the_name() {
    // Run from the crate's directory: paths in compare's header stay relative.
    let report = Report::load(&data("long_names.json")).unwrap();
    for width in WIDTHS {
        let text = table::render(&report, None, width);
        check_golden(&golden_name("report", width), &text);
        if let Width::Columns(columns) = width {
            // Every line, footers too.
            for line in text.lines() {
                assert!(line.chars().count() <= columns, "{columns}: {line:?}");
            }
            // The name is whole at every width while the callers are not.
            assert!(
                text.contains("\n mysqlnd_global_stats->LOCK_access "),
                "{text}"
            );
            assert!(text.contains("--wide shows all"), "{text}");
        } else {
            assert!(!text.contains("--wide"), "{text}");
            assert!(
                text.contains(
                    "g_plugin_core.plugin_header.plugin_registry.extension_table->rwlock"
                ),
                "{text}"
            );
        }
        // One lock per line: each lock's row starts with its name.
        for lock in report.locks.iter().filter(|lock| lock.is_contention()) {
            let name = lock.name.as_deref().unwrap();
            let start: String = name.chars().take(15).collect();
            let rows = text
                .lines()
                .filter(|line| line.starts_with(&format!(" {start}")))
                .count();
            assert_eq!(rows, 1, "{name} at {width:?}:\n{text}");
        }
    }
}

#[test]
fn compare_table_fits_each_width() {
    for width in WIDTHS {
        let outcome = compare::evaluate(
            &data("long_names.json"),
            &data("long_names_after.json"),
            &[],
            &[],
            width,
        )
        .unwrap();
        check_golden(&golden_name("compare", width), &outcome.text);
        if let Width::Columns(columns) = width {
            for line in outcome.text.lines() {
                assert!(line.chars().count() <= columns, "{columns}: {line:?}");
            }
        }
        // What the comparison is for stays at every width.
        assert!(outcome.text.contains("disappeared"), "{}", outcome.text);
    }
}
