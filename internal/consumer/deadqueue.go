package consumer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/deadletter"
)

func newDeadQueue(gauge prometheus.Gauge) *deadQueue {
	return &deadQueue{gauge: gauge, wake: make(chan struct{}, 1), stop: make(chan struct{})}
}

// push queues l for sending. retry is set when l was counted already (a
// send that failed and is tried again). It never blocks; after stop it
// drops l, whose message stays unfinished and is read again by the
// partition's next reader.
func (q *deadQueue) push(l *letter, retry bool) {
	q.mu.Lock()
	if q.stopped {
		q.mu.Unlock()
		return
	}
	q.items = append(q.items, l)
	q.mu.Unlock()
	if !retry {
		q.waiting.Add(1)
		q.gauge.Inc()
	}
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// durable counts a letter of the queue as durable.
func (q *deadQueue) durable() {
	q.waiting.Add(-1)
	q.gauge.Dec()
}

// take returns the letters queued so far (nil after stop).
func (q *deadQueue) take() []*letter {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.stopped {
		return nil
	}
	batch := q.items
	q.items, q.spare = q.spare[:0], nil
	return batch
}

// giveBack returns the sender's finished batch for reuse.
func (q *deadQueue) giveBack(batch []*letter) {
	clear(batch)
	q.mu.Lock()
	q.spare = batch[:0]
	q.mu.Unlock()
}

// halt stops the queue: letters not handed to Send yet are dropped (their
// messages stay unfinished), later pushes too. Letters already in Send may
// still become durable and finish their messages.
func (q *deadQueue) halt() {
	q.once.Do(func() {
		q.mu.Lock()
		q.stopped = true
		clear(q.items)
		q.items = nil
		q.mu.Unlock()
		close(q.stop)
	})
}

// deadLetterer is the consumer's dead-lettering (I6): it builds a
// message's dead letter, queues it on the partition's deadQueue, sends it
// from the queue's goroutine, repeats a send that failed after a backoff,
// and finishes the message (finish) only when its letter is durable.
type deadLetterer struct {
	dlq       DeadLetters
	runCtx    context.Context // ended: no more sends or retries
	finish    func(*envelope)
	retryBase time.Duration
	retryMax  time.Duration
	clock     Clock
	log       *zap.Logger
	m         *metrics

	// retries are the pending retries of dead letters that were not
	// durable yet; shutdown stops them.
	mu      sync.Mutex
	retries map[Timer]struct{}
	// notDurable is the last failed send (DeadLetterDetail).
	notDurable atomic.Pointer[notDurable]
	// wg counts the partitions' sender goroutines.
	wg sync.WaitGroup
}

func newDeadLetterer(dlq DeadLetters, runCtx context.Context, finish func(*envelope), p config.Processor, clk Clock, log *zap.Logger, m *metrics) *deadLetterer {
	return &deadLetterer{dlq: dlq, runCtx: runCtx, finish: finish, retryBase: p.RetryBase, retryMax: p.RetryMax,
		clock: clk, log: log, m: m, retries: map[Timer]struct{}{}}
}

// wait waits for the partitions' sender goroutines (after their queues
// were halted).
func (d *deadLetterer) wait() { d.wg.Wait() }

// runDeadQueue is the partition's dead-letter sender goroutine, started
// with the partition's assignment; halt ends it and Consumer.shutdown
// waits for it (wait).
func (d *deadLetterer) run(q *deadQueue) {
	defer d.wg.Done()
	for {
		select {
		case <-q.stop:
			return
		case <-q.wake:
		}
		for {
			batch := q.take()
			if len(batch) == 0 {
				break
			}
			for _, l := range batch {
				select {
				case <-q.stop:
					return // the rest stays unfinished: read again
				default:
				}
				d.send(l.dl, l.env, l.backoff)
			}
			q.giveBack(batch)
		}
	}
}

// startDeadQueue gives p its dead-letter queue and sender goroutine.
func (d *deadLetterer) startQueue(p *partition) {
	p.dead = newDeadQueue(d.m.part.deadWaiting.WithLabelValues(p.label))
	d.wg.Add(1)
	go d.run(p.dead)
}

// stopDeadQueue halts p's queue and forgets its gauge; the goroutine ends
// at its next step (a Send in progress finishes first).
func (d *deadLetterer) stopQueue(p *partition) {
	if p.dead == nil {
		return
	}
	p.dead.halt()
	d.m.part.deadWaiting.DeleteLabelValues(p.label)
}

// deadLetter hands env to the DLQ; the message is finished only when the
// dead letter is durable (I6). It queues the letter on the partition's
// dead-letter queue, whose goroutine sends it (deadqueue.go), so neither
// the poll goroutine nor an actor waits for the DLQ. A failed send is
// repeated after a backoff until it succeeds or the consumer stops, or the
// partition goes (then the offset stays uncommitted and the record is read
// again).
func (d *deadLetterer) deadLetter(env *envelope, reason, details string, attempts int) {
	km := env.km
	hs := make([]chatmsg.Header, len(km.Headers))
	for i, h := range km.Headers {
		hs[i] = chatmsg.Header{Key: h.Key, Value: h.Value}
	}
	dl := chatmsg.NewDeadLetter(chatmsg.Source{Topic: env.part.topic, Partition: env.part.id,
		Offset: int64(km.TopicPartition.Offset), Timestamp: km.Timestamp, Key: km.Key, Value: km.Value, Headers: hs, Decoded: env.msg},
		deadletter.Reason(reason), details, d.clock.Now())
	dl.HandlerAttempts = attempts
	// The user the record was routed by: its Kafka key, or the decoded
	// external_userid when it has none; Details says when both exist and
	// differ.
	if env.user != "" {
		dl.UserID = env.user
		if env.msg != nil && env.msg.ExternalUserID != env.user {
			dl.Details += fmt.Sprintf(" (routed by record key %q; payload external_userid %q)", env.user, env.msg.ExternalUserID)
		}
	}
	d.log.Info("dead letter", zap.String("reason", reason), zap.String("user_id", dl.UserID),
		zap.Int32("partition", dl.SourcePartition), zap.Int64("offset", dl.SourceOffset), zap.String("details", dl.Details))
	l := &letter{dl: dl, env: env, backoff: d.retryBase}
	if q := env.part.dead; q != nil {
		q.push(l, false) // never blocks: the poll goroutine and the actors only queue
		return
	}
	d.send(l.dl, l.env, l.backoff) // a partition built without a queue (unit tests of process)
}

func (d *deadLetterer) send(dl *chatmsg.DeadLetter, env *envelope, backoff time.Duration) {
	d.dlq.Send(dl, func(err error) {
		if err == nil {
			d.m.result(string(dl.Reason)).Inc()
			d.finish(env)
			if q := env.part.dead; q != nil {
				q.durable()
			}
			return
		}
		if d.runCtx.Err() != nil {
			return
		}
		d.notDurable.Store(&notDurable{at: d.clock.Now(), err: err})
		d.log.Error("dead letter not durable; retrying", zap.String("reason", string(dl.Reason)),
			zap.Int32("partition", dl.SourcePartition), zap.Int64("offset", dl.SourceOffset), zap.Error(err))
		next := min(2*backoff+time.Millisecond, max(d.retryMax, time.Millisecond))
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.runCtx.Err() != nil {
			return // shutdown stopped the retries: the message stays uncommitted
		}
		if d.retries == nil {
			d.retries = map[Timer]struct{}{}
		}
		var t Timer
		t = d.clock.AfterFunc(backoff, func() {
			d.mu.Lock()
			delete(d.retries, t)
			d.mu.Unlock()
			switch q := env.part.dead; {
			case d.runCtx.Err() != nil:
			case q != nil:
				q.push(&letter{dl: dl, env: env, backoff: next}, true) // sent again by the partition's sender
			default:
				d.send(dl, env, next)
			}
		})
		d.retries[t] = struct{}{}
	})
}

// stopRetries stops the pending dead-letter retries (after runCtx was
// cancelled, so none is added).
func (d *deadLetterer) stopRetries() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for t := range d.retries {
		t.Stop()
	}
	clear(d.retries)
}

// notDurable records a dead letter the DLQ did not take: neither the DLQ
// topic nor the emergency file.
type notDurable struct {
	at  time.Time
	err error
}
