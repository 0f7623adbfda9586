package proxy

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/courierhq/courier/internal/subject"
)

// How a pin goes from one courier to the next (pin.go keeps and notices
// it): taken over as the courier before left it (tookOver: handed on
// clean, or nothing out; else waitForOut: the keys of what is out wait
// for it), handed on at a clean stop (handOnPin), given up for a courier
// that is gone (checkOrphaned), and let go by a courier whose membership
// lapsed (checkLease).

// tookOver takes the pin over when it has come to this courier (checkPin
// has read the marks the courier before left): lines whose head is at or
// below the ack floor go on (also heads kept from before the pin last
// moved away that the courier that had it settled meanwhile:
// orderer.unpinned), and if that courier handed the pin on holding
// nothing (Handover.Clean), or the consumer has nothing out but the one
// message of this courier's first pull (exact: the pin came with it), the
// marks name each key's first unsettled message: nothing more to wait
// for. It reports whether it took the pin over; if not, checkPin makes
// the keys of what was out wait for it (waitForOut). If the consumer
// cannot be read, keyed messages wait an ack wait.
func (f *fetcher) tookOver(ctx context.Context, info *jetstream.ConsumerInfo, err error, exact bool) bool {
	if err != nil {
		f.log.Info("pinned to this courier; the consumer cannot be read: keyed messages wait for what another courier may still hold",
			"error", err, "for", orderBarrier(f.ackWaitNow()).String())
		f.order.takeover(orderBarrier(f.ackWaitNow()))
		return true
	}
	clean := f.cleanPin(ctx, info)
	f.order.ackFloor(info.AckFloor.Stream)
	if clean || exact && info.NumAckPending <= 1 {
		f.log.Info("pinned to this courier", "handed_on", clean)
		f.order.open(true)
		return true
	}
	return false
}

// cleanPin reports whether the courier before this one handed the pin in
// info on holding nothing just before it came to this one
// (Handover.Clean, within the consumer's PinnedTTL).
func (f *fetcher) cleanPin(ctx context.Context, info *jetstream.ConsumerInfo) bool {
	if f.handover.Clean == nil {
		return false
	}
	for _, g := range info.PriorityGroups {
		if g.Group == f.group && !g.PinnedTS.IsZero() {
			return f.handover.Clean(ctx, f.index, g.PinnedTS, info.Config.PinnedTTL)
		}
	}
	return false
}

// handOnPin gives the pin of f's group up once this courier has stopped
// pulling from it and holds nothing of it (the caller knows): if the pin
// is still this courier's and o, its lines, knew every key's first
// unsettled message (no wait for what a courier before held stood) and
// their marks are written, the hand-over is recorded (Handover.HandedOn),
// so that the next courier sends at once, awaiting only what the marks
// name; then the pin is given up (Handover.Unpin), so that the next
// courier takes it with its next pull rather than after the consumer's
// PinnedTTL. Nothing may pull from the group after: a pull would take the
// pin again.
func (f *fetcher) handOnPin(ctx context.Context, o *orderer) {
	clean := !o.isBlind() && o.marks != nil && o.marks.written()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if !f.stillPinned(ctx) {
		return
	}
	if !clean {
		what := "the pin"
		if f.part != nil {
			what = "the partition"
		}
		f.log.Info("handing " + what + " on without a clean record: the next courier waits for what may still be out")
	}
	if clean && f.handover.HandedOn != nil {
		if err := f.handover.HandedOn(ctx, f.index); err != nil {
			f.log.Warn("cannot record the pin's hand-over; the next courier waits an ack wait before first deliveries", "error", err)
		}
	}
	if f.handover.Unpin != nil {
		if err := f.handover.Unpin(ctx, f.index); err != nil {
			f.log.Warn("cannot give up the pin; it lapses after the consumer's pinned TTL", "error", err)
			return
		}
		f.log.Info("pin given up for the next courier", "handed_on", clean)
	}
}

// checkOrphaned gives the pin of the fetcher's group up if this courier
// does not hold it, the courier the server pinned is gone, and this one is
// to take its place (Membership.Orphaned): the group's messages then come
// to this courier's next pull within a moment of the membership seeing
// that courier gone, not after the consumer's PinnedTTL. Which client is
// pinned is read from the consumer every pinnedReadEvery, and at once when
// the one read last is found orphaned. Called every orphanEvery by watch.
func (f *fetcher) checkOrphaned(ctx context.Context) {
	if f.pinNow.Load() != nil {
		f.pinned = "" // this courier's
		return
	}
	if f.now().Sub(f.pinnedRead) < pinnedReadEvery && (f.pinned == "" || !f.membership.Orphaned(f.index, f.pinned)) {
		return
	}
	f.pinnedRead = f.now()
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := f.cons.Info(ictx)
	if err != nil {
		return
	}
	f.pinned = ""
	var pinnedAt time.Time
	for _, g := range info.PriorityGroups {
		if g.Group == f.group {
			f.pinned, pinnedAt = g.PinnedClientID, g.PinnedTS
		}
	}
	if f.pinned == "" || f.pinNow.Load() != nil || !f.membership.Orphaned(f.index, f.pinned) {
		return
	}
	f.redeliverOrphaned(ictx, pinnedAt)
	if err := f.handover.Unpin(ictx, f.index); err != nil {
		f.log.Warn("cannot give up the pin of a courier that is gone; it lapses after the consumer's pinned TTL", "error", err)
		return
	}
	f.log.Info("the courier holding the pin is gone: its pin is given up, for this courier to take", "pin", f.pinned)
	f.pinned = ""
}

// redeliverOrphaned, for a pin that a courier that is gone holds (a
// partition's, or the durable's with the shared dedup store), has the
// consumer deliver again at once what that courier had out
// (Handover.Redeliver), before the pin is given up: nothing is delivered
// meanwhile (the pin is still the gone courier's), and the pull that takes
// the pin next brings the first unsettled message on, in stream order,
// rather than after an ack wait. Not if this courier holds any of the
// group's messages itself (a request from before the pin
// moved away may still be at the app); nor if the partition's marks name a
// retry due later (the consumer would deliver it before the delay the app
// asked for) or cannot be read; nor if the gone courier had held the pin,
// since pinnedAt (the server's time), for less than redeliverPinnedFor:
// it may have died of a message it took (a poison one), and delivered
// again it would be counted from its first delivery again, crash after
// crash, never reaching the durable's delivery limit. What was out then
// comes back after its ack wait, awaited by its keys (waitForOut).
func (f *fetcher) redeliverOrphaned(ctx context.Context, pinnedAt time.Time) {
	held := f.track.held()
	if f.part != nil {
		held = int(f.part.heldNow())
	}
	if f.handover.Redeliver == nil || f.order == nil || f.order.marks == nil || held > 0 {
		return
	}
	if held := f.now().Sub(pinnedAt); pinnedAt.IsZero() || held < redeliverPinnedFor {
		f.log.Info("the courier that is gone held the pin only a moment: what it had out comes back after its ack wait, counted",
			"held_pin_for", held.Round(time.Millisecond).String())
		return
	}
	marks, err := f.order.marks.store.Marks(ctx)
	if err != nil {
		return
	}
	now := f.now()
	for k, m := range marks {
		if m.Due.After(now) {
			f.log.Info("the courier that is gone had a retry due later: what it had out comes back after its ack wait",
				"key", k, "due_in", m.Due.Sub(now).Round(time.Millisecond).String())
			return
		}
	}
	if err := f.handover.Redeliver(ctx, f.index); err != nil {
		f.log.Warn("cannot deliver again at once what the courier that is gone had out: it comes back after its ack wait", "error", err)
		return
	}
	f.log.Info("what the courier that is gone had out is delivered again now, from the first unsettled message")
}

// redeliverPinnedFor is how long a courier that died must have held a
// partition's pin for what it had out to be delivered again at once
// (redeliverOrphaned).
const redeliverPinnedFor = 10 * time.Second

// orphanEvery is how often a courier that does not hold the pin looks
// whether its holder is gone, and pinnedReadEvery how often it reads
// which client holds it.
const (
	orphanEvery     = 250 * time.Millisecond
	pinnedReadEvery = 2 * time.Second
)

// checkLease, once this courier's membership has lapsed (Membership.Term:
// paused past its TTL, or cut off from the bucket), acts as when the pin
// moves away (lostPin): another courier may have been given it. Nothing
// is pulled until the membership is live again; the lines then go on in
// its new term.
func (f *fetcher) checkLease(ctx context.Context) error {
	if f.order == nil || f.membership == nil || !f.order.lapsedNow() {
		return nil
	}
	f.lostPin("this courier's membership lapsed: another courier may have its pin; keyed messages held here are given back")
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if term, live := f.membership.Term(); live {
			f.order.renew(term)
			f.log.Info("membership live again")
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// waitForOut makes keyed messages wait for what the consumer had out
// (out of them) when the pin came to this courier, between its ack floor
// and the last message it delivered, which another courier may still hold
// (it died, or the pin moved away from it): only each key with messages
// out waits, for each of them in turn (outSeqs, orderer.awaitOut); if what
// is out cannot be read, every key waits an ack wait (orderer.takeover).
func (f *fetcher) waitForOut(ctx context.Context, floor, delivered uint64, out int) {
	wait := orderBarrier(f.ackWaitNow())
	outs, ok := f.outSeqs(ctx, floor, delivered)
	if !ok {
		f.log.Info("pinned to this courier: keyed messages wait for what another courier may still hold",
			"for", wait.String(), "out", out)
		f.order.takeover(wait)
		return
	}
	f.log.Info("pinned to this courier: the keys of what another courier may still hold wait for it",
		"keys", len(outs), "out", out, "for at most", wait.String())
	f.order.awaitOut(outs)
	f.order.open(true)
	f.floorUntil = f.now().Add(wait)
}

// checkReconnect, for a message m that arrives after the NATS connection
// was made again (the first of each pull for a while: recheckFor), makes
// the keys of what a pull had on its way when the connection broke wait
// for it: those messages are lost, counted as delivered, and come back
// only after their ack wait, when a key's later message, delivered new
// meanwhile, would go first. A pull sent before the break is still given
// messages until it expires (fetchWait), and they are lost while the
// server does not know where the connection went: hence a while, not
// once. What may be lost is what the consumer delivered after the last
// message that arrived here (lastSeq) up to its last delivered, but for m:
// read from the stream, each of their keys awaits them (awaitOut) until
// each is back and settled, the ack floor passes it, or an ack wait and
// 2 s have passed. A pin that comes with m is left to checkPin, which
// waits for all that is out. Called before m is admitted.
func (f *fetcher) checkReconnect(ctx context.Context, m jetstream.Msg) {
	first := f.firstOfPull
	f.firstOfPull = false
	if f.reconnects == nil {
		return
	}
	level := slog.LevelDebug // a later pull's check: what it finds is mostly on its way still
	if n := f.reconnects(); n != f.reconnected {
		f.reconnected, level = n, slog.LevelInfo
		f.recheckUntil = f.now().Add(recheckFor)
	} else if !first || f.now().After(f.recheckUntil) {
		return
	}
	if p := m.Headers().Get("Nats-Pin-Id"); f.lastSeq == 0 || f.group != "" && p != "" && p != f.pin {
		return // nothing arrived before (the start waits), or a pin come anew
	}
	wait := orderBarrier(f.ackWaitNow())
	outs, from, to, ok := f.lostSince(ctx)
	if !ok {
		f.log.Info("reconnected to NATS; what a pull may have lost cannot be read: keyed messages wait for it",
			"for", wait.String())
		f.order.takeover(wait)
		return
	}
	if meta, err := m.Metadata(); err == nil {
		seq := streamSeq(m, meta)
		for k, seqs := range outs {
			if seqs = slices.DeleteFunc(seqs, func(s uint64) bool { return s == seq }); len(seqs) > 0 {
				outs[k] = seqs
			} else {
				delete(outs, k)
			}
		}
	}
	if len(outs) == 0 {
		return
	}
	f.log.Log(context.Background(), level, "reconnected to NATS with messages lost on the way: their keys wait for them",
		"keys", len(outs), "after", from, "up_to", to, "for at most", wait.String())
	f.order.awaitOut(outs)
	f.floorUntil = f.now().Add(wait)
}

// lostSince reads, for checkReconnect, the keyed messages the consumer
// delivered after the last that arrived here (and after its ack floor),
// from and to the stream sequences that bound them. The consumer and the
// stream may be electing a leader (the server that went away led them):
// they are asked again for up to lostReadFor; ok is false if they did not
// answer by then.
func (f *fetcher) lostSince(ctx context.Context) (outs map[string][]uint64, from, to uint64, ok bool) {
	deadline := f.now().Add(lostReadFor)
	for {
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		info, err := f.cons.Info(ictx)
		if err == nil {
			from, to = max(info.AckFloor.Stream, f.lastSeq), info.Delivered.Stream
			if to <= from {
				cancel()
				return nil, from, to, true
			}
			outs, ok = f.outSeqs(ictx, from, to)
		}
		cancel()
		if ok || to-from > maxOutRead || f.now().After(deadline) {
			return outs, from, to, ok
		}
		select {
		case <-ctx.Done():
			return nil, from, to, false
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// lostReadFor bounds how long lostSince asks.
const lostReadFor = 10 * time.Second

// recheckFor is how long after a reconnection the first message of each
// pull is checked for what was lost (checkReconnect): longer than a pull
// sent before the break lives.
const recheckFor = 2 * fetchWait

// noteArrived notes the stream sequence of m, a message just arrived, for
// checkReconnect: the last that arrived, of those delivered new.
func (f *fetcher) noteArrived(m jetstream.Msg) {
	if f.reconnects == nil {
		return
	}
	if meta, err := m.Metadata(); err == nil {
		f.lastSeq = max(f.lastSeq, streamSeq(m, meta))
	}
}

// maxOutRead bounds how many stream sequences outSeqs reads.
const maxOutRead = 1000

// outSeqs reads the messages of the consumer's stream after floor up to
// delivered that its filter takes (Handover.Stream), and returns those of
// each ordering key, in stream order: what may be out is among them. It
// reports false if they cannot be read, or are more than maxOutRead.
func (f *fetcher) outSeqs(ctx context.Context, floor, delivered uint64) (map[string][]uint64, bool) {
	if f.handover.Stream == nil || delivered < floor || delivered-floor > maxOutRead {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var filters []string
	if ci := f.cons.CachedInfo(); ci != nil {
		filters = ci.Config.FilterSubjects
		if ci.Config.FilterSubject != "" {
			filters = append(filters, ci.Config.FilterSubject)
		}
	}
	outs := map[string][]uint64{}
	for seq := floor + 1; seq <= delivered; seq++ {
		raw, err := f.handover.Stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			f.log.Debug("cannot read what the consumer has out", "error", err)
			return nil, false
		}
		if len(filters) > 0 && !slices.ContainsFunc(filters, func(fl string) bool { return subject.Matches(fl, raw.Subject) }) {
			continue
		}
		subj, h := raw.Subject, raw.Header
		if f.wrap != nil {
			subj, h, _, _ = origin(subj, h) // a partition's: the key is the origin's
		}
		if k, ok := f.order.key(subj, h); ok {
			outs[k] = append(outs[k], seq)
		}
	}
	return outs, true
}

// floorReadEvery is how often readFloor reads the ack floor.
const floorReadEvery = 500 * time.Millisecond

// readFloor reads the consumer's ack floor (with its other settings,
// reread) after a pull, at most every floorReadEvery, while keys wait for
// what was out at a takeover: a key whose awaited message was settled by
// the courier that had it goes on once the floor passes it.
func (f *fetcher) readFloor(ctx context.Context) {
	now := f.now()
	if now.Sub(f.floorRead) < floorReadEvery || now.After(f.floorUntil) && (f.order == nil || !f.order.awaiting()) {
		return
	}
	f.floorRead = f.now()
	f.reread(ctx)
}
