//! `--request-probe MODULE:SYMBOL`: finds a function that runs once per
//! request in one of the target's modules, as the file offset a uprobe takes.
use anyhow::{Context, Result, anyhow, bail};
use object::Object;

use super::{
    lockfuncs::file_offset_of,
    modules::{defines_function, function_range, soname},
    placement,
    target::Target,
};

/// A resolved request-boundary function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestProbe {
    /// Module path as the target sees it.
    pub module: String,
    pub symbol: String,
    pub file_offset: u64,
    /// Whether the kernel emulates the probed (first) instruction, i.e. a cheap hit.
    pub emulated: bool,
}

impl RequestProbe {
    pub(crate) fn describe(&self) -> String {
        let file = self.module.rsplit('/').next().unwrap_or(&self.module);
        format!("{file}:{}", self.symbol)
    }
}

/// Splits `MODULE:SYMBOL` (the module may be a file name, a path, or a path suffix).
pub(crate) fn parse(spec: &str) -> Result<(String, String)> {
    match spec.split_once(':') {
        Some((module, symbol)) if !module.is_empty() && !symbol.is_empty() => {
            Ok((module.to_string(), symbol.to_string()))
        }
        _ => bail!(
            "--request-probe {spec:?}: want MODULE:SYMBOL, e.g. libphp.so:php_request_startup"
        ),
    }
}

pub(crate) fn resolve(target: &Target, spec: &str) -> Result<RequestProbe> {
    let (wanted, symbol) = parse(spec)?;
    let modules = modules(target);
    let module = choose_module(&modules, &wanted).map_err(|error| match error {
        ModuleMatch::None => anyhow!(
            "--request-probe: process {} has no module matching {wanted:?} (its modules: {})",
            target.pid,
            modules
                .iter()
                .map(Module::shown)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        ModuleMatch::Several(several) => anyhow!(
            "--request-probe: {wanted:?} matches several modules: {}; give more of the path",
            several
                .iter()
                .map(|m| m.shown_with_path())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })?;
    probe_symbol(target, &module.path, &symbol)
}

/// An executable module of the target, as `--request-probe` can name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Module {
    /// Path as the target sees it.
    pub path: String,
    /// `DT_SONAME` of a shared library (`libphp.so` for a library mapped as
    /// `libphp-franken-stock.so`, the target of a symlink or a versioned file).
    pub soname: Option<String>,
}

impl Module {
    pub(crate) fn file_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    /// The file name, with the SONAME where it differs.
    fn shown(&self) -> String {
        match &self.soname {
            Some(soname) if soname != self.file_name() => {
                format!("{} (SONAME {soname})", self.file_name())
            }
            _ => self.file_name().to_string(),
        }
    }

    fn shown_with_path(&self) -> String {
        match &self.soname {
            Some(soname) if soname != self.file_name() => {
                format!("{} (SONAME {soname})", self.path)
            }
            _ => self.path.clone(),
        }
    }

    /// Named by its path, a path suffix, its file name or its SONAME.
    fn matches(&self, wanted: &str) -> bool {
        module_matches(&self.path, wanted)
            || (!wanted.contains('/')
                && self
                    .soname
                    .as_deref()
                    .is_some_and(|soname| module_matches(soname, wanted)))
    }
}

/// The target's executable file-backed modules, the executable first, each
/// once, with their SONAMEs (read from the mapped files).
pub(crate) fn modules(target: &Target) -> Vec<Module> {
    let mut paths: Vec<&str> = Vec::new();
    for mapping in &target.maps {
        if mapping.is_file() && mapping.is_executable() && !paths.contains(&mapping.path.as_str()) {
            paths.push(&mapping.path);
        }
    }
    paths.sort_by_key(|path| *path != target.exe);
    paths
        .into_iter()
        .map(|path| Module {
            path: path.to_string(),
            soname: target
                .module_file(path)
                .ok()
                .and_then(|file| soname(file.bytes())),
        })
        .collect()
}

/// Why no single module was chosen.
#[derive(Debug, PartialEq, Eq)]
enum ModuleMatch<'a> {
    None,
    Several(Vec<&'a Module>),
}

/// The one module `wanted` names; a full path wins over other matches.
fn choose_module<'a>(modules: &'a [Module], wanted: &str) -> Result<&'a Module, ModuleMatch<'a>> {
    if let Some(exact) = modules.iter().find(|m| m.path == wanted) {
        return Ok(exact);
    }
    let matching: Vec<&Module> = modules.iter().filter(|m| m.matches(wanted)).collect();
    match matching.as_slice() {
        [one] => Ok(one),
        [] => Err(ModuleMatch::None),
        _ => Err(ModuleMatch::Several(matching)),
    }
}

/// Which of the functions `symbols` `module` defines (text symbols,
/// versioned or not), in one pass over its symbol tables.
pub(crate) fn defined<'a>(target: &Target, module: &str, symbols: &[&'a str]) -> Vec<&'a str> {
    let Ok(file) = target.module_file(module) else {
        return Vec::new();
    };
    let Ok(elf) = file.elf() else {
        return Vec::new();
    };
    let mut found: Vec<&str> = Vec::new();
    for symbol in elf.symbols().chain(elf.dynamic_symbols()) {
        if let Some(wanted) = symbols
            .iter()
            .find(|wanted| defines_function(&symbol, wanted))
            && !found.contains(wanted)
        {
            found.push(wanted);
        }
    }
    found
}

/// The uprobe point of the function `symbol` in the target's `module`.
pub(crate) fn probe_symbol(target: &Target, module: &str, symbol: &str) -> Result<RequestProbe> {
    let file = target
        .module_file(module)
        .with_context(|| format!("--request-probe: cannot read {module}"))?;
    let data = file.bytes();
    let elf = file
        .elf()
        .with_context(|| format!("--request-probe: {module}"))?;
    let Some((address, _)) = function_range(&elf, symbol) else {
        bail!(
            "--request-probe: no function {symbol} in {module} (misspelt, static and stripped, or inlined?)"
        );
    };
    let file_offset = file_offset_of(&elf, address).ok_or_else(|| {
        anyhow!("--request-probe: {symbol} in {module} is not in a loaded segment")
    })?;
    let first_bytes = data.get(file_offset as usize..).unwrap_or_default();
    let emulated =
        placement::first_instruction_is_emulated(&first_bytes[..first_bytes.len().min(16)]);
    Ok(RequestProbe {
        module: module.to_string(),
        symbol: symbol.to_string(),
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

    fn module(path: &str, soname: Option<&str>) -> Module {
        Module {
            path: path.into(),
            soname: soname.map(str::to_string),
        }
    }

    #[test]
    fn matches_by_soname_and_file_name() {
        let modules = [
            module("/tmp/e2e/frankenphp-e2e", None),
            module("/tmp/e2e/libphp-franken-stock.so", Some("libphp.so")),
            module("/usr/lib/x86_64-linux-gnu/libc.so.6", Some("libc.so.6")),
        ];
        // The SONAME names the library mapped under a symlink's target name.
        assert_eq!(choose_module(&modules, "libphp.so"), Ok(&modules[1]));
        assert_eq!(choose_module(&modules, "libphp"), Ok(&modules[1]));
        // So does its file name.
        assert_eq!(
            choose_module(&modules, "libphp-franken-stock.so"),
            Ok(&modules[1])
        );
        assert_eq!(choose_module(&modules, "libc.so.6"), Ok(&modules[2]));
        assert_eq!(
            choose_module(&modules, "libpthread.so"),
            Err(ModuleMatch::None)
        );
        // A path is matched against paths only, not against SONAMEs.
        assert_eq!(
            choose_module(&modules, "e2e/libphp.so"),
            Err(ModuleMatch::None)
        );
    }

    #[test]
    fn ambiguous_match_lists_candidates_and_full_path_wins() {
        let modules = [
            module("/tmp/e2e/libphp-franken-stock.so", Some("libphp.so")),
            module("/opt/php/lib/libphp.so", Some("libphp.so")),
        ];
        assert_eq!(
            choose_module(&modules, "libphp.so"),
            Err(ModuleMatch::Several(vec![&modules[0], &modules[1]]))
        );
        assert_eq!(
            modules[0].shown_with_path(),
            "/tmp/e2e/libphp-franken-stock.so (SONAME libphp.so)"
        );
        assert_eq!(modules[1].shown_with_path(), "/opt/php/lib/libphp.so");
        assert_eq!(
            choose_module(&modules, "/opt/php/lib/libphp.so"),
            Ok(&modules[1])
        );
        assert_eq!(
            choose_module(&modules, "libphp-franken-stock.so"),
            Ok(&modules[0])
        );
    }

    #[test]
    fn reads_sonames() {
        let me = Target::open(std::process::id()).unwrap();
        let found = modules(&me);
        assert_eq!(found[0].path, me.exe, "the executable comes first");
        let libc = found
            .iter()
            .find(|m| m.file_name() == "libc.so.6")
            .expect("this test binary maps glibc");
        assert_eq!(libc.soname.as_deref(), Some("libc.so.6"));
        // An executable has no SONAME.
        assert_eq!(found[0].soname, None);
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
