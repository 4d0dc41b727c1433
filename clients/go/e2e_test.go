//go:build e2e

// End-to-end tests against a real sidecar, run by graceguard's test bed
// (tests/tests/e2e/sidecar_api.rs), which starts the sidecars and a kubelet
// that ends each pod a moment after it runs (annotation
// testbed.graceguard.io/end: Succeeded, Failed or never) and passes:
// GRACEGUARD_E2E_NAMESPACE, GRACEGUARD_E2E_TEMPLATE (a pod JSON file),
// GRACEGUARD_E2E_SOCKET, and GRACEGUARD_E2E_URL with GRACEGUARD_E2E_TOKEN_FILE.
package graceguard

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

func env(t *testing.T, name string) string {
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run these tests through graceguard's scripts/test (tests/tests/e2e/sidecar_api.rs)", name)
	}
	return v
}

func template(t *testing.T, end string, image string) json.RawMessage {
	raw, err := os.ReadFile(env(t, "GRACEGUARD_E2E_TEMPLATE"))
	if err != nil {
		t.Fatal(err)
	}
	var pod map[string]any
	if err := json.Unmarshal(raw, &pod); err != nil {
		t.Fatal(err)
	}
	meta, _ := pod["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		pod["metadata"] = meta
	}
	meta["annotations"] = map[string]any{"testbed.graceguard.io/end": end}
	if image != "" {
		c := pod["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
		c["image"] = image
	}
	out, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// result waits for task's result at attempt; returns it with the cursor that read it.
func result(t *testing.T, c *Client, ns, task string, attempt int) (Event, *Cursor) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cur := c.Cursor()
	for {
		events, _, err := cur.Next(ctx, 5)
		if err != nil {
			t.Fatalf("waiting for %s's result: %v", task, err)
		}
		for _, e := range events {
			if e.Result != nil && e.Result.Namespace == ns && e.Result.Task == task && e.Result.Outcome.Attempts == attempt+1 {
				return e, cur
			}
		}
	}
}

func phase(t *testing.T, c *Client, ns, task, want string) {
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		s, err := c.GetTask(context.Background(), ns, task)
		if err != nil {
			t.Fatal(err)
		}
		if s.Phase == want {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s never reached %s", task, want)
}

func TestEveryCallOnBothTransports(t *testing.T) {
	ns := env(t, "GRACEGUARD_E2E_NAMESPACE")
	token, err := os.ReadFile(env(t, "GRACEGUARD_E2E_TOKEN_FILE"))
	if err != nil {
		t.Fatal(err)
	}
	transports := map[string]Options{
		"socket": {Socket: env(t, "GRACEGUARD_E2E_SOCKET")},
		"tcp":    {URL: env(t, "GRACEGUARD_E2E_URL"), Token: strings.TrimSpace(string(token))},
	}
	for name, o := range transports {
		o := o
		t.Run(name, func(t *testing.T) { everyCall(t, o, ns, "go-"+name) })
	}
}

func everyCall(t *testing.T, o Options, ns, prefix string) {
	ctx := context.Background()
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := c.Health(ctx); err != nil || !h.Synced || !h.HoldsLease {
		t.Fatalf("health: %+v %v", h, err)
	}
	ok, fail, never := prefix+"-ok", prefix+"-fail", prefix+"-abort"
	okTask := Task{Template: template(t, "Succeeded", "")}

	// PUT: 201 once, then 200 with the same body; other settings or template: 409.
	s, created, err := c.PutTask(ctx, ns, ok, okTask)
	if err != nil || !created || s.Pod != ok+"-0" {
		t.Fatalf("first PUT: %+v %v %v", s, created, err)
	}
	if _, created, err := c.PutTask(ctx, ns, ok, okTask); err != nil || created {
		t.Fatalf("second PUT: created %v, %v", created, err)
	}
	if _, _, err := c.PutTask(ctx, ns, ok, Task{Template: okTask.Template, Retries: 2}); !HasReason(err, ReasonSpecConflict) {
		t.Fatalf("other retries: %v", err)
	}
	other := Task{Template: template(t, "Succeeded", "busybox:other")}
	if _, _, err := c.PutTask(ctx, ns, ok, other); !HasReason(err, ReasonTemplateConflict) {
		t.Fatalf("other template: %v", err)
	}

	// Its result, acknowledged: the pod is marked done.
	ev, cur := result(t, c, ns, ok, 0)
	if !ev.Result.Outcome.Succeeded || ev.Result.Outcome.Pod != ok+"-0" {
		t.Fatalf("result: %+v", ev.Result)
	}
	acked, err := cur.Ack(ctx, ev)
	if err != nil || len(acked) != 1 || string(acked[0].Marked) != `"done"` {
		t.Fatalf("ack: %+v %v", acked, err)
	}
	if _, err := c.AckOnly(ctx, "0000000000000000", ev.Seq); !HasReason(err, ReasonEpochChanged) {
		t.Fatalf("an ack for another epoch: %v", err)
	}

	// Replace the ended task with another template: the name after its last.
	s, err = c.ReplaceTask(ctx, ns, ok, other)
	if err != nil || s.Attempt != 1 || s.Pod != ok+"-1" {
		t.Fatalf("replace: %+v %v", s, err)
	}
	ev, cur = result(t, c, ns, ok, 1)
	if !ev.Result.Outcome.Succeeded || ev.Result.Outcome.Pod != ok+"-1" {
		t.Fatalf("replaced result: %+v", ev.Result)
	}
	if _, err := cur.Ack(ctx, ev); err != nil {
		t.Fatal(err)
	}

	// A user failure, then the executor's own retry under the next name.
	if _, _, err := c.PutTask(ctx, ns, fail, Task{Template: template(t, "Failed", "")}); err != nil {
		t.Fatal(err)
	}
	ev, cur = result(t, c, ns, fail, 0)
	if ev.Result.Outcome.Succeeded || ev.Result.Outcome.FailureKind == nil || *ev.Result.Outcome.FailureKind != "user" {
		t.Fatalf("failed result: %+v", ev.Result.Outcome)
	}
	if _, err := cur.Ack(ctx, ev); err != nil {
		t.Fatal(err)
	}
	s, err = c.RetryTask(ctx, ns, fail)
	if err != nil || s.Attempt != 1 || s.Pod != fail+"-1" {
		t.Fatalf("retry: %+v %v", s, err)
	}
	if _, err := c.RetryTask(ctx, ns, fail); !HasReason(err, ReasonNotEnded) {
		t.Fatalf("a retry of a running task: %v", err)
	}
	ev, cur = result(t, c, ns, fail, 1)
	if _, err := cur.Ack(ctx, ev); err != nil {
		t.Fatal(err)
	}

	// Abort a running task, then forget it.
	if _, _, err := c.PutTask(ctx, ns, never, Task{Template: template(t, "never", "")}); err != nil {
		t.Fatal(err)
	}
	phase(t, c, ns, never, "Running")
	s, err = c.DeleteTask(ctx, ns, never, false)
	if err != nil || !s.Terminal || s.Reason == nil || !strings.HasPrefix(*s.Reason, "Aborted") {
		t.Fatalf("abort: %+v %v", s, err)
	}

	// The list, a page at a time.
	page, err := c.ListTasks(ctx, ListOptions{Namespace: ns, Limit: 1})
	if err != nil || len(page.Items) != 1 || page.Continue == "" {
		t.Fatalf("first page: %+v %v", page, err)
	}
	all, err := c.AllTasks(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, s := range all {
		names[s.Task] = true
	}
	for _, want := range []string{ok, fail, never} {
		if !names[want] {
			t.Fatalf("%s is not listed: %v", want, names)
		}
	}

	// Forgotten once its pod has ended (the kubelet finishes its deletion).
	deadline := time.Now().Add(90 * time.Second)
	for {
		_, err := c.DeleteTask(ctx, ns, never, true)
		if err == nil {
			break
		}
		if !HasReason(err, ReasonCleanupPending) && !HasReason(err, ReasonNotEnded) || time.Now().After(deadline) {
			t.Fatalf("forget: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if _, err := c.GetTask(ctx, ns, never); !HasReason(err, ReasonNotFound) {
		t.Fatalf("a forgotten task: %v", err)
	}
}
