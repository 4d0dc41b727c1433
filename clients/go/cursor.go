package graceguard

import "context"

// Cursor follows the sidecar's events, carrying the epoch its sequence
// numbers belong to. Not safe for concurrent use.
type Cursor struct {
	c     *Client
	after uint64
	epoch string
	// Limit is the most events one Next returns (0: the sidecar's default).
	Limit int
}

// Cursor starts following from the oldest event the sidecar holds.
func (c *Client) Cursor() *Cursor { return &Cursor{c: c} }

// Next waits up to wait seconds for events after the last ones returned.
// restarted is true when the sidecar restarted since: the cursor starts
// over from its oldest event, and the caller should submit its tasks again
// (idempotent: they resume from their pods) — their results come again.
func (cur *Cursor) Next(ctx context.Context, wait int) (events []Event, restarted bool, err error) {
	p, err := cur.c.Events(ctx, cur.after, cur.epoch, wait, cur.Limit)
	if HasReason(err, ReasonEpochChanged) {
		cur.after, cur.epoch = 0, ""
		return nil, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	restarted = cur.epoch != "" && p.Epoch != cur.epoch
	cur.epoch = p.Epoch
	if n := len(p.Events); n > 0 {
		cur.after = p.Events[n-1].Seq
	}
	return p.Events, restarted, nil
}

// Epoch is the epoch of the events returned so far ("" before the first).
func (cur *Cursor) Epoch() string { return cur.epoch }

// Ack acknowledges exactly these events (results: their pods are marked
// done). After a sidecar restart it is refused (EpochChanged) and nothing
// is marked: the new sidecar delivers the results again.
func (cur *Cursor) Ack(ctx context.Context, events ...Event) ([]Acked, error) {
	seqs := make([]uint64, 0, len(events))
	for _, e := range events {
		seqs = append(seqs, e.Seq)
	}
	if len(seqs) == 0 {
		return nil, nil
	}
	acked, err := cur.c.AckOnly(ctx, cur.epoch, seqs...)
	if HasReason(err, ReasonEpochChanged) {
		cur.after, cur.epoch = 0, ""
	}
	return acked, err
}
