package console

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// The verdict's history: one sample a minute of the consumers' lag, the
// main topic's end and committed offsets (their differences are the
// throughput in and out) and the dead letters of the minute, kept 24 hours
// in one Redis sorted set <prefix>history scored by the sample's minute.
// Memory is bounded by construction: a minute holds one member (a replica
// sampling the same minute replaces it), and each write trims what is
// older than historyKeep, so the set never holds more than 1,441 members
// (about 145 bytes each in a sorted set, some 210 KB in all:
// TestHistoryBounded measures it).
const (
	historyStep = time.Minute
	historyKeep = 24 * time.Hour
)

func historyKey(prefix string) string { return prefix + "history" }

// historyWrite replaces the sample of ARGV[1]'s minute with ARGV[2], drops
// the samples older than ARGV[3] and keeps the key ARGV[4] ms.
var historyWrite = redis.NewScript(`
redis.call('ZREMRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1`)

// historySample is one minute's sample; -1 marks a value that could not
// be read.
type historySample struct {
	at                  time.Time
	lag, end, committed int64
	dlq                 int64
}

func (h historySample) member() string {
	return fmt.Sprintf("%d|%d|%d|%d|%d", h.at.Unix(), h.lag, h.end, h.committed, h.dlq)
}

func parseSample(m string) (historySample, bool) {
	f := strings.Split(m, "|")
	if len(f) != 5 {
		return historySample{}, false
	}
	var n [5]int64
	for i, s := range f {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return historySample{}, false
		}
		n[i] = v
	}
	return historySample{at: time.Unix(n[0], 0).UTC(), lag: n[1], end: n[2], committed: n[3], dlq: n[4]}, true
}

// sampleHistory reads the pipeline's offsets and the DLQ inflow of the
// minute before now and writes them as now's minute.
func (s *watch) sampleHistory(ctx context.Context, now time.Time) error {
	at := now.Truncate(historyStep)
	h := historySample{at: at, lag: -1, end: -1, committed: -1, dlq: -1}
	if p := s.cfg.Pipeline; p != nil {
		if lag, err := p.Lag(ctx); err == nil {
			h.lag, h.end, h.committed = 0, 0, 0
			for _, pl := range lag {
				h.lag += pl.Lag
				h.end += pl.End
				h.committed += max(pl.Committed, 0)
			}
		}
	}
	if in, err := s.dlq.Inflow(ctx, now, historyStep, 1); err == nil {
		h.dlq = 0
		for _, c := range in {
			h.dlq += c[0]
		}
	}
	return historyWrite.Run(ctx, s.rdb, []string{historyKey(s.cfg.Prefix)}, at.Unix(), h.member(),
		at.Add(-historyKeep).Unix(), (historyKeep + historyStep).Milliseconds()).Err()
}

// sampleHistoryLoop samples every historyStep until the server closes.
func (s *watch) sampleHistoryLoop() {
	tick := time.NewTicker(historyStep)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(s.life, 10*time.Second)
		if err := s.sampleHistory(ctx, s.clock.Now().UTC()); err != nil && s.life.Err() == nil {
			s.log.Debug("history sample not written", zap.Error(err))
		}
		cancel()
		select {
		case <-s.life.Done():
			return
		case <-tick.C:
		}
	}
}

// HistoryPoint is one minute of the verdict's history. A value that could
// not be read at the time is absent.
type HistoryPoint struct {
	Time time.Time `json:"time"`
	Lag  *int64    `json:"lag,omitempty"`
	// InPerSecond and OutPerSecond are the main topic's produce and
	// commit rates since the previous sample.
	InPerSecond  *float64 `json:"in_per_second,omitempty"`
	OutPerSecond *float64 `json:"out_per_second,omitempty"`
	// DLQ counts the dead letters of the minute.
	DLQ *int64 `json:"dlq,omitempty"`
}

// HistoryView is the verdict's history, oldest first.
type HistoryView struct {
	From        time.Time      `json:"from"`
	To          time.Time      `json:"to"`
	StepSeconds int64          `json:"step_seconds"`
	Points      []HistoryPoint `json:"points"`
}

func (s *watch) readHistory(ctx context.Context, now time.Time, span time.Duration) (HistoryView, error) {
	v := HistoryView{From: now.Add(-span), To: now, StepSeconds: int64(historyStep / time.Second), Points: []HistoryPoint{}}
	// One sample before the span gives the first point its throughput.
	ms, err := s.rdb.ZRangeByScore(ctx, historyKey(s.cfg.Prefix), &redis.ZRangeBy{
		Min: strconv.FormatInt(now.Add(-span-historyStep).Unix(), 10), Max: strconv.FormatInt(now.Unix(), 10)}).Result()
	if err != nil {
		return v, err
	}
	var prev *historySample
	for _, m := range ms {
		h, ok := parseSample(m)
		if !ok {
			continue
		}
		if !h.at.Before(v.From) {
			p := HistoryPoint{Time: h.at}
			if h.lag >= 0 {
				p.Lag = &h.lag
			}
			if h.dlq >= 0 {
				p.DLQ = &h.dlq
			}
			if prev != nil && prev.end >= 0 && h.end >= prev.end && h.committed >= prev.committed && prev.committed >= 0 {
				dt := h.at.Sub(prev.at).Seconds()
				in, out := float64(h.end-prev.end)/dt, float64(h.committed-prev.committed)/dt
				p.InPerSecond, p.OutPerSecond = &in, &out
			}
			v.Points = append(v.Points, p)
		}
		hc := h
		prev = &hc
	}
	return v, nil
}
