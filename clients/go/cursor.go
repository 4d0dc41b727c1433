package graceguard

import (
	"context"
	"sort"
)

// Cursor follows the sidecar's events, carrying the epoch its sequence
// numbers belong to. It remembers which events it returned that were not
// acknowledged yet, so none is skipped for good: an Ack that fails, or a
// Rewind, makes them come again (the sidecar keeps an event until it is
// acknowledged). Not safe for concurrent use.
type Cursor struct {
	c     *Client
	after uint64
	epoch string
	// pending: returned by Next, not acknowledged through this cursor.
	pending map[uint64]struct{}
	// Limit is the most events one Next returns (0: the sidecar's default).
	Limit int
}

// Cursor starts following from the oldest event the sidecar holds.
func (c *Client) Cursor() *Cursor { return &Cursor{c: c, pending: map[uint64]struct{}{}} }

// Next waits up to wait seconds for events after the last ones returned.
// restarted is true when the sidecar restarted since: the cursor starts
// over from its oldest event, and the caller should submit its tasks again
// (idempotent: they resume from their pods) — their results come again.
func (cur *Cursor) Next(ctx context.Context, wait int) (events []Event, restarted bool, err error) {
	p, err := cur.c.Events(ctx, cur.after, cur.epoch, wait, cur.Limit)
	if HasReason(err, ReasonEpochChanged) {
		cur.startOver()
		return nil, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	restarted = cur.epoch != "" && p.Epoch != cur.epoch
	if restarted {
		cur.pending = map[uint64]struct{}{}
	}
	cur.epoch = p.Epoch
	for _, e := range p.Events {
		cur.pending[e.Seq] = struct{}{}
	}
	if n := len(p.Events); n > 0 {
		cur.after = p.Events[n-1].Seq
	}
	return p.Events, restarted, nil
}

// Epoch is the epoch of the events returned so far ("" before the first).
func (cur *Cursor) Epoch() string { return cur.epoch }

// Unacknowledged is how many events Next returned that no Ack through this
// cursor has acknowledged yet.
func (cur *Cursor) Unacknowledged() int { return len(cur.pending) }

// Rewind makes the next Next start again from the oldest event this cursor
// returned and nobody acknowledged through it: call it when handling
// events failed part way. Events acknowledged meanwhile by anyone are gone
// from the sidecar and do not come again.
func (cur *Cursor) Rewind() {
	if len(cur.pending) == 0 {
		return
	}
	seqs := make([]uint64, 0, len(cur.pending))
	for s := range cur.pending {
		seqs = append(seqs, s)
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	cur.after = seqs[0] - 1
	cur.pending = map[uint64]struct{}{}
}

// Ack acknowledges exactly these events (results: their pods are marked
// done). After a sidecar restart it is refused (EpochChanged) and nothing
// is marked: the new sidecar delivers the results again. Any other failure
// rewinds the cursor (Rewind), so the events it could not acknowledge come
// again from the next Next instead of being skipped.
func (cur *Cursor) Ack(ctx context.Context, events ...Event) ([]Acked, error) {
	seqs := make([]uint64, 0, len(events))
	for _, e := range events {
		seqs = append(seqs, e.Seq)
	}
	if len(seqs) == 0 {
		return nil, nil
	}
	acked, err := cur.c.AckOnly(ctx, cur.epoch, seqs...)
	switch {
	case HasReason(err, ReasonEpochChanged):
		cur.startOver()
	case err != nil:
		cur.Rewind()
	default:
		for _, s := range seqs {
			delete(cur.pending, s)
		}
	}
	return acked, err
}

func (cur *Cursor) startOver() {
	cur.after, cur.epoch = 0, ""
	cur.pending = map[uint64]struct{}{}
}
