// Command executor is a model of an executor's pod plugin, on client-go, for
// graceguard's end-to-end tests: it follows the behaviour of Flyte's v2 pod
// plugin as far as it matters for a name collision, so the tests can compare
// graceguard's modes against the client library such executors use.
//
//   - Each task attempt's pod has a fixed name; the plugin re-creates that
//     same name.
//   - A Create answered AlreadyExists is read as "my pod exists": success.
//   - A pod of its own seen with a deletionTimestamp is a system failure
//     (UnexpectedObjectDeletion): the plugin deletes it and creates it again.
//   - A successful Create resets the system-failure count.
//   - Reconciles run on every watch event of the task's pods (an informer
//     feeding a work queue), not on a timer.
//
// client-go itself retries a 429 that carries Retry-After inside the same
// call (up to 10 times), so a caller simply waits.
//
// It runs until --run-for has passed, or until the task's pod has run again
// (Running after a disruption) for --settle, and prints one JSON object:
// the requests it sent by verb and answer, system failures charged, the
// longest single Create call, and how long after the first disruption its pod
// was Running again.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

// counter counts the requests the executor's client sends, by verb,
// resource and answer code, as they leave client-go's transport (each retry
// of a 429 is one request).
type counts struct {
	mu sync.Mutex
	m  map[string]int
}

type counter struct {
	c    *counts
	next http.RoundTripper
}

func (c *counter) RoundTrip(req *http.Request) (*http.Response, error) {
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

type result struct {
	Requests             map[string]int `json:"requests"`
	PodCreates           int            `json:"pod_creates"`
	PodDeletes           int            `json:"pod_deletes"`
	SystemFailures       int            `json:"system_failures"`
	MaxSystemFailures    int            `json:"max_system_failures_seen"`
	Attempts             int            `json:"attempts"`
	LongestCreateCallMS  int64          `json:"longest_create_call_ms"`
	RunningAgainAfterMS  *int64         `json:"running_again_after_ms"`
	CreateErrors         map[string]int `json:"create_errors"`
	FailedPermanently    bool           `json:"failed_permanently"`
	FailedPermanentlyWhy string         `json:"failed_permanently_why,omitempty"`
}

type plugin struct {
	client      kubernetes.Interface
	namespace   string
	name        string
	image       string
	grace       int64
	maxFailures int

	mu             sync.Mutex
	res            result
	disruptedAt    time.Time
	runningAgainAt time.Time
	firstUID       string
}

// status is the task's status object (Flyte keeps it in its TaskAction
// custom resource): every system failure is written to it, and its watch
// event triggers the next reconcile, which is what keeps Flyte's loop going.
func (p *plugin) status() string { return p.name + "-status" }

func (p *plugin) writeStatus(ctx context.Context, failures int) {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: p.status(), Labels: map[string]string{"graceguard-test/task": p.name}},
		Data:       map[string]string{"systemFailures": strconv.Itoa(failures), "at": time.Now().Format(time.RFC3339Nano)},
	}
	cms := p.client.CoreV1().ConfigMaps(p.namespace)
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); apierrors.IsNotFound(err) {
		_, _ = cms.Create(ctx, cm, metav1.CreateOptions{})
	}
}

func (p *plugin) pod() *corev1.Pod {
	grace := p.grace
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:   p.name,
			Labels: map[string]string{"graceguard-test/task": p.name},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "task",
				Image:           p.image,
				ImagePullPolicy: corev1.PullIfNotPresent,
				// Runs until SIGTERM, then takes its grace period to exit.
				Command: []string{"sh", "-c", fmt.Sprintf("trap 'sleep %d; exit 143' TERM; while true; do sleep 1; done", p.grace)},
			}},
		},
	}
}

// create sends one Create (client-go may retry a 429 inside it) and reads
// AlreadyExists as success, as the plugin does.
func (p *plugin) create(ctx context.Context) {
	start := time.Now()
	_, err := p.client.CoreV1().Pods(p.namespace).Create(ctx, p.pod(), metav1.CreateOptions{})
	took := time.Since(start).Milliseconds()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.res.PodCreates++
	if took > p.res.LongestCreateCallMS {
		p.res.LongestCreateCallMS = took
	}
	switch {
	case err == nil:
		p.res.Attempts++
		p.res.SystemFailures = 0
	case apierrors.IsAlreadyExists(err):
		// "my pod exists": the plugin moves on.
	default:
		p.res.CreateErrors[reasonOf(err)]++
		if apierrors.IsForbidden(err) {
			// Flyte reads an exceeded quota as a user error once its retries are spent.
			p.res.FailedPermanently = true
			p.res.FailedPermanentlyWhy = err.Error()
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

func (p *plugin) reconcile(ctx context.Context, lister func() (*corev1.Pod, bool)) {
	pod, found := lister()
	if !found {
		p.create(ctx)
		return
	}
	if pod.DeletionTimestamp != nil {
		p.mu.Lock()
		if p.disruptedAt.IsZero() {
			p.disruptedAt = time.Now()
		}
		p.res.SystemFailures++
		if p.res.SystemFailures > p.res.MaxSystemFailures {
			p.res.MaxSystemFailures = p.res.SystemFailures
		}
		if p.maxFailures > 0 && p.res.SystemFailures > p.maxFailures {
			p.res.FailedPermanently = true
			p.res.FailedPermanentlyWhy = "system failures exceeded"
		}
		failures := p.res.SystemFailures
		p.mu.Unlock()
		p.writeStatus(ctx, failures)
		// UnexpectedObjectDeletion: delete (already deleting) and create again.
		err := p.client.CoreV1().Pods(p.namespace).Delete(ctx, p.name, metav1.DeleteOptions{})
		p.mu.Lock()
		p.res.PodDeletes++
		p.mu.Unlock()
		if err != nil && !apierrors.IsNotFound(err) {
			return
		}
		p.create(ctx)
		return
	}
	if pod.Status.Phase == corev1.PodRunning {
		p.mu.Lock()
		switch {
		case p.firstUID == "":
			p.firstUID = string(pod.UID)
		case string(pod.UID) != p.firstUID && !p.disruptedAt.IsZero() && p.runningAgainAt.IsZero():
			p.runningAgainAt = time.Now()
		}
		p.mu.Unlock()
	}
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	namespace := flag.String("namespace", "", "namespace of the task")
	name := flag.String("name", "task-0", "the task pod's name (re-created under the same name)")
	image := flag.String("image", "", "the task container's image")
	grace := flag.Int64("grace", 30, "terminationGracePeriodSeconds, and how long the task takes to stop")
	runFor := flag.Duration("run-for", 2*time.Minute, "stop after this long")
	settle := flag.Duration("settle", 3*time.Second, "once Running again after a disruption, stop after this long")
	maxFailures := flag.Int("max-system-failures", 0, "fail the task after this many system failures in a row (0: never)")
	flag.Parse()
	if *kubeconfig == "" || *namespace == "" || *image == "" {
		fmt.Fprintln(os.Stderr, "executor: --kubeconfig, --namespace and --image are required")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "executor: reading %s: %v\n", *kubeconfig, err)
		os.Exit(2)
	}
	// No client-side throttling: Flyte's own client settings are generous,
	// and the API server's answers are what is measured here.
	cfg.QPS = 1000
	cfg.Burst = 1000
	count := &counts{m: map[string]int{}}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return &counter{c: count, next: rt} }
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "executor: building a client: %v\n", err)
		os.Exit(2)
	}
	p := &plugin{client: client, namespace: *namespace, name: *name, image: *image, grace: *grace, maxFailures: *maxFailures}
	p.res.CreateErrors = map[string]int{}

	ctx, cancel := context.WithTimeout(context.Background(), *runFor)
	defer cancel()
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(*namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = "graceguard-test/task=" + *name }))
	podInformer := factory.Core().V1().Pods()
	queue := workqueue.NewTyped[string]()
	enqueue := func(any) { queue.Add(*name) }
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue,
	}
	for _, inf := range []cache.SharedIndexInformer{podInformer.Informer(), factory.Core().V1().ConfigMaps().Informer()} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			fmt.Fprintf(os.Stderr, "executor: watching the task: %v\n", err)
			os.Exit(1)
		}
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	lister := func() (*corev1.Pod, bool) {
		pods, err := podInformer.Lister().Pods(*namespace).List(labels.Everything())
		if err != nil {
			return nil, false
		}
		for _, pod := range pods {
			if pod.Name == *name {
				return pod, true
			}
		}
		return nil, false
	}
	// The first reconcile creates the task's pod.
	queue.Add(*name)
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	go func() {
		for {
			key, quit := queue.Get()
			if quit {
				return
			}
			p.reconcile(ctx, lister)
			queue.Done(key)
		}
	}()
	// Signal readiness to the test once the first pod runs, and finish once
	// it runs again after a disruption.
	announced := false
	for ctx.Err() == nil {
		p.mu.Lock()
		again := p.runningAgainAt
		p.mu.Unlock()
		if pod, ok := lister(); ok && pod.Status.Phase == corev1.PodRunning && pod.DeletionTimestamp == nil && !announced {
			announced = true
			fmt.Fprintln(os.Stderr, "executor: task pod Running")
		}
		if !again.IsZero() && time.Since(again) > *settle {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.runningAgainAt.IsZero() {
		ms := p.runningAgainAt.Sub(p.disruptedAt).Milliseconds()
		p.res.RunningAgainAfterMS = &ms
	}
	count.mu.Lock()
	p.res.Requests = count.m
	count.mu.Unlock()
	out, _ := json.Marshal(p.res)
	fmt.Println(string(out))
}
