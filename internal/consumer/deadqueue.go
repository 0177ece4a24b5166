package consumer

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// deadQueue holds one assigned partition's dead letters until they are
// durable (I6) and hands them to DeadLetters.Send from a goroutine of its
// own. The DLQ producer's Send blocks while its queues are full (fsync
// speed when Kafka refuses and the emergency file takes over); called from
// the poll goroutine it slowed every partition's dispatch to that speed.
// Now the poll goroutine and the actors only push, which never blocks, and
// the poll goroutine pauses the partition while processor.dead_letter_queue
// letters wait (flowControl), so a slow DLQ holds back only the partitions
// that dead-letter (I5).
//
// The queue is bounded by what the partition has in flight: a letter is a
// record the offset tracker tracks until the letter is durable, and the
// in-flight cap (processor.max_in_flight) bounds those. The dead-letter
// mark pauses well before it; the letters that still arrive after the mark
// are the rest of the poll batch being dispatched and the messages already
// in the users' mailboxes.
//
// Letters are sent in the order they were pushed, but order does not
// matter for commits: the tracker commits only the contiguous finished
// prefix, whichever letter becomes durable first.
type deadQueue struct {
	// waiting counts letters pushed and not durable yet: queued, in Send,
	// or waiting for a retry. Read by the poll goroutine without the lock.
	waiting atomic.Int64
	gauge   prometheus.Gauge // kfpipe_dead_letters_waiting of the partition

	mu      sync.Mutex
	items   []*letter // pushed, not handed to Send yet
	spare   []*letter // the sender's previous batch, reused
	stopped bool

	wake chan struct{} // cap 1: one pending wake-up is enough
	stop chan struct{}
	once sync.Once
}

// letter is a dead letter and the message it finishes once durable.
type letter struct {
	dl  *DeadLetter
	env *envelope
	// backoff is the wait before the next send if this one fails.
	backoff time.Duration
}

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

// runDeadQueue is the partition's dead-letter sender goroutine, started
// with the partition's assignment; halt ends it and Consumer.shutdown
// waits for it (deadWG).
func (c *Consumer) runDeadQueue(q *deadQueue) {
	defer c.deadWG.Done()
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
				c.sendDead(l.dl, l.env, l.backoff)
			}
			q.giveBack(batch)
		}
	}
}

// startDeadQueue gives p its dead-letter queue and sender goroutine.
func (c *Consumer) startDeadQueue(p *partition) {
	p.dead = newDeadQueue(c.m.deadWaiting.WithLabelValues(p.label))
	c.deadWG.Add(1)
	go c.runDeadQueue(p.dead)
}

// stopDeadQueue halts p's queue and forgets its gauge; the goroutine ends
// at its next step (a Send in progress finishes first).
func (c *Consumer) stopDeadQueue(p *partition) {
	if p.dead == nil {
		return
	}
	p.dead.halt()
	c.m.deadWaiting.DeleteLabelValues(p.label)
}

// notDurable records a dead letter the DLQ did not take: neither the DLQ
// topic nor the emergency file.
type notDurable struct {
	at  time.Time
	err error
}

// DeadLetterDetail is the /readyz detail while dead letters cannot be
// recorded: how many wait, how many partitions are paused for them, and
// the last error (the DLQ topic's and the emergency file's). Empty when
// every send of the last 30 s was recorded, or nothing waits.
func (c *Consumer) DeadLetterDetail() string {
	nd := c.notDurable.Load()
	if nd == nil || c.clock.Now().Sub(nd.at) > 30*time.Second {
		return ""
	}
	waiting := int64(0)
	for _, p := range c.deadQueues() {
		waiting += p.waiting.Load()
	}
	if waiting == 0 {
		return ""
	}
	return fmt.Sprintf("%d dead letters not recorded, retried; their partitions pause at processor.dead_letter_queue and nothing after them is committed: %v",
		waiting, nd.err)
}

// deadQueues returns the assigned partitions' dead-letter queues.
func (c *Consumer) deadQueues() []*deadQueue {
	c.mu.Lock()
	defer c.mu.Unlock()
	qs := make([]*deadQueue, 0, len(c.parts))
	for _, p := range c.parts {
		if p.dead != nil {
			qs = append(qs, p.dead)
		}
	}
	return qs
}
