// Package graceguard is a client of graceguard's sidecar API (`graceguard
// sidecar`): submit pod tasks, follow their events, acknowledge results.
//
// Every call takes a context.Context. Calls that fail to connect (the
// sidecar restarting, its socket not there yet, another process taking its
// instance over) are retried with exponential backoff for about a minute,
// longer than a failover. A call whose connection broke mid-call is
// retried too when it is safe to repeat: GET, PUT, DELETE, and an
// acknowledgement (it names its epoch and sequence numbers). RetryTask is
// not: it is retried only if it was never sent, and otherwise returns
// ErrMaybeApplied: read the task's status before retrying it again.
//
// Sequence numbers of events belong to an epoch (one sidecar process): use
// a Cursor, which carries the epoch and tells you when the sidecar
// restarted, so you submit your tasks again (they resume from their pods).
package graceguard

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
	"syscall"
	"time"
)

// Options configure a Client; set exactly one of Socket and URL.
type Options struct {
	// Socket is the sidecar's Unix socket (no token: its file mode guards it).
	Socket string
	// URL is the sidecar's loopback TCP address, such as http://127.0.0.1:8090.
	URL string
	// Token is the bearer token a TCP listener requires (its --token-file's content).
	Token string
	// ConnectRetries is how many times a call that could not connect is
	// tried again (default 16: about 56 s with the default backoff, longer
	// than a failover: a Lease duration, 30 s by default, and a start).
	ConnectRetries int
	// FirstBackoff is the first wait before a retry (default 100ms; it doubles, at most 5 s).
	FirstBackoff time.Duration
	// Timeout bounds one HTTP exchange (default 90 s: longer than any long poll).
	Timeout time.Duration
}

// Client talks to one sidecar. It is safe for concurrent use.
type Client struct {
	http    *http.Client
	base    string
	token   string
	retries int
	backoff time.Duration
}

// New makes a client.
func New(o Options) (*Client, error) {
	if (o.Socket == "") == (o.URL == "") {
		return nil, errors.New("graceguard: set exactly one of Options.Socket and Options.URL")
	}
	c := &Client{token: o.Token, retries: o.ConnectRetries, backoff: o.FirstBackoff}
	if c.retries == 0 {
		c.retries = 16
	}
	if c.backoff == 0 {
		c.backoff = 100 * time.Millisecond
	}
	timeout := o.Timeout
	if timeout == 0 {
		timeout = 90 * time.Second
	}
	if o.Socket != "" {
		path := o.Socket
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}}
		c.http = &http.Client{Transport: tr, Timeout: timeout}
		c.base = "http://sidecar"
		return c, nil
	}
	u, err := url.Parse(o.URL)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("graceguard: Options.URL %q is not an http://host:port address", o.URL)
	}
	c.http = &http.Client{Timeout: timeout}
	c.base = strings.TrimRight(o.URL, "/")
	return c, nil
}

// ErrMaybeApplied is returned (wrapped) for a RetryTask whose connection
// broke after it was sent: the sidecar may have applied it. Read the task's
// status before sending it again.
var ErrMaybeApplied = errors.New("graceguard: the connection broke after the request was sent; it may have taken effect: read the task's status before repeating it")

// couldNotConnect says whether err means no answer came from a sidecar.
func couldNotConnect(err error) bool {
	return neverSent(err) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// repeatable says whether a call may be sent again after its connection
// broke: all but a task's retry (POST …/retry), which would run it twice.
func repeatable(method, path string) bool {
	return method != http.MethodPost || path == "/v1/events/ack"
}

// neverSent says whether err means the request never left: nothing listened.
func neverSent(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// do sends one request, retrying while it cannot connect; it returns the
// status code of a 2xx answer (decoded into out) or an *Error.
func (c *Client) do(ctx context.Context, method, path string, body, out any) (int, error) {
	var raw []byte
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, fmt.Errorf("graceguard: encoding the request: %w", err)
		}
		raw = b
	}
	wait := c.backoff
	for try := 0; ; try++ {
		code, err := c.once(ctx, method, path, raw, out)
		if err == nil || !couldNotConnect(err) {
			return code, err
		}
		if !repeatable(method, path) && !neverSent(err) {
			return 0, fmt.Errorf("%w (%s %s: %v)", ErrMaybeApplied, method, path, err)
		}
		if try >= c.retries {
			return code, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(wait):
		}
		if wait *= 2; wait > 5*time.Second {
			wait = 5 * time.Second
		}
	}
}

func (c *Client) once(ctx context.Context, method, path string, raw []byte, out any) (int, error) {
	var rd io.Reader
	if raw != nil {
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "application/json")
	if raw != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode >= 400 {
		e := &Error{Code: resp.StatusCode}
		if json.Unmarshal(b, e) != nil || e.Reason == "" {
			e.Reason, e.Message = http.StatusText(resp.StatusCode), string(b)
		}
		return resp.StatusCode, e
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("graceguard: the sidecar's answer to %s %s is not what this client reads: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// HasReason says whether err is the sidecar's refusal with reason.
func HasReason(err error, reason string) bool {
	var e *Error
	return errors.As(err, &e) && e.Reason == reason
}

func taskPath(namespace, task string) string {
	return "/v1/tasks/" + url.PathEscape(namespace) + "/" + url.PathEscape(task)
}

// PutTask submits a task; created is false when it was already submitted
// with this body. Another template or settings is a TemplateConflict or
// SpecConflict refusal (see ReplaceTask).
func (c *Client) PutTask(ctx context.Context, namespace, task string, t Task) (status *TaskStatus, created bool, err error) {
	return c.put(ctx, namespace, task, t, "")
}

// ReplaceTask submits a task in place of an ended one submitted otherwise:
// it runs anew under the pod name after its last one. A task still running
// is a NotEnded refusal: DeleteTask it first.
func (c *Client) ReplaceTask(ctx context.Context, namespace, task string, t Task) (*TaskStatus, error) {
	s, _, err := c.put(ctx, namespace, task, t, "?replace=true")
	return s, err
}

func (c *Client) put(ctx context.Context, namespace, task string, t Task, query string) (*TaskStatus, bool, error) {
	if t.MaxSystemFailures == 0 {
		t.MaxSystemFailures = 3
	}
	var s TaskStatus
	code, err := c.do(ctx, http.MethodPut, taskPath(namespace, task)+query, t, &s)
	if err != nil {
		return nil, false, err
	}
	return &s, code == http.StatusCreated, nil
}

// GetTask reads a task's status.
func (c *Client) GetTask(ctx context.Context, namespace, task string) (*TaskStatus, error) {
	var s TaskStatus
	if _, err := c.do(ctx, http.MethodGet, taskPath(namespace, task), nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ListOptions select a page of ListTasks.
type ListOptions struct {
	Namespace string // "" for every namespace
	Limit     int    // 1 to 1000; 0 for the sidecar's default (500)
	Continue  string // the previous page's TaskList.Continue
}

// ListTasks reads one page of the tasks the sidecar knows, in (namespace,
// task) order: what an executor resyncs from after its own restart.
func (c *Client) ListTasks(ctx context.Context, o ListOptions) (*TaskList, error) {
	q := url.Values{}
	if o.Namespace != "" {
		q.Set("namespace", o.Namespace)
	}
	if o.Limit != 0 {
		q.Set("limit", fmt.Sprint(o.Limit))
	}
	if o.Continue != "" {
		q.Set("continue", o.Continue)
	}
	var l TaskList
	if _, err := c.do(ctx, http.MethodGet, "/v1/tasks?"+q.Encode(), nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// AllTasks reads every page of ListTasks.
func (c *Client) AllTasks(ctx context.Context, namespace string) ([]TaskStatus, error) {
	var all []TaskStatus
	o := ListOptions{Namespace: namespace}
	for {
		page, err := c.ListTasks(ctx, o)
		if err != nil {
			return nil, err
		}
		all = append(all, page.Items...)
		if page.Continue == "" {
			return all, nil
		}
		o.Continue = page.Continue
	}
}

// RetryTask runs an ended task again under its next pod name.
func (c *Client) RetryTask(ctx context.Context, namespace, task string) (*TaskStatus, error) {
	var s TaskStatus
	if _, err := c.do(ctx, http.MethodPost, taskPath(namespace, task)+"/retry", nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// DeleteTask aborts a task (its pod is deleted); with forget, it is also
// forgotten once it has ended (a CleanupPending or NotEnded refusal while a
// pod of it still runs: ask again).
func (c *Client) DeleteTask(ctx context.Context, namespace, task string, forget bool) (*TaskStatus, error) {
	q := ""
	if forget {
		q = "?forget=true"
	}
	var s TaskStatus
	if _, err := c.do(ctx, http.MethodDelete, taskPath(namespace, task)+q, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// EventsPage is one answer of Events.
type EventsPage struct {
	Events  []Event `json:"events"`
	LastSeq uint64  `json:"last_seq"`
	Epoch   string  `json:"epoch"`
}

// Events long-polls (up to wait seconds) for events after seq after of
// epoch (epoch may be empty when after is 0). Prefer a Cursor.
func (c *Client) Events(ctx context.Context, after uint64, epoch string, wait, limit int) (*EventsPage, error) {
	q := url.Values{"after": {fmt.Sprint(after)}, "wait": {fmt.Sprint(wait)}}
	if epoch != "" {
		q.Set("epoch", epoch)
	}
	if limit > 0 {
		q.Set("limit", fmt.Sprint(limit))
	}
	var p EventsPage
	if _, err := c.do(ctx, http.MethodGet, "/v1/events?"+q.Encode(), nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

type ackAnswer struct {
	Acked []Acked `json:"acked"`
}

// Ack acknowledges every event of epoch up to seq (for a sidecar's one consumer).
func (c *Client) Ack(ctx context.Context, epoch string, seq uint64) ([]Acked, error) {
	var a ackAnswer
	_, err := c.do(ctx, http.MethodPost, "/v1/events/ack", map[string]any{"epoch": epoch, "seq": seq}, &a)
	return a.Acked, err
}

// AckOnly acknowledges exactly the events seqs of epoch (consumers sharing a sidecar).
func (c *Client) AckOnly(ctx context.Context, epoch string, seqs ...uint64) ([]Acked, error) {
	var a ackAnswer
	_, err := c.do(ctx, http.MethodPost, "/v1/events/ack", map[string]any{"epoch": epoch, "seqs": seqs}, &a)
	return a.Acked, err
}

// Health reads /healthz: whether the sidecar's pod watch has synced (a
// 503 answer is returned as Health too, with Synced false).
func (c *Client) Health(ctx context.Context) (*Health, error) {
	var h Health
	_, err := c.do(ctx, http.MethodGet, "/healthz", nil, &h)
	var e *Error
	if errors.As(err, &e) && e.Code == http.StatusServiceUnavailable {
		if json.Unmarshal([]byte(e.Message), &h) == nil && h.Instance != "" {
			return &h, nil
		}
	}
	if err != nil {
		return nil, err
	}
	return &h, nil
}
