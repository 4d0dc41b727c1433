// Package main is a client of `graceguard sidecar`, standard library only,
// and a small command the end-to-end tests drive:
//
//	graceguard-go-client -socket S run NS TASK TEMPLATE.json [-retries N]
//	graceguard-go-client -socket S status NS TASK
//
// `run` PUTs the task, prints each of its events as a JSON line, acknowledges
// its result and prints {"final": <status>} last.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client talks to one sidecar over a Unix socket or loopback TCP.
type Client struct {
	http  *http.Client
	base  string
	token string
}

// Error is a refusal by the sidecar: Code is its error code.
type Error struct {
	Status  int
	Code    string `json:"code"`
	Message string `json:"error"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("HTTP %d %s: %s", e.Status, e.Code, e.Message)
}

// NewSocketClient talks to the sidecar listening on the Unix socket path.
func NewSocketClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}
	return &Client{http: &http.Client{Transport: tr, Timeout: 90 * time.Second}, base: "http://sidecar"}
}

// NewTCPClient talks to the sidecar at baseURL with a bearer token.
func NewTCPClient(baseURL, token string) *Client {
	return &Client{http: &http.Client{Timeout: 90 * time.Second}, base: strings.TrimRight(baseURL, "/"), token: token}
}

func (c *Client) do(method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 400 {
		e := &Error{Status: resp.StatusCode}
		if json.Unmarshal(raw, e) != nil {
			e.Message = string(raw)
		}
		return e
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

func taskPath(namespace, task string) string {
	return "/v1/tasks/" + url.PathEscape(namespace) + "/" + url.PathEscape(task)
}

// Status is a task's status (the fields every executor needs).
type Status struct {
	Namespace      string  `json:"namespace"`
	Task           string  `json:"task"`
	Attempt        int     `json:"attempt"`
	Pod            string  `json:"pod"`
	UID            *string `json:"uid"`
	Phase          string  `json:"phase"`
	Reason         *string `json:"reason"`
	FailureKind    *string `json:"failure_kind"`
	UserFailures   int     `json:"user_failures"`
	SystemFailures int     `json:"system_failures"`
	Terminal       bool    `json:"terminal"`
	Succeeded      *bool   `json:"succeeded"`
	Started        bool    `json:"started"`
}

// PutTask submits a task (idempotent).
func (c *Client) PutTask(namespace, task string, template json.RawMessage, retries, maxSystemFailures int) (*Status, error) {
	var s Status
	body := map[string]any{"template": template, "retries": retries, "max_system_failures": maxSystemFailures}
	return &s, c.do(http.MethodPut, taskPath(namespace, task), body, &s)
}

// GetTask reads a task's status.
func (c *Client) GetTask(namespace, task string) (*Status, error) {
	var s Status
	return &s, c.do(http.MethodGet, taskPath(namespace, task), nil, &s)
}

// RetryTask runs an ended task again under its next pod name.
func (c *Client) RetryTask(namespace, task string) (*Status, error) {
	var s Status
	return &s, c.do(http.MethodPost, taskPath(namespace, task)+"/retry", nil, &s)
}

// DeleteTask aborts a task (its pod is deleted).
func (c *Client) DeleteTask(namespace, task string) (*Status, error) {
	var s Status
	return &s, c.do(http.MethodDelete, taskPath(namespace, task), nil, &s)
}

// Events is one long poll's answer; each event is kept raw (its fields
// depend on its type). Sequence numbers belong to Epoch: reads after a
// sequence number and acknowledgements name it, and a sidecar that has
// restarted since answers 409 epoch_changed (IsEpochChanged): poll from 0
// again and submit the tasks again.
type Events struct {
	Events  []map[string]any `json:"events"`
	LastSeq uint64           `json:"last_seq"`
	Epoch   string           `json:"epoch"`
}

// Events long-polls for events after seq of epoch (empty when after is 0),
// waiting up to wait seconds.
func (c *Client) Events(after uint64, epoch string, wait int) (*Events, error) {
	var e Events
	q := url.Values{"after": {fmt.Sprint(after)}, "wait": {fmt.Sprint(wait)}}
	if epoch != "" {
		q.Set("epoch", epoch)
	}
	return &e, c.do(http.MethodGet, "/v1/events?"+q.Encode(), nil, &e)
}

// Ack acknowledges every event of epoch up to seq (results are then marked
// done); for the one consumer of a sidecar.
func (c *Client) Ack(epoch string, seq uint64) error {
	return c.do(http.MethodPost, "/v1/events/ack", map[string]any{"epoch": epoch, "seq": seq}, nil)
}

// AckOnly acknowledges exactly the events seqs of epoch (consumers sharing
// a sidecar).
func (c *Client) AckOnly(epoch string, seqs ...uint64) error {
	return c.do(http.MethodPost, "/v1/events/ack", map[string]any{"epoch": epoch, "seqs": seqs}, nil)
}

// IsEpochChanged says whether err is the sidecar's 409 epoch_changed: it
// restarted since the events were read.
func IsEpochChanged(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == "epoch_changed"
}
