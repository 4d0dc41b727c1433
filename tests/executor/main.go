// Command executor is a model of an executor's pod plugin, on client-go, for
// graceguard's end-to-end tests and benchmarks: it follows the behaviour of
// Flyte's v2 executor (flyteorg/flyte v2.0.43, executor/) as far as it
// matters for a name collision, so the tests can compare graceguard's modes
// against the client library such executors use.
//
//   - Each task attempt's pod has a fixed name; the plugin re-creates that
//     same name.
//   - A Create answered AlreadyExists is read as "my pod exists": success,
//     which (like any transition but a system error) resets the task's
//     system-failure count.
//   - A pod of its own seen with a deletionTimestamp is a system failure
//     (UnexpectedObjectDeletion): the plugin deletes it and creates it again.
//   - Any other Create error but Forbidden is a system error: counted, and
//     the task requeued after a fixed 10 s; more than 3 system failures in a
//     row fail the task for good (MaxSystemFailuresExceeded).
//   - Reconciles run on every watch event of the tasks' pods and status
//     objects (informers feeding one work queue), by up to 512 workers at
//     once (MaxConcurrentReconciles), through one shared client.
//
// client-go itself retries a 429 that carries Retry-After inside the same
// call (up to 10 times), so a caller simply waits, and its worker with it.
//
// It runs --tasks tasks (task-0, task-1, ...). Once the first of them is seen
// disrupted, it launches --unrelated new tasks (new-0, ...) a moment later
// (--unrelated-after, when colliding Creates are waiting), whose latency
// shows whether workers blocked in colliding Creates starve the rest. It stops after --run-for, or once every task has run again (the
// disrupted ones on a new pod, the unrelated ones at all) for --settle, and
// prints one JSON object: requests by verb and answer, per-task figures and
// their totals.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

const (
	taskLabel     = "graceguard-test/task"
	executorLabel = "graceguard-test/executor"
)

// counts are the requests the executor's client sends, by verb, resource
// and answer code, as they leave client-go's transport (each retry of a 429
// is one request).
type counts struct {
	mu sync.Mutex
	m  map[string]int
}

type counter struct {
	c    *counts
	next http.RoundTripper
}

// relaunchKey marks the context of a disrupted task's Create calls until
// its successor pod is made: each request sent under it (client-go's own
// retries of a 429 included) is counted on the task.
type relaunchKey struct{}

func (c *counter) RoundTrip(req *http.Request) (*http.Response, error) {
	if n, ok := req.Context().Value(relaunchKey{}).(*atomic.Int64); ok {
		n.Add(1)
	}
	resp, err := c.next.RoundTrip(req)
	code := "error"
	if err == nil {
		code = strconv.Itoa(resp.StatusCode)
	}
	key := fmt.Sprintf("%s %s %s", req.Method, resourceOf(req.URL.Path), code)
	if req.URL.Query().Get("watch") == "true" {
		key = fmt.Sprintf("WATCH %s %s", resourceOf(req.URL.Path), code)
	}
	c.c.mu.Lock()
	c.c.m[key]++
	c.c.mu.Unlock()
	return resp, err
}

// resourceOf names the resource of an API path: ".../pods/NAME" -> "pods".
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i := len(parts) - 1; i >= 0; i-- {
		switch parts[i] {
		case "pods", "configmaps":
			return parts[i]
		}
	}
	return path
}

// task is one task's state and figures.
type task struct {
	name      string
	unrelated bool

	podCreates, podDeletes, attempts  int
	systemFailures, maxSystemFailures int
	systemFailuresRecorded            int
	// Create requests sent from the disruption to the successor's 201.
	relaunchRequests atomic.Int64
	longestCreateMS  int64
	createErrors     map[string]int
	failed           bool
	failedWhy        string

	firstUID       string
	launchedAt     time.Time
	createdAt      time.Time
	runningAt      time.Time
	disruptedAt    time.Time
	runningAgainAt time.Time
	// goneAt: the informer saw the first pod deleted (its name free);
	// recreatedAt: the Create that made the successor returned.
	goneAt      time.Time
	recreatedAt time.Time
}

// taskReport is what the executor prints per task.
type taskReport struct {
	Name                string         `json:"name"`
	PodCreates          int            `json:"pod_creates"`
	Attempts            int            `json:"attempts"`
	MaxSystemFailures   int            `json:"max_system_failures_seen"`
	LongestCreateCallMS int64          `json:"longest_create_call_ms"`
	CreateErrors        map[string]int `json:"create_errors"`
	FailedPermanently   bool           `json:"failed_permanently"`
	FailedWhy           string         `json:"failed_permanently_why,omitempty"`
	// Disrupted tasks: from the first sight of the deletion to the new pod Running.
	RunningAgainAfterMS *int64 `json:"running_again_after_ms,omitempty"`
	// Disrupted tasks: from the old pod gone (the informer's delete) to the
	// Create that made its successor returning: how long the name stood free.
	RelaunchedAfterGoneMS *int64 `json:"relaunched_after_gone_ms,omitempty"`
	// Disrupted tasks: Create requests from the disruption to the Create
	// that made the successor pod, that one included; a Create sent after
	// (the informer not yet showing the new pod) is not one of them.
	RelaunchPodCreates int64 `json:"relaunch_pod_creates"`
	// Unrelated tasks: from launch to the Create that made the pod returning, and to Running.
	CreatedAfterMS *int64 `json:"created_after_ms,omitempty"`
	RunningAfterMS *int64 `json:"running_after_ms,omitempty"`
}

type result struct {
	Requests map[string]int `json:"requests"`
	// Totals over the disrupted tasks (--tasks).
	PodCreates        int `json:"pod_creates"`
	PodDeletes        int `json:"pod_deletes"`
	SystemFailures    int `json:"system_failures"`
	MaxSystemFailures int `json:"max_system_failures_seen"`
	// Every system failure counted (each a status write and an event in Flyte).
	SystemFailuresRecorded int            `json:"system_failures_recorded"`
	RelaunchPodCreates     int64          `json:"relaunch_pod_creates"`
	Attempts               int            `json:"attempts"`
	LongestCreateCallMS    int64          `json:"longest_create_call_ms"`
	RunningAgainAfterMS    *int64         `json:"running_again_after_ms"`
	CreateErrors           map[string]int `json:"create_errors"`
	FailedPermanently      bool           `json:"failed_permanently"`
	FailedPermanentlyWhy   string         `json:"failed_permanently_why,omitempty"`
	Workers                int            `json:"workers"`
	Tasks                  []taskReport   `json:"tasks"`
	Unrelated              []taskReport   `json:"unrelated"`
}

type executor struct {
	client      kubernetes.Interface
	pods        corelisters.PodLister
	queue       workqueue.TypedDelayingInterface[string]
	namespace   string
	image       string
	grace       int64
	stopAfter   int64
	maxFailures int
	requeue     time.Duration
	resync      time.Duration
	unrelated   int

	unrelatedAfter time.Duration
	cpuRequest     string
	priorityClass  string

	mu             sync.Mutex
	tasks          map[string]*task
	disruptionSeen bool
	launched       bool
}

// status is the task's status object (Flyte keeps it in its TaskAction
// custom resource): every system failure is written to it, and its watch
// event triggers the next reconcile, which is what keeps Flyte's loop going.
func (e *executor) writeStatus(ctx context.Context, name string, failures int) {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-status", Labels: map[string]string{taskLabel: name, executorLabel: "model"}},
		Data:       map[string]string{"systemFailures": strconv.Itoa(failures), "at": time.Now().Format(time.RFC3339Nano)},
	}
	cms := e.client.CoreV1().ConfigMaps(e.namespace)
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); apierrors.IsNotFound(err) {
		_, _ = cms.Create(ctx, cm, metav1.CreateOptions{})
	}
}

func (e *executor) pod(name string) *corev1.Pod {
	grace := e.grace
	var resources corev1.ResourceRequirements
	if e.cpuRequest != "" {
		resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(e.cpuRequest)}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: map[string]string{taskLabel: name, executorLabel: "model"},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			PriorityClassName:             e.priorityClass,
			Containers: []corev1.Container{{
				Name:            "task",
				Image:           e.image,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Resources:       resources,
				// Runs until SIGTERM, then takes --stop-after (its grace period by default) to exit.
				Command: []string{"sh", "-c", fmt.Sprintf("trap 'sleep %d; exit 143' TERM; while true; do sleep 1; done", e.stopAfter)},
			}},
		},
	}
}

// systemFailure counts one for t (the caller holds e.mu); false once the
// task has failed for good.
func (e *executor) systemFailure(t *task) bool {
	t.systemFailures++
	t.systemFailuresRecorded++
	if t.systemFailures > t.maxSystemFailures {
		t.maxSystemFailures = t.systemFailures
	}
	if e.maxFailures > 0 && t.systemFailures > e.maxFailures {
		t.failed = true
		t.failedWhy = fmt.Sprintf("MaxSystemFailuresExceeded: %d system failures in a row", t.systemFailures)
		return false
	}
	return true
}

// create sends one Create (client-go may retry a 429 inside it, the worker
// waiting) and reads its answer as the plugin does.
func (e *executor) create(ctx context.Context, t *task) {
	e.mu.Lock()
	if !t.disruptedAt.IsZero() && t.attempts < 2 {
		ctx = context.WithValue(ctx, relaunchKey{}, &t.relaunchRequests)
	}
	e.mu.Unlock()
	start := time.Now()
	_, err := e.client.CoreV1().Pods(e.namespace).Create(ctx, e.pod(t.name), metav1.CreateOptions{})
	took := time.Since(start).Milliseconds()
	e.mu.Lock()
	defer e.mu.Unlock()
	t.podCreates++
	if took > t.longestCreateMS {
		t.longestCreateMS = took
	}
	switch {
	case err == nil:
		t.attempts++
		t.systemFailures = 0
		if t.createdAt.IsZero() {
			t.createdAt = time.Now()
		} else if t.recreatedAt.IsZero() {
			t.recreatedAt = time.Now()
		}
	case apierrors.IsAlreadyExists(err):
		// "my pod exists": the plugin moves on (Queued), which resets the count.
		t.systemFailures = 0
	case apierrors.IsForbidden(err):
		t.createErrors[reasonOf(err)]++
		// Flyte reads an exceeded quota as a user error once its retries are spent.
		t.failed = true
		t.failedWhy = err.Error()
	default:
		// "Failed to launch job, system error": counted, requeued after a fixed delay.
		t.createErrors[reasonOf(err)]++
		if ctx.Err() == nil && e.systemFailure(t) {
			e.queue.AddAfter(t.name, e.requeue)
		}
	}
}

func reasonOf(err error) string {
	var s apierrors.APIStatus
	if errors.As(err, &s) {
		return fmt.Sprintf("%d %s", s.Status().Code, s.Status().Reason)
	}
	return "transport"
}

func (e *executor) reconcile(ctx context.Context, name string) {
	e.mu.Lock()
	t, ok := e.tasks[name]
	if !ok || t.failed {
		e.mu.Unlock()
		return
	}
	e.mu.Unlock()
	pod, err := e.pods.Pods(e.namespace).Get(name)
	if err != nil {
		e.create(ctx, t)
		return
	}
	if pod.DeletionTimestamp != nil {
		e.disrupted(name)
		e.mu.Lock()
		alive := e.systemFailure(t)
		failures := t.systemFailures
		e.mu.Unlock()
		if !alive {
			return
		}
		e.writeStatus(ctx, name, failures)
		// UnexpectedObjectDeletion: delete (already deleting) and create again.
		err := e.client.CoreV1().Pods(e.namespace).Delete(ctx, name, metav1.DeleteOptions{})
		e.mu.Lock()
		t.podDeletes++
		e.mu.Unlock()
		if err != nil && !apierrors.IsNotFound(err) {
			return
		}
		e.create(ctx, t)
		return
	}
	if pod.Status.Phase == corev1.PodRunning {
		e.mu.Lock()
		switch {
		case t.firstUID == "":
			t.firstUID = string(pod.UID)
			t.runningAt = time.Now()
		case string(pod.UID) != t.firstUID && !t.disruptedAt.IsZero() && t.runningAgainAt.IsZero():
			t.runningAgainAt = time.Now()
		}
		e.mu.Unlock()
	}
}

// resyncLater requeues a live task as Flyte's TaskAction reconciler does
// after every reconcile of a task not yet finished (RequeueAfter 5 s): what
// gets a task going again when no watch event comes, e.g. after a Create
// answered 409 just as the old pod went.
func (e *executor) resyncLater(name string) {
	e.mu.Lock()
	t, ok := e.tasks[name]
	live := ok && !t.failed
	e.mu.Unlock()
	if live && e.resync > 0 {
		e.queue.AddAfter(name, e.resync)
	}
}

// disrupted notes the first sight of task name's pod being deleted (by the
// informer or a reconcile, whichever comes first: with few workers the
// reconcile may come after the pod is gone), and launches the unrelated
// tasks --unrelated-after the first disruption of all, once the colliding
// Creates have begun to wait.
func (e *executor) disrupted(name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t, ok := e.tasks[name]; ok && t.disruptedAt.IsZero() && t.firstUID != "" {
		t.disruptedAt = time.Now()
	}
	if e.disruptionSeen {
		return
	}
	e.disruptionSeen = true
	time.AfterFunc(e.unrelatedAfter, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		for i := 0; i < e.unrelated; i++ {
			n := fmt.Sprintf("new-%d", i)
			e.tasks[n] = &task{name: n, unrelated: true, launchedAt: time.Now(), createErrors: map[string]int{}}
			e.queue.Add(n)
		}
		e.launched = true
	})
}

// gone notes when the informer saw task name's first pod (uid) deleted:
// from then on its name is free.
func (e *executor) gone(name, uid string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t, ok := e.tasks[name]; ok && t.goneAt.IsZero() && t.firstUID != "" && uid == t.firstUID {
		t.goneAt = time.Now()
	}
}

// settled: every disrupted task has run again (or failed for good) and every
// unrelated task runs, since when; zero if not yet.
func (e *executor) settled() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.launched {
		return time.Time{}
	}
	var last time.Time
	for _, t := range e.tasks {
		at := t.runningAgainAt
		if t.unrelated {
			at = t.runningAt
		}
		switch {
		case t.failed:
		case at.IsZero():
			return time.Time{}
		case at.After(last):
			last = at
		}
	}
	return last
}

// firstRunning: every task of --tasks has its first pod Running.
func (e *executor) firstRunning() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, t := range e.tasks {
		if !t.unrelated && t.firstUID == "" {
			return false
		}
	}
	return true
}

func ms(from, to time.Time) *int64 {
	if from.IsZero() || to.IsZero() {
		return nil
	}
	v := to.Sub(from).Milliseconds()
	return &v
}

func (e *executor) report(workers int, count *counts) result {
	e.mu.Lock()
	defer e.mu.Unlock()
	res := result{CreateErrors: map[string]int{}, Workers: workers, Tasks: []taskReport{}, Unrelated: []taskReport{}}
	names := make([]string, 0, len(e.tasks))
	for n := range e.tasks {
		names = append(names, n)
	}
	sort.Strings(names)
	allAgain := true
	var slowest int64
	for _, n := range names {
		t := e.tasks[n]
		r := taskReport{
			Name: t.name, PodCreates: t.podCreates, Attempts: t.attempts, MaxSystemFailures: t.maxSystemFailures,
			LongestCreateCallMS: t.longestCreateMS, CreateErrors: t.createErrors, FailedPermanently: t.failed, FailedWhy: t.failedWhy,
		}
		if t.unrelated {
			r.CreatedAfterMS = ms(t.launchedAt, t.createdAt)
			r.RunningAfterMS = ms(t.launchedAt, t.runningAt)
			res.Unrelated = append(res.Unrelated, r)
			continue
		}
		r.RunningAgainAfterMS = ms(t.disruptedAt, t.runningAgainAt)
		r.RelaunchedAfterGoneMS = ms(t.goneAt, t.recreatedAt)
		r.RelaunchPodCreates = t.relaunchRequests.Load()
		res.RelaunchPodCreates += r.RelaunchPodCreates
		res.Tasks = append(res.Tasks, r)
		res.PodCreates += t.podCreates
		res.PodDeletes += t.podDeletes
		res.SystemFailures += t.systemFailures
		res.SystemFailuresRecorded += t.systemFailuresRecorded
		res.Attempts += t.attempts
		if t.maxSystemFailures > res.MaxSystemFailures {
			res.MaxSystemFailures = t.maxSystemFailures
		}
		if t.longestCreateMS > res.LongestCreateCallMS {
			res.LongestCreateCallMS = t.longestCreateMS
		}
		for k, v := range t.createErrors {
			res.CreateErrors[k] += v
		}
		if t.failed && !res.FailedPermanently {
			res.FailedPermanently = true
			res.FailedPermanentlyWhy = t.name + ": " + t.failedWhy
		}
		switch again := r.RunningAgainAfterMS; {
		case again == nil:
			allAgain = false
		case *again > slowest:
			slowest = *again
		}
	}
	if allAgain && len(res.Tasks) > 0 {
		res.RunningAgainAfterMS = &slowest
	}
	count.mu.Lock()
	res.Requests = count.m
	count.mu.Unlock()
	return res
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	namespace := flag.String("namespace", "", "namespace of the tasks")
	tasks := flag.Int("tasks", 1, "tasks task-0 ... (each re-created under its own fixed name)")
	unrelated := flag.Int("unrelated", 0, "tasks new-0 ... launched --unrelated-after the first disruption is seen")
	unrelatedAfter := flag.Duration("unrelated-after", 3*time.Second, "when the unrelated tasks are launched, after the first disruption")
	workers := flag.Int("workers", 512, "reconciles at once (Flyte's executor: MaxConcurrentReconciles 512)")
	qps := flag.Float64("qps", 1000, "client-side QPS of the shared client (Flyte's manager: 1000)")
	burst := flag.Int("burst", 2000, "client-side burst of the shared client (Flyte's manager: 2000)")
	image := flag.String("image", "", "the task container's image")
	grace := flag.Int64("grace", 30, "terminationGracePeriodSeconds, and how long the task takes to stop")
	stopAfter := flag.Int64("stop-after", -1, "seconds the task takes to stop after SIGTERM (-1: its whole grace)")
	runFor := flag.Duration("run-for", 2*time.Minute, "stop after this long")
	settle := flag.Duration("settle", 3*time.Second, "once every task has run again, stop after this long")
	maxFailures := flag.Int("max-system-failures", 3, "fail a task after more than this many system failures in a row (Flyte: 3; 0: never)")
	requeue := flag.Duration("requeue", 10*time.Second, "requeue delay after a system error (Flyte: 10 s)")
	resync := flag.Duration("resync", 5*time.Second, "every reconcile of a live task requeues it after this long (Flyte's TaskActionDefaultRequeueDuration: 5 s; 0: never)")
	cpuRequest := flag.String("cpu-request", "", "each task container's CPU request (for a node the scheduler can fill)")
	priorityClass := flag.String("priority-class", "", "each task pod's PriorityClass (for a scheduler that preempts)")
	flag.Parse()
	if *cpuRequest != "" {
		if _, err := resource.ParseQuantity(*cpuRequest); err != nil {
			fmt.Fprintf(os.Stderr, "executor: --cpu-request %q: %v\n", *cpuRequest, err)
			os.Exit(2)
		}
	}
	if *kubeconfig == "" || *namespace == "" || *image == "" || *tasks < 1 || *workers < 1 {
		fmt.Fprintln(os.Stderr, "executor: --kubeconfig, --namespace and --image are required; --tasks and --workers at least 1")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "executor: reading %s: %v\n", *kubeconfig, err)
		os.Exit(2)
	}
	cfg.QPS = float32(*qps)
	cfg.Burst = *burst
	count := &counts{m: map[string]int{}}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return &counter{c: count, next: rt} }
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "executor: building a client: %v\n", err)
		os.Exit(2)
	}

	ctx, cancel := context.WithTimeout(context.Background(), *runFor)
	defer cancel()
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(*namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = executorLabel + "=model" }))
	podInformer := factory.Core().V1().Pods()
	queue := workqueue.NewTypedDelayingQueue[string]()
	if *stopAfter < 0 {
		*stopAfter = *grace
	}
	e := &executor{
		client: client, pods: podInformer.Lister(), queue: queue, namespace: *namespace, image: *image,
		grace: *grace, stopAfter: *stopAfter, maxFailures: *maxFailures, requeue: *requeue, resync: *resync, unrelated: *unrelated, unrelatedAfter: *unrelatedAfter, cpuRequest: *cpuRequest, priorityClass: *priorityClass,
		tasks: map[string]*task{},
	}
	enqueue := func(o any) {
		m, err := meta(o)
		if err != nil {
			return
		}
		n := m.GetLabels()[taskLabel]
		if n == "" {
			return
		}
		queue.Add(n)
		if _, isPod := o.(*corev1.Pod); isPod && m.GetDeletionTimestamp() != nil {
			e.disrupted(n)
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) },
		DeleteFunc: func(o any) {
			if m, err := meta(o); err == nil {
				e.gone(m.GetLabels()[taskLabel], string(m.GetUID()))
			}
			enqueue(o)
		},
	}
	for _, inf := range []cache.SharedIndexInformer{podInformer.Informer(), factory.Core().V1().ConfigMaps().Informer()} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			fmt.Fprintf(os.Stderr, "executor: watching the tasks: %v\n", err)
			os.Exit(1)
		}
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	// The first reconcile of each task creates its pod.
	for i := 0; i < *tasks; i++ {
		n := fmt.Sprintf("task-%d", i)
		e.tasks[n] = &task{name: n, createErrors: map[string]int{}}
		queue.Add(n)
	}
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	for w := 0; w < *workers; w++ {
		go func() {
			for {
				key, quit := queue.Get()
				if quit {
					return
				}
				e.reconcile(ctx, key)
				e.resyncLater(key)
				queue.Done(key)
			}
		}()
	}
	// Signal readiness to the test once every first pod runs, and finish
	// once every task has run again.
	announced := false
	for ctx.Err() == nil {
		if !announced && e.firstRunning() {
			announced = true
			fmt.Fprintln(os.Stderr, "executor: task pod Running")
		}
		if at := e.settled(); !at.IsZero() && time.Since(at) > *settle {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	out, _ := json.Marshal(e.report(*workers, count))
	fmt.Println(string(out))
}

// meta reads an informer event's object, tombstones included.
func meta(o any) (metav1.Object, error) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	m, ok := o.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("not an object: %T", o)
	}
	return m, nil
}
