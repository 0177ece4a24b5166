package consumer

// Flow control: pausing partitions whose in-flight or dead-letter queues
// are full, and the lag the consumer reports.

import (
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"
)

// flow pauses and resumes the assigned partitions and reports their lag
// (poll goroutine only).
type flow struct {
	*core
	kc  *kafka.Consumer
	own *ownership
}

// flowControl pauses and resumes partitions (poll goroutine only). A
// partition is paused for two reasons, each with its own high and low
// mark, and stays paused until neither holds:
//   - its in-flight count reached processor.max_in_flight (cleared below
//     processor.resume_below). It is the node-overload valve: one user can
//     hold at most mailbox_size messages, so a single user cannot trigger
//     it (I5).
//   - its dead-letter queue holds processor.dead_letter_queue letters not
//     durable yet (cleared below half of that): the DLQ is slower than the
//     partition's refusals, and only this partition waits for it (I5).
//
// Pausing stops fetching the partition; messages already dispatched go on.
func (f *flow) flowControl() {
	pc := f.cfg.Processor
	for _, p := range f.own.parts {
		if p.dropped.Load() {
			continue
		}
		n := p.tracker.InFlight()
		switch {
		case !p.pause.cap && n >= pc.MaxInFlight:
			p.pause.cap = true
			f.m.part.paused.Inc()
			f.log.Info("partition paused: in-flight cap", zap.Int32("partition", p.id), zap.Int("in_flight", n))
		case p.pause.cap && n < pc.ResumeBelow:
			p.pause.cap = false
			f.m.part.paused.Dec()
			f.log.Info("partition in-flight cap cleared", zap.Int32("partition", p.id), zap.Int("in_flight", n))
		}
		if p.dead != nil {
			w := p.dead.waiting.Load()
			switch {
			case !p.pause.dead && w >= int64(pc.DeadLetterQueue):
				p.pause.dead = true
				f.m.part.deadPaused.Inc()
				f.m.part.deadPauses.Inc()
				f.log.Warn("partition paused: dead-letter queue full (the DLQ is slower than this partition's refusals)",
					zap.Int32("partition", p.id), zap.Int64("dead_letters_waiting", w))
			case p.pause.dead && w < int64(resumeDeadBelow(pc.DeadLetterQueue)):
				p.pause.dead = false
				f.m.part.deadPaused.Dec()
				f.log.Info("partition dead-letter queue drained", zap.Int32("partition", p.id),
					zap.Int64("dead_letters_waiting", w))
			}
		}
		f.setPaused(p, p.pause.cap || p.pause.dead)
	}
}

// resumeDeadBelow is the dead-letter queue's low mark: half of the high
// mark, so a queue hovering at the mark does not pause and resume the
// partition (each resume refetches it) for every letter.
func resumeDeadBelow(mark int) int { return max(mark/2, 1) }

// setPaused pauses or resumes p in the Kafka client when it is not as
// wanted; a failure is logged and tried again on the next call.
func (f *flow) setPaused(p *partition, want bool) {
	if p.pause.on == want {
		return
	}
	tp := []kafka.TopicPartition{{Topic: &p.topic, Partition: p.id}}
	if want {
		if err := f.kc.Pause(tp); err != nil {
			f.log.Warn("pause partition", zap.Int32("partition", p.id), zap.Error(err))
			return
		}
	} else if err := f.kc.Resume(tp); err != nil {
		f.log.Warn("resume partition", zap.Int32("partition", p.id), zap.Error(err))
		return
	}
	p.pause.on = want
	if !want {
		f.log.Info("partition resumed", zap.Int32("partition", p.id), zap.Int("in_flight", p.tracker.InFlight()))
	}
}

// resumeForRevoke resumes the partitions of ps that are paused and clears
// their pause reasons (poll goroutine, inside the rebalance callback).
func (f *flow) resumeForRevoke(kc *kafka.Consumer, ps []*partition) {
	for _, p := range ps {
		if p.pause.cap {
			p.pause.cap = false
			f.m.part.paused.Dec()
		}
		if p.pause.dead {
			p.pause.dead = false
			f.m.part.deadPaused.Dec()
		}
		if !p.pause.on {
			continue
		}
		if err := kc.Resume([]kafka.TopicPartition{{Topic: &p.topic, Partition: p.id}}); err != nil {
			f.log.Warn("resume revoked partition", zap.Int32("partition", p.id), zap.Error(err))
		}
		p.pause.on = false
	}
}

// updateLag sets consumer lag from the cached high watermark (poll
// goroutine only): the high watermark minus the committable offset, or,
// before the partition finished a message, minus the oldest offset in
// flight or the offset committed when it was assigned — so a partition that
// is assigned but never progresses shows its lag and alerts. The committed
// offsets are read from the broker once per assignment.
func (f *flow) updateLag() {
	f.readBases()
	for _, p := range f.own.parts {
		next, ok := p.tracker.Committable()
		if !ok {
			next, ok = p.tracker.Oldest()
		}
		if !ok && p.base >= 0 {
			next, ok = p.base, true
		}
		low, high, err := f.kc.GetWatermarkOffsets(p.topic, p.id)
		if err != nil || high < 0 {
			continue
		}
		if !ok {
			if p.base != -1 || low < 0 {
				continue // not known yet
			}
			// Nothing committed: auto_offset_reset is earliest, so the
			// whole partition is behind.
			next = low
		}
		f.m.part.lag.WithLabelValues(p.label).Set(float64(max(high-next, 0)))
	}
}

// readBases reads, in one request, the committed offsets of the assigned
// partitions whose base is not known yet.
func (f *flow) readBases() {
	var tps []kafka.TopicPartition
	for _, p := range f.own.parts {
		if p.base == baseUnknown {
			tps = append(tps, kafka.TopicPartition{Topic: &p.topic, Partition: p.id})
		}
	}
	if len(tps) == 0 {
		return
	}
	got, err := f.kc.Committed(tps, 2000)
	if err != nil {
		f.log.Warn("read committed offsets for lag", zap.Error(err))
		return
	}
	for _, tp := range got {
		p := f.own.parts[tpKey{*tp.Topic, tp.Partition}]
		if p == nil || tp.Error != nil {
			continue
		}
		if p.base = int64(tp.Offset); p.base < 0 {
			p.base = -1 // none committed
		}
	}
}
