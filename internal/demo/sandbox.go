package demo

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// Sandbox is the demo's pipeline without its scenario and without its
// consumer: the fake WeChat, kf-producer and dlq-consumer wired as Run
// wires them, on embedded (or real) Kafka and Redis. The caller runs its
// own consumer with Consumer (kfpipe.NewConsumer), so a bot runs exactly
// as under RunConsumer; kfpipesim chats with it through Fake and Notify.
type Sandbox struct {
	// Fake is the fake WeChat: append a customer's or a servicer's
	// message to Account's log, then Notify; read the replies back.
	Fake    *wecomtest.Server
	Account string
	// Consumer is the schedule-consumer's configuration for this
	// pipeline (its handler.type is unused: the caller brings the handler).
	Consumer *config.Consumer
	// DLQ is the dead letters' index; AdminURL and OperatorToken the
	// dlq-consumer's admin API and console.
	DLQ                     *dlq.Index
	AdminURL, OperatorToken string
	// Kafka and Redis describe the backends ("embedded" or an address).
	Kafka, Redis string

	st     *stage
	pl     *pipeline
	sender *wecomtest.CallbackSender
	notice io.Writer
}

// StartSandbox starts the pipeline (o.ConfigPath, o.Kafka, o.Redis,
// o.LogLevel and o.Notice are used; one account); Close stops it.
func StartSandbox(ctx context.Context, o Options) (*Sandbox, error) {
	if o.Notice == nil {
		o.Notice = io.Discard
	}
	o.Scenario.Accounts = 1
	st, err := stageUp(o)
	if err != nil {
		return nil, err
	}
	pl, err := startPipeline(ctx, st.cfgs, nil)
	if err != nil {
		st.close(o.Notice)
		return nil, err
	}
	c := st.cfgs
	sb := &Sandbox{Fake: st.fake, Account: accountName(0), Consumer: c.consumer, DLQ: pl.dlq.Index,
		AdminURL: pl.dlq.AdminURL, OperatorToken: c.operatorToken, st: st, pl: pl, notice: o.Notice,
		Kafka: describe(st.be.embedded.kafka, st.be.brokers), Redis: describe(st.be.embedded.redis, st.be.redisAddr),
		sender: &wecomtest.CallbackSender{URL: pl.producer.CallbackURL, Token: c.producer.Callback.Token,
			AESKey: c.producer.Callback.EncodingAESKey, CorpID: c.producer.WeCom.CorpID,
			HTTPClient: &http.Client{Timeout: 5 * time.Second}}}
	return sb, nil
}

func describe(embedded bool, addr string) string {
	if embedded {
		return "embedded"
	}
	return addr
}

// Notify sends WeChat's kf_msg_or_event callback for the account, as
// WeChat does when someone writes: kf-producer then pulls the new
// messages.
func (s *Sandbox) Notify(ctx context.Context) error {
	resp, err := s.sender.SendEvent(ctx, s.Account, s.Fake.IssueToken(s.Account))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("callback answered %s", resp.Status)
	}
	return nil
}

// Close stops the pipeline, then the fake and the backends.
func (s *Sandbox) Close() error {
	sctx, cancel := context.WithTimeout(context.Background(), s.st.cfgs.common.Ops.ShutdownTimeout)
	defer cancel()
	err := s.pl.close(sctx)
	s.st.close(s.notice)
	return err
}
