package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
)

// Errors of the Producer.
var (
	// ErrClosed is passed to done by Send after Close.
	ErrClosed = errors.New("dlq: producer closed")
	// ErrBreakerOpen is the Kafka error recorded for a dead letter that
	// went straight to the emergency file because the DLQ breaker is open.
	ErrBreakerOpen = errors.New("dlq: breaker open")
)

// ProducerConfig configures a Producer: the brokers and DLQ topic name
// come from Kafka, the emergency file and breaker from DLQ.
type ProducerConfig struct {
	Kafka config.Kafka
	DLQ   config.DLQ
}

// Producer sends dead letters to the DLQ topic (I6). A dead letter is
// durable when Kafka acknowledged it (acks=all, idempotent) or, when Kafka
// fails, times out or the producer's own breaker is open, when it was
// written and fsync'd to the emergency file. A replayer goroutine moves
// the emergency file's records to the topic once Kafka takes them again.
type Producer struct {
	cfg     ProducerConfig
	topic   string
	log     *zap.Logger
	kp      *kafka.Producer
	breaker *gobreaker.TwoStepCircuitBreaker[struct{}]
	em      *emergencyFile
	m       producerMetrics

	// mu orders Send against Close: Send holds it shared while handing a
	// record over, Close exclusively to flip closed.
	mu      sync.RWMutex
	closed  bool
	pending atomic.Int64 // dead letters whose done has not been called

	// emq feeds the emergency writer. 256 bounds memory when Kafka is down
	// and lets one fsync cover many records; when full, the sender blocks,
	// which is the backpressure we want when both Kafka and disk lag.
	emq         chan *sendJob
	replayMu    sync.Mutex // one replay at a time (loop and ReplayOnce)
	stop        chan struct{}
	deliveryWG  sync.WaitGroup // delivery loop
	emergencyWG sync.WaitGroup // emergency writer
	replayWG    sync.WaitGroup // replay loop
}

type sendJob struct {
	dl      *chatmsg.DeadLetter
	value   []byte
	done    func(error)
	brDone  func(error)
	kafkaEr error
}

type producerMetrics struct {
	produced        *prometheus.CounterVec
	emergencyWrites prometheus.Counter
	produceErrors   prometheus.Counter
	replayed        prometheus.Counter
	tornLines       prometheus.Counter
	unrecorded      prometheus.Counter
}

func newProducerMetrics(reg prometheus.Registerer) producerMetrics {
	return producerMetrics{
		produced: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_dlq_messages_produced_total", Help: "Dead letters acknowledged by the DLQ topic, by reason."}, []string{"reason"})),
		emergencyWrites: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_dlq_emergency_writes_total", Help: "Dead letters written to the fsync'd emergency file because Kafka failed."})),
		produceErrors: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_dlq_produce_errors_total", Help: "Failed produce attempts to the DLQ topic."})),
		replayed: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_dlq_emergency_replayed_total", Help: "Emergency-file records acknowledged by the DLQ topic."})),
		tornLines: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_dlq_emergency_torn_lines_total", Help: "Undecodable emergency-file lines skipped at replay (torn writes)."})),
		unrecorded: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_dlq_unrecorded_total",
			Help: "Dead letters neither the DLQ topic nor the emergency file took (disk full): the sender retries them and their messages stay uncommitted."})),
	}
}

// NewProducer connects the DLQ producer and starts its delivery loop,
// emergency writer and (when dlq.replay_interval > 0) replayer.
func NewProducer(cfg ProducerConfig, opts ...Option) (*Producer, error) {
	o := buildOptions(opts)
	em, err := openEmergencyFile(cfg.DLQ.EmergencyFile)
	if err != nil {
		return nil, err
	}
	cm := kafkaclient.Producer(cfg.Kafka)
	// A dead letter Kafka has not acknowledged within produce_timeout goes
	// to the emergency file; librdkafka reports the timeout itself.
	_ = cm.SetKey("delivery.timeout.ms", int(cfg.DLQ.ProduceTimeout.Milliseconds()))
	if lg, ok := (*cm)["linger.ms"].(int); ok && time.Duration(lg)*time.Millisecond >= cfg.DLQ.ProduceTimeout {
		_ = cm.SetKey("linger.ms", 0)
	}
	kp, err := kafka.NewProducer(cm)
	if err != nil {
		return nil, fmt.Errorf("dlq producer: %w", err)
	}
	p := &Producer{
		cfg:   cfg,
		topic: cfg.Kafka.Topics.DLQ.Name,
		log:   o.log.Named("dlq-producer"),
		kp:    kp,
		em:    em,
		m:     newProducerMetrics(o.reg),
		emq:   make(chan *sendJob, 256),
		stop:  make(chan struct{}),
	}
	p.breaker = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "dlq-producer",
		MaxRequests: 1,
		Timeout:     cfg.DLQ.BreakerOpen,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= uint32(cfg.DLQ.BreakerFailures) },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			p.log.Warn("dlq breaker state change", zap.Stringer("from", from), zap.Stringer("to", to))
		},
	})
	p.deliveryWG.Add(1)
	p.emergencyWG.Add(1)
	go p.deliveryLoop()
	go p.emergencyLoop()
	if cfg.DLQ.ReplayInterval > 0 {
		p.replayWG.Add(1)
		go p.replayLoop(cfg.DLQ.ReplayInterval)
	}
	return p, nil
}

// Send hands dl to Kafka and returns at once. done(nil) is called once dl
// is durable: acknowledged by the DLQ topic, or fsync'd to the emergency
// file when Kafka failed, timed out or the breaker is open. done(err)
// means neither happened: the caller must not commit the source offset and
// should retry. done runs on a producer goroutine and must not block long;
// it is called exactly once, possibly before Send returns.
func (p *Producer) Send(dl *chatmsg.DeadLetter, done func(error)) {
	dl.EnsureID()
	value, err := Encode(dl)
	if err != nil {
		done(fmt.Errorf("dlq: encode: %w", err))
		return
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		done(ErrClosed)
		return
	}
	p.pending.Add(1)
	job := &sendJob{dl: dl, value: value, done: done}
	brDone, err := p.breaker.Allow()
	if err != nil {
		job.kafkaEr = fmt.Errorf("%w: %v", ErrBreakerOpen, err)
		p.emq <- job
		return
	}
	job.brDone = brDone
	if err := p.kp.Produce(p.record(dl, value, job), nil); err != nil {
		brDone(err)
		p.m.produceErrors.Inc()
		job.kafkaEr = err
		p.emq <- job
	}
}

// record builds the DLQ Kafka record of dl.
func (p *Producer) record(dl *chatmsg.DeadLetter, value []byte, opaque any) *kafka.Message {
	return dlqRecord(&p.topic, dl, value, opaque)
}

// dlqRecord builds the Kafka record of dl (encoded as value) for the DLQ
// topic.
func dlqRecord(topic *string, dl *chatmsg.DeadLetter, value []byte, opaque any) *kafka.Message {
	src := dl.SourceTopic + "/" + strconv.FormatInt(int64(dl.SourcePartition), 10) + "/" + strconv.FormatInt(dl.SourceOffset, 10)
	hs := []kafka.Header{
		{Key: HeaderReason, Value: []byte(dl.Reason)},
		{Key: HeaderUser, Value: []byte(dl.UserID)},
		{Key: HeaderSource, Value: []byte(src)},
		{Key: HeaderDLQID, Value: []byte(dl.ID)},
	}
	if dl.Event != "" {
		hs = append(hs, kafka.Header{Key: HeaderEvent, Value: []byte(dl.Event)})
	}
	return &kafka.Message{
		TopicPartition: kafka.TopicPartition{Topic: topic, Partition: kafka.PartitionAny},
		Key:            dl.Key(),
		Value:          value,
		Headers:        hs,
		Opaque:         opaque,
	}
}

// deliveryLoop reads the producer's events. A fatal error is logged:
// every later produce fails too and lands in the emergency file; the
// process should be restarted.
func (p *Producer) deliveryLoop() {
	defer p.deliveryWG.Done()
	kafkaclient.DrainEvents(p.kp.Events(), kafkaclient.Events[*sendJob]{
		Delivered: p.delivered, Log: p.log, ErrorLevel: zap.DebugLevel, Name: "dlq producer"})
}

// delivered settles a job by its delivery report: done, or on to the
// emergency file.
func (p *Producer) delivered(job *sendJob, err error) {
	job.brDone(err)
	if err == nil {
		p.m.produced.WithLabelValues(string(job.dl.Reason)).Inc()
		job.done(nil)
		p.pending.Add(-1)
		return
	}
	p.m.produceErrors.Inc()
	job.kafkaEr = err
	p.emq <- job
}

// emergencyLoop writes jobs Kafka did not take to the emergency file,
// several per fsync.
func (p *Producer) emergencyLoop() {
	defer p.emergencyWG.Done()
	batch := make([]*sendJob, 0, 256)
	lines := make([][]byte, 0, 256)
	for job := range p.emq {
		batch, lines = append(batch[:0], job), lines[:0]
	fill:
		for len(batch) < cap(batch) {
			select {
			case j, ok := <-p.emq:
				if !ok {
					break fill
				}
				batch = append(batch, j)
			default:
				break fill
			}
		}
		for _, j := range batch {
			lines = append(lines, j.value)
		}
		err := p.em.append(lines)
		for _, j := range batch {
			if err != nil {
				p.m.unrecorded.Inc()
				p.log.Error("dead letter neither in Kafka nor in the emergency file",
					zap.String("dlq_id", j.dl.ID), zap.String("user_id", j.dl.UserID),
					zap.NamedError("kafka_error", j.kafkaEr), zap.Error(err))
				j.done(fmt.Errorf("dlq: kafka: %v; emergency file: %w", j.kafkaEr, err))
			} else {
				p.m.emergencyWrites.Inc()
				p.log.Warn("dead letter written to the emergency file",
					zap.String("dlq_id", j.dl.ID), zap.String("user_id", j.dl.UserID), zap.NamedError("kafka_error", j.kafkaEr))
				j.done(nil)
			}
			p.pending.Add(-1)
		}
	}
}

func (p *Producer) replayLoop(every time.Duration) {
	defer p.replayWG.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-p.stop
		cancel()
	}()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		if p.breaker.State() == gobreaker.StateOpen {
			continue // Kafka is known to be failing; try after the breaker's timeout
		}
		if n, err := p.ReplayOnce(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("emergency replay incomplete", zap.Int("replayed", n), zap.Error(err))
		} else if n > 0 {
			p.log.Info("emergency file replayed to the DLQ", zap.Int("replayed", n))
		}
	}
}

// ReplayOnce sends the emergency file's records to the DLQ topic, batch by
// batch, advancing the file's replay offset only past records Kafka
// acknowledged. It returns how many were acknowledged. Records are sent
// directly (not through Send), so a failing replay never copies them into
// the file a second time.
func (p *Producer) ReplayOnce(ctx context.Context) (int, error) {
	p.replayMu.Lock()
	defer p.replayMu.Unlock()
	total := 0
	for {
		recs, err := p.em.readBatch(500, 4<<20)
		if err != nil || len(recs) == 0 {
			return total, err
		}
		ch := make(chan kafka.Event, len(recs))
		sent := make(map[int]bool, len(recs))
		var firstErr error
		for i, r := range recs {
			if r.dl == nil {
				continue
			}
			if err := p.kp.Produce(p.record(r.dl, r.value, i), ch); err != nil {
				firstErr = err
				break // later records wait for the next round; order is kept
			}
			sent[i] = true
		}
		acked := make(map[int]bool, len(sent))
		for range len(sent) {
			select {
			case ev := <-ch:
				m, ok := ev.(*kafka.Message)
				if !ok {
					continue
				}
				if m.TopicPartition.Error != nil {
					if firstErr == nil {
						firstErr = m.TopicPartition.Error
					}
					continue
				}
				acked[m.Opaque.(int)] = true
			case <-ctx.Done():
				return total, ctx.Err()
			}
		}
		// Advance over the acknowledged (or undecodable) prefix only.
		var end int64 = -1
		n := 0
		for i, r := range recs {
			if r.dl == nil {
				p.m.tornLines.Inc()
				p.log.Warn("skipping undecodable emergency-file line (torn write)", zap.Int64("end_offset", r.end))
			} else if !acked[i] {
				break
			} else {
				n++
			}
			end = r.end
		}
		if end >= 0 {
			if err := p.em.commit(end); err != nil {
				return total + n, err
			}
		}
		total += n
		p.m.replayed.Add(float64(n))
		if firstErr != nil || n < len(sent) {
			if firstErr == nil {
				firstErr = errors.New("not acknowledged")
			}
			return total, fmt.Errorf("replay emergency file: %w", firstErr)
		}
	}
}

// EmergencyPending reports whether the emergency file holds records not
// yet replayed; readiness probes and tests use it.
func (p *Producer) EmergencyPending() (bool, error) { return p.em.pending() }

// Close stops accepting dead letters, waits until every one handed to Send
// is durable (Kafka flush until ctx's deadline; what is still unacknowledged
// then is purged from librdkafka and written to the emergency file), and
// stops the producer's goroutines.
func (p *Producer) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	close(p.stop)
	p.replayWG.Wait()

	for p.pending.Load() > 0 && ctx.Err() == nil {
		p.kp.Flush(50)
	}
	if p.pending.Load() > 0 {
		// Out of time for Kafka: purged records come back as failed
		// deliveries and go to the emergency file.
		_ = p.kp.Purge(kafka.PurgeQueue | kafka.PurgeInFlight | kafka.PurgeNonBlocking)
		for p.pending.Load() > 0 {
			p.kp.Flush(50)
		}
	}
	p.kp.Close() // closes Events: the delivery loop ends
	p.deliveryWG.Wait()
	close(p.emq) // only now: the delivery loop may still feed it before
	p.emergencyWG.Wait()
	return p.em.close()
}
