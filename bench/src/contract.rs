//! What the bench promises to print, checked in Rust: `graceguard-bench
//! check FILE` reads every JSON line `scripts/bench` wrote into its typed
//! row ([`Row`], by its `group`) and checks the contract `scripts/test`
//! relies on: every group measured, both protocols, the no-op floor, the
//! three churn phases with their figures, and the two facts of the
//! preemption trace (graceguard changes no running victim and tags every
//! one; the tagging floor does change them, or the experiment shows
//! nothing). A row that does not read as its group's type is a failure too.
//!
//! The figures themselves are not judged here: the quick bench runs beside
//! a test pass on shared cores (docs/benchmarks.md says what each target
//! is and where it is met).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::groups::apiserver_overhead::FLOOR_MIN_MS;

/// Declares the rows once: the enum the JSON lines read into (by their
/// `group`), the list of groups `--quick` must print, and each row's
/// group, so the three cannot disagree.
macro_rules! rows {
    ($($variant:ident($ty:ty) = $group:literal,)*) => {
        /// One line of the bench's stdout, by its `group`: the fields the
        /// contract reads, typed; the others are the docs' to describe and
        /// are not read.
        #[derive(Debug, Deserialize)]
        #[serde(tag = "group")]
        pub enum Row {
            $(#[serde(rename = $group)] $variant($ty),)*
        }

        /// The groups `--quick` must print, each at least one row.
        pub const GROUPS: &[&str] = &[$($group,)*];

        impl Row {
            /// The row's `group`, as printed.
            pub fn group(&self) -> &'static str {
                match self {
                    $(Row::$variant(_) => $group,)*
                }
            }
        }
    };
}

rows! {
    WebhookSaturation(Throughput) = "webhook_saturation",
    WebhookFixedRate(Throughput) = "webhook_fixed_rate",
    ApiserverOverhead(ApiserverOverhead) = "apiserver_overhead",
    IndexMemory(IndexMemory) = "index_memory",
    IndexListOptions(IndexListOption) = "index_list_options",
    LivelockStorm(Untyped) = "livelock_storm",
    GuardRecovery(Untyped) = "guard_recovery",
    TagDelay(Untyped) = "tag_delay",
    KindIndexMemory(Untyped) = "kind_index_memory",
    KindIndexPeak(KindIndexPeak) = "kind_index_peak",
    MatchConditionsShare(Untyped) = "match_conditions_share",
    SidecarScale(SidecarScale) = "sidecar_scale",
    SidecarRss(Untyped) = "sidecar_rss",
    ExecutorStorm(Untyped) = "executor_storm",
    ClusterChurn(ClusterChurn) = "cluster_churn",
    PreemptionTrace(PreemptionTrace) = "preemption_trace",
    RelaunchDelay(RelaunchDelay) = "relaunch_delay",
}

/// A group whose rows the contract only counts.
#[derive(Debug, Deserialize)]
pub struct Untyped {}

#[derive(Debug, Deserialize)]
pub struct Throughput {
    pub protocol: String,
}

#[derive(Debug, Deserialize)]
pub struct ApiserverOverhead {
    /// graceguard's added latency over the no-op floor's (absent without a
    /// floor measured).
    pub added_latency_ratio_vs_noop: Option<f64>,
    /// What the no-op floor adds to a Create, in ms.
    pub added_ms_noop: Option<f64>,
}

#[derive(Debug, Deserialize)]
pub struct IndexMemory {
    /// Start to ready, in the at-scale row.
    #[serde(default)]
    pub ready_seconds: Option<f64>,
    /// The two replicas' initial lists, p99, in the at-scale row.
    #[serde(default)]
    pub two_replicas_list_p99_seconds: Option<f64>,
}

#[derive(Debug, Deserialize)]
pub struct IndexListOption {
    pub option: String,
    pub streamed: bool,
}

#[derive(Debug, Deserialize)]
pub struct KindIndexPeak {
    #[serde(default)]
    pub over_cap: Option<bool>,
    #[serde(default)]
    pub summary: bool,
}

#[derive(Debug, Deserialize)]
pub struct SidecarScale {
    pub pod_watches: u64,
}

/// A `cluster_churn` row: one phase's run, or the summary.
#[derive(Debug, Deserialize)]
pub struct ClusterChurn {
    pub hollow_nodes: u64,
    #[serde(default)]
    pub phase: Option<String>,
    /// An arm's row (a repetition's preemptions and drains in that arm).
    #[serde(default)]
    pub arm: Option<String>,
    #[serde(default)]
    pub summary: bool,
    #[serde(default)]
    pub pod_startup_p99_ms: Option<f64>,
    #[serde(default)]
    pub pod_patch_status_p99_ms: Option<f64>,
    #[serde(default)]
    pub preemption_p50_ms: Option<f64>,
    #[serde(default)]
    pub drain_ms: Option<f64>,
    #[serde(default)]
    pub graceguard_collision_guard_p99_ms: Option<f64>,
    #[serde(default)]
    pub webhook_collision_guard_p99_ms: Option<f64>,
    #[serde(default)]
    pub by_kind: Option<BTreeMap<String, Value>>,
    #[serde(default)]
    pub ratios_graceguard_over_noop: Option<BTreeMap<String, Value>>,
    #[serde(default)]
    pub targets: Option<ChurnTargets>,
}

#[derive(Debug, Deserialize)]
pub struct ChurnTargets {
    /// Per figure, whether every run met its target.
    pub every_run_met: BTreeMap<String, Value>,
}

/// A `preemption_trace` row: one phase, or the summary.
#[derive(Debug, Deserialize)]
pub struct PreemptionTrace {
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub summary: bool,
    #[serde(default)]
    pub preemption_p50_ms: Option<f64>,
    #[serde(default)]
    pub victims_changed_while_running: Option<u64>,
    #[serde(default)]
    pub victims_tagged_before_gone: Option<u64>,
    /// Victims whose termination the kubelet's log (`--v=4`) showed.
    #[serde(default)]
    pub kubelet_victims_read: Option<u64>,
    /// Updates of the victims the kubelet acted on before their deletion.
    #[serde(default)]
    pub kubelet_updates_before_deletion: Option<u64>,
    /// The most passes of a victim's pod worker after its deletion.
    #[serde(default)]
    pub kubelet_passes_max: Option<u64>,
    #[serde(default)]
    pub ratios_graceguard_over_noop: Option<BTreeMap<String, Value>>,
    /// The median of a phase run's drains of the real node.
    #[serde(default)]
    pub drain_ms: Option<f64>,
    /// The summary's per-run judgement of the latency figures.
    #[serde(default)]
    pub targets: Option<ChurnTargets>,
}

#[derive(Debug, Deserialize)]
pub struct RelaunchDelay {
    pub holder: String,
    /// Successor created this long after the old name was free (negative:
    /// before the watch saw it gone).
    pub after_name_free_ms_median: Option<f64>,
}

/// Reads the bench's stdout: one row per non-empty line. A line that is not
/// a row of a known group is an error naming its number.
pub fn read(text: &str) -> Result<Vec<Row>, Vec<String>> {
    let mut rows = Vec::new();
    let mut problems = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Row>(line) {
            Ok(row) => rows.push(row),
            Err(e) => problems.push(format!(
                "line {}: not a row of a known group as the contract types it ({e}): {line}",
                n + 1
            )),
        }
    }
    if problems.is_empty() {
        Ok(rows)
    } else {
        Err(problems)
    }
}

/// Every broken promise of `rows`, each a sentence naming what is missing.
pub fn check(rows: &[Row]) -> Vec<String> {
    let mut missing = Vec::new();
    let mut need = |ok: bool, what: &str| {
        if !ok {
            missing.push(what.to_string());
        }
    };
    for g in GROUPS {
        need(
            rows.iter().any(|r| r.group() == *g),
            &format!("no {g} row: the group was not measured"),
        );
    }
    let any = |f: &dyn Fn(&Row) -> bool| rows.iter().any(f);
    for p in ["h2", "http1"] {
        need(
            any(&|r| matches!(r, Row::WebhookSaturation(t) if t.protocol == p)),
            &format!("no webhook_saturation row over {p}"),
        );
    }
    need(
        any(&|r| matches!(r, Row::WebhookFixedRate(t) if t.protocol == "h2")),
        "no webhook_fixed_rate row over h2",
    );
    // A ratio, or a floor too small to divide by (the bench says so).
    need(
        any(&|r| {
            matches!(r, Row::ApiserverOverhead(a) if a.added_latency_ratio_vs_noop.is_some()
                || a.added_ms_noop.is_some_and(|n| n <= FLOOR_MIN_MS))
        }),
        "apiserver_overhead has no added_latency_ratio_vs_noop (the no-op floor's comparison) though the floor added more than 10 us",
    );
    need(
        any(&|r| matches!(r, Row::ApiserverOverhead(a) if a.added_ms_noop.is_some())),
        "apiserver_overhead has no added_ms_noop (the no-op floor's own cost)",
    );
    need(
        any(&|r| matches!(r, Row::IndexMemory(i) if i.ready_seconds.is_some())),
        "no index_memory row with ready_seconds (the at-scale start)",
    );
    need(
        any(&|r| matches!(r, Row::IndexMemory(i) if i.two_replicas_list_p99_seconds.is_some())),
        "no index_memory row with two_replicas_list_p99_seconds",
    );
    need(
        any(&|r| matches!(r, Row::IndexListOptions(o) if o.option == "streaming" && o.streamed)),
        "index_list_options has no streaming row that streamed",
    );
    need(
        any(&|r| matches!(r, Row::SidecarScale(s) if s.pod_watches == 1)),
        "sidecar_scale did not run its tasks from one pod watch",
    );
    need(
        any(&|r| matches!(r, Row::KindIndexPeak(k) if k.over_cap == Some(true))),
        "kind_index_peak has no row over its cap",
    );
    need(
        any(&|r| matches!(r, Row::KindIndexPeak(k) if k.summary)),
        "kind_index_peak has no summary row",
    );
    let churn: Vec<&ClusterChurn> = rows
        .iter()
        .filter_map(|r| match r {
            Row::ClusterChurn(c) => Some(c),
            _ => None,
        })
        .collect();
    for phase in ["none", "noop", "graceguard"] {
        need(
            churn.iter().any(|c| c.phase.as_deref() == Some(phase)),
            &format!("cluster_churn has no {phase} phase"),
        );
    }
    for arm in ["none", "noop", "graceguard"] {
        need(
            churn.iter().any(|c| {
                c.arm.as_deref() == Some(arm)
                    && c.preemption_p50_ms.is_some()
                    && c.drain_ms.is_some()
            }),
            &format!("cluster_churn has no {arm} arm with preemption_p50_ms and drain_ms"),
        );
    }
    let churn_has = |f: &dyn Fn(&ClusterChurn) -> bool, what: &str| {
        (
            churn.iter().any(|c| f(c)),
            format!("cluster_churn: no row with {what}"),
        )
    };
    for (ok, what) in [
        churn_has(&|c| c.pod_startup_p99_ms.is_some(), "pod_startup_p99_ms"),
        churn_has(
            &|c| c.pod_patch_status_p99_ms.is_some(),
            "pod_patch_status_p99_ms",
        ),
        churn_has(
            &|c| c.graceguard_collision_guard_p99_ms.is_some(),
            "graceguard_collision_guard_p99_ms",
        ),
        churn_has(
            &|c| c.webhook_collision_guard_p99_ms.is_some(),
            "webhook_collision_guard_p99_ms",
        ),
        churn_has(
            &|c| c.by_kind.as_ref().is_some_and(|k| !k.is_empty()),
            "by_kind",
        ),
        churn_has(&|c| c.hollow_nodes == 3, "hollow_nodes 3 (the quick size)"),
        churn_has(
            &|c| c.summary && c.ratios_graceguard_over_noop.is_some(),
            "a summary with ratios_graceguard_over_noop",
        ),
        churn_has(
            &|c| {
                c.targets
                    .as_ref()
                    .is_some_and(|t| !t.every_run_met.is_empty())
            },
            "targets.every_run_met",
        ),
    ] {
        need(ok, &what);
    }
    need(
        any(&|r| matches!(r, Row::RelaunchDelay(d) if d.after_name_free_ms_median.is_some())),
        "relaunch_delay has no after_name_free_ms_median",
    );
    need(
        any(&|r| matches!(r, Row::RelaunchDelay(d) if d.holder == "early_exit")),
        "relaunch_delay has no early_exit holder",
    );
    const PHASES_READ: [&str; 4] = ["none", "noop", "noop_tagging", "graceguard"];
    let phase = |name: &str| -> Vec<&PreemptionTrace> {
        rows.iter()
            .filter_map(|r| match r {
                Row::PreemptionTrace(t) if t.phase.as_deref() == Some(name) => Some(t),
                _ => None,
            })
            .collect()
    };
    need(
        !phase("noop_tagging").is_empty(),
        "preemption_trace has no noop_tagging phase",
    );
    need(
        any(
            &|r| matches!(r, Row::PreemptionTrace(t) if t.summary && t.ratios_graceguard_over_noop.is_some()),
        ),
        "preemption_trace has no summary with ratios_graceguard_over_noop",
    );
    need(
        any(&|r| matches!(r, Row::PreemptionTrace(t) if t.preemption_p50_ms.is_some())),
        "preemption_trace has no preemption_p50_ms",
    );
    need(
        any(&|r| matches!(r, Row::PreemptionTrace(t) if t.drain_ms.is_some())),
        "preemption_trace has no drain_ms (the real node's drain)",
    );
    need(
        any(
            &|r| matches!(r, Row::PreemptionTrace(t) if t.summary && t.targets.as_ref().is_some_and(|g| g.every_run_met.contains_key("drain_ms"))),
        ),
        "preemption_trace's summary judges no run (targets.every_run_met)",
    );
    for opted_out in ["none", "noop"] {
        need(
            phase(opted_out)
                .iter()
                .all(|t| t.victims_tagged_before_gone.unwrap_or(0) == 0),
            &format!("preemption_trace: a victim in the {opted_out} phase was tagged, though its namespace opts out (graceguard.io/ignore=true): graceguard wrote to a pod it must leave alone"),
        );
    }
    let graceguard = phase("graceguard");
    need(
        !graceguard.is_empty()
            && graceguard.iter().all(|t| {
                t.victims_changed_while_running == Some(0)
                    && t.victims_tagged_before_gone.is_some_and(|n| n >= 1)
            }),
        "preemption_trace: graceguard changed a running preemption victim, or left one untagged (or measured none)",
    );
    let passes = |name: &str| {
        phase(name)
            .iter()
            .filter_map(|t| t.kubelet_passes_max)
            .max()
    };
    need(
        PHASES_READ
            .iter()
            .all(|name| phase(name).iter().all(|t| t.kubelet_victims_read.is_some_and(|n| n >= 1))),
        "preemption_trace: a phase has no victim whose termination the kubelet's log showed (is it at --v=4?)",
    );
    need(
        passes("graceguard").is_some() && passes("graceguard") <= passes("none"),
        &format!(
            "preemption_trace: the kubelet's pod worker made more passes to end a victim with graceguard ({:?}) than with no webhook ({:?}): a write of graceguard's made the kubelet work",
            passes("graceguard"),
            passes("none")
        ),
    );
    need(
        phase("graceguard").iter().all(|t| t.kubelet_updates_before_deletion == Some(0)),
        "preemption_trace: the kubelet received an update of a running victim in graceguard's phase (a metadata write it syncs, which delays the termination by a relist)",
    );
    need(
        phase("noop_tagging")
            .iter()
            .any(|t| t.kubelet_updates_before_deletion.is_some_and(|n| n >= 1)),
        "preemption_trace: the kubelet's log shows no update of a running victim under the tagging floor (is the log read?)",
    );
    need(
        phase("noop_tagging")
            .iter()
            .any(|t| t.victims_changed_while_running.is_some_and(|n| n >= 1)),
        "preemption_trace: the tagging floor changed no running victim (is it called on the tagger's path?)",
    );
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row of every group, as `--quick` prints them (the fields the
    /// contract reads; the bench prints more).
    fn complete() -> String {
        [
            r#"{"group":"webhook_saturation","protocol":"h2","rps":1}"#,
            r#"{"group":"webhook_saturation","protocol":"http1"}"#,
            r#"{"group":"webhook_fixed_rate","protocol":"h2"}"#,
            r#"{"group":"apiserver_overhead","added_latency_ratio_vs_noop":1.1,"added_ms_noop":0.4}"#,
            r#"{"group":"index_memory","pods":0,"bytes_per_pod":null}"#,
            r#"{"group":"index_memory","pods":1000,"ready_seconds":0.5,"two_replicas_list_p99_seconds":0.1}"#,
            r#"{"group":"index_list_options","option":"streaming","streamed":true}"#,
            r#"{"group":"livelock_storm"}"#,
            r#"{"group":"guard_recovery"}"#,
            r#"{"group":"tag_delay"}"#,
            r#"{"group":"kind_index_memory"}"#,
            r#"{"group":"kind_index_peak","over_cap":true}"#,
            r#"{"group":"kind_index_peak","summary":true}"#,
            r#"{"group":"match_conditions_share"}"#,
            r#"{"group":"sidecar_scale","pod_watches":1}"#,
            r#"{"group":"sidecar_rss"}"#,
            r#"{"group":"executor_storm"}"#,
            r#"{"group":"cluster_churn","hollow_nodes":3,"phase":"none","pod_startup_p99_ms":5.0,"pod_patch_status_p99_ms":2.0,"webhook_collision_guard_p99_ms":null,"by_kind":{"deployment":{}}}"#,
            r#"{"group":"cluster_churn","hollow_nodes":3,"arm":"none","preemption_p50_ms":900.0,"drain_ms":3000.0}"#,
            r#"{"group":"cluster_churn","hollow_nodes":3,"arm":"noop","preemption_p50_ms":900.0,"drain_ms":3000.0}"#,
            r#"{"group":"cluster_churn","hollow_nodes":3,"arm":"graceguard","preemption_p50_ms":900.0,"drain_ms":3000.0}"#,
            r#"{"group":"cluster_churn","hollow_nodes":3,"phase":"noop","webhook_collision_guard_p99_ms":3.0}"#,
            r#"{"group":"cluster_churn","hollow_nodes":3,"phase":"graceguard","graceguard_collision_guard_p99_ms":4.0}"#,
            r#"{"group":"cluster_churn","hollow_nodes":3,"summary":true,"ratios_graceguard_over_noop":{"drain_ms":1.0},"targets":{"every_run_met":{"drain_ms":true}}}"#,
            r#"{"group":"relaunch_delay","holder":"whole_grace","after_name_free_ms_median":-20}"#,
            r#"{"group":"relaunch_delay","holder":"early_exit","after_name_free_ms_median":null}"#,
            r#"{"group":"preemption_trace","phase":"none","preemption_p50_ms":800.0,"drain_ms":2000.0,"victims_tagged_before_gone":0,"kubelet_victims_read":1,"kubelet_updates_before_deletion":0,"kubelet_passes_max":2}"#,
            r#"{"group":"preemption_trace","phase":"noop_tagging","victims_changed_while_running":1,"victims_tagged_before_gone":1,"kubelet_victims_read":1,"kubelet_updates_before_deletion":1,"kubelet_passes_max":2}"#,
            r#"{"group":"preemption_trace","phase":"graceguard","victims_changed_while_running":0,"victims_tagged_before_gone":1,"kubelet_victims_read":1,"kubelet_updates_before_deletion":0,"kubelet_passes_max":2}"#,
            r#"{"group":"preemption_trace","summary":true,"ratios_graceguard_over_noop":{"preemption_p50_ms":1.0},"targets":{"every_run_met":{"drain_ms":true}}}"#,
        ]
        .join("\n")
    }

    #[test]
    fn a_complete_output_keeps_every_promise() {
        let rows = read(&complete()).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(check(&rows), Vec::<String>::new());
    }

    #[test]
    fn a_group_left_out_is_named() {
        let text: String = complete()
            .lines()
            .filter(|l| !l.contains("\"tag_delay\""))
            .collect::<Vec<_>>()
            .join("\n");
        let rows = read(&text).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            check(&rows),
            vec!["no tag_delay row: the group was not measured".to_string()]
        );
    }

    #[test]
    fn graceguard_changing_a_running_victim_breaks_the_contract() {
        let text = complete().replace(
            r#""phase":"graceguard","victims_changed_while_running":0"#,
            r#""phase":"graceguard","victims_changed_while_running":2"#,
        );
        let rows = read(&text).unwrap_or_else(|e| panic!("{e:?}"));
        let missing = check(&rows);
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(missing[0].contains("graceguard changed a running preemption victim"));
    }

    #[test]
    fn a_floor_too_small_to_divide_by_needs_no_ratio_but_a_measured_one_does() {
        let without_ratio = |noop: f64| {
            complete().replace(
                r#""added_latency_ratio_vs_noop":1.1,"added_ms_noop":0.4"#,
                &format!(r#""added_ms_noop":{noop}"#),
            )
        };
        // a busy machine: the floor's median below the no-webhook one
        let rows = read(&without_ratio(-5.13)).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(check(&rows), Vec::<String>::new());
        let rows = read(&without_ratio(0.4)).unwrap_or_else(|e| panic!("{e:?}"));
        let missing = check(&rows);
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(
            missing[0].contains("added_latency_ratio_vs_noop"),
            "{missing:?}"
        );
    }

    #[test]
    fn a_tagged_victim_in_an_opted_out_namespace_breaks_the_contract() {
        let text = complete().replace(
            r#""drain_ms":2000.0,"victims_tagged_before_gone":0"#,
            r#""drain_ms":2000.0,"victims_tagged_before_gone":1"#,
        );
        let rows = read(&text).unwrap_or_else(|e| panic!("{e:?}"));
        let missing = check(&rows);
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(missing[0].contains("none phase was tagged"), "{missing:?}");
    }

    #[test]
    fn a_kubelet_update_or_pass_more_with_graceguard_or_an_unread_log_breaks_the_contract() {
        let graceguard = r#""victims_changed_while_running":0,"victims_tagged_before_gone":1,"kubelet_victims_read":1,"kubelet_updates_before_deletion":0,"kubelet_passes_max":2"#;
        let text = complete().replace(graceguard, &graceguard.replace("max\":2", "max\":3"));
        let missing = check(&read(&text).unwrap_or_else(|e| panic!("{e:?}")));
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(missing[0].contains("more passes"), "{missing:?}");
        let text = complete().replace(graceguard, &graceguard.replace("read\":1", "read\":0"));
        let missing = check(&read(&text).unwrap_or_else(|e| panic!("{e:?}")));
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(missing[0].contains("--v=4"), "{missing:?}");
        let text = complete().replace(
            graceguard,
            &graceguard.replace("deletion\":0", "deletion\":1"),
        );
        let missing = check(&read(&text).unwrap_or_else(|e| panic!("{e:?}")));
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(
            missing[0].contains("update of a running victim"),
            "{missing:?}"
        );
    }

    #[test]
    fn a_row_of_the_wrong_shape_or_group_is_an_error_with_its_line() {
        let text = complete()
            + "\n{\"group\":\"sidecar_scale\",\"pod_watches\":\"one\"}\n{\"group\":\"nonsense\"}";
        let problems = read(&text).err().unwrap_or_default();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("line 31:"), "{problems:?}");
        assert!(problems[1].starts_with("line 32:"), "{problems:?}");
    }

    #[test]
    fn a_missing_protocol_or_churn_phase_is_named() {
        let text: String = complete()
            .lines()
            .filter(|l| !l.contains("\"http1\"") && !l.contains("\"phase\":\"noop\""))
            .collect::<Vec<_>>()
            .join("\n");
        let rows = read(&text).unwrap_or_else(|e| panic!("{e:?}"));
        let missing = check(&rows);
        assert!(
            missing.contains(&"no webhook_saturation row over http1".to_string()),
            "{missing:?}"
        );
        assert!(
            missing.contains(&"cluster_churn has no noop phase".to_string()),
            "{missing:?}"
        );
    }
}
