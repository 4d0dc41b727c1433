// Command graceguard-client drives a sidecar from the shell (and from
// graceguard's end-to-end tests):
//
//	graceguard-client -socket S run NS TASK TEMPLATE.json [-retries N]
//	graceguard-client -url U -token-file F status NS TASK
//
// `run` PUTs the task, prints each of its events as a JSON line,
// acknowledges its result and prints {"final": <status>} last; after a
// sidecar restart it submits the task again and goes on.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	graceguard "github.com/graceguard/graceguard/clients/go"
)

func emit(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		fail(err)
	}
	fmt.Println(string(b))
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "graceguard-client: %v\n", err)
	os.Exit(1)
}

func main() {
	socket := flag.String("socket", "", "the sidecar's Unix socket")
	base := flag.String("url", "", "the sidecar's URL (with -token-file)")
	tokenFile := flag.String("token-file", "", "a file holding the bearer token")
	retries := flag.Int("retries", 0, "user failures retried (run)")
	flag.Parse()
	args := flag.Args()
	o := graceguard.Options{Socket: *socket, URL: *base}
	if *tokenFile != "" {
		tok, err := os.ReadFile(*tokenFile)
		if err != nil {
			fail(fmt.Errorf("reading -token-file: %w", err))
		}
		o.Token = strings.TrimSpace(string(tok))
	}
	c, err := graceguard.New(o)
	if err != nil {
		fail(err)
	}
	if len(args) < 3 {
		fail(fmt.Errorf("usage: run NS TASK TEMPLATE.json | status NS TASK"))
	}
	ctx := context.Background()
	ns, task := args[1], args[2]
	switch args[0] {
	case "status":
		s, err := c.GetTask(ctx, ns, task)
		if err != nil {
			fail(err)
		}
		emit(s)
	case "run":
		if len(args) < 4 {
			fail(fmt.Errorf("run needs NS TASK TEMPLATE.json"))
		}
		tpl, err := os.ReadFile(args[3])
		if err != nil {
			fail(err)
		}
		t := graceguard.Task{Template: tpl, Retries: *retries, MaxSystemFailures: 3}
		put := func() {
			s, _, err := c.PutTask(ctx, ns, task, t)
			if err != nil {
				fail(err)
			}
			emit(map[string]any{"put": s})
		}
		put()
		cur := c.Cursor()
		for {
			events, restarted, err := cur.Next(ctx, 20)
			if err != nil {
				fail(err)
			}
			if restarted {
				put()
				continue
			}
			for _, e := range events {
				if e.Namespace() != ns || e.TaskName() != task {
					continue
				}
				emit(e)
				if e.Result == nil {
					continue
				}
				// Only our own result: the log may hold other callers' events.
				if _, err := cur.Ack(ctx, e); err != nil {
					fail(err)
				}
				final, err := c.GetTask(ctx, ns, task)
				if err != nil {
					fail(err)
				}
				emit(map[string]any{"final": final})
				return
			}
		}
	default:
		fail(fmt.Errorf("unknown command %q", args[0]))
	}
}
