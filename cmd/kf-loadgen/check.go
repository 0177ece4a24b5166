package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/bench"
	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/judge"
	"github.com/kfpipe/kfpipe/internal/kafkaclient"
)

// runVerdict is check's judgement of one run (one kf-loadgen invocation).
type runVerdict struct {
	Run       string `json:"run"`
	Sent      int    `json:"sent"`
	Effects   int    `json:"effects"` // distinct messages handled
	Lost      int    `json:"lost"`
	Dup       int    `json:"dup"`
	Reordered int    `json:"reordered"`
	// DeadLettered counts the run's messages with a dead letter, by reason;
	// Unexpected those whose reason is not allowed (--allow-dlq);
	// Recovered those handled after all; Unrecovered the rest.
	DeadLettered map[string]int `json:"dead_lettered"`
	Unexpected   int            `json:"unexpected_dead_letters"`
	Recovered    int            `json:"recovered"`
	Unrecovered  int            `json:"unrecovered"`
	MaxStallMs   float64        `json:"max_user_stall_ms"`
	MaxStallUser string         `json:"max_user_stall_user,omitempty"`
	OK           bool           `json:"ok"`
	Examples     []string       `json:"examples,omitempty"`
}

// checkResult is what check prints.
type checkResult struct {
	OK   bool         `json:"ok"`
	Runs []runVerdict `json:"runs"`
	// Foreign counts effects of messages in no run of the expected set
	// (other traffic at the receiver): reported, not judged.
	Foreign int `json:"foreign_effects"`
}

// checkRules are what a run is held to besides the judge's properties.
type checkRules struct {
	allow           map[string]bool // dead-letter reasons that are no failure
	requireRecovery bool            // every dead-lettered message must be handled in the end
}

// judgeRuns judges each run of the expected set against the effects (in
// arrival order) and the dead letters (msgid → reasons): lost, duplicate
// and reordered with the chaos suite's judge, the longest user stall, and
// dead letters against the rules.
func judgeRuns(expected []expectLine, effects []bench.RecordLine, dead map[string][]string, rules checkRules) checkResult {
	runOf := map[string]string{}
	var runs []string
	sent := map[string][]judge.Message{}
	for _, e := range expected {
		if _, ok := sent[e.Run]; !ok {
			runs = append(runs, e.Run)
		}
		runOf[e.MsgID] = e.Run
		sent[e.Run] = append(sent[e.Run], judge.Message{MsgID: e.MsgID, User: e.User, Index: e.Index, At: e.At})
	}
	res := checkResult{OK: true}
	effs := map[string][]judge.Effect{}
	for i, r := range effects {
		run, ok := runOf[r.MsgID]
		if !ok {
			res.Foreign++
			continue
		}
		effs[run] = append(effs[run], judge.Effect{Seq: i, MsgID: r.MsgID, User: r.User, At: r.At})
	}
	for _, run := range runs {
		deadSet := map[string]bool{}
		rv := runVerdict{Run: run, Sent: len(sent[run]), DeadLettered: map[string]int{}}
		var ex []string
		for _, m := range sent[run] {
			reasons := dead[m.MsgID]
			if len(reasons) == 0 {
				continue
			}
			deadSet[m.MsgID] = true
			unexpected := false
			for _, r := range reasons {
				if !rules.allow[r] {
					unexpected = true
				}
			}
			rv.DeadLettered[reasons[len(reasons)-1]]++
			if unexpected {
				rv.Unexpected++
				ex = append(ex, fmt.Sprintf("dead letter: %s of user %s (%s)", m.MsgID, m.User, strings.Join(reasons, ", ")))
			}
		}
		v := judge.Judge(judge.Input{Sent: sent[run], Effects: effs[run], Dead: deadSet})
		rv.Effects, rv.Lost, rv.Dup, rv.Reordered = v.Effects, len(v.Lost), v.Dup(), len(v.Reordered)
		rv.Recovered, rv.Unrecovered = v.Recovered, v.Dead-v.Recovered
		for _, m := range v.Lost {
			ex = append(ex, fmt.Sprintf("lost: %s of user %s (index %d)", m.MsgID, m.User, m.Index))
		}
		for _, r := range v.Repeats {
			ex = append(ex, fmt.Sprintf("dup: %s of user %s handled %d times", r.MsgID, r.User, len(r.Effects)))
		}
		for _, o := range v.Reordered {
			ex = append(ex, fmt.Sprintf("reordered: %s of user %s (index %d) first handled after index %d", o.MsgID, o.User, o.Index, o.After))
		}
		if rules.requireRecovery {
			for id := range deadSet {
				if len(v.ByMsg[id]) == 0 {
					ex = append(ex, "not recovered: "+id)
				}
			}
		}
		st := judge.MaxUserStall(sent[run], effs[run], deadSet)
		rv.MaxStallMs, rv.MaxStallUser = float64(st.Wait.Microseconds())/1000, st.User
		rv.OK = v.OK() && rv.Unexpected == 0 && (!rules.requireRecovery || rv.Unrecovered == 0)
		sort.Strings(ex)
		if len(ex) > 10 {
			ex = ex[:10]
		}
		rv.Examples = ex
		res.OK = res.OK && rv.OK
		res.Runs = append(res.Runs, rv)
	}
	return res
}

// line is a run's one-line summary for people.
func (rv runVerdict) line() string {
	var reasons []string
	for r, n := range rv.DeadLettered {
		reasons = append(reasons, fmt.Sprintf("%s:%d", r, n))
	}
	sort.Strings(reasons)
	return fmt.Sprintf("run=%s sent=%d effects=%d lost=%d dup=%d reordered=%d dlq=%d [%s] unexpected_dlq=%d recovered=%d max_user_stall=%s (%s) ok=%v",
		rv.Run, rv.Sent, rv.Effects, rv.Lost, rv.Dup, rv.Reordered, rv.Unrecovered+rv.Recovered, strings.Join(reasons, " "),
		rv.Unexpected, rv.Recovered, (time.Duration(rv.MaxStallMs * 1e6)).Round(time.Millisecond), rv.MaxStallUser, rv.OK)
}

// runCheck is `kf-loadgen check`.
func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kf-loadgen check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "the daemons' config file (brokers and topic names); default $KFPIPE_CONFIG")
	expectPath := fs.String("expect", "", "the expected set a run wrote with --expect (required)")
	record := fs.String("record", "", "the receiver's record (JSON lines: msgid, user, at), or \"topic\" to check the main topic's content instead (required)")
	dlq := fs.String("dlq", "topic", "where dead letters are read: topic (the DLQ topic, from its start) or none")
	allow := fs.String("allow-dlq", "", "comma-separated dead-letter reasons that are expected (e.g. rate_limited,user_blocked for an attack); any other dead letter makes ok false")
	requireRecovery := fs.Bool("require-recovery", false, "ok only if every dead-lettered message was handled in the end (after a fix and a retry)")
	wait := fs.Duration("wait", 0, "while messages are still missing, read again every 2 s for up to this long (messages in flight when check starts)")
	timeout := fs.Duration("timeout", 2*time.Minute, "how long reading a topic may take")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *expectPath == "" || *record == "" {
		return errors.New("check: --expect and --record are required")
	}
	if *dlq != "topic" && *dlq != "none" {
		return fmt.Errorf("check: --dlq must be topic or none, got %q", *dlq)
	}
	expected, err := readExpect(*expectPath)
	if err != nil {
		return err
	}
	var k config.Kafka
	if *record == "topic" || *dlq == "topic" {
		c, err := config.LoadConsumer(config.Path(*cfgPath))
		if err != nil {
			return err
		}
		k = c.Kafka
	}
	rules := checkRules{allow: reasonSet(*allow), requireRecovery: *requireRecovery}
	deadline := time.Now().Add(*wait)
	var res checkResult
	for {
		if res, err = checkOnce(ctx, k, expected, *record, *dlq == "topic", *timeout, rules); err != nil {
			return err
		}
		missing := 0
		for _, rv := range res.Runs {
			missing += rv.Lost
			if *requireRecovery {
				missing += rv.Unrecovered
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			break
		}
		fmt.Fprintf(stderr, "kf-loadgen check: %d messages not handled yet, reading again\n", missing)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	for _, rv := range res.Runs {
		fmt.Fprintln(stderr, rv.line())
		for _, e := range rv.Examples {
			fmt.Fprintln(stderr, "  "+e)
		}
	}
	b, _ := json.Marshal(res)
	fmt.Fprintln(stdout, string(b))
	if !res.OK {
		return errors.New("check failed (details above)")
	}
	return nil
}

// checkOnce reads the record and the dead letters and judges them.
func checkOnce(ctx context.Context, k config.Kafka, expected []expectLine, record string, dlqTopic bool,
	timeout time.Duration, rules checkRules) (checkResult, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var effects []bench.RecordLine
	var err error
	if record == "topic" {
		effects, err = mainTopicRecord(ctx, k)
	} else {
		effects, err = readRecord(record)
	}
	if err != nil {
		return checkResult{}, err
	}
	dead := map[string][]string{}
	if dlqTopic {
		if dead, err = deadLetters(ctx, k); err != nil {
			return checkResult{}, err
		}
	}
	return judgeRuns(expected, effects, dead, rules), nil
}

func reasonSet(s string) map[string]bool {
	out := map[string]bool{}
	for _, r := range strings.Split(s, ",") {
		if r = strings.TrimSpace(r); r != "" {
			out[r] = true
		}
	}
	return out
}

// deadLetters reads the DLQ topic from its start to its end: msgid → the
// reasons of its dead letters, in the order written. The topic, not the
// DLQ index, because it keeps every letter ever written: a letter retried
// or purged since still shows that the message was refused once.
func deadLetters(ctx context.Context, k config.Kafka) (map[string][]string, error) {
	out := map[string][]string{}
	err := readTopic(ctx, k, k.Topics.DLQ.Name, func(m *kafka.Message) {
		var dl struct {
			Reason        string `json:"failure_reason"`
			UpstreamMsgID string `json:"upstream_msgid"`
			Original      struct {
				UpstreamMsgID string `json:"upstream_msgid"`
			} `json:"original_message"`
		}
		if json.Unmarshal(m.Value, &dl) != nil {
			return
		}
		id := dl.UpstreamMsgID
		if id == "" {
			id = dl.Original.UpstreamMsgID
		}
		if id != "" {
			out[id] = append(out[id], strings.TrimSpace(dl.Reason))
		}
	})
	return out, err
}

// mainTopicRecord reads the main topic as a record: one effect per record
// (its Kafka timestamp as the time), so check tells whether what was sent
// reached Kafka whole and, per user, in order.
func mainTopicRecord(ctx context.Context, k config.Kafka) ([]bench.RecordLine, error) {
	var out []bench.RecordLine
	err := readTopic(ctx, k, k.Topics.Main.Name, func(m *kafka.Message) {
		cm, err := chatmsg.Decode(m.Value)
		if err != nil {
			return
		}
		out = append(out, bench.RecordLine{MsgID: cm.UpstreamMsgID, User: cm.ExternalUserID, OpenKfID: cm.OpenKfID, At: m.Timestamp})
	})
	return out, err
}

// readTopic hands every committed record of topic, from the start of each
// partition to its end when called, to fn (per partition in offset order).
func readTopic(ctx context.Context, k config.Kafka, topic string, fn func(*kafka.Message)) error {
	cm := kafkaclient.Consumer(k, fmt.Sprintf("kf-loadgen-check-%d", time.Now().UnixNano()))
	_ = cm.SetKey("enable.partition.eof", true)
	c, err := kafka.NewConsumer(cm)
	if err != nil {
		return fmt.Errorf("read %s: %w", topic, err)
	}
	defer c.Close()
	md, err := c.GetMetadata(&topic, false, 10000)
	if err != nil {
		return fmt.Errorf("read %s: %w", topic, err)
	}
	t, ok := md.Topics[topic]
	if !ok || t.Error.Code() != kafka.ErrNoError || len(t.Partitions) == 0 {
		return fmt.Errorf("read %s: topic not found (%v)", topic, t.Error)
	}
	var tps []kafka.TopicPartition
	open := map[int32]bool{}
	for _, p := range t.Partitions {
		tps = append(tps, kafka.TopicPartition{Topic: &topic, Partition: p.ID, Offset: kafka.OffsetBeginning})
		open[p.ID] = true
	}
	if err := c.Assign(tps); err != nil {
		return fmt.Errorf("read %s: %w", topic, err)
	}
	for len(open) > 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("read %s: %d partitions not read to the end: %w", topic, len(open), err)
		}
		switch ev := c.Poll(100).(type) {
		case *kafka.Message:
			if ev.TopicPartition.Error == nil {
				fn(ev)
			}
		case kafka.PartitionEOF:
			delete(open, ev.Partition)
		case kafka.Error:
			if ev.IsFatal() {
				return fmt.Errorf("read %s: %w", topic, ev)
			}
		}
	}
	return nil
}
