package consumer

// What the consumer's parts share: the core every part reads, and the
// state of an assigned partition and of a message on its way, which the
// parts hand each other. The parts themselves (consumer.go) build on
// these; nothing here refers to a part.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/offsets"
)

// core is what every part of the consumer reads and none changes after
// New: the settings, the clock, the logger, the metrics, and the run's
// context (handed to handlers and the limiter; ended when the consumer
// gives up waiting: the Close deadline, an abort).
type core struct {
	cfg    config.Consumer
	topic  string
	log    *zap.Logger
	clock  Clock
	m      *metrics
	runCtx context.Context
}

// partition is the consumer's state for one assigned partition.
type partition struct {
	topic   string
	id      int32
	tracker *offsets.Tracker
	// committed is the last committed offset and meta the finished offsets
	// behind it listed in that commit's metadata (guarded by
	// the committer's mu).
	committed int64
	meta      string
	// prior is what the previous owner finished behind its committed
	// offset: those records are finished at once instead of run again.
	prior priorFinished
	// pause is the partition's pause in the Kafka client and its reasons
	// (flowControl; poll goroutine).
	pause partPause
	// dead holds the partition's dead letters until they are durable; its
	// goroutine lives as long as the assignment (nil only for partitions
	// that unit tests build without a consumer loop).
	dead *deadQueue
	// base is the group's committed offset when the partition was assigned
	// (-1: none committed; -2: not read yet), so that lag shows from the
	// assignment on, before the first message is finished (poll goroutine).
	base int64
	// batched counts the partition's records in the poll goroutine's
	// current batch (owned by it), not yet tracked.
	batched int
	// dropped is set when the partition is revoked or lost: actors skip its
	// remaining messages, which the next owner reads again.
	dropped atomic.Bool
	label   string
	// lease is the partition's hold in the State (nil without one).
	lease *partLease
	// work is its running handler attempts, which the lease covers
	// (own.go).
	work partWork
	// after, when set, is closed when this consumer's earlier hand-over of
	// the same partition ended: its lease keeper waits for it.
	after <-chan struct{}
}

// priorFinished is what the previous owner of a partition finished behind
// its committed offset (from the commit's metadata, ascending). Set before
// the partition is shared and never changed; at is the poll goroutine's
// position in it.
type priorFinished struct {
	offs []int64
	at   int
}

// has reports whether the previous owner finished off (poll goroutine;
// offsets come in ascending order).
func (pf *priorFinished) has(off int64) bool {
	for pf.at < len(pf.offs) && pf.offs[pf.at] < off {
		pf.at++
	}
	return pf.at < len(pf.offs) && pf.offs[pf.at] == off
}

// partPause is whether a partition is paused in the Kafka client (on), and
// the reasons it should be: the in-flight cap (cap), a full dead-letter
// queue (dead). It is paused while either holds (flowControl). Owned by the
// poll goroutine.
type partPause struct {
	on, cap, dead bool
}

// baseUnknown marks a partition whose committed offset at assignment has
// not been read yet.
const baseUnknown = -2

type tpKey struct {
	topic string
	id    int32
}

// envelope is one message on its way through a user's actor.
type envelope struct {
	km *kafka.Message
	// msg is the decoded record: set by the actor (or by the dispatcher for
	// a record without key); nil when the record is not decoded yet or
	// could not be decoded.
	msg  *chatmsg.ChatMessage
	user string // the routing user: the record key, else msg.ExternalUserID
	part *partition
	// breakerDone reports the outcome to the user's breaker; nil when no
	// breaker is configured.
	breakerDone func(success bool)
	// prepared: the actor has handed the envelope to registry.prepare
	// (written under the actor's lock).
	prepared bool
	// guard stops the handler when the partition's lease is lost (part of
	// the envelope to save an allocation per message).
	guard claimGuard
}

// polled is a record read by the poll goroutine, with the partition it
// belonged to when it was read (a revoke inside a later Poll of the same
// batch marks that partition dropped, and the record is skipped).
type polled struct {
	km   *kafka.Message
	part *partition
}

// partWork is a partition's running handler attempts. The zero value is
// open and idle.
type partWork struct {
	mu      sync.Mutex
	closed  bool // no new attempt: the partition is being handed over
	next    int
	cancels map[int]context.CancelFunc
	holds   map[int]bool  // entries of cancels that are messages, not attempts
	idle    chan struct{} // closed when the last attempt ends (nil: none waits)
}

// claimGuard stops a message's handler when its dedup claim is lost
// (AheadDeduper's lost callback), so the message needs no context of its
// own besides each attempt's.
type claimGuard struct {
	mu     sync.Mutex
	lost   bool
	cancel context.CancelFunc // the running attempt's, if any
}

// partLease is an assigned partition's hold in the State: its keeper
// goroutine takes the partition's lease on assignment (waiting for the
// previous owner to give it back or let it expire), takes it again when it
// is lost, and stops on revoke, when the consumer gives it back after the
// last commit.
type partLease struct {
	mu    sync.Mutex
	cur   Lease         // nil while the lease is being taken
	ready chan struct{} // closed when cur is set
	// pending counts the keys handled by this consumer whose done marks
	// are not recorded yet: a copy of such a message is a duplicate (the
	// store would not know it yet).
	pending map[string]int
	stop    chan struct{} // closed on revoke
	done    chan struct{} // closed when the keeper returned
}

// isPending reports whether key's done mark is queued, not recorded yet.
func (pl *partLease) isPending(key string) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.pending[key] > 0
}

// addPending and donePending count key's marks queued and recorded.
func (pl *partLease) addPending(key string) {
	pl.mu.Lock()
	pl.pending[key]++
	pl.mu.Unlock()
}

func (pl *partLease) donePending(key string) {
	pl.mu.Lock()
	if pl.pending[key]--; pl.pending[key] <= 0 {
		delete(pl.pending, key)
	}
	pl.mu.Unlock()
}

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
	dl  *chatmsg.DeadLetter
	env *envelope
	// backoff is the wait before the next send if this one fails.
	backoff time.Duration
}
