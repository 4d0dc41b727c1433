package graceguard

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestEventsAreReadByTheirType(t *testing.T) {
	raw := `[{"seq":1,"type":"transition","namespace":"n","task":"t","attempt":0,"pod":"t-0","phase":"Running","reason":null,"failure_kind":null},
	{"seq":2,"type":"result","namespace":"n","task":"t","outcome":{"succeeded":true,"failure_kind":null,"reason":null,"attempts":1,"user_failures":0,"system_failures":0,"pod":"t-0","uid":"u"}},
	{"seq":3,"type":"adopted","namespace":"n","pod":"x-1","uid":"u","task":"x","attempt":1,"instance":"dead","phase":"Succeeded","reason":null,"resource_version":"9"},
	{"seq":4,"type":"from_the_future","whatever":1}]`
	var evs []Event
	if err := json.Unmarshal([]byte(raw), &evs); err != nil {
		t.Fatal(err)
	}
	if evs[0].Transition == nil || evs[0].Transition.Phase != "Running" || evs[0].TaskName() != "t" {
		t.Fatalf("transition: %+v", evs[0])
	}
	if evs[1].Result == nil || !evs[1].Result.Outcome.Succeeded || evs[1].Result.Outcome.Pod != "t-0" {
		t.Fatalf("result: %+v", evs[1])
	}
	if evs[2].Pod == nil || *evs[2].Pod.Attempt != 1 || evs[2].Namespace() != "n" {
		t.Fatalf("adopted: %+v", evs[2])
	}
	if evs[3].Seq != 4 || evs[3].Type != "from_the_future" || evs[3].Transition != nil {
		t.Fatalf("unknown kinds keep their seq: %+v", evs[3])
	}
	again, err := json.Marshal(evs[1])
	if err != nil || !strings.Contains(string(again), `"type":"result"`) || !strings.Contains(string(again), `"seq":2`) {
		t.Fatalf("round trip: %s %v", again, err)
	}
}

func status(w http.ResponseWriter, code int, reason string) {
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": "m"})
}

func TestARefusalIsAnErrorWithItsReasonAndTheTokenIsSent(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			status(w, 401, ReasonUnauthorized)
			return
		}
		status(w, 404, ReasonNotFound)
	}))
	defer srv.Close()
	c, err := New(Options{URL: srv.URL, Token: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.GetTask(context.Background(), "n", "t")
	if !HasReason(err, ReasonNotFound) || err.(*Error).Code != 404 {
		t.Fatalf("want NotFound, got %v", err)
	}
	bad, _ := New(Options{URL: srv.URL, Token: "wrong"})
	if _, err := bad.GetTask(context.Background(), "n", "t"); !HasReason(err, ReasonUnauthorized) {
		t.Fatalf("want Unauthorized, got %v", err)
	}
	if _, err := New(Options{}); err == nil {
		t.Fatal("no socket and no URL must be refused")
	}
}

func TestACallIsRetriedUntilTheSidecarListens(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	c, err := New(Options{Socket: sock, FirstBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(200 * time.Millisecond)
		l, err := net.Listen("unix", sock)
		if err != nil {
			return
		}
		_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"namespace":"n","task":"t","attempt":0,"pod":"t-0","phase":"Queued"}`))
		}))
	}()
	s, err := c.GetTask(context.Background(), "n", "t")
	if err != nil || s.Pod != "t-0" {
		t.Fatalf("got %+v, %v", s, err)
	}
	// Refused calls are not retried: the sidecar answered.
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		status(w, 409, ReasonNotEnded)
	}))
	defer srv.Close()
	c2, _ := New(Options{URL: srv.URL})
	if _, err := c2.RetryTask(context.Background(), "n", "t"); !HasReason(err, ReasonNotEnded) || calls != 1 {
		t.Fatalf("calls %d, err %v", calls, err)
	}
}

// A POST whose connection breaks after it was sent is not sent again (the
// sidecar may have applied it); a GET is.
func TestABrokenPostIsNotRepeatedButAGetIs(t *testing.T) {
	calls := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls[r.Method]++
		if calls[r.Method] == 1 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		_, _ = w.Write([]byte(`{"namespace":"n","task":"t","attempt":1,"pod":"t-1","phase":"Queued"}`))
	}))
	defer srv.Close()
	c, _ := New(Options{URL: srv.URL, FirstBackoff: 10 * time.Millisecond})
	if _, err := c.RetryTask(context.Background(), "n", "t"); !errors.Is(err, ErrMaybeApplied) || calls["POST"] != 1 {
		t.Fatalf("POST: calls %d, err %v", calls["POST"], err)
	}
	if s, err := c.GetTask(context.Background(), "n", "t"); err != nil || s.Pod != "t-1" || calls["GET"] != 2 {
		t.Fatalf("GET: calls %d, %+v, %v", calls["GET"], s, err)
	}
}

func TestACursorSaysWhenTheSidecarRestarted(t *testing.T) {
	epoch := "e1"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("after") != "0" && q.Get("epoch") != epoch {
			status(w, 409, ReasonEpochChanged)
			return
		}
		_, _ = w.Write([]byte(`{"events":[{"seq":5,"type":"transition","namespace":"n","task":"t","attempt":0,"pod":"t-0","phase":"Queued"}],"last_seq":5,"epoch":"` + epoch + `"}`))
	}))
	defer srv.Close()
	c, _ := New(Options{URL: srv.URL})
	cur := c.Cursor()
	ctx := context.Background()
	if evs, restarted, err := cur.Next(ctx, 0); err != nil || restarted || len(evs) != 1 || cur.Epoch() != "e1" {
		t.Fatalf("first: %v %v %v", evs, restarted, err)
	}
	epoch = "e2"
	if _, restarted, err := cur.Next(ctx, 0); err != nil || !restarted || cur.Epoch() != "" {
		t.Fatalf("after a restart: %v %v", restarted, err)
	}
	if evs, restarted, err := cur.Next(ctx, 0); err != nil || restarted || len(evs) != 1 || cur.Epoch() != "e2" {
		t.Fatalf("from the start again: %v %v %v", evs, restarted, err)
	}
}

// A sidecar's event log in miniature: events stay until acknowledged;
// failAcks makes the next acknowledgements answer 503 Fenced.
type fakeLog struct {
	mu       sync.Mutex
	held     []uint64
	failAcks int
}

func (l *fakeLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.Method == http.MethodPost {
		if l.failAcks > 0 {
			l.failAcks--
			status(w, 503, ReasonFenced)
			return
		}
		var body struct{ Seqs []uint64 }
		_ = json.NewDecoder(r.Body).Decode(&body)
		kept := l.held[:0]
		for _, s := range l.held {
			if !slices.Contains(body.Seqs, s) {
				kept = append(kept, s)
			}
		}
		l.held = kept
		_, _ = w.Write([]byte(`{"acked":[]}`))
		return
	}
	after, _ := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
	evs := []map[string]any{}
	for _, s := range l.held {
		if s > after {
			evs = append(evs, map[string]any{"seq": s, "type": "transition", "namespace": "n", "task": "t", "attempt": 0, "pod": "t-0", "phase": "Queued"})
		}
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"events": evs, "last_seq": 3, "epoch": "e1"})
}

func seqsOf(evs []Event) []uint64 {
	out := []uint64{}
	for _, e := range evs {
		out = append(out, e.Seq)
	}
	return out
}

func TestACursorNeverSkipsAnEventItCouldNotAcknowledge(t *testing.T) {
	log := &fakeLog{held: []uint64{1, 2, 3}}
	srv := httptest.NewServer(log)
	defer srv.Close()
	c, _ := New(Options{URL: srv.URL})
	cur, ctx := c.Cursor(), context.Background()
	evs, _, err := cur.Next(ctx, 0)
	if err != nil || !slices.Equal(seqsOf(evs), []uint64{1, 2, 3}) {
		t.Fatalf("first page: %v %v", seqsOf(evs), err)
	}
	if _, err := cur.Ack(ctx, evs[0]); err != nil || cur.Unacknowledged() != 2 {
		t.Fatalf("ack 1: %v, %d unacknowledged", err, cur.Unacknowledged())
	}
	// The acknowledgement of 2 fails: 2 and 3 (returned, not acknowledged)
	// come again; 1 does not.
	log.failAcks = 1
	if _, err := cur.Ack(ctx, evs[1]); !HasReason(err, ReasonFenced) {
		t.Fatalf("ack 2: want Fenced, got %v", err)
	}
	evs, _, err = cur.Next(ctx, 0)
	if err != nil || !slices.Equal(seqsOf(evs), []uint64{2, 3}) {
		t.Fatalf("after a failed ack: %v %v (want 2 and 3 again)", seqsOf(evs), err)
	}
	// The caller acknowledges 3 and rewinds for what it could not handle.
	if _, err := cur.Ack(ctx, evs[1]); err != nil {
		t.Fatal(err)
	}
	cur.Rewind()
	evs, _, err = cur.Next(ctx, 0)
	if err != nil || !slices.Equal(seqsOf(evs), []uint64{2}) {
		t.Fatalf("after Rewind: %v %v (want 2 alone)", seqsOf(evs), err)
	}
	if _, err := cur.Ack(ctx, evs...); err != nil || cur.Unacknowledged() != 0 {
		t.Fatalf("ack 2: %v, %d unacknowledged", err, cur.Unacknowledged())
	}
	cur.Rewind()
	if evs, _, err = cur.Next(ctx, 0); err != nil || len(evs) != 0 {
		t.Fatalf("all acknowledged: %v %v", seqsOf(evs), err)
	}
}
