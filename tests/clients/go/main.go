package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
)

func emit(v any) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "graceguard-go-client: %v\n", err)
	os.Exit(1)
}

func main() {
	socket := flag.String("socket", "", "the sidecar's Unix socket")
	base := flag.String("url", "", "the sidecar's URL (with -token-file)")
	tokenFile := flag.String("token-file", "", "a file holding the bearer token")
	retries := flag.Int("retries", 0, "user failures retried (run)")
	flag.Parse()
	args := flag.Args()
	var c *Client
	switch {
	case *socket != "":
		c = NewSocketClient(*socket)
	case *base != "":
		tok, err := os.ReadFile(*tokenFile)
		if err != nil {
			fail(fmt.Errorf("reading -token-file: %w", err))
		}
		c = NewTCPClient(*base, string(trimSpace(tok)))
	default:
		fail(fmt.Errorf("pass -socket PATH or -url URL -token-file FILE"))
	}
	if len(args) < 3 {
		fail(fmt.Errorf("usage: run NS TASK TEMPLATE.json | status NS TASK"))
	}
	ns, task := args[1], args[2]
	switch args[0] {
	case "status":
		s, err := c.GetTask(ns, task)
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
		s, err := c.PutTask(ns, task, json.RawMessage(tpl), *retries, 3)
		if err != nil {
			fail(err)
		}
		emit(map[string]any{"put": s})
		var after uint64
		epoch := ""
		for {
			batch, err := c.Events(after, epoch, 20)
			if IsEpochChanged(err) {
				// The sidecar restarted: read its log from the start and
				// submit the task again (idempotent: it resumes from its pods).
				after, epoch = 0, ""
				s, err := c.PutTask(ns, task, json.RawMessage(tpl), *retries, 3)
				if err != nil {
					fail(err)
				}
				emit(map[string]any{"put": s})
				continue
			}
			if err != nil {
				fail(err)
			}
			epoch = batch.Epoch
			for _, e := range batch.Events {
				seq, _ := e["seq"].(float64)
				after = uint64(seq)
				if e["namespace"] != ns || e["task"] != task {
					continue
				}
				emit(e)
				if e["type"] == "result" {
					// Only our own result: the log may hold other callers' events.
					if err := c.AckOnly(epoch, after); err != nil {
						fail(err)
					}
					final, err := c.GetTask(ns, task)
					if err != nil {
						fail(err)
					}
					emit(map[string]any{"final": final})
					return
				}
			}
		}
	default:
		fail(fmt.Errorf("unknown command %q", args[0]))
	}
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
