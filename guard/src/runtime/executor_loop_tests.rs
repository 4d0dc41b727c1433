//! The loop driven by a fake API server under paused time: the waits it
//! keeps between calls, what a closed or expired fence stops, and which
//! result finalizers it lets go of. Every figure is tokio's paused clock, so
//! these tests take no wall time and do not depend on the machine's load.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::stream::{self, BoxStream};
use futures::StreamExt;
use graceguard_contract::fencing::Token;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::watcher::Event;
use kube::ResourceExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::{spawn, Command, Stats};
use crate::core::answer::{AnswerKind, Released};
use crate::core::backoff::BackoffPolicy;
use crate::core::classify::CreateRefusal;
use crate::core::reconcile::{Existing, TaskSpec};
use crate::core::task::{TaskKey, TaskStatus};
use crate::core::template::Template;
use crate::runtime::events::EventLog;
use crate::runtime::executor_config::ExecutorConfig;
use crate::runtime::kube_events::Publisher;
use crate::runtime::lease::{Fence, FenceState};
use crate::runtime::pod_api::{PodApi, WatchEvent};
use crate::runtime::pod_index::Version;

const NS: &str = "team-a";
const INSTANCE: &str = "exec";

/// A call the loop made, as the fake saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Watch,
    Create { name: String, term: Option<String> },
    Read { name: String },
    Delete { name: String },
    Release { name: String, term: Option<String> },
    Namespace,
}

#[derive(Default)]
struct Cluster {
    pods: BTreeMap<String, Pod>,
    next: u64,
    watchers: Vec<mpsc::UnboundedSender<WatchEvent>>,
    /// Answers given to the next Creates instead of creating.
    scripted: VecDeque<AnswerKind>,
    calls: Vec<(Duration, Call)>,
    namespace_terminating: bool,
}

impl Cluster {
    fn publish(&mut self, event: impl Fn() -> Event<Pod>) {
        self.watchers.retain(|w| w.send(Ok(event())).is_ok());
    }

    fn stored(&mut self, mut pod: Pod) {
        self.next += 1;
        pod.metadata.resource_version = Some(self.next.to_string());
        self.pods.insert(pod.name_any(), pod.clone());
        self.publish(|| Event::Apply(pod.clone()));
    }

    fn removed(&mut self, name: &str) {
        if let Some(pod) = self.pods.remove(name) {
            self.publish(|| Event::Delete(pod.clone()));
        }
    }
}

/// An API server holding pods in memory, answering as the real one does for
/// what the loop asks, recording every call with its (paused) time.
#[derive(Clone)]
struct Fake {
    cluster: Arc<Mutex<Cluster>>,
    t0: Instant,
}

impl Fake {
    fn new() -> Self {
        Self {
            cluster: Arc::default(),
            t0: Instant::now(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Cluster> {
        self.cluster.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, call: Call) {
        let at = self.t0.elapsed();
        self.lock().calls.push((at, call));
    }

    /// The next Creates are answered with these, in order.
    fn script(&self, answers: impl IntoIterator<Item = AnswerKind>) {
        self.lock().scripted.extend(answers);
    }

    fn calls(&self) -> Vec<(Duration, Call)> {
        self.lock().calls.clone()
    }

    /// When each Create was sent, and under which name.
    fn creates(&self) -> Vec<(Duration, String)> {
        self.calls()
            .into_iter()
            .filter_map(|(at, c)| match c {
                Call::Create { name, .. } => Some((at, name)),
                _ => None,
            })
            .collect()
    }

    fn count(&self, matches: impl Fn(&Call) -> bool) -> usize {
        self.calls().iter().filter(|(_, c)| matches(c)).count()
    }

    /// Pod `name` as the kubelet would move it: to `phase`.
    fn set_phase(&self, name: &str, phase: &str) {
        let mut c = self.lock();
        let Some(mut pod) = c.pods.get(name).cloned() else {
            panic!("no pod {name}");
        };
        pod.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        c.stored(pod);
    }

    /// Pod `name` deleted gracefully by someone else: kept by its
    /// finalizers, or gone.
    fn delete(&self, name: &str) {
        let mut c = self.lock();
        let Some(mut pod) = c.pods.get(name).cloned() else {
            panic!("no pod {name}");
        };
        if pod.finalizers().is_empty() {
            c.removed(name);
            return;
        }
        pod.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        pod.metadata.deletion_grace_period_seconds = Some(30);
        c.stored(pod);
    }

    /// Pod `name` gone at once (its finalizers too: a force delete).
    fn remove(&self, name: &str) {
        self.lock().removed(name);
    }

    /// A pod of this instance made by an earlier process (from `pod_for`).
    fn preexisting(&self, pod: serde_json::Map<String, serde_json::Value>, uid: &str) {
        let Ok(mut pod) = serde_json::from_value::<Pod>(pod.into()) else {
            panic!("the template's pod reads as a pod");
        };
        pod.metadata.uid = Some(uid.into());
        self.lock().stored(pod);
    }

    fn finalizers(&self, name: &str) -> Vec<String> {
        self.lock()
            .pods
            .get(name)
            .map(|p| p.finalizers().to_vec())
            .unwrap_or_default()
    }
}

impl PodApi for Fake {
    fn watch(&self, _selector: &str) -> BoxStream<'static, WatchEvent> {
        self.record(Call::Watch);
        let (tx, rx) = mpsc::unbounded_channel();
        let mut c = self.lock();
        let listed: Vec<WatchEvent> = std::iter::once(Ok(Event::Init))
            .chain(c.pods.values().map(|p| Ok(Event::InitApply(p.clone()))))
            .chain(std::iter::once(Ok(Event::InitDone)))
            .collect();
        c.watchers.push(tx);
        let changes = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) });
        stream::iter(listed).chain(changes).boxed()
    }

    async fn create(
        &self,
        _namespace: &str,
        pod: &serde_json::Map<String, serde_json::Value>,
    ) -> AnswerKind {
        let Ok(mut pod) = serde_json::from_value::<Pod>(pod.clone().into()) else {
            panic!("the loop sent a pod that does not read as one");
        };
        let name = pod.name_any();
        let term = pod
            .annotations()
            .get(graceguard_contract::fencing::ANNOTATION)
            .cloned();
        self.record(Call::Create {
            name: name.clone(),
            term,
        });
        let mut c = self.lock();
        if let Some(answer) = c.scripted.pop_front() {
            return answer;
        }
        if c.pods.contains_key(&name) {
            return AnswerKind::Refused {
                refusal: CreateRefusal::NameTaken,
                retry_after: None,
            };
        }
        let uid = format!("uid-{name}");
        pod.metadata.uid = Some(uid.clone());
        c.stored(pod);
        AnswerKind::Created(uid)
    }

    async fn read(&self, _namespace: &str, name: &str) -> AnswerKind {
        self.record(Call::Read { name: name.into() });
        let found = self.lock().pods.get(name).map(|p| Existing {
            uid: p.uid().unwrap_or_default(),
            labels: p.labels().clone(),
            deleting: p.metadata.deletion_timestamp.is_some(),
        });
        AnswerKind::Read(found)
    }

    async fn delete_exact(&self, _namespace: &str, name: &str, uid: &str) -> bool {
        self.record(Call::Delete { name: name.into() });
        let ours = self.lock().pods.get(name).and_then(|p| p.uid()) == Some(uid.to_string());
        if ours {
            self.delete(name);
        }
        true
    }

    async fn release(&self, _namespace: &str, v: &Version, token: Option<String>) -> Released {
        self.record(Call::Release {
            name: v.name.clone(),
            term: token,
        });
        let mut c = self.lock();
        let Some(mut pod) = c.pods.get(&v.name).cloned() else {
            return Released::Done;
        };
        if pod.resource_version().as_deref() != Some(v.resource_version.as_str()) {
            return Released::Changed;
        }
        pod.metadata.finalizers = Some(crate::core::result_finalizer::without(&v.finalizers));
        let gone = pod.metadata.deletion_timestamp.is_some() && pod.finalizers().is_empty();
        match gone {
            true => c.removed(&v.name),
            false => c.stored(pod),
        }
        Released::Done
    }

    async fn namespace_terminating(&self, _namespace: &str) -> Option<bool> {
        self.record(Call::Namespace);
        Some(self.lock().namespace_terminating)
    }

    async fn server_offset_ms(&self, _local_ms: impl Fn() -> i64 + Send) -> Option<i64> {
        Some(0)
    }
}

fn template() -> Template {
    let pod = serde_json::json!({
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    });
    match Template::from_json(pod) {
        Ok(t) => t,
        Err(e) => panic!("the test template: {e}"),
    }
}

fn spec(task: &str) -> TaskSpec {
    TaskSpec {
        retries: 2,
        ..TaskSpec::new(task, NS, INSTANCE)
    }
}

fn config(fence: Fence) -> ExecutorConfig {
    let seeded = |min_ms, max_ms| BackoffPolicy {
        min: Duration::from_millis(min_ms),
        max: Duration::from_millis(max_ms),
        seed: Some(11),
    };
    ExecutorConfig {
        namespace: Some(NS.into()),
        quota_backoff: seeded(1_000, 60_000),
        transient_backoff: seeded(200, 10_000),
        publish_events: false,
        fence,
        ..ExecutorConfig::new(INSTANCE)
    }
}

fn term(transitions: i64) -> Arc<Token> {
    Arc::new(Token {
        lease_namespace: NS.into(),
        lease_name: "graceguard-exec".into(),
        lease_uid: "lease-uid".into(),
        transitions,
    })
}

/// The loop, started on the test's runtime against `fake`.
struct Bed {
    commands: mpsc::UnboundedSender<Command>,
}

impl Bed {
    fn start(fake: &Fake, config: ExecutorConfig) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        let log = Arc::new(EventLog::default());
        let stats = Arc::new(Stats::default());
        spawn(fake.clone(), Publisher::off(), config, log, stats, rx);
        Self { commands }
    }

    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> T {
        let (reply, rx) = oneshot::channel();
        if self.commands.send(make(reply)).is_err() {
            panic!("the loop stopped");
        }
        match rx.await {
            Ok(v) => v,
            Err(_) => panic!("the loop dropped a reply"),
        }
    }

    async fn submit(&self, task: &str) -> TaskStatus {
        let submitted = self
            .ask(|reply| Command::Submit {
                spec: spec(task),
                template: Box::new(template()),
                replace: false,
                reply,
            })
            .await;
        match submitted {
            Ok(s) => s.status,
            Err(e) => panic!("submitting {task}: {e}"),
        }
    }

    async fn status(&self, task: &str) -> Option<TaskStatus> {
        let key = TaskKey::new(NS, task);
        self.ask(|reply| Command::Status { key, reply }).await
    }

    async fn abort(&self, task: &str) {
        let key = TaskKey::new(NS, task);
        if let Err(e) = self.ask(|reply| Command::Abort { key, reply }).await {
            panic!("aborting {task}: {e}");
        }
    }

    fn acknowledge(&self, task: &str) {
        let key = TaskKey::new(NS, task);
        if self.commands.send(Command::Acknowledged { key }).is_err() {
            panic!("the loop stopped");
        }
    }
}

/// Lets the paused clock run `d` (every timer due in it fires in order).
async fn run_for(d: Duration) {
    tokio::time::sleep(d).await;
}

fn quota_full() -> AnswerKind {
    AnswerKind::Refused {
        refusal: CreateRefusal::QuotaFull,
        retry_after: None,
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn gaps(times: &[Duration]) -> Vec<f64> {
    times.windows(2).map(|w| secs(w[1] - w[0])).collect()
}

#[tokio::test(start_paused = true)]
async fn quota_refusals_wait_the_namespace_backoff_under_one_name_and_spend_nothing() {
    let fake = Fake::new();
    fake.script([quota_full(), quota_full(), quota_full()]);
    let bed = Bed::start(&fake, config(Fence::open()));
    bed.submit("train").await;
    run_for(Duration::from_millis(500)).await;
    let waiting = bed.status("train").await;
    assert_eq!(
        waiting.as_ref().map(|s| s.phase),
        Some("WaitingForResources"),
        "{waiting:?}"
    );
    run_for(Duration::from_secs(30)).await;
    let creates = fake.creates();
    let names: Vec<&str> = creates.iter().map(|(_, n)| n.as_str()).collect();
    let first = spec("train").pod_name(0);
    assert_eq!(names, [first.as_str(); 4], "one name throughout");
    // 1 s, 2 s and 4 s doubling, each jittered up to its base again, plus
    // the task's own offset of up to a second.
    let times: Vec<Duration> = creates.iter().map(|(t, _)| *t).collect();
    let g = gaps(&times);
    for (gap, base) in g.iter().zip([1.0, 2.0, 4.0]) {
        assert!(
            (base..=2.0 * base + 1.0).contains(gap),
            "gaps {g:?}: each waits its window"
        );
    }
    let s = bed.status("train").await;
    let s = s.as_ref();
    assert_eq!(s.map(|s| s.attempt), Some(0), "{s:?}");
    assert_eq!(s.map(|s| s.system_failures), Some(0), "{s:?}");
    assert_eq!(s.and_then(|s| s.uid.clone()), Some(format!("uid-{first}")));
}

#[tokio::test(start_paused = true)]
async fn tasks_waiting_on_one_namespace_s_quota_send_one_create_per_window() {
    let fake = Fake::new();
    fake.script((0..200).map(|_| quota_full()));
    let bed = Bed::start(&fake, config(Fence::open()));
    for t in ["a", "b", "c", "d", "e"] {
        bed.submit(t).await;
    }
    run_for(Duration::from_secs(40)).await;
    let creates = fake.creates();
    // The first refusal opens the namespace's window before the others
    // are submitted; from then on one probe per window, by whichever task
    // asks first after it (a success would let the next one go at once).
    let times: Vec<Duration> = creates.iter().map(|(t, _)| *t).collect();
    let g = gaps(&times);
    assert!(
        g.iter().all(|gap| *gap >= 1.0),
        "one Create per window, never two at once: {creates:?}"
    );
    assert!(
        g.windows(2).all(|w| w[1] >= w[0] - 1.0),
        "the windows grow: {creates:?}"
    );
    // Windows of 1, 2, 4, 8 and 16 s (jittered) fit 4 to 7 Creates in 40
    // s; five tasks backing off alone would have sent about 25.
    assert!((4..=7).contains(&creates.len()), "{creates:?}");
}

#[tokio::test(start_paused = true)]
async fn a_transient_refusal_waits_at_least_its_retry_after_then_the_doubling_backoff() {
    let fake = Fake::new();
    fake.script([
        AnswerKind::Refused {
            refusal: CreateRefusal::Transient,
            retry_after: Some(Duration::from_secs(5)),
        },
        AnswerKind::Refused {
            refusal: CreateRefusal::Transient,
            retry_after: None,
        },
    ]);
    let bed = Bed::start(&fake, config(Fence::open()));
    bed.submit("train").await;
    run_for(Duration::from_secs(20)).await;
    let times: Vec<Duration> = fake.creates().iter().map(|(t, _)| *t).collect();
    assert_eq!(times.len(), 3, "{times:?}");
    let g = gaps(&times);
    assert!(
        (5.0..5.5).contains(&g[0]),
        "the Retry-After is a floor: {g:?}"
    );
    // The second transient wait: 400 ms, jittered up to 800 ms.
    assert!((0.4..=0.8).contains(&g[1]), "{g:?}");
    let s = bed.status("train").await;
    assert_eq!(s.as_ref().map(|s| s.attempt), Some(0), "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn a_closed_fence_sends_nothing_and_a_reopened_one_lists_again_before_acting() {
    let fake = Fake::new();
    let (fence, f) = Fence::driven(FenceState::Closed);
    let bed = Bed::start(&fake, config(f));
    bed.submit("train").await;
    run_for(Duration::from_secs(10)).await;
    assert_eq!(fake.creates().len(), 0, "nothing while the fence is closed");
    let s = bed.status("train").await;
    assert_eq!(s.as_ref().map(|s| s.started), Some(false), "{s:?}");

    fence.send_replace(FenceState::Until(
        Instant::now() + Duration::from_secs(3600),
        term(1),
    ));
    run_for(Duration::from_secs(1)).await;
    let first = spec("train").pod_name(0);
    let created: Vec<Call> = fake
        .calls()
        .into_iter()
        .map(|(_, c)| c)
        .filter(|c| matches!(c, Call::Create { .. }))
        .collect();
    assert_eq!(
        created,
        [Call::Create {
            name: first.clone(),
            term: Some("team-a/graceguard-exec/lease-uid/1".into()),
        }],
        "the Create carries the term it was sent under"
    );
    assert_eq!(fake.count(|c| *c == Call::Watch), 1);

    // Closed again, and the pod vanishes meanwhile: no next attempt yet.
    fence.send_replace(FenceState::Closed);
    run_for(Duration::from_millis(100)).await;
    fake.set_phase(&first, "Running");
    fake.remove(&first);
    run_for(Duration::from_secs(10)).await;
    assert_eq!(fake.creates().len(), 1, "nothing while the fence is closed");

    // Open again: the pods are listed anew before anything is decided.
    fence.send_replace(FenceState::Until(
        Instant::now() + Duration::from_secs(3600),
        term(2),
    ));
    run_for(Duration::from_secs(5)).await;
    let calls: Vec<Call> = fake.calls().into_iter().map(|(_, c)| c).collect();
    let second_watch = calls
        .iter()
        .enumerate()
        .filter(|(_, c)| **c == Call::Watch)
        .nth(1)
        .map(|(i, _)| i);
    let next_create = calls
        .iter()
        .enumerate()
        .filter(|(_, c)| matches!(c, Call::Create { .. }))
        .nth(1)
        .map(|(i, _)| i);
    assert!(
        matches!((second_watch, next_create), (Some(w), Some(c)) if w < c),
        "a new list, then the next attempt: {calls:?}"
    );
    assert_eq!(
        calls.get(next_create.unwrap_or(0)),
        Some(&Call::Create {
            name: spec("train").pod_name(1),
            term: Some("team-a/graceguard-exec/lease-uid/2".into()),
        })
    );
}

#[tokio::test(start_paused = true)]
async fn a_fence_past_its_deadline_stops_the_next_create_with_no_message_at_all() {
    let fake = Fake::new();
    fake.script([AnswerKind::Refused {
        refusal: CreateRefusal::Transient,
        retry_after: Some(Duration::from_secs(5)),
    }]);
    let (fence, f) = Fence::driven(FenceState::Until(
        Instant::now() + Duration::from_secs(3),
        term(1),
    ));
    let bed = Bed::start(&fake, config(f));
    bed.submit("train").await;
    run_for(Duration::from_secs(20)).await;
    // The retry came due at 5 s, after the deadline at 3 s: not sent.
    assert_eq!(fake.creates().len(), 1, "{:?}", fake.calls());

    // Renewed: the retry goes out now, under the renewed term.
    fence.send_replace(FenceState::Until(
        Instant::now() + Duration::from_secs(3600),
        term(1),
    ));
    run_for(Duration::from_secs(5)).await;
    let creates = fake.creates();
    assert_eq!(creates.len(), 2, "{:?}", fake.calls());
    let resent = creates[1].0;
    assert!(
        (20.0..20.1).contains(&secs(resent)),
        "sent on the renewal, at {resent:?}"
    );
    assert_eq!(creates[1].1, spec("train").pod_name(0));
}

#[tokio::test(start_paused = true)]
async fn a_result_keeps_its_finalizer_until_acknowledged_and_an_aborted_task_lets_go() {
    let fake = Fake::new();
    let bed = Bed::start(&fake, config(Fence::open()));
    bed.submit("done").await;
    bed.submit("stopped").await;
    run_for(Duration::from_secs(1)).await;
    let done = spec("done").pod_name(0);
    let stopped = spec("stopped").pod_name(0);
    fake.set_phase(&done, "Succeeded");
    fake.set_phase(&stopped, "Running");
    run_for(Duration::from_secs(10)).await;
    let s = bed.status("done").await;
    assert_eq!(s.as_ref().and_then(|s| s.succeeded), Some(true), "{s:?}");
    assert_eq!(
        fake.count(|c| matches!(c, Call::Release { .. })),
        0,
        "a result nobody acknowledged keeps its pod"
    );
    assert_eq!(
        fake.finalizers(&done),
        [crate::core::naming::RESULT_FINALIZER],
        "still held"
    );

    bed.abort("stopped").await;
    run_for(Duration::from_secs(1)).await;
    let calls: Vec<Call> = fake.calls().into_iter().map(|(_, c)| c).collect();
    assert!(
        calls.contains(&Call::Delete {
            name: stopped.clone()
        }),
        "{calls:?}"
    );
    assert!(
        calls.contains(&Call::Release {
            name: stopped.clone(),
            term: None
        }),
        "nothing to keep for an aborted task: {calls:?}"
    );
    // Only its pods: a release that met the deletion's own write (409)
    // is sent again for the version the watch shows next.
    let releases: Vec<&Call> = calls
        .iter()
        .filter(|c| matches!(c, Call::Release { .. }))
        .collect();
    assert!(
        releases.iter().all(|c| **c
            == Call::Release {
                name: stopped.clone(),
                term: None
            }),
        "{calls:?}"
    );
    assert!(fake.finalizers(&stopped).is_empty());
    assert!(
        !fake.lock().pods.contains_key(&stopped),
        "its deletion ended"
    );
    assert_eq!(
        fake.finalizers(&done),
        [crate::core::naming::RESULT_FINALIZER]
    );
}

#[tokio::test(start_paused = true)]
async fn in_a_namespace_being_deleted_a_fenced_process_lets_go_without_a_term() {
    let fake = Fake::new();
    let spec = spec("train");
    let name = spec.pod_name(0);
    fake.preexisting(template().pod_for(&spec, &name, 0), "uid-old");
    fake.delete(&name);
    fake.lock().namespace_terminating = true;
    let (_fence, f) = Fence::driven(FenceState::Closed);
    let _bed = Bed::start(&fake, config(f));
    run_for(Duration::from_secs(5)).await;
    let calls: Vec<Call> = fake
        .calls()
        .into_iter()
        .map(|(_, c)| c)
        .filter(|c| *c != Call::Watch)
        .collect();
    assert_eq!(
        calls,
        [
            Call::Namespace,
            Call::Release {
                name: name.clone(),
                term: None
            }
        ],
        "asked, then let go under no term; nothing created"
    );
    assert!(
        !fake.lock().pods.contains_key(&name),
        "the deletion went on"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fenced_process_keeps_the_finalizer_where_the_namespace_stays() {
    let fake = Fake::new();
    let spec = spec("train");
    let name = spec.pod_name(0);
    fake.preexisting(template().pod_for(&spec, &name, 0), "uid-old");
    fake.delete(&name);
    let (_fence, f) = Fence::driven(FenceState::Closed);
    let _bed = Bed::start(&fake, config(f));
    run_for(Duration::from_secs(35)).await;
    assert_eq!(fake.count(|c| matches!(c, Call::Release { .. })), 0);
    // Asked again every 10 s while the held pod is being deleted.
    let asked = fake.count(|c| *c == Call::Namespace);
    assert!((3..=4).contains(&asked), "{:?}", fake.calls());
}

#[tokio::test(start_paused = true)]
async fn an_acknowledged_result_is_forgotten_on_time_even_days_ahead() {
    let fake = Fake::new();
    let mut cfg = config(Fence::open());
    cfg.forget_after = Some(Duration::from_secs(3 * 86_400));
    let bed = Bed::start(&fake, cfg);
    bed.submit("train").await;
    run_for(Duration::from_secs(1)).await;
    fake.set_phase(&spec("train").pod_name(0), "Succeeded");
    run_for(Duration::from_secs(1)).await;
    bed.acknowledge("train");
    // Past the delay queue's one-day step: armed again, not fired early.
    run_for(Duration::from_secs(3 * 86_400 - 60)).await;
    assert!(bed.status("train").await.is_some(), "kept until its time");
    run_for(Duration::from_secs(120)).await;
    assert!(bed.status("train").await.is_none(), "forgotten on time");
}
