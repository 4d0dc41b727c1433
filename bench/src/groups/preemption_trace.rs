//! `scripts/bench` group `preemption_trace`: the same fixed schedule of
//! scheduler preemptions on a real node (real kubelet, containerd, runc),
//! one at a time, traced ([`scenarios::preemption_trace`]) in four phases that
//! differ only in what admission calls:
//!
//! * `none`: no webhook (the namespace carries `graceguard.io/ignore=true`);
//! * `noop`: the no-op floor, a copy of every graceguard webhook answering
//!   "allowed" at once;
//! * `noop_tagging`: the same floor, except that it answers the tagger's
//!   calls with the tags in admission, as graceguard did until it stopped
//!   changing running pods: the experiment that isolates that one patch;
//! * `graceguard`: graceguard registered as the chart registers it.
//!
//! The phases are interleaved: each round of a repetition preempts (and
//! drains) once in every phase, in an order rotated every round, so that
//! all four share the same moments of a busy machine and a repetition's
//! ratios compare like with like. Each repetition reports, per phase, the
//! medians, p99s and the slowest of every interval, and the summary the
//! ratios of graceguard (and of the tagging floor) over the no-op floor,
//! pooled and per repetition.

use std::collections::BTreeMap;

use crate::prelude::{emit, table, Args, BaselineServer};
use crate::report::{median, per_run, LATENCY_RATIO_TARGET};
use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::PostParams;
use kube::Api;
use serde_json::{json, Value};

use scenarios::disruptions::{most_of_node_cpu, priority_classes, victim_settle, Kubelets};
use scenarios::preemption_trace::{drain_once, preempt_once, Timeline, Trace};
use testbed::load::stats::{percentile_f64, round3};
use testbed::node::kubelet_log::{KubeletLog, Termination};
use testbed::webhook::{register_noop_like, WebhookProcess, OPT_OUT_LABEL, REGISTERED_LABEL};
use testbed::{TestBed, TestBedOptions};

/// The phases, in their first repetition's order.
pub const PHASES: [&str; 4] = ["none", "noop", "noop_tagging", "graceguard"];

const NOOP_LABEL: &str = "bench.graceguard.io/noop";
const TAGGING_LABEL: &str = "bench.graceguard.io/noop-tagging";

/// What graceguard must not slow on a real node: graceguard ÷ no-op
/// of the same repetition at most [`LATENCY_RATIO_TARGET`] in every one.
pub const EVERY_RUN_TARGETED: [&str; 6] = [
    "preemption_p50_ms",
    "preemption_p99_ms",
    "drain_ms",
    "deletion_to_gone_p50_ms",
    "deletion_to_gone_p99_ms",
    "pod_startup_p99_ms",
];

/// Pods on the node when it is drained, and the CPU each asks for.
const DRAIN_PODS: usize = 4;
const DRAIN_POD_CPU: &str = "50m";

pub struct Options {
    /// Preemptions per phase and repetition.
    pub preemptions: usize,
    /// Drains of the node per phase and repetition (after its preemptions).
    pub drains: usize,
    pub repetitions: usize,
    /// The no-op floor's and the tagging floor's `https://HOST:PORT`, both
    /// serving a certificate `ca_pem` signs.
    pub noop_url: String,
    pub tagging_url: String,
    pub ca_pem: String,
}

/// The phases' order in round `k`: each phase leads every fourth round.
fn order(k: usize) -> Vec<&'static str> {
    let mut o = PHASES.to_vec();
    o.rotate_left(k % PHASES.len());
    o
}

fn namespace(phase: &str) -> String {
    format!("preempt-{}", phase.replace('_', "-"))
}

pub async fn run(opts: &Options, log: impl Fn(String)) -> Result<Vec<Value>> {
    let bed = TestBed::start_with(TestBedOptions {
        version: None,
        real_nodes: 1,
        // Each step of the kubelet's pod workers, read per victim.
        kubelet_verbosity: Some(4),
        ..Default::default()
    })
    .await?;
    let ns_api: Api<Namespace> = Api::all(bed.client.clone());
    for phase in PHASES {
        let mut labels = BTreeMap::new();
        if phase != "graceguard" {
            labels.insert(OPT_OUT_LABEL, "true");
        }
        match phase {
            "noop" => labels.insert(NOOP_LABEL, "true"),
            "noop_tagging" => labels.insert(TAGGING_LABEL, "true"),
            _ => None,
        };
        let ns: Namespace = serde_json::from_value(
            json!({"metadata": {"name": namespace(phase), "labels": labels}}),
        )?;
        ns_api
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {}", namespace(phase)))?;
    }
    // graceguard's flags for an experiment
    // (`GRACEGUARD_TRACE_WEBHOOK_ARGS="--follow-up-tagging=false"`); its
    // defaults otherwise.
    let extra = std::env::var("GRACEGUARD_TRACE_WEBHOOK_ARGS").unwrap_or_default();
    let extra: Vec<&str> = extra.split_whitespace().collect();
    let webhook = WebhookProcess::start(&bed, &extra).await?;
    webhook.register_as_the_chart_does(&bed).await?;
    let selector = format!("{}={}", REGISTERED_LABEL.0, REGISTERED_LABEL.1);
    for (prefix, url, label, phase) in [
        ("noop", &opts.noop_url, NOOP_LABEL, "noop"),
        (
            "noop-tagging",
            &opts.tagging_url,
            TAGGING_LABEL,
            "noop_tagging",
        ),
    ] {
        register_noop_like(
            &bed,
            &selector,
            prefix,
            url,
            &opts.ca_pem,
            label,
            &namespace(phase),
        )
        .await?;
    }
    priority_classes(&bed).await?;
    let cpu = most_of_node_cpu(&bed, testbed::pods::NODE).await?;
    let image = bed.task_image()?;
    let kubelets = Kubelets::Real {
        image: &image,
        terminate_seconds: 0,
    };
    let alice = bed.client_as("alice").await?;
    let mut traces: BTreeMap<&str, Vec<Trace>> = BTreeMap::new();
    let mut drains: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut rows = Vec::new();
    let mut n = 0;
    // One watch per phase's namespace for the whole run.
    let timelines: BTreeMap<&str, Timeline> = PHASES
        .iter()
        .map(|&phase| {
            (
                phase,
                Timeline::start(bed.client.clone(), &namespace(phase)),
            )
        })
        .collect();
    // Every trace (with its kubelet's steps) and the kubelet's log, kept
    // for reading one slow preemption (`GRACEGUARD_TRACE_DETAIL=<dir>`).
    let detail = std::env::var_os("GRACEGUARD_TRACE_DETAIL").map(std::path::PathBuf::from);
    if let Some(dir) = &detail {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    for rep in 0..opts.repetitions {
        let mut these: BTreeMap<&str, Vec<Trace>> = BTreeMap::new();
        let mut drained: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for round in 0..opts.preemptions.max(opts.drains) {
            for phase in order(rep + round) {
                let api: Api<Pod> = Api::namespaced(alice.clone(), &namespace(phase));
                if round < opts.preemptions {
                    let timeline = timelines.get(phase).context("a phase without its watch")?;
                    let t =
                        preempt_once(&api, timeline, &kubelets, n, &cpu, victim_settle(n)).await?;
                    these.entry(phase).or_default().push(t);
                    n += 1;
                }
                // Not in the tagging floor's phase: it tags the kubelet's
                // status updates of an evicted pod inline, which
                // NodeRestriction refuses, so the pod would never finish.
                if round < opts.drains && phase != "noop_tagging" {
                    let at = (n, DRAIN_PODS);
                    let node = testbed::pods::NODE;
                    let ms =
                        drain_once(&bed.client, &api, &kubelets, node, at, DRAIN_POD_CPU).await?;
                    drained.entry(phase).or_default().push(ms);
                    n += 1;
                }
            }
        }
        let text = bed.kubelet_log(testbed::pods::NODE)?;
        let kubelet = KubeletLog::parse(&text);
        for (phase, t) in &mut these {
            for t in t.iter_mut() {
                t.read_kubelet(&kubelet, &namespace(phase));
            }
        }
        if let Some(dir) = &detail {
            keep_traces(dir, rep, &these)?;
        }
        for phase in PHASES {
            let t = these.remove(phase).unwrap_or_default();
            let d = drained.remove(phase).unwrap_or_default();
            let mut row = summarize(phase, &t, &d);
            row["repetition"] = json!(rep);
            log(line(&row));
            rows.push(row);
            traces.entry(phase).or_default().extend(t);
            drains.entry(phase).or_default().extend(d);
        }
    }
    if let Some(dir) = &detail {
        let to = dir.join("kubelet.log");
        std::fs::write(&to, bed.kubelet_log(testbed::pods::NODE)?)
            .with_context(|| format!("writing {}", to.display()))?;
    }
    let mut by_phase = BTreeMap::new();
    for (phase, t) in &traces {
        let d = drains.get(phase).map_or(&[][..], Vec::as_slice);
        by_phase.insert(*phase, summarize(phase, t, d));
    }
    let ratio = |a: &str, key: &str| -> Value {
        let num = by_phase.get(a).and_then(|r| r[key].as_f64());
        let den = by_phase.get("noop").and_then(|r| r[key].as_f64());
        match (num, den) {
            (Some(x), Some(y)) if y > 0.0 => json!(round3(x / y)),
            _ => Value::Null,
        }
    };
    let keys = [
        "preemption_p50_ms",
        "preemption_p99_ms",
        "preemption_max_ms",
        "deletion_to_gone_p50_ms",
        "deletion_to_gone_p99_ms",
        "disruption_to_deletion_p50_ms",
        "drain_ms",
        "pod_startup_p99_ms",
    ];
    let ratios = |a: &str| -> Value {
        keys.iter()
            .map(|k| (k.to_string(), ratio(a, k)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let (gg_per_run, every_run_met) =
        per_run(&rows, "phase", &EVERY_RUN_TARGETED, "graceguard", "noop");
    let (noise_per_run, _) = per_run(&rows, "phase", &EVERY_RUN_TARGETED, "noop", "none");
    let summary = json!({"group": "preemption_trace", "summary": true,
        "preemptions_per_phase": opts.preemptions * opts.repetitions,
        "drains_per_phase": opts.drains * opts.repetitions,
        "ratios_graceguard_over_noop_per_run": gg_per_run,
        "ratios_noop_over_none_per_run": noise_per_run,
        "targets": {"ratio_max": LATENCY_RATIO_TARGET, "every_run_met": every_run_met},
        "phases": by_phase.values().cloned().collect::<Vec<_>>(),
        "ratios_graceguard_over_noop": ratios("graceguard"),
        "ratios_noop_tagging_over_noop": ratios("noop_tagging"),
        "note": "one real node (kubelet, containerd, runc); one preemption at a time, the phases interleaved (one preemption and drain of each phase per round, the order rotated every round); times from a watch of the namespace, from the preemptor's Create; drain_ms: cordon -> the node's 4 evicted pods gone, the median of a run's drains; pod startup: the victims' Create -> Running; noop_tagging is the no-op floor answering the tagger with the tags in admission (graceguard's behaviour before the fix)"});
    log(summary_line(&summary));
    rows.push(summary);
    Ok(rows)
}

/// Appends repetition `rep`'s traces to `dir/traces.jsonl`, one per line.
fn keep_traces(
    dir: &std::path::Path,
    rep: usize,
    these: &BTreeMap<&str, Vec<Trace>>,
) -> Result<()> {
    use std::io::Write;
    let path = dir.join("traces.jsonl");
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    for (phase, traces) in these {
        for t in traces {
            let line = json!({"phase": phase, "repetition": rep, "trace": t});
            writeln!(out, "{line}").with_context(|| format!("writing {}", path.display()))?;
        }
    }
    Ok(())
}

fn p(v: &[f64], q: f64) -> Value {
    if v.is_empty() {
        return Value::Null;
    }
    let mut v = v.to_vec();
    json!(round3(percentile_f64(&mut v, q)))
}

/// A phase's figures over `traces` and the node's drains (ms each).
pub fn summarize(phase: &str, traces: &[Trace], drains: &[f64]) -> Value {
    let of =
        |f: &dyn Fn(&Trace) -> Option<f64>| -> Vec<f64> { traces.iter().filter_map(f).collect() };
    let preemption = of(&|t| Some(t.preemptor_running_ms));
    let to_dt = of(&|t| t.victim_disruption_target_ms);
    let dt_to_del = of(&|t| Some(t.victim_deletion_ms? - t.victim_disruption_target_ms?));
    let del_to_gone = of(&|t| t.deletion_to_gone_ms());
    let gone_to_bound = of(&|t| Some(t.preemptor_bound_ms? - t.victim_gone_ms?));
    let bound_to_running = of(&|t| Some(t.preemptor_running_ms - t.preemptor_bound_ms?));
    let startup = of(&|t| Some(t.victim_startup_ms));
    let kubelet: Vec<&Termination> = traces
        .iter()
        .filter_map(|t| t.victim_kubelet.as_ref())
        .collect();
    let steps = |f: fn(&Termination) -> f64| -> Vec<f64> {
        kubelet.iter().map(|k| f(k) * 1000.0).collect()
    };
    json!({"group": "preemption_trace", "phase": phase, "preemptions": traces.len(),
        "preemption_p50_ms": p(&preemption, 50.0), "preemption_p99_ms": p(&preemption, 99.0),
        "preemption_max_ms": p(&preemption, 100.0),
        "pod_startup_p50_ms": p(&startup, 50.0), "pod_startup_p99_ms": p(&startup, 99.0),
        "drains": drains.len(), "drain_ms": median(&mut drains.to_vec()).map(round3),
        "drain_max_ms": p(drains, 100.0),
        "created_to_disruption_target_p50_ms": p(&to_dt, 50.0),
        "disruption_to_deletion_p50_ms": p(&dt_to_del, 50.0),
        "deletion_to_gone_p50_ms": p(&del_to_gone, 50.0), "deletion_to_gone_p99_ms": p(&del_to_gone, 99.0),
        "deletion_to_gone_max_ms": p(&del_to_gone, 100.0),
        "gone_to_bound_p50_ms": p(&gone_to_bound, 50.0),
        "bound_to_running_p50_ms": p(&bound_to_running, 50.0),
        "victims_changed_while_running": traces.iter().filter(|t| !t.tagged_while_running().is_empty()).count(),
        "victims_tagged_before_gone": traces.iter().filter(|t| t.tagged_before_gone()).count(),
        "kubelet_victims_read": kubelet.len(),
        "kubelet_passes_max": kubelet.iter().map(|k| k.passes).max(),
        "kubelet_updates_before_deletion": kubelet.iter().map(|k| k.updates_before_deletion).sum::<usize>(),
        "kubelet_updates_during_termination": kubelet.iter().map(|k| k.updates).sum::<usize>(),
        "kubelet_deleted_mid_pass": kubelet.iter().filter(|k| k.pass_busy_s > 0.1).count(),
        "kubelet_pass_busy_max_ms": p(&steps(|k| k.pass_busy_s), 100.0),
        "kubelet_wait_before_kill_p50_ms": p(&steps(|k| k.wait_before_kill_s), 50.0),
        "kubelet_wait_before_kill_max_ms": p(&steps(|k| k.wait_before_kill_s), 100.0),
        "kubelet_kill_p50_ms": p(&steps(|k| k.kill_s), 50.0),
        "kubelet_wait_after_kill_p50_ms": p(&steps(|k| k.wait_after_kill_s), 50.0)})
}

fn ms(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.0}"))
}

fn line(r: &Value) -> String {
    format!(
        "preemption_trace {:<12} rep {}: {} preemptions, created->Running p50/p99 {}/{} ms, victim deletion->gone p50/p99 {}/{} ms, drain {} ms, pod startup p99 {} ms, DisruptionTarget->deletion p50 {} ms; changed while running {}, tagged {}; kubelet: updates before deletion {}, passes max {}, updates while terminating {}, deleted mid-pass {}, wait before kill p50/max {}/{} ms, kill p50 {} ms, wait after kill p50 {} ms",
        r["phase"].as_str().unwrap_or("?"),
        r["repetition"],
        r["preemptions"],
        ms(&r["preemption_p50_ms"]),
        ms(&r["preemption_p99_ms"]),
        ms(&r["deletion_to_gone_p50_ms"]),
        ms(&r["deletion_to_gone_p99_ms"]),
        ms(&r["drain_ms"]),
        ms(&r["pod_startup_p99_ms"]),
        ms(&r["disruption_to_deletion_p50_ms"]),
        r["victims_changed_while_running"],
        r["victims_tagged_before_gone"],
        r["kubelet_updates_before_deletion"],
        r["kubelet_passes_max"],
        r["kubelet_updates_during_termination"],
        r["kubelet_deleted_mid_pass"],
        ms(&r["kubelet_wait_before_kill_p50_ms"]),
        ms(&r["kubelet_wait_before_kill_max_ms"]),
        ms(&r["kubelet_kill_p50_ms"]),
        ms(&r["kubelet_wait_after_kill_p50_ms"]),
    )
}

fn summary_line(s: &Value) -> String {
    let g = &s["ratios_graceguard_over_noop"];
    let t = &s["ratios_noop_tagging_over_noop"];
    format!(
        "preemption_trace summary ({} per phase): graceguard/noop preemption p50 {} max {} deletion->gone {} drain {}; noop_tagging/noop preemption p50 {} deletion->gone {}; per run graceguard/noop {} (<= {} in every run: {}); noop/none {}",
        s["preemptions_per_phase"],
        g["preemption_p50_ms"],
        g["preemption_max_ms"],
        g["deletion_to_gone_p50_ms"],
        g["drain_ms"],
        t["preemption_p50_ms"],
        t["deletion_to_gone_p50_ms"],
        s["ratios_graceguard_over_noop_per_run"],
        LATENCY_RATIO_TARGET,
        s["targets"]["every_run_met"],
        s["ratios_noop_over_none_per_run"],
    )
}

/// Scheduler preemptions on a real node with no webhook, the no-op floor,
/// the floor tagging in admission, and graceguard ([`testbed::load::preemption_trace`]).
pub(crate) async fn preemption_trace(args: &Args) -> Result<()> {
    let q = args.quick;
    let dir = tempfile::tempdir()?;
    let ca = BaselineServer::own_certificate(dir.path())?;
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let noop = BaselineServer::spawn(&cert, &key, false).await?;
    let tagging = BaselineServer::spawn(&cert, &key, true).await?;
    let opts = Options {
        preemptions: args.preemptions.unwrap_or(if q { 1 } else { 12 }).max(1),
        drains: args.preemption_drains.unwrap_or(if q { 1 } else { 3 }),
        repetitions: args
            .preemption_repetitions
            .unwrap_or(if q { 1 } else { 3 })
            .max(1),
        noop_url: format!("https://127.0.0.1:{}", noop.port),
        tagging_url: format!("https://127.0.0.1:{}", tagging.port),
        ca_pem: ca.cert_pem(),
    };
    for row in run(&opts, table).await? {
        emit(row);
    }
    drop((noop, tagging));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use scenarios::preemption_trace::VictimVersion;

    fn trace(running: f64, deletion: f64, gone: f64, tagged_running: bool) -> Trace {
        let v = |tagged, deleting| VictimVersion {
            at_ms: 0.0,
            resource_version: "1".into(),
            tagged,
            deleting,
            phase: Some("Running".into()),
        };
        Trace {
            victim: "v".into(),
            preemptor: "p".into(),
            victim_disruption_target_ms: Some(10.0),
            victim_deletion_ms: Some(deletion),
            victim_gone_ms: Some(gone),
            preemptor_bound_ms: Some(gone + 5.0),
            preemptor_running_ms: running,
            victim_startup_ms: 700.0,
            victim_versions: vec![v(tagged_running, false), v(true, true)],
            victim_uid: "u".into(),
            victim_kubelet: Some(Termination {
                passes: 2,
                updates_before_deletion: usize::from(tagged_running),
                updates: usize::from(!tagged_running),
                pass_busy_s: if tagged_running { 0.4 } else { 0.0 },
                wait_before_kill_s: if tagged_running { 1.0 } else { 0.2 },
                kill_s: 0.5,
                wait_after_kill_s: 0.3,
                removed_s: Some(1.0),
            }),
        }
    }

    #[test]
    fn every_phase_leads_one_round_in_four() {
        let leads: Vec<&str> = (0..4).map(|r| order(r)[0]).collect();
        assert_eq!(leads, PHASES.to_vec());
    }

    #[test]
    fn a_phase_reports_its_intervals_and_the_victims_changed_while_running() {
        let r = summarize(
            "graceguard",
            &[
                trace(900.0, 20.0, 820.0, false),
                trace(2000.0, 20.0, 1820.0, true),
            ],
            &[3000.0, 1000.0, 2000.0],
        );
        assert_eq!(r["drains"], 3);
        assert_eq!(r["drain_ms"], 2000.0);
        assert_eq!(r["drain_max_ms"], 3000.0);
        assert_eq!(r["pod_startup_p99_ms"], 700.0);
        assert_eq!(r["preemptions"], 2);
        assert_eq!(r["preemption_max_ms"], 2000.0);
        assert_eq!(r["deletion_to_gone_max_ms"], 1800.0);
        assert_eq!(r["disruption_to_deletion_p50_ms"], 10.0);
        assert_eq!(r["victims_changed_while_running"], 1);
        assert_eq!(r["victims_tagged_before_gone"], 2);
        assert_eq!(r["kubelet_victims_read"], 2);
        assert_eq!(r["kubelet_passes_max"], 2);
        assert_eq!(r["kubelet_updates_during_termination"], 1);
        assert_eq!(r["kubelet_updates_before_deletion"], 1);
        assert_eq!(r["kubelet_deleted_mid_pass"], 1);
        assert_eq!(r["kubelet_wait_before_kill_max_ms"], 1000.0);
        assert_eq!(r["kubelet_kill_p50_ms"], 500.0);
    }
}
