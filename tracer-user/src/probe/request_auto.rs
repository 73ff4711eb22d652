//! `--request-probe auto`, and the default when no request count was asked
//! for: recognise the server from the target's own modules and symbols and
//! pick the function that runs exactly once per request on it.
//!
//! - FrankenPHP: `sapi_activate` (libphp, or the executable of a static
//!   build). FrankenPHP activates the SAPI once per request in classic mode
//!   (through `php_request_startup`) and in worker mode (through
//!   `frankenphp_worker_request_startup`, where `php_request_startup` runs
//!   once per worker thread only), so one function is right in both modes
//!   and in a server mixing worker and classic scripts, without guessing the
//!   mode from the command line or the Caddyfile.
//!   A stripped static FrankenPHP has no symbols at all: Go's function table
//!   (`.gopclntab`) recognises it (its Go package's functions), and the Go
//!   body of `go_update_request_info`, which FrankenPHP's C side calls once
//!   just before each `sapi_activate` (in `frankenphp_update_request_context`,
//!   both modes), counts its requests.
//! - Apache with mod_php, and any other process with PHP's engine:
//!   `php_request_startup`, the start of every request in PHP's SAPIs.
use anyhow::{Result, bail};

use super::{
    request_probe::{self, Module, RequestProbe},
    target::Target,
};
use crate::model::{AutoProbe, ServerKind};

/// What `--request-probe` asked for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RequestProbeSpec {
    /// No flag: choose automatically unless requests are counted otherwise;
    /// an unrecognised target gets a hint, not an error.
    #[default]
    Default,
    /// `auto`: choose automatically; an unrecognised target is an error.
    Auto,
    /// `none`: no request probe.
    Off,
    /// `MODULE:SYMBOL`.
    Named(String),
}

impl RequestProbeSpec {
    pub(crate) fn parse(text: &str) -> RequestProbeSpec {
        match text {
            "auto" => RequestProbeSpec::Auto,
            "none" => RequestProbeSpec::Off,
            named => RequestProbeSpec::Named(named.to_string()),
        }
    }
}

/// The request probe to attach, if any, and how it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chosen {
    pub probe: RequestProbe,
    /// Set when locktrace chose the function (not named by the user).
    pub auto: Option<AutoChoice>,
}

/// A function chosen for a recognised server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AutoChoice {
    pub server: ServerKind,
    pub recognised_by: String,
}

impl Chosen {
    /// The report's `requests.auto_probe`.
    pub(crate) fn auto_probe(&self) -> Option<AutoProbe> {
        self.auto.as_ref().map(|auto| AutoProbe {
            server: auto.server,
            module: self.probe.module.clone(),
            function: self.probe.symbol.clone(),
            recognised_by: auto.recognised_by.clone(),
        })
    }
}

/// The outcome of resolving a spec: a probe, none, or none with a hint.
#[derive(Debug)]
pub(crate) enum Resolution {
    Probe(Chosen),
    None,
    /// No flag, and the target is not recognised: say how to count requests.
    Hint(String),
}

/// Resolves `--request-probe`; `counted_otherwise` is true when `--load` or
/// `--requests` count the requests (the default then probes nothing).
pub(crate) fn resolve(
    target: &Target,
    spec: &RequestProbeSpec,
    counted_otherwise: bool,
) -> Result<Resolution> {
    match spec {
        RequestProbeSpec::Off => Ok(Resolution::None),
        RequestProbeSpec::Default if counted_otherwise => Ok(Resolution::None),
        RequestProbeSpec::Named(spec) => Ok(Resolution::Probe(Chosen {
            probe: request_probe::resolve(target, spec)?,
            auto: None,
        })),
        RequestProbeSpec::Auto => match choose(target)? {
            Ok(chosen) => Ok(Resolution::Probe(chosen)),
            Err(unrecognised) => bail!("--request-probe auto: {unrecognised}"),
        },
        RequestProbeSpec::Default => Ok(match choose(target)? {
            Ok(chosen) => Resolution::Probe(chosen),
            Err(unrecognised) => {
                Resolution::Hint(format!("locktrace: no per-request figures: {unrecognised}"))
            }
        }),
    }
}

/// What the target's modules say about it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Evidence {
    /// The executable's file name.
    pub exe_name: String,
    /// The executable's path as the target sees it.
    pub exe_path: String,
    /// A FrankenPHP symbol and the module defining it.
    pub frankenphp: Option<(String, String)>,
    /// An Apache httpd symbol and the module defining it.
    pub apache: Option<(String, String)>,
    /// The module holding PHP's engine (defining `php_request_startup`).
    pub php: Option<String>,
    /// PHP-looking modules without the symbols (stripped).
    pub stripped_php: Vec<String>,
    /// Why the executable's Go function table could not be read (a Go
    /// program without section headers), said when nothing was recognised.
    pub go_table_unread: Option<String>,
}

/// Why no function was chosen: one line saying what to do instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unrecognised {
    /// No PHP engine in the target; `unread` says why its Go function
    /// table could not be looked at, if it could not.
    NotPhp {
        exe_name: String,
        unread: Option<String>,
    },
    /// PHP is there but its symbols are not (a stripped build).
    Stripped { modules: Vec<String> },
}

impl std::fmt::Display for Unrecognised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const HOW: &str =
            "count requests with --load URL, --request-probe MODULE:SYMBOL or --requests N";
        match self {
            Unrecognised::NotPhp { exe_name, unread } => {
                write!(
                    f,
                    "{exe_name} is not a server locktrace recognises (FrankenPHP, Apache with mod_php, a process with libphp)"
                )?;
                if let Some(why) = unread {
                    write!(f, " ({exe_name}: {why})")?;
                }
                write!(f, "; {HOW}")
            }
            Unrecognised::Stripped { modules } => write!(
                f,
                "{} looks like PHP but has no symbol table (stripped); {HOW}",
                modules.join(", ")
            ),
        }
    }
}

/// Symbols only FrankenPHP defines (cgo exports of its Go package, in the executable).
const FRANKENPHP_SYMBOLS: [&str; 2] = [
    "go_frankenphp_finish_worker_request",
    "go_frankenphp_before_script_execution",
];
/// FrankenPHP's Go package: a stripped executable's `.gopclntab` names the
/// Go bodies of its cgo exports (`github.com/dunglas/frankenphp.go_frankenphp_…`).
const FRANKENPHP_PACKAGE: &str = "github.com/dunglas/frankenphp.";
/// Once per request in both modes, on the PHP thread, right before
/// `sapi_activate`: what a build without C symbols counts.
pub(crate) const FRANKENPHP_GO_REQUEST: &str =
    "github.com/dunglas/frankenphp.go_update_request_info";
/// Apache httpd's hook runner, exported by the executable for its modules.
const APACHE_SYMBOLS: [&str; 1] = ["ap_run_handler"];
/// The start of a PHP request in every SAPI (not per request in FrankenPHP's worker mode).
const PHP_REQUEST_STARTUP: &str = "php_request_startup";
/// The SAPI's activation: once per request in FrankenPHP's classic and worker modes.
const SAPI_ACTIVATE: &str = "sapi_activate";

/// Recognises the target and resolves the function for it.
pub(crate) fn choose(target: &Target) -> Result<Result<Chosen, Unrecognised>> {
    let evidence = gather(target);
    let (server, module, function, recognised_by) = match decide(&evidence) {
        Ok(decision) => decision,
        Err(unrecognised) => return Ok(Err(unrecognised)),
    };
    let probe = request_probe::probe_symbol(target, &module, function)?;
    Ok(Ok(Chosen {
        probe,
        auto: Some(AutoChoice {
            server,
            recognised_by,
        }),
    }))
}

/// The server, the module and function to probe, and what recognised it.
pub(crate) fn decide(
    evidence: &Evidence,
) -> Result<(ServerKind, String, &'static str, String), Unrecognised> {
    let shown = |(symbol, module): &(String, String)| format!("{symbol} in {module}");
    if evidence.php.is_none()
        && let Some(found) = &evidence.frankenphp
    {
        // A stripped static build: PHP's engine is in the executable, unnamed.
        return Ok((
            ServerKind::Frankenphp,
            evidence.exe_path.clone(),
            FRANKENPHP_GO_REQUEST,
            shown(found),
        ));
    }
    let Some(php) = &evidence.php else {
        if !evidence.stripped_php.is_empty() {
            return Err(Unrecognised::Stripped {
                modules: evidence.stripped_php.clone(),
            });
        }
        return Err(Unrecognised::NotPhp {
            exe_name: evidence.exe_name.clone(),
            unread: evidence.go_table_unread.clone(),
        });
    };
    let php_in = format!("{PHP_REQUEST_STARTUP} in {}", file_name(php));
    Ok(if let Some(found) = &evidence.frankenphp {
        (
            ServerKind::Frankenphp,
            php.clone(),
            SAPI_ACTIVATE,
            shown(found),
        )
    } else if let Some(found) = &evidence.apache {
        let by = format!("{}, {php_in}", shown(found));
        (
            ServerKind::ApacheModPhp,
            php.clone(),
            PHP_REQUEST_STARTUP,
            by,
        )
    } else {
        (ServerKind::Php, php.clone(), PHP_REQUEST_STARTUP, php_in)
    })
}

/// Reads the evidence: the executable's symbols, and PHP's engine in the
/// executable (static builds, the php binary) or a library named libphp*
/// (by file name or SONAME; Debian's Apache module is `libphp8.2.so`).
pub(crate) fn gather(target: &Target) -> Evidence {
    let modules = request_probe::modules(target);
    let mut evidence = Evidence {
        exe_name: file_name(&target.exe).to_string(),
        exe_path: target.exe.clone(),
        ..Evidence::default()
    };
    let first_of = |symbols: &[&str], found: &[&str], module: &Module| {
        symbols
            .iter()
            .find(|symbol| found.contains(symbol))
            .map(|symbol| (symbol.to_string(), module.file_name().to_string()))
    };
    for module in &modules {
        let is_exe = module.path == target.exe;
        if !is_exe && !looks_like_libphp(module) {
            continue;
        }
        let wanted: Vec<&str> = if is_exe {
            [
                &FRANKENPHP_SYMBOLS[..],
                &APACHE_SYMBOLS,
                &[PHP_REQUEST_STARTUP],
            ]
            .concat()
        } else {
            vec![PHP_REQUEST_STARTUP]
        };
        let found = request_probe::defined(target, &module.path, &wanted);
        if is_exe {
            evidence.frankenphp = first_of(&FRANKENPHP_SYMBOLS, &found, module);
            if evidence.frankenphp.is_none() {
                match frankenphp_go_function(target, module) {
                    Ok(found) => evidence.frankenphp = found,
                    Err(why) => evidence.go_table_unread = why,
                }
            }
            evidence.apache = first_of(&APACHE_SYMBOLS, &found, module);
        }
        if found.contains(&PHP_REQUEST_STARTUP) {
            evidence.php = Some(module.path.clone());
            break;
        }
        if !is_exe {
            evidence.stripped_php.push(module.file_name().to_string());
        }
    }
    evidence
}

/// The first of FrankenPHP's marker functions that the executable's Go
/// function table names (a stripped build), as (`NAME (.gopclntab)`, file);
/// Err with why the table could not be read, for a file that may be a Go
/// program (all but one with no `.gopclntab` section at all).
fn frankenphp_go_function(
    target: &Target,
    module: &Module,
) -> Result<Option<(String, String)>, Option<String>> {
    let file = target.module_file(&module.path).map_err(|_| None)?;
    let elf = file.elf().map_err(|_| None)?;
    let go = match super::gopclntab::read(&elf) {
        Ok(go) => go,
        Err(super::gopclntab::GoTableError::NotGo) => return Err(None),
        Err(why) => return Err(Some(why.to_string())),
    };
    let wanted: Vec<String> = FRANKENPHP_SYMBOLS
        .iter()
        .map(|symbol| format!("{FRANKENPHP_PACKAGE}{symbol}"))
        .collect();
    let mut found: Vec<&str> = Vec::new();
    for function in go.functions() {
        if wanted.iter().any(|name| name == function.name) {
            found.push(function.name);
        }
    }
    Ok(wanted
        .iter()
        .find(|name| found.contains(&name.as_str()))
        .map(|first| {
            (
                format!("{first} (.gopclntab)"),
                module.file_name().to_string(),
            )
        }))
}

/// The PHP servers the agent watches by default, recognised as `record`
/// recognises them ([`gather`], [`decide`]): FrankenPHP, and any other
/// process whose PHP engine is thread-safe (ZTS: it defines
/// `executor_globals_offset` or `tsrm_get_ls_cache`, as `--php` reads it).
/// None for anything else.
pub(crate) fn recognise(target: &Target) -> Option<ServerKind> {
    let evidence = gather(target);
    let (server, module, ..) = decide(&evidence).ok()?;
    if server == ServerKind::Frankenphp {
        return Some(server);
    }
    defines_any(target, &module, &ZTS_SYMBOLS).then_some(server)
}

/// Whether `module` defines one of `names` (a function or a variable).
fn defines_any(target: &Target, module: &str, names: &[&str]) -> bool {
    use object::{Object, ObjectSymbol};
    let Ok(file) = target.module_file(module) else {
        return false;
    };
    let Ok(elf) = file.elf() else {
        return false;
    };
    elf.symbols().chain(elf.dynamic_symbols()).any(|symbol| {
        symbol.is_definition() && symbol.name().is_ok_and(|name| names.contains(&name))
    })
}

/// Defined by a thread-safe (ZTS) PHP engine only (NTS has `executor_globals`).
const ZTS_SYMBOLS: [&str; 2] = ["executor_globals_offset", "tsrm_get_ls_cache"];

/// Cheap pre-check before [`recognise`] reads symbols: the executable's
/// name says PHP (`frankenphp`, `php`, a static build), or a libphp is mapped.
pub(crate) fn may_be_php(exe: &str, maps: &str) -> bool {
    file_name(exe).contains("php")
        || maps.lines().any(|line| {
            line.rsplit('/')
                .next()
                .is_some_and(|name| name.starts_with("libphp"))
        })
}

fn looks_like_libphp(module: &Module) -> bool {
    module.file_name().starts_with("libphp")
        || module
            .soname
            .as_deref()
            .is_some_and(|soname| soname.starts_with("libphp"))
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(symbol: &str, module: &str) -> Option<(String, String)> {
        Some((symbol.into(), module.into()))
    }

    #[test]
    fn frankenphp_counts_sapi_activate_in_libphp() {
        let evidence = Evidence {
            exe_name: "frankenphp-e2e".into(),
            frankenphp: found("go_frankenphp_finish_worker_request", "frankenphp-e2e"),
            php: Some("/tmp/e2e/libphp-franken-stock.so".into()),
            ..Evidence::default()
        };
        assert_eq!(
            decide(&evidence),
            Ok((
                ServerKind::Frankenphp,
                "/tmp/e2e/libphp-franken-stock.so".into(),
                "sapi_activate",
                "go_frankenphp_finish_worker_request in frankenphp-e2e".into()
            ))
        );
        // A static build: PHP in the executable.
        let static_build = Evidence {
            php: Some("/usr/local/bin/frankenphp".into()),
            ..evidence
        };
        let (server, module, function, _) = decide(&static_build).unwrap();
        assert_eq!(
            (server, module.as_str(), function),
            (
                ServerKind::Frankenphp,
                "/usr/local/bin/frankenphp",
                "sapi_activate"
            )
        );
    }

    #[test]
    fn stripped_static_frankenphp_counts_its_go_request_function() {
        let evidence = Evidence {
            exe_name: "frankenphp".into(),
            exe_path: "/usr/local/bin/frankenphp".into(),
            frankenphp: found(
                "github.com/dunglas/frankenphp.go_frankenphp_finish_worker_request (.gopclntab)",
                "frankenphp",
            ),
            php: None,
            ..Evidence::default()
        };
        assert_eq!(
            decide(&evidence),
            Ok((
                ServerKind::Frankenphp,
                "/usr/local/bin/frankenphp".into(),
                "github.com/dunglas/frankenphp.go_update_request_info",
                "github.com/dunglas/frankenphp.go_frankenphp_finish_worker_request (.gopclntab) in frankenphp".into()
            ))
        );
    }

    #[test]
    fn apache_and_other_php_count_php_request_startup() {
        let apache = Evidence {
            exe_name: "apache2".into(),
            apache: found("ap_run_handler", "apache2"),
            php: Some("/usr/lib/apache2/modules/libphp8.2.so".into()),
            ..Evidence::default()
        };
        assert_eq!(
            decide(&apache),
            Ok((
                ServerKind::ApacheModPhp,
                "/usr/lib/apache2/modules/libphp8.2.so".into(),
                "php_request_startup",
                "ap_run_handler in apache2, php_request_startup in libphp8.2.so".into()
            ))
        );
        let embed = Evidence {
            exe_name: "myhost".into(),
            php: Some("/opt/php/lib/libphp.so".into()),
            ..Evidence::default()
        };
        let (server, _, function, by) = decide(&embed).unwrap();
        assert_eq!(server, ServerKind::Php);
        assert_eq!(function, "php_request_startup");
        assert_eq!(by, "php_request_startup in libphp.so");
    }

    #[test]
    fn unrecognised_targets_get_one_line_saying_what_to_do() {
        let apache_without_php = Evidence {
            exe_name: "apache2".into(),
            apache: found("ap_run_handler", "apache2"),
            ..Evidence::default()
        };
        let error = decide(&apache_without_php).unwrap_err();
        assert_eq!(
            error,
            Unrecognised::NotPhp {
                exe_name: "apache2".into(),
                unread: None
            }
        );
        let line = error.to_string();
        assert!(!line.contains('\n'));
        assert!(line.contains("--load URL, --request-probe MODULE:SYMBOL or --requests N"));

        let headless = Evidence {
            exe_name: "frankenphp".into(),
            go_table_unread: Some(
                super::super::gopclntab::GoTableError::NoSectionHeaders.to_string(),
            ),
            ..Evidence::default()
        };
        let line = decide(&headless).unwrap_err().to_string();
        assert!(!line.contains('\n'));
        assert!(
            line.contains("(frankenphp: it has no section headers (sstrip, or a packer): Go's function table (.gopclntab) cannot be found)"),
            "{line}"
        );

        let stripped = Evidence {
            exe_name: "frankenphp".into(),
            frankenphp: None,
            stripped_php: vec!["libphp.so".into()],
            ..Evidence::default()
        };
        assert!(
            decide(&stripped)
                .unwrap_err()
                .to_string()
                .starts_with("libphp.so looks like PHP but has no symbol table")
        );
    }

    #[test]
    fn specs() {
        assert_eq!(RequestProbeSpec::parse("auto"), RequestProbeSpec::Auto);
        assert_eq!(RequestProbeSpec::parse("none"), RequestProbeSpec::Off);
        assert_eq!(
            RequestProbeSpec::parse("libphp.so:sapi_activate"),
            RequestProbeSpec::Named("libphp.so:sapi_activate".into())
        );
    }

    #[test]
    fn this_test_binary_is_not_php() {
        let me = Target::open(std::process::id()).unwrap();
        let evidence = gather(&me);
        assert_eq!(evidence.php, None);
        assert_eq!(evidence.frankenphp, None);
        let resolution = resolve(&me, &RequestProbeSpec::Default, false).unwrap();
        assert!(
            matches!(&resolution, Resolution::Hint(line) if line.contains("is not a server locktrace recognises")),
            "{resolution:?}"
        );
        assert!(matches!(
            resolve(&me, &RequestProbeSpec::Default, true).unwrap(),
            Resolution::None
        ));
        let error = resolve(&me, &RequestProbeSpec::Auto, false).unwrap_err();
        assert!(error.to_string().starts_with("--request-probe auto: "));
    }
}
