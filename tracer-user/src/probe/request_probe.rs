//! `--request-probe MODULE:SYMBOL`: finds a function that runs once per
//! request in one of the target's modules, as the file offset a uprobe takes.
use std::collections::BTreeSet;

use anyhow::{Context, Result, anyhow, bail};
use object::{Object, ObjectSymbol, SymbolKind};

use super::{lockfuncs::file_offset_of, placement, target::Target};

/// A resolved request-boundary function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestProbe {
    /// Module path as the target sees it.
    pub module: String,
    pub symbol: String,
    pub file_offset: u64,
    /// Whether the kernel emulates the probed (first) instruction, i.e. a cheap hit.
    pub emulated: bool,
}

impl RequestProbe {
    pub fn describe(&self) -> String {
        let file = self.module.rsplit('/').next().unwrap_or(&self.module);
        format!("{file}:{}", self.symbol)
    }
}

/// Splits `MODULE:SYMBOL` (the module may be a file name, a path, or a path suffix).
pub fn parse(spec: &str) -> Result<(String, String)> {
    match spec.split_once(':') {
        Some((module, symbol)) if !module.is_empty() && !symbol.is_empty() => {
            Ok((module.to_string(), symbol.to_string()))
        }
        _ => bail!(
            "--request-probe {spec:?}: want MODULE:SYMBOL, e.g. libphp.so:php_request_startup"
        ),
    }
}

pub fn resolve(target: &Target, spec: &str) -> Result<RequestProbe> {
    let (wanted, symbol) = parse(spec)?;
    let modules: BTreeSet<&str> = target
        .maps
        .iter()
        .filter(|m| m.is_file() && m.is_executable())
        .map(|m| m.path.as_str())
        .collect();
    let matching: Vec<&str> = modules
        .iter()
        .copied()
        .filter(|path| module_matches(path, &wanted))
        .collect();
    let module = match matching.as_slice() {
        [one] => one.to_string(),
        [] => bail!(
            "--request-probe: process {} has no module matching {wanted:?} (its modules: {})",
            target.pid,
            modules
                .iter()
                .map(|p| p.rsplit('/').next().unwrap_or(p))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        several => bail!(
            "--request-probe: {wanted:?} matches several modules ({}); give more of the path",
            several.join(", ")
        ),
    };
    let file = target
        .module_file(&module)
        .with_context(|| format!("--request-probe: cannot read {module}"))?;
    let data = file.bytes();
    let elf = file
        .elf()
        .with_context(|| format!("--request-probe: {module}"))?;
    let found = elf.symbols().chain(elf.dynamic_symbols()).find(|s| {
        s.kind() == SymbolKind::Text
            && s.is_definition()
            && s.name().is_ok_and(|n| {
                n == symbol
                    || n.strip_prefix(symbol.as_str())
                        .is_some_and(|v| v.starts_with('@'))
            })
    });
    let Some(found) = found else {
        bail!(
            "--request-probe: no function {symbol} in {module} (misspelt, static and stripped, or inlined?)"
        );
    };
    let file_offset = file_offset_of(&elf, found.address()).ok_or_else(|| {
        anyhow!("--request-probe: {symbol} in {module} is not in a loaded segment")
    })?;
    let first_bytes = data.get(file_offset as usize..).unwrap_or_default();
    let emulated =
        placement::first_instruction_is_emulated(&first_bytes[..first_bytes.len().min(16)]);
    Ok(RequestProbe {
        module,
        symbol,
        file_offset,
        emulated,
    })
}

/// A module path matches its full path, a path suffix (`lib/libphp.so`), its
/// file name, or a file name prefix up to a version (`libphp.so` for `libphp.so.8`).
fn module_matches(path: &str, wanted: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    path == wanted
        || (wanted.contains('/')
            && path.ends_with(wanted)
            && path[..path.len() - wanted.len()].ends_with('/'))
        || file == wanted
        || file
            .strip_prefix(wanted)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_modules() {
        assert!(module_matches("/usr/lib/libphp.so", "libphp.so"));
        assert!(module_matches(
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "libc.so"
        ));
        assert!(module_matches(
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "x86_64-linux-gnu/libc.so.6"
        ));
        assert!(module_matches("/opt/httpd-glibc", "httpd"));
        assert!(!module_matches("/usr/lib/libcrypt.so.1", "libc"));
        assert!(!module_matches("/usr/lib/xlibc.so.6", "libc.so.6"));
        assert!(!module_matches("/usr/lib/xlibc.so.6", "ibc.so.6"));
    }

    #[test]
    fn parses_specs() {
        assert_eq!(
            parse("httpd:handle_request").unwrap(),
            ("httpd".into(), "handle_request".into())
        );
        assert!(parse("handle_request").is_err());
        assert!(parse(":x").is_err());
    }
}
