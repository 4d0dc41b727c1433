package graceguard

import (
	"encoding/json"
	"fmt"
)

// TaskStatus is a task as the sidecar sees it.
type TaskStatus struct {
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
	CleanupPending bool    `json:"cleanup_pending"`
	NeedsTemplate  bool    `json:"needs_template"`
}

// Bounds are the limits that keep a task from retrying or waiting forever;
// nil fields take the sidecar's defaults.
type Bounds struct {
	DeadlineSeconds           *uint64 `json:"deadline_seconds,omitempty"`
	PendingTimeoutSeconds     *uint64 `json:"pending_timeout_seconds,omitempty"`
	TerminatingCeilingSeconds *uint64 `json:"terminating_ceiling_seconds,omitempty"`
	MaxTotalSystemFailures    *uint32 `json:"max_total_system_failures,omitempty"`
	MaxTransientRetries       *uint32 `json:"max_transient_retries,omitempty"`
}

// Task is a PUT's body. Template is a pod (metadata and spec; the sidecar
// names each attempt's pod).
type Task struct {
	Template          json.RawMessage `json:"template"`
	Retries           int             `json:"retries"`
	MaxSystemFailures int             `json:"max_system_failures"`
	Bounds            *Bounds         `json:"bounds,omitempty"`
	RerunDone         bool            `json:"rerun_done,omitempty"`
}

// TaskList is one page of GET /v1/tasks.
type TaskList struct {
	Items    []TaskStatus `json:"items"`
	Continue string       `json:"continue,omitempty"`
}

// Outcome is how a task ended.
type Outcome struct {
	Succeeded      bool    `json:"succeeded"`
	FailureKind    *string `json:"failure_kind"`
	Reason         *string `json:"reason"`
	Attempts       int     `json:"attempts"`
	UserFailures   int     `json:"user_failures"`
	SystemFailures int     `json:"system_failures"`
	Pod            string  `json:"pod"`
	UID            *string `json:"uid"`
}

// Event is one event of GET /v1/events: exactly one of Transition, Result
// and Pod is set, as Type says.
type Event struct {
	Seq        uint64
	Type       string // "transition", "result", "adopted" or "gone"
	Transition *TransitionEvent
	Result     *ResultEvent
	Pod        *PodEvent
}

// TransitionEvent says a task's phase changed.
type TransitionEvent struct {
	Namespace   string  `json:"namespace"`
	Task        string  `json:"task"`
	Attempt     int     `json:"attempt"`
	Pod         string  `json:"pod"`
	Phase       string  `json:"phase"`
	Reason      *string `json:"reason"`
	FailureKind *string `json:"failure_kind"`
}

// ResultEvent says a task ended; acknowledging it marks its pod done.
type ResultEvent struct {
	Namespace string  `json:"namespace"`
	Task      string  `json:"task"`
	Outcome   Outcome `json:"outcome"`
}

// PodEvent is a dead instance's pod: "adopted" (completed, claimed for this
// instance) or "gone" (deleted before it was delivered).
type PodEvent struct {
	Namespace       string  `json:"namespace"`
	Pod             string  `json:"pod"`
	UID             string  `json:"uid"`
	Task            string  `json:"task"`
	Attempt         *int    `json:"attempt"`
	Instance        string  `json:"instance"`
	Phase           string  `json:"phase"`
	Reason          *string `json:"reason"`
	ResourceVersion string  `json:"resource_version"`
}

// Namespace and TaskName say whom the event is about.
func (e *Event) Namespace() string {
	switch {
	case e.Transition != nil:
		return e.Transition.Namespace
	case e.Result != nil:
		return e.Result.Namespace
	case e.Pod != nil:
		return e.Pod.Namespace
	}
	return ""
}

// TaskName is the task the event is about.
func (e *Event) TaskName() string {
	switch {
	case e.Transition != nil:
		return e.Transition.Task
	case e.Result != nil:
		return e.Result.Task
	case e.Pod != nil:
		return e.Pod.Task
	}
	return ""
}

// UnmarshalJSON reads an event by its "type".
func (e *Event) UnmarshalJSON(b []byte) error {
	var head struct {
		Seq  uint64 `json:"seq"`
		Type string `json:"type"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return err
	}
	e.Seq, e.Type = head.Seq, head.Type
	switch head.Type {
	case "transition":
		e.Transition = &TransitionEvent{}
		return json.Unmarshal(b, e.Transition)
	case "result":
		e.Result = &ResultEvent{}
		return json.Unmarshal(b, e.Result)
	case "adopted", "gone":
		e.Pod = &PodEvent{}
		return json.Unmarshal(b, e.Pod)
	}
	// A kind this client does not know (a newer sidecar): kept by Seq and
	// Type only, so acknowledgements still cover it.
	return nil
}

// MarshalJSON writes the event as the sidecar does.
func (e Event) MarshalJSON() ([]byte, error) {
	var body any
	switch {
	case e.Transition != nil:
		body = e.Transition
	case e.Result != nil:
		body = e.Result
	case e.Pod != nil:
		body = e.Pod
	default:
		return json.Marshal(map[string]any{"seq": e.Seq, "type": e.Type})
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	m["seq"], m["type"] = e.Seq, e.Type
	return json.Marshal(m)
}

// Acked is one acknowledged event that wrote a done-mark: Marked is
// "done", "lost", "gone" or {"failed": reason}.
type Acked struct {
	Seq    uint64          `json:"seq"`
	Marked json.RawMessage `json:"marked"`
}

// Health is GET /healthz.
type Health struct {
	OK                 bool    `json:"ok"`
	Synced             bool    `json:"synced"`
	Instance           string  `json:"instance"`
	HoldsLease         bool    `json:"holds_lease"`
	Epoch              string  `json:"epoch"`
	EventsHeld         int     `json:"events_held"`
	TransitionsDropped int     `json:"transitions_dropped"`
	WatchError         *string `json:"watch_error"`
}

// Error is the sidecar's refusal, a Kubernetes-Status-like object: switch
// on Reason (ReasonNotFound, ReasonEpochChanged, ...).
type Error struct {
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("graceguard sidecar: HTTP %d %s: %s", e.Code, e.Reason, e.Message)
}

// The reasons a client acts on.
const (
	ReasonNotFound         = "NotFound"
	ReasonTemplateConflict = "TemplateConflict"
	ReasonSpecConflict     = "SpecConflict"
	ReasonNotEnded         = "NotEnded"
	ReasonCleanupPending   = "CleanupPending"
	ReasonEpochChanged     = "EpochChanged"
	ReasonFenced           = "Fenced"
	ReasonNotSynced        = "NotSynced"
	// The sidecar holds as many tasks (or bytes of templates) as it may:
	// forget ended tasks, then submit again.
	ReasonTooManyTasks = "TooManyTasks"
	ReasonUnauthorized = "Unauthorized"
)
