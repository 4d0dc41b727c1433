//! Which kinds a ResourceQuota charges, from the names in its `spec.hard`.
//!
//! The quota leak is an admission-order problem of every kind a quota counts:
//! the ResourceQuota plugin charges a Create before the name check refuses it.
//! graceguard indexes (names only) exactly the kinds some quota in the cluster
//! counts, so a kind no quota counts costs nothing.

use std::collections::BTreeSet;
use std::fmt;

/// A kind by API group and plural resource name (`jobs.batch`, `configmaps`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupResource {
    pub group: String,
    pub resource: String,
}

impl GroupResource {
    pub fn new(group: &str, resource: &str) -> Self {
        Self {
            group: group.to_string(),
            resource: resource.to_string(),
        }
    }

    /// Parses `resource` or `resource.group` (the form quotas and the chart use).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        if s.is_empty() {
            return None;
        }
        Some(match s.split_once('.') {
            Some((resource, group)) => Self::new(group, resource),
            None => Self::new("", s),
        })
    }

    /// Core pods.
    pub fn pods() -> Self {
        Self::new("", "pods")
    }

    pub fn is_pods(&self) -> bool {
        self.group.is_empty() && self.resource == "pods"
    }
}

impl fmt::Display for GroupResource {
    /// `resource.group`, or `resource` for the core group.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            write!(f, "{}", self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

/// The kind one quota resource name charges, if any.
///
/// * `count/<resource>[.<group>]`: that kind;
/// * `pods` and every compute resource (`cpu`, `memory`, `requests.*` but
///   storage, `limits.*`, `hugepages-*`, `ephemeral-storage`): pods;
/// * `persistentvolumeclaims`, `requests.storage` and their per-storage-class
///   forms (`<class>.storageclass.storage.k8s.io/...`): persistentvolumeclaims;
/// * `services`, `services.loadbalancers`, `services.nodeports`: services;
/// * `configmaps`, `secrets`, `replicationcontrollers`, `resourcequotas`:
///   themselves.
pub fn charged_kind(name: &str) -> Option<GroupResource> {
    let core = |r: &str| Some(GroupResource::new("", r));
    if let Some(rest) = name.strip_prefix("count/") {
        return GroupResource::parse(rest);
    }
    if name.contains(".storageclass.storage.k8s.io/") {
        return core("persistentvolumeclaims");
    }
    match name {
        "persistentvolumeclaims" | "requests.storage" => core("persistentvolumeclaims"),
        "services" | "services.loadbalancers" | "services.nodeports" => core("services"),
        "configmaps" | "secrets" | "replicationcontrollers" | "resourcequotas" | "pods" => {
            core(name)
        }
        "cpu" | "memory" | "ephemeral-storage" => core("pods"),
        _ if name.starts_with("requests.")
            || name.starts_with("limits.")
            || name.starts_with("hugepages-") =>
        {
            core("pods")
        }
        _ => None,
    }
}

/// Every kind the `hard` resource names of a quota charge.
pub fn charged_kinds<'a>(hard: impl IntoIterator<Item = &'a str>) -> BTreeSet<GroupResource> {
    hard.into_iter().filter_map(charged_kind).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_names_map_to_the_kinds_they_charge() {
        let cases = [
            ("pods", Some("pods")),
            ("count/pods", Some("pods")),
            ("requests.cpu", Some("pods")),
            ("limits.memory", Some("pods")),
            ("cpu", Some("pods")),
            ("hugepages-2Mi", Some("pods")),
            ("requests.nvidia.com/gpu", Some("pods")),
            ("requests.storage", Some("persistentvolumeclaims")),
            ("persistentvolumeclaims", Some("persistentvolumeclaims")),
            (
                "gold.storageclass.storage.k8s.io/requests.storage",
                Some("persistentvolumeclaims"),
            ),
            ("services.loadbalancers", Some("services")),
            ("configmaps", Some("configmaps")),
            ("count/jobs.batch", Some("jobs.batch")),
            ("count/widgets.example.com", Some("widgets.example.com")),
            ("count/deployments.apps", Some("deployments.apps")),
            ("something-else", None),
        ];
        for (name, want) in cases {
            assert_eq!(
                charged_kind(name).map(|k| k.to_string()),
                want.map(str::to_string),
                "{name}"
            );
        }
        let all = charged_kinds(["pods", "requests.cpu", "count/jobs.batch", "x"]);
        assert_eq!(
            all.iter().map(ToString::to_string).collect::<Vec<_>>(),
            vec!["pods", "jobs.batch"]
        );
    }

    #[test]
    fn group_resources_parse_as_the_chart_writes_them() {
        assert_eq!(
            GroupResource::parse("jobs.batch"),
            Some(GroupResource::new("batch", "jobs"))
        );
        assert_eq!(
            GroupResource::parse("widgets.graceguard.test"),
            Some(GroupResource::new("graceguard.test", "widgets"))
        );
        assert_eq!(
            GroupResource::parse("configmaps"),
            Some(GroupResource::new("", "configmaps"))
        );
        assert!(GroupResource::parse(" ").is_none());
        assert!(GroupResource::new("", "pods").is_pods());
    }
}
