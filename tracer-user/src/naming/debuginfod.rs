//! Debug files of stripped modules fetched by build-id from debuginfod
//! servers, as perf, gdb, bpftrace and systemd-coredump do:
//! `$DEBUGINFOD_URLS` (space-separated), `GET URL/buildid/HEX/debuginfo`,
//! cached where elfutils' client caches them (`$DEBUGINFOD_CACHE_PATH`, else
//! `$XDG_CACHE_HOME/debuginfod_client`, else `~/.cache/debuginfod_client`,
//! file `HEX/debuginfo`), so the tools share one cache.
//!
//! Only at the end of a recording, only for stripped modules that hold a
//! lock or a caller of the report, and bounded: `$DEBUGINFOD_TIMEOUT`
//! seconds (default 10) per file in all, and a server that did not answer
//! is not asked again. A failure costs that module's names, never the
//! recording: it becomes a `debuginfod_failed` skipped file.
use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsString,
    io::Read,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use object::Object;

use super::{
    elf::{MAX_DEBUG_LINK_BYTES, ModuleSymbols, hex},
    region::AddressSpace,
};
use crate::{
    model::{SkipReason, SkippedFile},
    probe::modules::ModuleFile,
};

/// Seconds allowed per debug file when `$DEBUGINFOD_TIMEOUT` is not set.
const DEFAULT_TIMEOUT_SECONDS: u64 = 10;

/// The servers of `$DEBUGINFOD_URLS` and the cache.
#[derive(Debug)]
pub(crate) struct Client {
    urls: Vec<String>,
    cache: PathBuf,
    timeout: Duration,
    max_bytes: u64,
    /// Servers that did not answer (refused, unreachable, too slow), with
    /// why: not asked again this run, so naming stays bounded in time.
    down: BTreeMap<String, String>,
}

/// Why one server did not give the file.
struct Failure {
    cause: String,
    /// The server itself failed (not just this file): skip it from now on.
    server_down: bool,
}

impl Failure {
    fn file(cause: String) -> Failure {
        Failure {
            cause,
            server_down: false,
        }
    }

    fn server(cause: String) -> Failure {
        Failure {
            cause,
            server_down: true,
        }
    }
}

impl Client {
    /// The client `$DEBUGINFOD_URLS` asks for; None when it is unset or empty.
    pub(crate) fn from_env() -> Option<Client> {
        Client::from_vars(|name| std::env::var_os(name))
    }

    fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Option<Client> {
        let set = |name: &str| var(name).filter(|value| !value.is_empty());
        let urls: Vec<String> = set("DEBUGINFOD_URLS")?
            .to_string_lossy()
            .split_whitespace()
            .map(|url| url.trim_end_matches('/').to_string())
            .filter(|url| !url.is_empty())
            .collect();
        if urls.is_empty() {
            return None;
        }
        let cache = set("DEBUGINFOD_CACHE_PATH")
            .map(PathBuf::from)
            .or_else(|| set("XDG_CACHE_HOME").map(|dir| Path::new(&dir).join("debuginfod_client")))
            .or_else(|| set("HOME").map(|home| Path::new(&home).join(".cache/debuginfod_client")))
            .unwrap_or_else(|| std::env::temp_dir().join("debuginfod_client"));
        let seconds = set("DEBUGINFOD_TIMEOUT")
            .and_then(|value| value.to_string_lossy().trim().parse::<u64>().ok())
            .filter(|&seconds| seconds > 0)
            .unwrap_or(DEFAULT_TIMEOUT_SECONDS);
        // elfutils' size cap, in bytes (0: none); never above naming's own.
        let max_bytes = set("DEBUGINFOD_MAXSIZE")
            .and_then(|value| value.to_string_lossy().trim().parse::<u64>().ok())
            .filter(|&bytes| bytes > 0)
            .map_or(MAX_DEBUG_LINK_BYTES, |bytes| {
                bytes.min(MAX_DEBUG_LINK_BYTES)
            });
        Some(Client {
            urls,
            cache,
            timeout: Duration::from_secs(seconds),
            max_bytes,
            down: BTreeMap::new(),
        })
    }

    /// The debug file of `build_id`: from the cache if there, else fetched
    /// from the first server that has it. Err says, per server, why not.
    pub(crate) fn debug_file(&mut self, build_id: &[u8]) -> Result<PathBuf, String> {
        let hex = hex(build_id);
        let dir = self.cache.join(&hex);
        let cached = dir.join("debuginfo");
        if has_build_id(&cached, build_id).is_ok() {
            return Ok(cached);
        }
        std::fs::create_dir_all(&dir)
            .map_err(|error| format!("cache {}: {error}", dir.display()))?;
        let mut causes = Vec::new();
        for url in self.urls.clone() {
            let address = format!("{url}/buildid/{hex}/debuginfo");
            if let Some(cause) = self.down.get(&url) {
                causes.push(format!("{address}: not asked, {cause} before"));
                continue;
            }
            match self.fetch(&address, build_id, &dir) {
                Ok(temp) => {
                    return temp
                        .persist(&cached)
                        .map(|_| cached.clone())
                        .map_err(|error| format!("cache {}: {}", cached.display(), error.error));
                }
                Err(failure) => {
                    if failure.server_down {
                        self.down.insert(url.clone(), failure.cause.clone());
                    }
                    causes.push(format!("{address}: {}", failure.cause));
                }
            }
        }
        Err(causes.join("; "))
    }

    /// Downloads `address` into a temporary file in `dir` and checks it is
    /// the debug file of `build_id`.
    fn fetch(
        &self,
        address: &str,
        build_id: &[u8],
        dir: &Path,
    ) -> Result<tempfile::NamedTempFile, Failure> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(self.timeout))
            .http_status_as_error(false)
            .user_agent(concat!("locktrace/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let response = agent
            .get(address)
            .call()
            .map_err(|error| Failure::server(transport_cause(&error, self.timeout)))?;
        if response.status() != 200 {
            return Err(Failure::file(format!("HTTP {}", response.status())));
        }
        let too_large = |bytes: u64| {
            Failure::file(format!(
                "{} MiB, over the {} MiB cap",
                bytes >> 20,
                self.max_bytes >> 20
            ))
        };
        let body = response.into_body();
        if let Some(length) = body.content_length()
            && length > self.max_bytes
        {
            return Err(too_large(length));
        }
        let mut temp = tempfile::Builder::new()
            .prefix(".locktrace-")
            .tempfile_in(dir)
            .map_err(|error| Failure::file(format!("cache {}: {error}", dir.display())))?;
        let mut reader = body.into_reader().take(self.max_bytes + 1);
        let copied = std::io::copy(&mut reader, temp.as_file_mut()).map_err(|error| {
            // ureq's own errors (a timeout) come wrapped in io::Error; a
            // plain one is the connection's or the cache's (disk full).
            match error
                .get_ref()
                .and_then(|e| e.downcast_ref::<ureq::Error>())
            {
                Some(ureq::Error::Timeout(_)) => {
                    Failure::server(format!("not received within {} s", self.timeout.as_secs()))
                }
                Some(other) => Failure::server(format!("receiving: {other}")),
                None => Failure::file(format!("receiving: {error}")),
            }
        })?;
        if copied > self.max_bytes {
            return Err(too_large(copied));
        }
        has_build_id(temp.path(), build_id).map_err(Failure::file)?;
        Ok(temp)
    }
}

/// A request that got no answer, in a few words.
fn transport_cause(error: &ureq::Error, timeout: Duration) -> String {
    match error {
        ureq::Error::Timeout(_) => format!("no answer within {} s", timeout.as_secs()),
        ureq::Error::Io(io) => io.to_string(),
        other => other.to_string(),
    }
}

/// Ok when `path` is an ELF file with build-id `build_id`; else why not.
fn has_build_id(path: &Path, build_id: &[u8]) -> Result<(), String> {
    let file = ModuleFile::open(path).map_err(|error| format!("{error:#}"))?;
    let elf = file.elf().map_err(|error| format!("{error:#}"))?;
    match elf.build_id() {
        Ok(Some(found)) if found == build_id => Ok(()),
        Ok(Some(found)) => Err(format!(
            "served build-id {}, not the module's {}",
            hex(found),
            hex(build_id)
        )),
        _ => Err("served file has no build-id".into()),
    }
}

/// Gives the stripped modules of `space` that hold one of `addresses`
/// (locks, callers) and have no local debug file the debug file the
/// `client`'s servers have; a module whose file is not got is skipped
/// with why.
pub(crate) fn add_debug_files(
    space: &mut AddressSpace,
    files: &BTreeMap<String, Arc<ModuleFile>>,
    root: Option<&Path>,
    addresses: &[u64],
    client: &mut Client,
) {
    let wanted: BTreeSet<String> = addresses
        .iter()
        .filter_map(|&address| space.module_of(address))
        .filter(|module| {
            let symbols = &module.symbols;
            // No sections (sstrip): a debug file would not be read either.
            !symbols.has_symtab && symbols.debug_path.is_none() && !symbols.sections.is_empty()
        })
        .map(|module| module.path.clone())
        .collect();
    for path in wanted {
        let (Some(file), Some(build_id)) = (
            files.get(&path),
            space
                .modules
                .iter()
                .find(|module| module.path == path)
                .and_then(|module| module.symbols.build_id.clone()),
        ) else {
            continue;
        };
        let parsed = client.debug_file(&build_id).and_then(|debug| {
            ModuleSymbols::parse_with_debug_file(file.bytes(), &path, root, &debug)
                .map_err(|error| format!("{error:#}"))
        });
        match parsed {
            Ok(symbols) => {
                let symbols = Arc::new(symbols);
                for module in space.modules.iter_mut().filter(|m| m.path == path) {
                    module.symbols = Arc::clone(&symbols);
                }
            }
            Err(detail) => space.skipped.push(SkippedFile {
                file: path,
                reason: SkipReason::DebuginfodFailed,
                detail,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(vars: &[(&str, &str)]) -> Option<Client> {
        let vars: BTreeMap<String, OsString> = vars
            .iter()
            .map(|(name, value)| (name.to_string(), OsString::from(value)))
            .collect();
        Client::from_vars(|name| vars.get(name).cloned())
    }

    #[test]
    fn reads_the_environment_as_elfutils_does() {
        assert!(client(&[]).is_none());
        assert!(client(&[("DEBUGINFOD_URLS", "  ")]).is_none());
        let both = client(&[
            (
                "DEBUGINFOD_URLS",
                "https://a.example/ http://b.example:8002",
            ),
            ("DEBUGINFOD_CACHE_PATH", "/c"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
            ("DEBUGINFOD_TIMEOUT", "3"),
        ])
        .unwrap();
        assert_eq!(both.urls, ["https://a.example", "http://b.example:8002"]);
        assert_eq!(both.cache, Path::new("/c"));
        assert_eq!(both.timeout, Duration::from_secs(3));
        assert_eq!(both.max_bytes, MAX_DEBUG_LINK_BYTES);
        let xdg = client(&[
            ("DEBUGINFOD_URLS", "u"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ]);
        assert_eq!(xdg.unwrap().cache, Path::new("/x/debuginfod_client"));
        let home = client(&[
            ("DEBUGINFOD_URLS", "u"),
            ("HOME", "/h"),
            ("DEBUGINFOD_TIMEOUT", "soon"),
            ("DEBUGINFOD_MAXSIZE", "1000"),
        ])
        .unwrap();
        assert_eq!(home.cache, Path::new("/h/.cache/debuginfod_client"));
        assert_eq!(home.timeout, Duration::from_secs(DEFAULT_TIMEOUT_SECONDS));
        assert_eq!(home.max_bytes, 1000);
    }

    /// A cached file is used without a request (the server here does not
    /// exist); a cached file of another build is not.
    #[test]
    fn a_cached_file_is_used_without_a_request_and_checked() {
        let cache = tempfile::tempdir().unwrap();
        let module = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&module).unwrap();
        let elf = object::File::parse(&*bytes).unwrap();
        let Some(build_id) = elf.build_id().unwrap().map(<[u8]>::to_vec) else {
            return; // a test binary linked without a build-id
        };
        let dir = cache.path().join(hex(&build_id));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(&module, dir.join("debuginfo")).unwrap();
        let mut client = client(&[
            ("DEBUGINFOD_URLS", "http://127.0.0.1:1"),
            ("DEBUGINFOD_CACHE_PATH", cache.path().to_str().unwrap()),
        ])
        .unwrap();
        assert_eq!(client.debug_file(&build_id), Ok(dir.join("debuginfo")));
        let other: Vec<u8> = build_id.iter().map(|byte| byte ^ 0xff).collect();
        let other_dir = cache.path().join(hex(&other));
        std::fs::create_dir_all(&other_dir).unwrap();
        std::fs::copy(&module, other_dir.join("debuginfo")).unwrap();
        let error = client.debug_file(&other).unwrap_err();
        assert!(
            error.starts_with(&format!(
                "http://127.0.0.1:1/buildid/{}/debuginfo: ",
                hex(&other)
            )),
            "{error}"
        );
        // The server that refused is not asked again.
        let again = client.debug_file(&other).unwrap_err();
        assert!(again.contains("not asked"), "{again}");
    }

    /// A local server answering each connection with `answer` (status line,
    /// headers and body), for `connections` connections.
    fn serve(answer: Vec<u8>, connections: usize) -> String {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for stream in listener.incoming().take(connections) {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let _ = stream.write_all(&answer);
            }
        });
        url
    }

    /// 404, a file of another build, a file over the size cap, a server
    /// that never answers: each a one-line cause naming the URL, within the
    /// timeout, and nothing left in the cache.
    #[test]
    fn failures_say_why_in_one_line() {
        let cache = tempfile::tempdir().unwrap();
        let wanted = [0xabu8; 20];
        // Another build's file, small enough for the cap below.
        let other = std::fs::read("/usr/bin/true").unwrap();
        let mut wrong =
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", other.len()).into_bytes();
        wrong.extend_from_slice(&other);
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let cases = [
            (
                serve(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
                    1,
                ),
                "HTTP 404",
            ),
            (serve(wrong, 1), "served build-id"),
            (
                serve(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 5000000\r\n\r\n".to_vec(),
                    1,
                ),
                "4 MiB, over the 1 MiB cap",
            ),
            (
                format!("http://{}", silent.local_addr().unwrap()),
                "no answer within 1 s",
            ),
        ];
        for (url, cause) in cases {
            let mut client = client(&[
                ("DEBUGINFOD_URLS", &url),
                ("DEBUGINFOD_CACHE_PATH", cache.path().to_str().unwrap()),
                ("DEBUGINFOD_TIMEOUT", "1"),
                ("DEBUGINFOD_MAXSIZE", "1048576"),
            ])
            .unwrap();
            let started = std::time::Instant::now();
            let error = client.debug_file(&wanted).unwrap_err();
            assert!(started.elapsed() < Duration::from_secs(5), "{error}");
            let prefix = format!("{url}/buildid/{}/debuginfo: ", hex(&wanted));
            assert!(
                error.starts_with(&prefix) && error.contains(cause),
                "{error}"
            );
            assert!(!error.contains('\n'), "{error}");
        }
        let left: Vec<_> = std::fs::read_dir(cache.path().join(hex(&wanted)))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
