// An executor in 45 lines: launch a task, wait out whatever happens to its
// pods (a preemption included), print the result, acknowledge it.
package main

import (
	"context"
	"fmt"
	"os"

	graceguard "github.com/graceguard/graceguard/clients/go"
)

func must[T any](v T, err error) T {
	if err != nil {
		fmt.Fprintln(os.Stderr, "executor:", err)
		os.Exit(2)
	}
	return v
}

func put(c *graceguard.Client, ns, task string, t graceguard.Task) {
	_, _, err := c.PutTask(context.Background(), ns, task, t)
	must(0, err)
}

func main() {
	ns, task, ctx := os.Args[1], os.Args[2], context.Background()
	c := must(graceguard.New(graceguard.Options{Socket: os.Getenv("GRACEGUARD_SOCKET")}))
	t := graceguard.Task{Template: must(os.ReadFile(os.Args[3])), Retries: 1}
	put(c, ns, task, t)
	for cur := c.Cursor(); ; {
		events, restarted, err := cur.Next(ctx, 20)
		if must(restarted, err) { // the sidecar restarted: submit again, it resumes
			put(c, ns, task, t)
		}
		for _, e := range events {
			if e.Transition != nil && e.Transition.Task == task {
				fmt.Println(e.Transition.Pod, e.Transition.Phase)
			} else if e.Result != nil && e.Result.Task == task {
				must(cur.Ack(ctx, e))
				fmt.Println("result:", e.Result.Outcome.Pod, e.Result.Outcome.Succeeded)
				return
			}
		}
	}
}
