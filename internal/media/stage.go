package media

import (
	"context"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// kf-producer's stage: media is kept soonest there, as soon as the page
// that carries it is in Kafka. The stage never holds up the sync loop (a
// slow download would stall every customer of the account, and the
// cursor waits for nothing but Kafka, I1): the page's media jobs go to a
// bounded queue served by media.workers goroutines. A job lost there (the
// queue full, kf-producer stopped or crashed) is not lost for the
// message: the consumer keeps its media before the handler runs (Wrap),
// within WeChat's 3 days.

// Start starts the stage's workers; Stop stops them.
func (k *Keeper) Start() {
	if k == nil {
		return
	}
	k.startMu.Lock()
	defer k.startMu.Unlock()
	if k.queue != nil {
		return
	}
	// The queue holds media.queue_size refs (a few hundred bytes each);
	// when it is full a job is dropped and counted, never waited for.
	k.queue = make(chan Ref, max(k.cfg.QueueSize, 1))
	k.stop = make(chan struct{})
	for range k.cfg.Workers {
		k.wg.Add(1)
		go k.work(k.queue, k.stop)
	}
}

func (k *Keeper) work(queue <-chan Ref, stop <-chan struct{}) {
	defer k.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-stop:
			return
		case ref := <-queue:
			k.m.queued.Dec()
			_, _ = k.Keep(ctx, "producer", ref) // logged and counted by Keep
		}
	}
}

// Enqueue queues ref for the workers; false (counted in
// kfpipe_media_queue_dropped_total) when the queue is full or the stage
// is not started.
func (k *Keeper) Enqueue(ref Ref) bool {
	k.startMu.Lock()
	q := k.queue
	k.startMu.Unlock()
	if q == nil {
		k.m.dropped.Inc()
		return false
	}
	select {
	case q <- ref:
		k.m.queued.Inc()
		return true
	default:
		k.m.dropped.Inc()
		return false
	}
}

// Stop stops the workers, cancelling the downloads under way, and waits
// for them until ctx ends. Jobs still queued are left to the consumer.
func (k *Keeper) Stop(ctx context.Context) error {
	if k == nil {
		return nil
	}
	k.startMu.Lock()
	stop := k.stop
	k.stop = nil
	k.startMu.Unlock()
	if stop == nil {
		return nil
	}
	close(stop)
	done := make(chan struct{})
	go func() { k.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Publisher produces a page of messages to Kafka (kf-producer's
// producer.Publisher).
type Publisher interface {
	ProduceBatch(ctx context.Context, topic string, msgs []*chatmsg.ChatMessage) error
}

// KeepingPublisher is p that, once a batch is in Kafka, queues the media
// of its messages for k's workers; k nil (keeping off) returns p.
func KeepingPublisher(p Publisher, k *Keeper) Publisher {
	if k == nil {
		return p
	}
	return keepingPublisher{p: p, k: k}
}

type keepingPublisher struct {
	p Publisher
	k *Keeper
}

func (kp keepingPublisher) ProduceBatch(ctx context.Context, topic string, msgs []*chatmsg.ChatMessage) error {
	if err := kp.p.ProduceBatch(ctx, topic, msgs); err != nil {
		return err
	}
	for _, m := range msgs {
		if ref, ok := kp.k.RefOf(m); ok {
			kp.k.Enqueue(ref)
		}
	}
	return nil
}
