package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/overload"
)

// handlerFailure carries the handler's last error out of Deduper.Do so that
// a failure of the handler can be told from a failure of the dedup store.
type handlerFailure struct {
	err      error
	attempts int
	timedOut bool
}

func (h *handlerFailure) Error() string { return h.err.Error() }
func (h *handlerFailure) Unwrap() error { return h.err }

// processor is what a user's actor does with the user's messages: decode
// once, look up under the partition's lease, run the handler with retries
// (the outage gate, the downstream limit and the ownership check before
// each attempt), queue the done mark, and finish each message or
// dead-letter it. A single message is a batch of one.
type processor struct {
	*core
	handler Handler
	own     *ownership
	gate    *gate
	down    *downstream
	dead    *deadLetterer
	commits *committer
	batch   batchMode
}

// process runs in the user's actor goroutine for one message: a batch of
// one (processBatch).
func (pr *processor) process(env *envelope) { pr.processBatch([]*envelope{env}) }

// batching reports whether the consumer runs in batch mode (WithBatch):
// the handler then sees the batch (handler.BatchFrom) and the dead
// letters say how many messages it held.
func (pr *processor) batching() bool { return pr.batch.max > 1 }

// processBatch runs in the user's actor goroutine: decode, dedup, handle
// with retry, then finish every message or dead-letter each. Outside batch
// mode envs is one message; in it, the user's consecutive messages of one
// partition (batch.go).
func (pr *processor) processBatch(envs []*envelope) {
	defer func() {
		// A bug here must not kill the daemon; the message stays
		// unfinished (never committed) and is read again after a restart.
		if r := recover(); r != nil {
			pr.log.Error("actor panic", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
		}
	}()
	if envs[0].part.dropped.Load() || pr.runCtx.Err() != nil {
		return // revoked past the drain limit, or stopping: the next reader handles it
	}
	live, bad := envs, 0
	for _, env := range envs {
		if env.msg == nil {
			msg, err := chatmsg.Decode(env.km.Value)
			if err != nil {
				// Bad input says nothing about the user's downstream: it
				// releases a half-open trial slot like a success instead of
				// opening the breaker for the user's good messages.
				pr.breakerOutcome(env, true)
				pr.dead.deadLetter(env, ReasonInvalidMessage, err.Error(), 0)
				bad++
				continue
			}
			env.msg = msg
		}
	}
	if bad > 0 { // the usual batch decodes whole: no copy
		live = make([]*envelope, 0, len(envs)-bad)
		for _, env := range envs {
			if env.msg != nil {
				live = append(live, env)
			}
		}
	}
	if len(live) == 0 {
		return
	}
	var dup []bool
	var err error
	for backoff := pr.cfg.Processor.RetryBase; ; {
		dup, err = pr.handleOnce(live)
		var hf *handlerFailure
		if err == nil || errors.As(err, &hf) || errors.Is(err, errStopping) || pr.runCtx.Err() != nil {
			break
		}
		// The state store failed or the partition's lease was lost (not
		// the handler):
		// the message is fine, so no dead letter; wait and try again. The
		// user's later messages wait behind it (I4) and the partition's
		// in-flight cap bounds how much piles up.
		m := live[0].msg
		pr.log.Warn("state: message not settled; retrying", zap.String("user_id", m.ExternalUserID),
			zap.String("dedup_key", m.DedupKey()), zap.Int("messages", len(live)), zap.Error(err))
		if !sleep(pr.runCtx, pr.clock, backoff) || live[0].part.dropped.Load() {
			return // stopping, or the partition's new owner reads it again
		}
		backoff = min(2*backoff+time.Millisecond, pr.cfg.Processor.RetryMax)
	}
	if pr.runCtx.Err() != nil || errors.Is(err, errStopping) {
		return
	}
	var hf *handlerFailure
	failed := errors.As(err, &hf)
	if err != nil && !failed {
		return // not reached: the loop ends on these errors only
	}
	for i, env := range live {
		switch {
		case dup[i]:
			pr.m.duplicates.Inc()
			pr.m.result(resultDuplicate).Inc()
			pr.breakerOutcome(env, true)
			pr.commits.finish(env)
		case !failed:
			pr.m.result(resultOK).Inc()
			if m := env.msg; m.ProducedAt > 0 {
				pr.m.latency.Observe(pr.clock.Now().Sub(time.UnixMilli(m.ProducedAt)).Seconds())
			}
			pr.breakerOutcome(env, true)
			pr.commits.finish(env)
		default:
			pr.breakerOutcome(env, false)
			reason := ReasonDownstreamError
			switch {
			case handler.IsPermanent(hf.err):
				// The record was fine: the handler refused it for good.
				reason = ReasonHandlerRejected
			case hf.timedOut:
				reason = ReasonProcessTimeout
			}
			details := hf.err.Error()
			if pr.batching() {
				details = fmt.Sprintf("batch of %d: %s", len(live), details)
			}
			pr.dead.deadLetter(env, reason, details, hf.attempts)
		}
	}
}

func (pr *processor) breakerOutcome(env *envelope, ok bool) {
	if env.breakerDone != nil {
		env.breakerDone(ok)
		env.breakerDone = nil
	}
}

// handleOnce runs the handler with retries under the partition's lease:
// a message the state store holds as done (or that this consumer handled
// and is marking) is a duplicate (dup[i]), left out of the handler's
// batch; the handler runs for the others — once, with the first of them
// and, in batch mode, all of them in handler.BatchFrom — with the lease's
// fencing token in its context, and is stopped when the lease is lost
// (errClaimLost: the messages are looked up again under the next lease).
// After a success the done marks are queued, the last message's first (a
// re-run batch begins with the same first message until it is done), and
// the messages are finished at once: the effect has happened, and a
// message left unfinished until its mark lands would be run again by the
// partition's next owner when a Redis outage outlasts the lease. The mark
// is recorded whoever owns the partition when it lands (Lease.Mark), and a
// copy of the message this consumer meets before then is a duplicate
// (pending).
func (pr *processor) handleOnce(live []*envelope) (dup []bool, err error) {
	dup = make([]bool, len(live))
	run := func(ctx context.Context, g *claimGuard, todo []*envelope) error {
		if pr.batching() {
			items := make([]handler.BatchItem, len(todo))
			for i, env := range todo {
				items[i] = handler.BatchItem{Msg: env.msg, Delivery: handler.DeliveryFrom(withDelivery(context.Background(), env.km))}
			}
			ctx = handler.WithBatchItems(ctx, items)
		}
		attempts, timedOut, err := pr.handleWithRetry(ctx, todo[0], g)
		if err == nil {
			return nil
		}
		if errors.Is(err, errStopping) || errors.Is(err, errClaimLost) {
			return err
		}
		return &handlerFailure{err: err, attempts: attempts, timedOut: timedOut}
	}
	pl := live[0].part.lease
	if pl == nil {
		return dup, run(pr.runCtx, nil, live) // no State: every message runs
	}
	l, ok := pr.own.leaseOf(pl)
	if !ok {
		return dup, errStopping
	}
	// A message that is not pending (the usual case) costs no slice beyond
	// items and dup: look is items and todo is live.
	items := make([]StateItem, len(live))
	pending := 0
	for i, env := range live {
		m := env.msg
		items[i] = StateItem{Key: m.DedupKey(), SendTime: m.SendTime, User: m.ExternalUserID}
		if pl.isPending(items[i].Key) {
			dup[i] = true
			pending++
		}
	}
	look, lookAt := items, []int(nil)
	if pending > 0 {
		look = nil
		for i := range items {
			if !dup[i] {
				look, lookAt = append(look, items[i]), append(lookAt, i)
			}
		}
	}
	if len(look) > 0 {
		seen, err := l.Seen(pr.runCtx, look)
		if err != nil {
			return dup, fmt.Errorf("state: look up %s: %w", look[0].Key, err)
		}
		for j, s := range seen {
			switch {
			case !s:
			case lookAt == nil:
				dup[j] = true
			default:
				dup[lookAt[j]] = true
			}
		}
	}
	todo, todoItems := live, items
	if slices.Contains(dup, true) {
		todo, todoItems = nil, nil
		for i, env := range live {
			if !dup[i] {
				todo, todoItems = append(todo, env), append(todoItems, items[i])
			}
		}
	}
	if len(todo) == 0 {
		return dup, nil
	}
	// own.go: the lease covers the messages until their marks are queued
	// (a hand-over gives the lease back only after that, with the marks).
	hctx, hcancel := context.WithCancel(pr.runCtx)
	defer hcancel()
	hold, ok := todo[0].part.work.hold(hcancel)
	if !ok {
		return dup, errStopping
	}
	defer todo[0].part.work.end(hold)
	g := &todo[0].guard
	if err := pr.underLease(hctx, l, g, func(ctx context.Context) error { return run(ctx, g, todo) }); err != nil {
		return dup, err
	}
	for k := len(todo) - 1; k >= 0; k-- {
		pr.markDone(pl, l, todo[k], todoItems[k])
	}
	return dup, nil
}

// underLease runs f with l in its context (the fencing token, the reply
// log, the owner margin), g reset and told when l is lost or reaches its
// local deadline unrenewed.
func (pr *processor) underLease(parent context.Context, l Lease, g *claimGuard, f func(ctx context.Context) error) error {
	*g = claimGuard{}
	watched, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		watchDeadline(l, g, watched) // own.go: lost, or past its deadline
	}()
	defer func() {
		close(watched)
		<-exited // g is reset by the next call: no late lose on it
	}()
	return f(handler.WithLease(parent, l, ownerMargin(pr.cfg.Dedup.Lease)))
}

// markDone queues env's done mark on l; until it is recorded a copy of the
// message this consumer meets is a duplicate (pending).
func (pr *processor) markDone(pl *partLease, l Lease, env *envelope, it StateItem) {
	pl.addPending(it.Key)
	off := int64(env.km.TopicPartition.Offset)
	l.Mark(it, off, func(recorded bool) {
		pl.donePending(it.Key)
		if !recorded {
			pr.log.Error("state: done mark given up; a copy of the message met later runs again",
				zap.Int32("partition", env.part.id), zap.Int64("offset", off), zap.String("idempotency_key", it.Key))
		}
	})
}

// handleWithRetry calls the handler up to processor.retry_attempts times
// with exponential backoff, each attempt bounded by
// processor.attempt_timeout from when it got its slot under the handler
// limit (downstream.go: the wait for a slot is the message's, not the
// attempt's), each retry within the retry budget. It reports the attempts made and whether the
// last one timed out. g, when set, stops it when the claim is lost; it also
// stops (errStopping: the message stays unfinished) when env's partition
// was revoked or lost meanwhile, because the partition's new owner reads
// the message again — retrying here would only run the handler beside it,
// and dead-letter a message the new owner handles. Every retry is logged
// (the first of a message at info, the others at debug) and counted by
// outcome: an attempt that failed or timed out may still have had its
// effect, which is why handlers get an idempotency key.
func (pr *processor) handleWithRetry(ctx context.Context, env *envelope, g *claimGuard) (attempts int, timedOut bool, err error) {
	m := env.msg
	pc := pr.cfg.Processor
	backoff := pc.RetryBase
	var took time.Duration // how long the last attempt ran
	for {
		if attempts > 0 {
			// Out of attempts: dead-lettered, unless the downstream is
			// slow (the last attempt timed out while the limit was being
			// cut and other users' calls time out too: the message waits
			// and is retried, the budget bounding the retries), down for everyone (the gate is open) or may be
			// (the gate is suspect: the message then waits, without calls,
			// for the verdict, at most outage.window).
			gated := false
			if attempts >= pc.RetryAttempts && !pr.gate.isOpen() && !(timedOut && pr.down.slowFor(m.ExternalUserID, pr.clock.Now(), pr.cfg.Outage.Window)) {
				open, ok := pr.awaitVerdict(ctx, m.ExternalUserID)
				if !ok {
					return attempts, false, pr.stopCause(ctx)
				}
				if !open {
					break
				}
				gated = true // the gate's hold below is the wait
			}
			if !gated {
				wait := retryWait(backoff, err, timedOut, took)
				pr.logRetry(m, attempts, err, timedOut, wait)
				if !sleep(ctx, pr.clock, wait) {
					return attempts, false, pr.stopCause(ctx)
				}
				backoff = min(2*backoff, pc.RetryMax)
			}
			if env.part.dropped.Load() {
				pr.m.attempts[attemptAbandoned].Inc()
				return attempts, false, errStopping
			}
			if !pr.awaitBudget(ctx) {
				return attempts, false, pr.stopCause(ctx)
			}
		}
		// No new effect while the partition's marks lag or cannot be
		// written (issue 43): the effect→mark window stays bounded.
		if err := pr.admitAttempt(ctx); err != nil {
			return attempts, false, err
		}
		// While the gate is open only probes call the handler.
		probe, ok := pr.gate.hold(ctx)
		if !ok {
			return attempts, false, pr.stopCause(ctx)
		}
		// A call beyond the handler limit waits here, in its actor, before
		// its attempt's time starts.
		start, ok := pr.down.acquire(ctx, attempts > 0)
		if !ok {
			pr.gate.release(probe)
			return attempts, false, pr.stopCause(ctx)
		}
		if env.part.dropped.Load() {
			pr.down.release(start, overload.Ignored)
			pr.gate.release(probe)
			pr.m.attempts[attemptAbandoned].Inc()
			return attempts, false, errStopping
		}
		actx, cancel, serr := pr.startAttempt(ctx, env, g) // own.go: the ownership check
		if serr != nil {
			pr.down.release(start, overload.Ignored)
			pr.gate.release(probe)
			return attempts, false, serr
		}
		if attempts == 0 {
			pr.down.firstCall()
		}
		attempts++
		called := start // the slot's start; without the limit, now
		if called.IsZero() && pr.gate != nil {
			called = pr.clock.Now()
		}
		err = pr.safeHandle(withDelivery(actx, env.km), m)
		timedOut = isTimeout(actx, err)
		lost := g.ended() || errors.Is(err, handler.ErrNotOwner) // a reply found the lease past its deadline
		cancel()
		pr.m.attempts[attemptOutcome(err, timedOut)].Inc()
		switch {
		case err != nil && (lost || ctx.Err() != nil):
			pr.down.release(start, overload.Ignored)
			pr.gate.release(probe) // cut short: says nothing of the downstream
		case timedOut:
			// A timeout is the limit's signal (the downstream is slow), not
			// an outage's: it neither opens nor closes the gate.
			now := pr.clock.Now()
			if !start.IsZero() {
				took = now.Sub(start)
			}
			pr.down.timedOut(m.ExternalUserID, now)
			pr.down.release(start, overload.Dropped)
			pr.gate.release(probe)
		default:
			pr.down.release(start, outcomeOf(err, false))
			// A permanent failure is the receiver refusing this message:
			// the downstream answers.
			pr.gate.result(m.ExternalUserID, err == nil || handler.IsPermanent(err), probe, called)
		}
		if err == nil {
			return attempts, false, nil
		}
		if lost {
			return attempts, false, errClaimLost
		}
		if ctx.Err() != nil {
			return attempts, false, pr.stopCause(ctx)
		}
		if handler.IsPermanent(err) {
			return attempts, false, err
		}
	}
	return attempts, timedOut, err
}

// awaitVerdict is where a message out of attempts waits while the gate is
// suspect, calling nothing (its retry_attempts are spent): until the gate
// opens (open: it then waits at the gate like every message), the
// suspicion ends (the downstream answers others: the failures are the
// message's own), or outage.window passes since it began waiting (the
// suspicion is spent: heldInVain). ok is false when ctx ended first.
func (pr *processor) awaitVerdict(ctx context.Context, user string) (open, ok bool) {
	since := pr.clock.Now()
	for wait := pr.cfg.Processor.RetryBase; ; wait = min(2*wait+time.Millisecond, time.Second) {
		switch {
		case pr.gate.isOpen():
			return true, true
		case !pr.gate.suspect():
			return false, true
		case pr.clock.Now().Sub(since) >= pr.cfg.Outage.Window:
			pr.gate.heldInVain(user)
			return false, true
		}
		if !sleep(ctx, pr.clock, max(wait, time.Millisecond)) {
			return false, false
		}
	}
}

// logRetry says that attempt number attempts of m failed (err, or a
// timeout) and the next comes after backoff: at info for the first retry
// of a message, at debug for the others.
func (pr *processor) logRetry(m *chatmsg.ChatMessage, attempts int, err error, timedOut bool, backoff time.Duration) {
	lvl := zapcore.DebugLevel
	if attempts == 1 {
		lvl = zapcore.InfoLevel
	}
	if ce := pr.log.Check(lvl, "handler attempt failed; retrying"); ce != nil {
		ce.Write(zap.String("user_id", m.ExternalUserID), zap.String("upstream_msgid", m.UpstreamMsgID),
			zap.String("idempotency_key", m.DedupKey()), zap.Int("attempt", attempts), zap.Bool("timed_out", timedOut),
			zap.Duration("backoff", backoff), zap.Error(err))
	}
}

// stopCause tells why the handler's context ended: the consumer stops, or
// only the dedup layer cancelled it because the claim was lost.
func (pr *processor) stopCause(ctx context.Context) error {
	if pr.runCtx.Err() == nil && ctx.Err() != nil {
		return errClaimLost
	}
	return errStopping
}

// safeHandle turns a handler panic into an error: counted as a failed
// attempt, never a dead daemon.
func (pr *processor) safeHandle(ctx context.Context, m *chatmsg.ChatMessage) (err error) {
	defer func() {
		if r := recover(); r != nil {
			pr.log.Error("handler panic", zap.String("user_id", m.ExternalUserID), zap.Any("panic", r),
				zap.ByteString("stack", debug.Stack()))
			err = fmt.Errorf("handler panic: %v", r)
		}
	}()
	return pr.handler.Handle(ctx, m)
}

// admitAttempt waits, before a handler attempt under ctx's lease, until
// the lease admits it: nil when it may start, errClaimLost when the lease
// was lost meanwhile, else ctx's stop cause. A lease that is no Admitter
// (or none: a consumer without a State) admits every attempt.
func (pr *processor) admitAttempt(ctx context.Context) error {
	hl, _ := handler.LeaseOf(ctx)
	l, ok := hl.(Lease)
	if !ok {
		return nil
	}
	a, ok := l.(Admitter)
	if !ok {
		return nil
	}
	// The usual case costs no goroutine: a lease that admits at once
	// does so under an ended context too.
	if a.Admit(endedCtx) == nil {
		return nil
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-l.Lost():
			cancel()
		case <-actx.Done():
		}
	}()
	if err := a.Admit(actx); err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return pr.stopCause(ctx)
	}
	// The lease was lost while the attempt waited, or its marker stopped
	// (the lease is gone): the message is looked up under the next lease.
	return errClaimLost
}

// startAttempt is the ownership check at the start of an attempt of env:
// it returns the attempt's context (bounded by processor.attempt_timeout,
// cancelled when the claim is lost or the partition handed over), or
// errStopping when the partition is being handed over, errClaimLost when
// the lease is past its local deadline or lost: the attempt does not
// start and the message is looked up again under the next lease (nothing
// is dead-lettered for it).
func (pr *processor) startAttempt(ctx context.Context, env *envelope, g *claimGuard) (context.Context, context.CancelFunc, error) {
	if err := handler.CheckOwner(ctx); err != nil {
		pr.m.own.notOwner.Inc()
		return nil, nil, errClaimLost
	}
	actx, cancel, ok := g.attempt(ctx, pr.cfg.Processor.AttemptTimeout)
	if !ok {
		return nil, nil, errClaimLost
	}
	id, ok := env.part.work.begin(cancel)
	if !ok {
		cancel()
		return nil, nil, errStopping
	}
	return actx, func() {
		cancel()
		env.part.work.end(id)
	}, nil
}

// awaitBudget waits until the retry budget lets a retry go (false when
// ctx ended first). A message waiting here keeps its place in its user's
// order, spends no attempt and holds no slot under the limit.
func (pr *processor) awaitBudget(ctx context.Context) bool {
	for wait := pr.cfg.Processor.RetryBase; !pr.down.retry(); wait = min(2*wait+time.Millisecond, time.Second) {
		if !sleep(ctx, pr.clock, max(wait, 10*time.Millisecond)) {
			return false
		}
	}
	return true
}
