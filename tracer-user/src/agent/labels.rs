//! A process's labels from its cgroup path: the container (docker,
//! containerd and cri-o name their cgroups after the container ID) and the
//! Kubernetes pod UID (the kubelet's pod slice). Pure parsing.

/// The container runtime whose cgroup naming matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Runtime {
    Docker,
    Containerd,
    Crio,
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Runtime::Docker => "docker",
            Runtime::Containerd => "containerd",
            Runtime::Crio => "cri-o",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Container {
    pub runtime: Runtime,
    pub id: String,
}

/// The cgroup v2 path of a process from its `/proc/PID/cgroup` (the `0::`
/// line); under cgroup v1, the first hierarchy's path that names a container.
pub(crate) fn cgroup_path(proc_cgroup: &str) -> Option<&str> {
    let paths = || {
        proc_cgroup
            .lines()
            .filter_map(|line| line.splitn(3, ':').nth(2))
    };
    let unified = proc_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"));
    match unified {
        Some(path) if container(path).is_some() || paths().all(|p| container(p).is_none()) => {
            Some(path)
        }
        _ => paths()
            .find(|path| container(path).is_some())
            .or_else(|| paths().next()),
    }
}

/// A container ID: hex, at least 12 digits (runtimes use 64).
fn is_container_id(text: &str) -> bool {
    text.len() >= 12 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The innermost container the path names: `docker-ID.scope` and
/// `/docker/ID` (docker), `cri-containerd-ID.scope` (containerd),
/// `crio-ID.scope` (cri-o; `crio-conmon-ID.scope` is its monitor, not the
/// container).
pub(crate) fn container(path: &str) -> Option<Container> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    for (index, part) in parts.iter().enumerate().rev() {
        let scoped = part.strip_suffix(".scope").and_then(|name| {
            [
                ("docker-", Runtime::Docker),
                ("cri-containerd-", Runtime::Containerd),
                ("crio-", Runtime::Crio),
            ]
            .into_iter()
            .find_map(|(prefix, runtime)| Some((runtime, name.strip_prefix(prefix)?)))
        });
        let found = match scoped {
            Some(found) => Some(found),
            None if index > 0 && parts[index - 1] == "docker" => Some((Runtime::Docker, *part)),
            None => None,
        };
        if let Some((runtime, id)) = found
            && is_container_id(id)
        {
            return Some(Container {
                runtime,
                id: id.to_string(),
            });
        }
    }
    None
}

/// The Kubernetes pod UID: `kubepods-…-pod<UID>.slice` (systemd driver,
/// dashes of the UID written as underscores) or `pod<UID>` under `kubepods`
/// (cgroupfs driver).
pub(crate) fn pod_uid(path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let under_kubepods = |index: usize| parts[..index].iter().any(|p| p.starts_with("kubepods"));
    parts.iter().enumerate().rev().find_map(|(index, part)| {
        let uid = match part.strip_suffix(".slice") {
            Some(slice) if slice.starts_with("kubepods") => slice.rsplit_once("-pod")?.1,
            Some(_) => return None,
            None if under_kubepods(index) => part.strip_prefix("pod")?,
            None => return None,
        };
        let uid = uid.replace('_', "-");
        let valid = uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
        valid.then_some(uid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c";
    const POD: &str = "0b9e3c4d-5f6a-4b7c-8d9e-0f1a2b3c4d5e";

    fn of(path: &str) -> Option<(Runtime, String)> {
        container(path).map(|c| (c.runtime, c.id))
    }

    #[test]
    fn container_ids_of_each_runtime() {
        assert_eq!(
            of(&format!("/system.slice/docker-{ID}.scope")),
            Some((Runtime::Docker, ID.into()))
        );
        assert_eq!(
            of(&format!("/docker/{ID}")),
            Some((Runtime::Docker, ID.into()))
        );
        let pod = POD.replace('-', "_");
        assert_eq!(
            of(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod}.slice/cri-containerd-{ID}.scope"
            )),
            Some((Runtime::Containerd, ID.into()))
        );
        assert_eq!(
            of(&format!(
                "/kubepods.slice/kubepods-pod{pod}.slice/crio-{ID}.scope"
            )),
            Some((Runtime::Crio, ID.into()))
        );
        // cri-o's monitor, a user session, a service and junk are no container.
        assert_eq!(of(&format!("/machine.slice/crio-conmon-{ID}.scope")), None);
        assert_eq!(of("/user.slice/user-1000.slice/session-2.scope"), None);
        assert_eq!(of("/system.slice/nginx.service"), None);
        assert_eq!(of("/system.slice/docker-xyz.scope"), None);
        assert_eq!(of("/docker/"), None);
        assert_eq!(of(""), None);
    }

    #[test]
    fn pod_uids_with_dashes() {
        let pod = POD.replace('-', "_");
        assert_eq!(
            pod_uid(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod}.slice/cri-containerd-{ID}.scope"
            )),
            Some(POD.into())
        );
        assert_eq!(
            pod_uid(&format!(
                "/kubepods.slice/kubepods-pod{pod}.slice/crio-{ID}.scope"
            )),
            Some(POD.into())
        );
        assert_eq!(
            pod_uid(&format!("/kubepods/besteffort/pod{POD}/{ID}")),
            Some(POD.into())
        );
        assert_eq!(pod_uid(&format!("/system.slice/docker-{ID}.scope")), None);
        assert_eq!(pod_uid("/kubepods.slice/kubepods-burstable.slice"), None);
        assert_eq!(pod_uid("/pod1234/x"), None);
    }

    #[test]
    fn the_unified_path_unless_a_v1_hierarchy_names_the_container() {
        assert_eq!(
            cgroup_path(&format!("0::/system.slice/docker-{ID}.scope\n")),
            Some(format!("/system.slice/docker-{ID}.scope").as_str())
        );
        let v1 = format!("12:cpu,cpuacct:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/\n");
        assert_eq!(cgroup_path(&v1), Some(format!("/docker/{ID}").as_str()));
        assert_eq!(cgroup_path("0::/init.scope\n"), Some("/init.scope"));
        assert_eq!(cgroup_path(""), None);
    }
}
