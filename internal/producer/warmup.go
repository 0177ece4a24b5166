package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// StatsInterval is librdkafka's statistics.interval.ms for the producer.
// The statistics are how the producer learns that its idempotent producer
// ID is assigned (there is no other API for it); once warm they are no
// longer parsed.
const StatsInterval = 250 * time.Millisecond

// ErrWarmingUp is what Ready returns until the producer can produce at
// full speed (WaitReady).
var ErrWarmingUp = errors.New("kafka producer warming up")

// warmup is the producer's start-up gate. An idempotent producer sends
// nothing before the broker has assigned it a producer ID (InitProducerId;
// a broker that is still loading its transaction coordinator answers
// COORDINATOR_LOAD_IN_PROGRESS and librdkafka retries), and a message for
// a topic whose partitions' leaders are not known yet waits for a metadata
// round trip. Messages produced meanwhile only wait in librdkafka's queue,
// so a page produced at that moment takes the whole start-up time.
type warmup struct {
	created time.Time
	topic   string // the main topic; "" = only the producer ID
	// parts is the main topic's partition count from a metadata request
	// (0 until it answered).
	parts  atomic.Int32
	done   chan struct{} // closed when warm
	warm   atomic.Bool
	reason atomic.Pointer[string] // why not warm yet
}

func newWarmup(topic string) *warmup {
	w := &warmup{created: time.Now(), topic: topic, done: make(chan struct{})}
	w.setReason("no statistics from librdkafka yet")
	return w
}

func (w *warmup) setReason(s string) { w.reason.Store(&s) }

// statsJSON is the part of librdkafka's statistics the warm-up reads.
type statsJSON struct {
	EOS struct {
		IdempState string `json:"idemp_state"`
		ProducerID int64  `json:"producer_id"`
	} `json:"eos"`
	Topics map[string]struct {
		Partitions map[string]struct {
			Partition int32 `json:"partition"`
			Leader    int32 `json:"leader"`
		} `json:"partitions"`
	} `json:"topics"`
}

// StatsNotReady reads one statistics report of an idempotent librdkafka
// producer (statistics.interval.ms) and says why it cannot produce to
// topic, which has parts partitions, at full speed yet: its producer ID is
// not assigned, or a partition's leader is unknown. ""
// when it can. With topic "" only the producer ID is checked; parts 0
// means the topic's partition count is not known yet.
func StatsNotReady(raw, topic string, parts int) string {
	reason, _ := checkStats(raw, topic, parts)
	return reason
}

func checkStats(raw, topic string, want int) (reason string, pid int64) {
	var st statsJSON
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return "unreadable librdkafka statistics: " + err.Error(), 0
	}
	if st.EOS.IdempState != "Assigned" {
		return fmt.Sprintf("idempotent producer ID not assigned (state %q)", st.EOS.IdempState), 0
	}
	if topic == "" {
		return "", st.EOS.ProducerID
	}
	if want == 0 {
		return fmt.Sprintf("no metadata for topic %s yet", topic), 0
	}
	var missing []int
	known := 0
	for _, p := range st.Topics[topic].Partitions {
		if p.Partition < 0 { // librdkafka's unassigned-partition queue
			continue
		}
		known++
		if p.Leader < 0 {
			missing = append(missing, int(p.Partition))
		}
	}
	if known < want {
		return fmt.Sprintf("topic %s: %d of %d partitions known", topic, known, want), 0
	}
	if len(missing) > 0 {
		slices.Sort(missing) // the statistics hold partitions in a map
		ids := make([]string, len(missing))
		for i, p := range missing {
			ids[i] = strconv.Itoa(p)
		}
		return fmt.Sprintf("topic %s: no leader known for partitions %s", topic, strings.Join(ids, ", ")), 0
	}
	return "", st.EOS.ProducerID
}

// onStats is called by the event reader for each statistics report.
func (kp *KafkaProducer) onStats(raw string) {
	w := kp.warm
	if w.warm.Load() {
		return
	}
	reason, pid := checkStats(raw, w.topic, int(w.parts.Load()))
	if reason != "" {
		w.setReason(reason)
		return
	}
	w.warm.Store(true)
	close(w.done)
	kp.log.Info("kafka producer ready", zap.Int64("producer_id", pid), zap.String("topic", w.topic),
		zap.Duration("after", time.Since(w.created)))
}

// fetchTopic asks the brokers for the main topic's metadata until they
// answer, so that librdkafka knows the topic (its partitions' leaders)
// before the first message, and the warm-up knows how many partitions to
// wait for. It returns when done or when the producer closes.
func (kp *KafkaProducer) fetchTopic() {
	defer kp.bg.Done()
	w := kp.warm
	topic := w.topic
	for {
		md, err := kp.p.GetMetadata(&topic, false, 1000)
		if err == nil {
			t, ok := md.Topics[topic]
			switch {
			case !ok:
				err = errors.New("not in the answer")
			case t.Error.Code() != 0:
				err = t.Error
			case len(t.Partitions) == 0:
				err = errors.New("no partitions")
			default:
				w.parts.Store(int32(len(t.Partitions)))
				return
			}
		}
		w.setReason(fmt.Sprintf("metadata of topic %s: %v", topic, err))
		select {
		case <-kp.closing:
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// WaitReady blocks until the producer can produce at full speed — its
// idempotent producer ID is assigned and, when the configuration names a
// main topic, the leaders of all that topic's partitions are known — or
// until ctx ends or the producer closes. Pages produced
// before then are not lost, they wait in librdkafka's queue for all of it.
func (kp *KafkaProducer) WaitReady(ctx context.Context) error {
	select {
	case <-kp.warm.done:
		return nil
	default:
	}
	select {
	case <-kp.warm.done:
		return nil
	case <-kp.closing:
		return ErrClosed
	case <-ctx.Done():
		return fmt.Errorf("%w: %s: %w", ErrWarmingUp, *kp.warm.reason.Load(), ctx.Err())
	}
}
