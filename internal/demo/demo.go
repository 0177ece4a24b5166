// Package demo runs the whole pipeline in one process — a fake WeChat,
// kf-producer, schedule-consumer and dlq-consumer, wired by
// internal/service exactly as the daemons are — against embedded Kafka
// (librdkafka's mock cluster) and Redis (miniredis) or real ones, plays a
// scripted scenario through the real ingestion path and reports what came
// out: processed, deduplicated, dead-lettered, recovered, lost, reordered.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/media"
	"github.com/kfpipe/kfpipe/internal/reply"
	"github.com/kfpipe/kfpipe/internal/service"
	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// Options configures a run.
type Options struct {
	// ConfigPath is the YAML the three configurations start from; ""
	// looks for config/development.yaml here and in parent directories,
	// and falls back to the built-in defaults.
	ConfigPath string
	// Kafka and Redis are real services' addresses; "" embeds them.
	Kafka, Redis string
	// Archive is a PostgreSQL DSN: the conversation archive is on
	// (archive.dsn of the consumer and the dlq-consumer), the timeline
	// reads it. "" keeps the demo's default: no database, the timeline
	// scans the main topic.
	Archive  string
	Scenario Scenario
	Seed     uint64
	// LogLevel of the daemons' loggers (stderr); "" is error, so the
	// progress bar stays readable.
	LogLevel string
	// Out receives the report; Progress, when non-nil, the progress bar.
	Out, Progress io.Writer
	// Hold keeps everything up after the report until ctx ends; the
	// notice saying so goes to Notice (stderr), so the report's last line
	// stays the summary.
	Hold   bool
	Notice io.Writer
	// DrainTimeout bounds the wait for the pipeline to settle after the
	// scenario; 0 is 60 s.
	DrainTimeout time.Duration
}

// Timing knobs of the demo's configuration; see configure.
const (
	recoveryBase = 4 * time.Second
	// horizon: a DLQ entry due within it is still moving, so the run
	// waits for it (two backoff steps: a letter retried once more, e.g.
	// one the limiter refused on its way back).
	horizon = 3 * recoveryBase
)

// Run plays o.Scenario and returns the report, which it has also written
// to o.Out.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Notice == nil {
		o.Notice = io.Discard
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = 60 * time.Second
	}
	st, err := stageUp(o)
	if err != nil {
		return nil, err
	}
	defer st.close(o.Notice)
	be, cfgs, fake := st.be, st.cfgs, st.fake

	rec := newRecorder()
	pl, err := startPipeline(ctx, cfgs, rec)
	if err != nil {
		return nil, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), cfgs.common.Ops.ShutdownTimeout)
		defer cancel()
		if err := pl.close(sctx); err != nil {
			fmt.Fprintf(o.Notice, "demo: shutdown: %v\n", err)
		}
	}()

	rep := &Report{AdminURL: pl.dlq.AdminURL, OperatorToken: cfgs.operatorToken, Scenario: o.Scenario,
		RetryBase: cfgs.dlq.Recovery.BaseDelay, ShippedRetry: cfgs.configuredRetry, Rule: ruleOf(cfgs.consumer.RateLimit)}
	fmt.Fprintf(o.Out, "kfpipe demo: kafka %s (%s), redis %s (%s)\n", be.brokers, kind(be.embedded.kafka),
		be.redisAddr, kind(be.embedded.redis))
	fmt.Fprintf(o.Out, "admin console: %s/admin/ui/  operator token: %s\n", pl.dlq.AdminURL, cfgs.operatorToken)
	fmt.Fprintf(o.Out, "callback: %s  fake WeChat: %s\n", pl.producer.CallbackURL, cfgs.producer.WeCom.BaseURL)

	sender := &wecomtest.CallbackSender{URL: pl.producer.CallbackURL, Token: cfgs.producer.Callback.Token,
		AESKey: cfgs.producer.Callback.EncodingAESKey, CorpID: cfgs.producer.WeCom.CorpID,
		HTTPClient: &http.Client{Timeout: 5 * time.Second}}
	if err := warmUp(ctx, fake, sender, rec); err != nil {
		return nil, err
	}
	photo, err := sendPhoto(ctx, fake, sender, rec)
	if err != nil {
		return nil, err
	}
	// The photo's reply is not the scenario's.
	photoSent, _, _, _ := pl.replies.Counts()
	photoAtWeChat := len(fake.Replies("", ""))

	p := o.Scenario.build(o.Seed)
	drv := &driver{plan: p, fake: fake, sender: sender, rec: rec}
	rep.Planned = p.duration
	fmt.Fprintf(o.Out, "scenario: %d messages over %.0f s (%d normal users, %d whose downstream fails and is fixed, excited user, bot, outage, re-delivery, crowd of %d)\n",
		len(p.msgs), p.duration.Seconds(), o.Scenario.Users, o.Scenario.FailUsers, o.Scenario.CrowdUsers)
	if rep.RetryBase != rep.ShippedRetry {
		fmt.Fprintf(o.Out, "recovery.base_delay: %s for the demo (configured: %s), so letters come back within the run\n",
			rep.RetryBase, rep.ShippedRetry)
	}
	start := time.Now()
	bar := newBar(o.Progress)
	sctx, cancel := context.WithCancel(ctx)
	drvDone := make(chan error, 1)
	go func() { drvDone <- drv.run(sctx, start) }()
	var sendErr error
	for sending := true; sending; {
		select {
		case sendErr = <-drvDone:
			sending = false
		case <-time.After(250 * time.Millisecond):
			// Approximate while the driver still writes the plan:
			// processed plus what the DLQ holds.
			done := rec.processed()
			if st, err := pl.dlq.Index.Stats(ctx); err == nil {
				done += int(st.Total - st.Retried)
			}
			bar.draw(done, len(p.msgs), fmt.Sprintf("t=%.0fs sending", time.Since(start).Seconds()))
		}
	}
	cancel()
	if sendErr != nil {
		bar.done()
		return nil, sendErr
	}
	rep.Settled = settle(ctx, pl, p, rec, bar, o.DrainTimeout)
	bar.done()
	now := time.Now()
	rep.Elapsed = now.Sub(start)
	view, err := loadDLQ(ctx, pl.dlq.Index)
	if err != nil {
		return nil, fmt.Errorf("read dlq index: %w", err)
	}
	rep.account(p, rec.snapshot(), view, now, start)
	rep.Duplicates = int(counterValue(pl.consumerBase.Registry, "kfpipe_messages_duplicate_total"))
	rep.GateTransitions = int(counterValue(pl.consumerBase.Registry, "kfpipe_outage_gate_transitions_total"))
	rep.RepliesSent, rep.RepliesSkipped, rep.RepliesRefused, _ = pl.replies.Counts()
	rep.RepliesAtWeChat, rep.ReplyMsgIDRepeats = len(fake.Replies("", "")), fake.DuplicateMsgIDs()
	rep.RepliesSent -= photoSent
	rep.RepliesAtWeChat -= photoAtWeChat
	rep.Photo, rep.PhotoBytes = rec.photoSnapshot(), len(photo)
	_, rep.Redelivered, rep.Callbacks, rep.CallbackErrors = drv.counts()
	checkAdmin(ctx, rep)
	rep.blocks(blockedUsers(ctx, rep))
	rep.Write(o.Out)
	if o.Hold {
		fmt.Fprintf(o.Notice, "holding: admin console %s/admin/ui/ (token %s); Ctrl-C to stop\n", rep.AdminURL, rep.OperatorToken)
		<-ctx.Done()
	}
	return rep, nil
}

func kind(embedded bool) string {
	if embedded {
		return "embedded"
	}
	return "real"
}

// settle waits until every message is processed or held in the DLQ with
// no retry due soon, and the consumer has read nothing new for a second.
func settle(ctx context.Context, pl *pipeline, p *plan, rec *recorder, bar *bar, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	var lastConsumed float64 = -1
	stableSince := time.Now()
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(250 * time.Millisecond):
		}
		view, err := loadDLQ(ctx, pl.dlq.Index)
		if err != nil {
			continue
		}
		now := time.Now()
		done, total := progress(p, rec.snapshot(), view, now, horizon)
		bar.draw(done, total, "draining")
		consumed := counterValue(pl.consumerBase.Registry, "kfpipe_messages_consumed_total")
		if consumed != lastConsumed {
			lastConsumed, stableSince = consumed, now
		}
		if done == total && now.Sub(stableSince) >= time.Second {
			return true
		}
	}
	return false
}

// warmUp sends one message through the whole path and waits for the
// handler to see it, so the scenario starts with the consumer group
// assigned (a backlog at the start would bunch users' messages together
// and trip the limiter).
func warmUp(ctx context.Context, fake *wecomtest.Server, sender *wecomtest.CallbackSender, rec *recorder) error {
	acc := accountName(0)
	fake.AddText(acc, warmupUser, "hello")
	deadline := time.After(90 * time.Second)
	for {
		tok := fake.IssueToken(acc)
		if resp, err := sender.SendEvent(ctx, acc, tok); err == nil {
			resp.Body.Close()
		}
		select {
		case <-rec.warm:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return errors.New("warm-up message not handled within 90 s: is the pipeline connected?")
		case <-time.After(2 * time.Second):
		}
	}
}

// checkAdmin asks the admin API what an operator would: the console, the
// DLQ stats and the bot's rate-limit status.
func checkAdmin(ctx context.Context, r *Report) {
	c := &http.Client{Timeout: 5 * time.Second}
	get := func(path string, into any) int {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.AdminURL+path, nil)
		if err != nil {
			return 0
		}
		req.Header.Set("Authorization", "Bearer "+r.OperatorToken)
		resp, err := c.Do(req)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		if into != nil {
			_ = json.NewDecoder(resp.Body).Decode(into)
		} else {
			_, _ = io.Copy(io.Discard, resp.Body)
		}
		return resp.StatusCode
	}
	r.AdminUI = get("/admin/ui/", nil)
	r.AdminDLQStats = get("/admin/dlq/stats", nil)
	var st struct {
		Blocked bool `json:"blocked"`
	}
	r.AdminBotStatus = get("/admin/ratelimit/status/"+botUser, &st)
	r.BotBlocked = st.Blocked
}

// blockedUsers lists, through the admin API, the users the limiter
// holds blocked.
func blockedUsers(ctx context.Context, r *Report) map[string]time.Time {
	c := &http.Client{Timeout: 5 * time.Second}
	out := map[string]time.Time{}
	cursor := ""
	for range 100 {
		url := r.AdminURL + "/admin/ratelimit/blocked?limit=500"
		if cursor != "" {
			url += "&cursor=" + cursor
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return out
		}
		req.Header.Set("Authorization", "Bearer "+r.OperatorToken)
		resp, err := c.Do(req)
		if err != nil {
			return out
		}
		var page struct {
			Users []struct {
				User         string    `json:"user"`
				BlockedUntil time.Time `json:"blocked_until"`
			} `json:"users"`
			NextCursor string `json:"next_cursor"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return out
		}
		for _, u := range page.Users {
			out[u.User] = u.BlockedUntil
		}
		if page.NextCursor == "" {
			return out
		}
		cursor = page.NextCursor
	}
	return out
}

// ruleOf describes the default group's limiter rule.
func ruleOf(rl config.RateLimit) string {
	if !rl.Enabled {
		return "limiter off"
	}
	g, ok := rl.Groups[rl.DefaultGroup]
	if !ok {
		return rl.DefaultGroup + " (unknown group)"
	}
	return fmt.Sprintf("%s, %d messages per %g s, blocked for %g h after %d refusals",
		rl.DefaultGroup, g.MaxMessages, g.WindowSeconds, g.BlockHours, g.PenaltyThreshold)
}

// findConfig looks for config/development.yaml from the working directory
// up, so the demo runs from the repository root and from a test's package
// directory alike.
func findConfig() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		p := filepath.Join(dir, "config", "development.yaml")
		if _, err := os.Stat(p); err == nil {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// writeSecrets writes, in dir, a configuration file with only what the
// built-in defaults leave empty: the callback's token and AES key and
// WeChat's corp ID and secret, random, for the fake WeChat.
func writeSecrets(dir string) (string, error) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	yaml := fmt.Sprintf("callback:\n  token: demo-%s\n  encoding_aes_key: %s\nwecom:\n  corp_id: ww-demo\n  secret: demo-%s\n",
		randHex(8), strings.TrimRight(base64.StdEncoding.EncodeToString(key), "="), randHex(12))
	path := filepath.Join(dir, "demo.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		return "", fmt.Errorf("demo configuration: %w", err)
	}
	return path, nil
}

// configs are the three daemons' configurations for one run.
type configs struct {
	common        config.Common
	producer      *config.Producer
	consumer      *config.Consumer
	dlq           *config.DLQConsumer
	operatorToken string
	// configuredRetry is recovery.base_delay as configured, before the
	// demo's override.
	configuredRetry time.Duration
}

// configure loads the three configurations from the file and overrides
// what the demo needs in Go: its backends, loopback ports picked by the
// OS, its own tokens and files, and short timers so recovery happens
// within the run.
func configure(o Options, be *backends, tmp, fakeURL string) (*configs, error) {
	path := o.ConfigPath
	if path == "" {
		path = findConfig()
	}
	if path == "" {
		// Outside the repository (a bot's own module under kfpipesim):
		// the built-in defaults, with the secrets they lack.
		var err error
		if path, err = writeSecrets(tmp); err != nil {
			return nil, err
		}
	}
	prod, err := config.LoadProducer(path)
	if err != nil {
		return nil, err
	}
	cons, err := config.LoadConsumer(path)
	if err != nil {
		return nil, err
	}
	dq, err := config.LoadDLQConsumer(path)
	if err != nil {
		return nil, err
	}
	level := o.LogLevel
	if level == "" {
		level = "error"
	}
	c := &configs{producer: prod, consumer: cons, dlq: dq, operatorToken: "demo-op-" + randHex(12)}
	common := func(cm *config.Common) {
		cm.Log.Level = level
		cm.Ops.Addr = "127.0.0.1:0"
		cm.Ops.Pprof = false
		cm.Kafka.Brokers = be.brokers
		cm.Redis.Mode = "single"
		cm.Redis.Addr = be.redisAddr
		// The embedded Redis evicts nothing and has no CONFIG command.
		cm.Redis.SkipEvictionPolicyCheck = true
		if be.suffix != "" {
			// Real services: nothing of an earlier run may be seen.
			cm.Kafka.Topics.Main.Name += "-" + be.suffix
			cm.Kafka.Topics.DLQ.Name += "-" + be.suffix
			cm.Kafka.Consumer.GroupID += "-" + be.suffix
			cm.Redis.KeyPrefix = "kfpipe-" + be.suffix + ":"
		}
		if be.embedded.kafka {
			// One mock broker: every topic has one replica.
			for _, t := range []*config.Topic{&cm.Kafka.Topics.Main, &cm.Kafka.Topics.DLQ} {
				t.ReplicationFactor, t.MinInsyncReplicas = 1, 1
			}
			// The mock broker answers a fetch only when fetch.wait.max.ms
			// (500 ms) ends, not when data arrives as a real broker does;
			// without this every message would wait ~250 ms on average.
			cm.Kafka.Overrides = map[string]string{"fetch.wait.max.ms": "20"}
			if level != "debug" && level != "info" {
				// Every producer and admin client would warn that
				// fetch.wait.max.ms is a consumer property.
				cm.Kafka.Overrides["log_level"] = "3"
			}
		}
	}
	common(&prod.Common)
	common(&cons.Common)
	common(&dq.Common)
	c.common = prod.Common

	accounts := make([]string, max(o.Scenario.Accounts, 1))
	for i := range accounts {
		accounts[i] = accountName(i)
	}
	prod.Callback.Addr = "127.0.0.1:0"
	prod.WeCom.BaseURL = fakeURL
	prod.WeCom.OpenKfIDs = accounts
	prod.Sync.SafetyInterval = 5 * time.Second

	// The photo's media store, shared by kf-producer's keeper and the
	// handler's.
	mediaDir := filepath.Join(tmp, "media")
	prod.Media.Store, prod.Media.Dir = "dir", mediaDir
	cons.Media.Store, cons.Media.Dir = "dir", mediaDir

	if o.Archive != "" {
		cons.Archive.DSN, dq.Archive.DSN = o.Archive, o.Archive
		// A group and an outcomes topic of the run's own: the database
		// may have seen other runs, the group must not resume theirs.
		run := be.suffix
		if run == "" {
			run = randHex(6)
		}
		dq.Archive.GroupID += "-" + run
		if be.suffix != "" {
			cons.Archive.OutcomesTopic += "-" + be.suffix
			dq.Archive.OutcomesTopic = cons.Archive.OutcomesTopic
		}
	}

	cons.Handler.Type = "noop" // replaced by the recorder
	cons.WeCom = prod.WeCom    // the recorder's replies go to the fake
	cons.Dedup.Lease = 10 * time.Second
	cons.DLQ.EmergencyFile = filepath.Join(tmp, "consumer-dlq-emergency.jsonl")

	dq.DLQ.EmergencyFile = filepath.Join(tmp, "dlq-consumer-emergency.jsonl")
	// The configured recovery.base_delay (shipped: 1 min) would bring the
	// failing downstream's letters back only after the scenario ended:
	// the demo retries after recoveryBase, and its report says so.
	c.configuredRetry = dq.Recovery.BaseDelay
	dq.Recovery.BaseDelay = recoveryBase
	dq.Recovery.ScanInterval = 250 * time.Millisecond
	dq.Admin.Addr = "127.0.0.1:0"
	dq.Admin.Tokens = []config.AdminToken{
		{Name: "demo-operator", Token: c.operatorToken, Role: "operator"},
		{Name: "demo-viewer", Token: "demo-view-" + randHex(12), Role: "viewer"},
	}
	for name, v := range map[string]interface{ Validate() error }{"kf-producer": prod, "schedule-consumer": cons, "dlq-consumer": dq} {
		if err := v.Validate(); err != nil {
			return nil, fmt.Errorf("demo %s config: %w", name, err)
		}
	}
	return c, nil
}

// pipeline is the three daemons running in this process.
type pipeline struct {
	producerBase, consumerBase, dlqBase *daemon.Base
	producer                            *service.Producer
	consumer                            *service.Consumer
	dlq                                 *service.DLQ
	replies                             *reply.Effects
	closeReplies                        func()
}

func startPipeline(ctx context.Context, c *configs, h *recorder) (*pipeline, error) {
	pl := &pipeline{}
	fail := func(err error) (*pipeline, error) {
		sctx, cancel := context.WithTimeout(context.Background(), c.common.Ops.ShutdownTimeout)
		defer cancel()
		_ = pl.close(sctx)
		return nil, err
	}
	var err error
	if pl.dlqBase, err = daemon.Start(ctx, "dlq-consumer", c.dlq.Common); err != nil {
		return fail(fmt.Errorf("dlq-consumer: %w", err))
	}
	if pl.dlq, err = service.StartDLQ(ctx, c.dlq, pl.dlqBase); err != nil {
		return fail(fmt.Errorf("dlq-consumer: %w", err))
	}
	if h != nil { // nil: the caller runs the consumer (Sandbox)
		if pl.consumerBase, err = daemon.Start(ctx, "schedule-consumer", c.consumer.Common); err != nil {
			return fail(fmt.Errorf("schedule-consumer: %w", err))
		}
		if pl.replies, pl.closeReplies, err = reply.FromConfig(ctx, c.consumer, pl.consumerBase); err != nil {
			return fail(fmt.Errorf("schedule-consumer: %w", err))
		}
		keeper, err := media.FromConfig(ctx, c.consumer.Media, c.consumer.WeCom,
			wecom.NewRedisTokenCache(pl.consumerBase.Redis, c.consumer.Redis.KeyPrefix), pl.consumerBase.Log, pl.consumerBase.Registry)
		if err != nil {
			return fail(fmt.Errorf("schedule-consumer: %w", err))
		}
		handler := media.Wrap(reply.Wrap(h, pl.replies), keeper)
		if pl.consumer, err = service.StartConsumer(ctx, c.consumer, pl.consumerBase, handler); err != nil {
			return fail(fmt.Errorf("schedule-consumer: %w", err))
		}
	}
	if pl.producerBase, err = daemon.Start(ctx, "kf-producer", c.producer.Common); err != nil {
		return fail(fmt.Errorf("kf-producer: %w", err))
	}
	if pl.producer, err = service.StartProducer(ctx, c.producer, pl.producerBase); err != nil {
		return fail(fmt.Errorf("kf-producer: %w", err))
	}
	return pl, nil
}

// close stops ingestion first, then consumption, then the DLQ side, as an
// operator would stop the daemons.
func (pl *pipeline) close(ctx context.Context) error {
	var errs []error
	if pl.producer != nil {
		errs = append(errs, pl.producer.Close(ctx))
	}
	if pl.producerBase != nil {
		errs = append(errs, pl.producerBase.Close(ctx))
	}
	if pl.consumer != nil {
		errs = append(errs, pl.consumer.Close(ctx))
	}
	if pl.closeReplies != nil {
		pl.closeReplies()
	}
	if pl.consumerBase != nil {
		errs = append(errs, pl.consumerBase.Close(ctx))
	}
	if pl.dlq != nil {
		errs = append(errs, pl.dlq.Close(ctx))
	}
	if pl.dlqBase != nil {
		errs = append(errs, pl.dlqBase.Close(ctx))
	}
	return errors.Join(errs...)
}
